"""Stop, unwind and resolve hold against a real Postgres.

A stop committed at any moment before an intent prevents it, an unwind lists every step it must
undo, a refused compensation is never counted as undone and can be tried again, and a person can
record "it must not happen"."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from activities.catalog import spec_registry
from activities.fs import FsRename
from helpers.fs_roots import FS_ROOTS
from helpers.ledger import LedgerRecord, ledger_lines, ledger_step
from helpers.steps import persist, run_one, wait_unlocked
from tidemark.actions import ProbeResult, Registry, StepContext
from tidemark.errors import (
    InvariantViolation,
    NotStopped,
    StepBusy,
    StepFailed,
    TargetUnavailable,
    TaskStopped,
    TaskUnwound,
)
from tidemark.faults import CRASH_ENV
from tidemark.keys import key_for
from tidemark.run_step import run_step
from tidemark.store import LEASE_S, JournalStore
from tidemark.unwind import undo_key, unwind_step
from tools.cli.main import main
from tools.operate import commands
from tools.operate.commands import DecisionError

SPECS = spec_registry(LedgerRecord)
REGISTRY = Registry([FsRename([FS_ROOTS]), LedgerRecord()])


def rename(tmp_path: Path, i: int) -> dict[str, Any]:
    (tmp_path / f"draft-{i}.txt").write_text(str(i))
    return {"action": "fs.rename", "args": {"path": str(tmp_path / f"draft-{i}.txt"),
                                            "name": f"final-{i}.txt"}}


def names(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".txt")


# -- 1. a stop committed before the intent prevents it --------------------------------------

@pytest.mark.parametrize("scope", ["task", "global"])
def test_a_stop_committed_during_the_snapshot_prevents_the_intent(
        store: JournalStore, tmp_path: Path, scope: str) -> None:
    task = persist(store, SPECS, [ledger_step(tmp_path)], "stop-snap")

    class StoppedMeanwhile(LedgerRecord):
        def snapshot(self, ctx: StepContext) -> dict[str, Any]:  # a person stops it now
            store.set_control(ctx.task_id if scope == "task" else "*", "stopped",
                              "wrong recipient", "ops")
            return super().snapshot(ctx)

    with pytest.raises(TaskStopped, match="wrong recipient"):
        run_step(store, Registry([StoppedMeanwhile()]), task, 1)
    assert store.step_row(task, 1) is None  # no intent
    assert ledger_lines(tmp_path / "ledger") == []


def test_an_in_doubt_step_checks_the_stop_again_right_before_it_acts(
        store: JournalStore, db_url: str, tmp_path: Path) -> None:
    task = persist(store, SPECS, [ledger_step(tmp_path)], "stop-probe")
    run_one(db_url, task, 1, **{CRASH_ENV: "after_intent"}).communicate(timeout=60)
    wait_unlocked(db_url)

    class StoppedWhileProbing(LedgerRecord):
        def probe(self, ctx: StepContext) -> ProbeResult:  # a slow probe; a stop lands
            store.set_control(ctx.task_id, "stopped", "stop during probe", "ops")
            return super().probe(ctx)

    with pytest.raises(TaskStopped, match="stop during probe"):
        run_step(store, Registry([StoppedWhileProbing()]), task, 1)
    assert ledger_lines(tmp_path / "ledger") == []
    assert store.progress(task).in_doubt is not None  # still in doubt, still untouched


def test_an_unwind_lists_a_step_whose_attempt_was_at_its_gates_when_the_stop_came(
        store: JournalStore, tmp_path: Path) -> None:
    task = persist(store, SPECS, [rename(tmp_path, 0), rename(tmp_path, 1)], "stop-list")
    run_step(store, REGISTRY, task, 1)
    in_snapshot, go_on = threading.Event(), threading.Event()

    class SlowSnapshot(FsRename):
        def snapshot(self, ctx: StepContext) -> dict[str, Any]:
            in_snapshot.set()
            go_on.wait(10)
            return super().snapshot(ctx)

    failure: list[BaseException] = []

    def attempt() -> None:
        try:
            run_step(store, Registry([SlowSnapshot([FS_ROOTS])]), task, 2)
        except BaseException as e:  # recorded for the assertions
            failure.append(e)

    thread = threading.Thread(target=attempt)
    thread.start()
    assert in_snapshot.wait(10)
    store.set_control(task, "stopped", "unwind", "ops")
    try:
        listed: list[int] | None = store.undo_candidates(task)
    except StepBusy:  # the attempt may still write its intent: the unwind waits for it
        listed = None
    go_on.set()
    thread.join(10)
    final = store.undo_candidates(task)
    if listed is not None:
        assert listed == final  # what the unwind listed is everything it has to undo
    assert final == [1]
    assert [type(e) for e in failure] == [TaskStopped]  # the stop prevented the intent
    assert names(tmp_path) == ["draft-1.txt", "final-0.txt"]


def test_a_release_committed_while_an_unwind_probes_prevents_the_compensation(
        store: JournalStore, tmp_path: Path) -> None:
    task = persist(store, SPECS, [rename(tmp_path, 0)], "release-probe")

    class AnswerLost(FsRename):
        def execute(self, ctx: StepContext) -> dict[str, Any]:  # renamed; the answer is lost
            super().execute(ctx)
            raise TargetUnavailable("the answer was lost")

    with pytest.raises(TargetUnavailable):
        run_step(store, Registry([AnswerLost([FS_ROOTS])]), task, 1)
    assert names(tmp_path) == ["final-0.txt"]
    store.set_control(task, "stopped", "undo", "ops")

    class ReleasedWhileProbing(FsRename):
        def probe(self, ctx: StepContext) -> ProbeResult:  # a slow probe; a release lands
            store.set_control(ctx.task_id, "released", "keep it after all", "ops")
            return super().probe(ctx)

    with pytest.raises(NotStopped):
        unwind_step(store, Registry([ReleasedWhileProbing([FS_ROOTS])]), task, 1)
    assert names(tmp_path) == ["final-0.txt"]  # not compensated
    row = store.step_row(task, 1)
    assert row is not None and (row.status, row.resolved_by) == ("done", "probe")
    assert [r.phase for r in store.rows(task)] == ["do"]  # no undo intent


# -- 4. a refused compensation is not "already undone", and can be tried again ---------------

def test_a_refused_compensation_is_tried_again_after_the_way_is_cleared(
        store: JournalStore, tmp_path: Path) -> None:
    task = persist(store, SPECS, [rename(tmp_path, 0)], "refused-undo")
    run_step(store, REGISTRY, task, 1)
    (tmp_path / "final-0.txt").rename(tmp_path / "theirs.txt")  # someone else renamed it
    store.set_control(task, "stopped", "undo", "ops")
    with pytest.raises(StepFailed, match="cannot restore"):
        unwind_step(store, REGISTRY, task, 1)
    assert store.undo_candidates(task) == [1]  # still to do
    with pytest.raises(StepFailed):  # a second unwind meets the same refusal, not "undone"
        unwind_step(store, REGISTRY, task, 1)
    (tmp_path / "theirs.txt").rename(tmp_path / "final-0.txt")  # a person clears the way
    result = unwind_step(store, REGISTRY, task, 1)
    assert result.status == "undone"
    assert names(tmp_path) == ["draft-0.txt"]
    undo = [r for r in store.rows(task) if r.phase == "undo"]
    assert [(r.attempt, r.status) for r in undo] == [(1, "failed"), (2, "failed"), (3, "done")]
    assert undo[0].idem_key == undo_key(task, 1, "fs.rename", undo[0].args)
    assert len({r.idem_key for r in undo}) == 3
    assert "cannot restore" in undo[0].outcome["error"]  # the refusals stay as they were
    assert store.undo_candidates(task) == []
    assert unwind_step(store, REGISTRY, task, 1).status == "already_undone"


# -- 5. "it did not happen and must not happen" -----------------------------------------------

def test_resolve_waits_out_the_lease_it_reads_from_lease_until(
        store: JournalStore, db_url: str, tmp_path: Path) -> None:
    """Resolve waits while the lease it reads from lease_until still runs.

    An attempt whose lease (lease_until, written with its intent for its call and horizon)
    still runs may still act: what a person saw at the target says nothing yet, however long
    ago the intent began."""
    task = persist(store, SPECS, [ledger_step(tmp_path)], "resolve-lease")
    with store.execution(task, 1) as s:
        s.begin(task_id=task, step=1, key=key_for(task, 1, s.spec.action, s.spec.args),
                action=s.spec.action, args=s.spec.args, before_state={}, lease_s=60.0)
    time.sleep(LEASE_S + 0.3)  # longer ago than a row without lease_until is leased for
    with pytest.raises(StepBusy, match="may still be acting on it"):
        commands.resolve(db_url, task, 1, "done", "looked", "ops")
    row = store.step_row(task, 1)
    assert row is not None and row.outcome is None


def test_resolve_never_closes_an_irreversible_step_in_doubt_and_unwind_proceeds(
        store: JournalStore, db_url: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    task = persist(store, SPECS, [rename(tmp_path, 0), ledger_step(tmp_path, "mail")],
                   "never-1")
    run_step(store, REGISTRY, task, 1)
    proc = run_one(db_url, task, 2, **{CRASH_ENV: "after_intent"})
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    wait_unlocked(db_url)
    with pytest.raises(DecisionError, match="not stopped"):
        commands.resolve(db_url, task, 2, "never", "looked", "ops")
    store.set_control(task, "stopped", "wrong mail", "ops")
    with pytest.raises(InvariantViolation, match="in doubt"):  # the mail blocks the unwind
        unwind_step(store, REGISTRY, task, 1)

    monkeypatch.setenv("DATABASE_URL", db_url)
    argv = ["resolve", task, "--step", "2", "--as", "never", "--by", "dana",
            "--note", "checked the outbox", "--yes"]
    assert main(argv) == 0
    assert '"as": "never"' in capsys.readouterr().out
    row = store.step_row(task, 2)
    assert row is not None and (row.status, row.resolved_by) == ("failed", "operator")
    assert row.outcome is not None and row.outcome["never"] is True
    decision = [e for e in store.events(task) if e["kind"] == "decision"]
    assert [(d["actor"], d["detail"]["as"], d["step"]) for d in decision] == [
        ("dana", "never", 2)]

    assert unwind_step(store, REGISTRY, task, 1).status == "undone"
    assert names(tmp_path) == ["draft-0.txt"]
    commands.release(db_url, task, "done with it", "ops")
    again = run_step(store, REGISTRY, task, 2)  # nothing executes the step ever after
    assert (again.status, again.skipped) == ("failed", True)
    assert ledger_lines(tmp_path / "ledger") == []


# -- 3. unwound is terminal, down to the intent's statement -----------------------------------

def test_no_intent_is_written_for_an_unwound_task_even_once_released(
        store: JournalStore, tmp_path: Path) -> None:
    task = persist(store, SPECS, [rename(tmp_path, 0), ledger_step(tmp_path, "mail")],
                   "unwound-1")
    run_step(store, REGISTRY, task, 1)
    store.set_control(task, "stopped", "undo", "ops")
    assert unwind_step(store, REGISTRY, task, 1).status == "undone"
    assert store.record_unwound(task, "ops", {}) == []
    commands.release(store.conninfo, task, "go on", "ops")
    with pytest.raises(TaskUnwound):
        run_step(store, REGISTRY, task, 2)
    assert store.step_row(task, 2) is None and ledger_lines(tmp_path / "ledger") == []
    assert commands.status(store.conninfo, task).state == "unwound"
