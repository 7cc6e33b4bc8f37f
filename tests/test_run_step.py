"""run_step against a real Postgres: the journal algorithm, twins, crashes and outages."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from activities.catalog import spec_registry
from activities.fs import FsRename
from helpers.fs_roots import FS_ROOTS
from helpers.ledger import LedgerRecord, ledger_lines, ledger_step
from helpers.steps import crash_at, run_one, wait_unlocked
from helpers.wait import assert_eventually
from tidemark.actions import Registry
from tidemark.errors import (
    InvariantViolation,
    NeedsDecision,
    PreconditionFailed,
    StepBusy,
    StepFailed,
    StoreUnavailable,
)
from tidemark.faults import CRASH_ENV
from tidemark.plan import load_plan
from tidemark.run_step import StepResult, run_step
from tidemark.store import JournalStore

SPECS = spec_registry(LedgerRecord)
REGISTRY = Registry([FsRename([FS_ROOTS]), LedgerRecord()])


def persist(store: JournalStore, steps: list[dict], task_id: str = "t") -> str:
    plan = load_plan({"task_id": task_id, "steps": steps}, SPECS)
    store.persist_plan(plan)
    return plan.task_id


# -- the algorithm -------------------------------------------------------------------------

def test_fs_rename_happy_path_then_skip(store: JournalStore, tmp_path: Path) -> None:
    (tmp_path / "draft.txt").write_text("x")
    task = persist(store, [{"action": "fs.rename",
                            "args": {"path": str(tmp_path / "draft.txt"), "name": "final.txt"}}])
    first = run_step(store, REGISTRY, task, 1)
    assert (first.status, first.resolved_by, first.skipped) == ("done", "execute", False)
    assert (tmp_path / "final.txt").read_text() == "x"
    assert not (tmp_path / "draft.txt").exists()
    row = store.step_row(task, 1)
    assert row is not None and row.before_state and row.before_state["name"] == "draft.txt"
    again = run_step(store, REGISTRY, task, 1)
    assert again.skipped and again.outcome == first.outcome


def test_steps_cannot_run_out_of_order(store: JournalStore, tmp_path: Path) -> None:
    task = persist(store, [ledger_step(tmp_path, "a"), ledger_step(tmp_path, "b")])
    with pytest.raises(InvariantViolation, match="before step 1 is done"):
        run_step(store, REGISTRY, task, 2)
    assert ledger_lines(tmp_path / "ledger") == []


def test_gate_refusal_runs_nothing_and_writes_no_intent(store: JournalStore,
                                                        tmp_path: Path) -> None:
    gate = tmp_path / "closed"
    gate.write_text("")
    task = persist(store, [ledger_step(tmp_path, gate_file=str(gate))])
    with pytest.raises(PreconditionFailed, match="closed exists"):
        run_step(store, REGISTRY, task, 1)
    assert store.step_row(task, 1) is None
    assert [e["kind"] for e in store.events(task)] == ["plan", "precondition"]


def test_refused_action_is_recorded_as_failed(store: JournalStore, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a")
    task = persist(store, [{"action": "fs.rename",
                            "args": {"path": str(tmp_path / "a.txt"), "name": "b.txt"}}])

    class Vanishing(FsRename):
        def snapshot(self, ctx):  # the file disappears between gate and execute
            state = super().snapshot(ctx)
            (tmp_path / "a.txt").unlink()
            return state

    with pytest.raises(StepFailed, match="is gone"):
        run_step(store, Registry([Vanishing([FS_ROOTS])]), task, 1)
    row = store.step_row(task, 1)
    assert row is not None and row.status == "failed" and row.resolved_by == "execute"
    assert store.progress(task).next_step is None


# -- crashes -------------------------------------------------------------------------------

def test_crash_between_rename_and_outcome_resolves_by_probe(store: JournalStore, db_url: str,
                                                            tmp_path: Path) -> None:
    (tmp_path / "draft.txt").write_text("x")
    task = persist(store, [{"action": "fs.rename",
                            "args": {"path": str(tmp_path / "draft.txt"), "name": "final.txt"}}])
    proc = run_one(db_url, task, 1, **{CRASH_ENV: "after_execute"})
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    wait_unlocked(db_url)
    assert (tmp_path / "final.txt").exists()  # the world changed...
    row = store.step_row(task, 1)
    assert row is not None and row.in_doubt  # ...and the journal knows it might have
    result = run_step(store, REGISTRY, task, 1)
    assert (result.status, result.resolved_by) == ("done", "probe")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final.txt"]
    assert [e["detail"]["status"] for e in store.events(task) if e["kind"] == "probe"] == ["done"]


def test_crash_after_intent_before_action_executes_once_on_resume(
        store: JournalStore, db_url: str, tmp_path: Path) -> None:
    task = persist(store, [ledger_step(tmp_path)])
    proc = run_one(db_url, task, 1, **{CRASH_ENV: "after_intent"})
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    wait_unlocked(db_url)
    assert ledger_lines(tmp_path / "ledger") == []
    result = run_step(store, REGISTRY, task, 1)
    assert (result.status, result.resolved_by) == ("done", "execute")
    assert len(ledger_lines(tmp_path / "ledger")) == 1


def test_sigkilled_lock_holder_frees_the_lock_and_the_next_attempt_probes(
        store: JournalStore, db_url: str, tmp_path: Path) -> None:
    hold = tmp_path / "hold"
    hold.write_text("")
    task = persist(store, [ledger_step(tmp_path, hold_while=str(hold))])
    proc = run_one(db_url, task, 1)
    assert_eventually(lambda: store.step_row(task, 1))
    with pytest.raises(StepBusy):  # the live holder blocks its twin
        run_step(store, REGISTRY, task, 1)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)

    wait_unlocked(db_url)  # the dead attempt's lease has run out
    hold.unlink()
    result = run_step(store, REGISTRY, task, 1)
    # The killed attempt never wrote its line: the probe says absent, so it executes now, once.
    assert (result.status, result.resolved_by) == ("done", "execute")
    assert [e["detail"]["status"] for e in store.events(task) if e["kind"] == "probe"] == ["absent"]
    assert len(ledger_lines(tmp_path / "ledger")) == 1


def test_unknown_probe_needs_a_decision_and_runs_nothing(store: JournalStore, db_url: str,
                                                         tmp_path: Path) -> None:
    ledger_dir = tmp_path / "ledger-dir"
    ledger_dir.mkdir()
    task = persist(store, [{"action": "ledger.record",
                            "args": {"ledger": str(ledger_dir / "l"), "entry": "e"}}])
    crash_at(db_url, task, 1, "after_intent")
    ledger_dir.rmdir()  # the target can no longer be read: the probe cannot tell
    with pytest.raises(NeedsDecision, match="cannot read the ledger"):
        run_step(store, REGISTRY, task, 1)
    assert not ledger_dir.exists()
    assert store.progress(task).in_doubt is not None


def test_gates_run_again_when_a_resumed_step_is_absent(store: JournalStore, db_url: str,
                                                       tmp_path: Path) -> None:
    gate = tmp_path / "closed"
    task = persist(store, [ledger_step(tmp_path, gate_file=str(gate))])
    crash_at(db_url, task, 1, "after_intent")
    gate.write_text("")  # the world changed while the task was down
    with pytest.raises(PreconditionFailed):
        run_step(store, REGISTRY, task, 1)
    assert ledger_lines(tmp_path / "ledger") == []
    gate.unlink()
    assert run_step(store, REGISTRY, task, 1).resolved_by == "execute"


# -- twins ---------------------------------------------------------------------------------

def test_two_threads_racing_one_step_execute_it_once(store: JournalStore,
                                                     tmp_path: Path) -> None:
    task = persist(store, [ledger_step(tmp_path, hold_s=0.5)])
    outcomes: list[str] = []
    barrier = threading.Barrier(2)

    def attempt() -> None:
        barrier.wait()
        try:
            outcomes.append("skipped" if run_step(store, REGISTRY, task, 1).skipped else "ran")
        except StepBusy:
            outcomes.append("busy")

    threads = [threading.Thread(target=attempt) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["busy", "ran"]
    assert len(ledger_lines(tmp_path / "ledger")) == 1


def test_a_twin_that_writes_the_intent_first_makes_the_other_busy_and_nothing_runs_twice(
        store: JournalStore, tmp_path: Path) -> None:
    """A twin that writes the intent first makes the other busy, and nothing runs twice.

    Two attempts begin on a step with no intent yet, and both run its gates and snapshot
    (nothing is locked before the intent). The one whose intent lands first owns the step; the
    other's intent is refused (StepBusy) and it acts on nothing."""
    task = persist(store, [ledger_step(tmp_path)])
    twin: list[StepResult] = []

    class Overtaken(LedgerRecord):
        def snapshot(self, ctx):  # a twin runs the whole step while this attempt snapshots
            if not twin:
                twin.append(run_step(store, REGISTRY, task, 1))
            return super().snapshot(ctx)

    with pytest.raises(StepBusy, match="wrote its intent first"):
        run_step(store, Registry([Overtaken()]), task, 1)
    assert [(r.status, r.resolved_by) for r in twin] == [("done", "execute")]
    assert len(ledger_lines(tmp_path / "ledger")) == 1
    again = run_step(store, REGISTRY, task, 1)
    assert (again.status, again.skipped) == ("done", True)
    assert len(ledger_lines(tmp_path / "ledger")) == 1


def test_two_processes_racing_one_step_execute_it_once(store: JournalStore, db_url: str,
                                                       tmp_path: Path) -> None:
    task = persist(store, [ledger_step(tmp_path, hold_s=1.0)])
    procs = [run_one(db_url, task, 1) for _ in range(2)]
    results = [p.communicate(timeout=60) for p in procs]
    ran = [json.loads(out) for out, _ in results if out]
    busy = [err.strip() for _, err in results if err.strip() == "StepBusy"]
    # Either the second found the lock held (busy) or arrived after the outcome (skipped).
    assert len(ran) + len(busy) == 2
    assert sum(1 for r in ran if not r["skipped"]) == 1
    assert len(ledger_lines(tmp_path / "ledger")) == 1


# -- Postgres outages ----------------------------------------------------------------------

def test_postgres_unreachable_at_intent_time_runs_no_action(store: JournalStore, db_url: str,
                                                            tmp_path: Path) -> None:
    task = persist(store, [ledger_step(tmp_path)])

    dbname = psycopg.conninfo.conninfo_to_dict(db_url)["dbname"]

    def allow(allowed: bool) -> None:  # from another database: this one may refuse us
        with psycopg.connect(db_url, dbname="postgres", autocommit=True) as admin:
            admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS {}").format(
                sql.Identifier(dbname), sql.Literal(allowed)))
            if not allowed:  # and every session it has is cut
                admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                              " WHERE datname = %s", (dbname,))

    class CutOff(LedgerRecord):
        def snapshot(self, ctx):  # the database goes away between the gate and the intent
            allow(False)
            return super().snapshot(ctx)

    short = JournalStore(db_url, timeout=1.0).open()
    try:
        with pytest.raises(StoreUnavailable):
            run_step(short, Registry([CutOff()]), task, 1)
    finally:
        allow(True)
        short.close()
    assert ledger_lines(tmp_path / "ledger") == []
    assert store.step_row(task, 1) is None  # the pool reconnects; nothing was written
    assert run_step(store, REGISTRY, task, 1).resolved_by == "execute"
    assert len(ledger_lines(tmp_path / "ledger")) == 1


def test_postgres_down_from_the_start_is_a_clear_retryable_error(tmp_path: Path) -> None:
    store = JournalStore("postgresql://nobody@127.0.0.1:1/none", timeout=0.5)
    with pytest.raises(StoreUnavailable) as e:
        store.open()
    assert e.value.retryable


def test_a_probe_that_cannot_reach_the_journal_is_retried_not_stopped_for_a_person(
        store: JournalStore, db_url: str, tmp_path: Path) -> None:
    """A probe that cannot reach the journal is retried, not stopped for a person.

    A probe whose own use of the journal fails (the grant of its credential read from a pool
    with no free connection, Postgres away) learned nothing about the target: the attempt fails
    as retryable StoreUnavailable, and no person is asked to decide."""
    task = persist(store, [ledger_step(tmp_path)])
    crash_at(db_url, task, 1, "after_intent")

    class JournalAway(LedgerRecord):
        def probe(self, ctx):
            raise StoreUnavailable("no database connection in time")

    with pytest.raises(StoreUnavailable):
        run_step(store, Registry([JournalAway()]), task, 1)
    result = run_step(store, REGISTRY, task, 1)  # at once: its take-over was given back
    assert (result.status, result.resolved_by) == ("done", "execute")
    assert len(ledger_lines(tmp_path / "ledger")) == 1
