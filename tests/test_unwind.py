"""unwind_step: compensations journaled as phase 'undo', last first, never blind."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from activities.catalog import spec_registry
from activities.fs import FsRename
from activities.wiring import worker_registry
from helpers.fs_roots import FS_ROOTS
from helpers.ledger import LedgerRecord, ledger_lines
from helpers.staging_fixtures import effects
from helpers.steps import wait_unlocked
from staging.core import StagingServer
from staging.drive import DriveTarget
from tidemark import series
from tidemark.actions import Registry
from tidemark.errors import NotStopped, Refused, StepFailed
from tidemark.faults import CRASH_ENV
from tidemark.plan import load_plan
from tidemark.run_step import run_step
from tidemark.series import SeriesBlocked
from tidemark.store import JournalStore
from tidemark.unwind import unwind_step

RUN_ONE = str(Path(__file__).parent / "helpers" / "run_one.py")
REGISTRY = Registry([FsRename([FS_ROOTS]), LedgerRecord()])


def setup_task(store: JournalStore, tmp_path: Path, n: int = 3) -> str:
    for i in range(n):
        (tmp_path / f"draft-{i}.txt").write_text(str(i))
    steps = [{"action": "fs.rename", "args": {"path": str(tmp_path / f"draft-{i}.txt"),
                                              "name": f"final-{i}.txt"}} for i in range(n)]
    steps.append({"action": "ledger.record",
                  "args": {"ledger": str(tmp_path / "ledger"), "entry": "sent"}})
    store.persist_plan(load_plan({"task_id": "uw", "steps": steps}, spec_registry(LedgerRecord)))
    return "uw"


def documented_undo_key(task_id: str, step: int, action: str, args: dict[str, Any]) -> str:
    """A compensation's key as documented, computed without the code's own functions.

    It is the forward key's recipe (sha256 of the JSON of task, step, action and args, keys
    sorted, first 32 hex digits) with ``#undo`` after the action's name."""
    payload = json.dumps([task_id, step, action + "#undo", args], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def names(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir() if p.name != "ledger")


def in_subprocess(db_url: str, step: int, *mode: str, crash: str) -> int:
    proc = subprocess.run([sys.executable, RUN_ONE, db_url, "uw", str(step), *mode],
                          env={**os.environ, CRASH_ENV: crash}, capture_output=True, timeout=60)
    wait_unlocked(db_url)
    return proc.returncode


def test_unwind_restores_reversible_steps_last_first_and_journals_them(
        store: JournalStore, tmp_path: Path) -> None:
    task = setup_task(store, tmp_path)
    for step in range(1, 5):
        run_step(store, REGISTRY, task, step)
    assert names(tmp_path) == ["final-0.txt", "final-1.txt", "final-2.txt"]
    with pytest.raises(NotStopped):
        unwind_step(store, REGISTRY, task, 3)
    store.set_control(task, "stopped", "wrong naming scheme", "ops")
    assert store.undo_candidates(task) == [3, 2, 1]
    with pytest.raises(Refused, match="irreversible"):
        unwind_step(store, REGISTRY, task, 4)
    results = [unwind_step(store, REGISTRY, task, s) for s in store.undo_candidates(task)]
    assert [(r.step, r.status) for r in results] == [(3, "undone"), (2, "undone"), (1, "undone")]
    assert names(tmp_path) == ["draft-0.txt", "draft-1.txt", "draft-2.txt"]
    # The irreversible step is left alone: its one entry, neither undone nor written again.
    assert [line.split(" ", 1)[1] for line in ledger_lines(tmp_path / "ledger")] == ["sent"]
    undo_rows = [r for r in store.rows(task) if r.phase == "undo"]
    assert [(r.step, r.status, r.resolved_by) for r in undo_rows] == [
        (1, "done", "execute"), (2, "done", "execute"), (3, "done", "execute")]
    forward = {r.step: r.args for r in store.rows(task) if r.phase == "do"}
    assert [r.idem_key for r in undo_rows] == [
        documented_undo_key(task, n, "fs.rename", forward[n]) for n in (1, 2, 3)]
    assert store.undo_candidates(task) == []
    assert unwind_step(store, REGISTRY, task, 1).status == "already_undone"


def test_a_forward_step_in_doubt_is_settled_by_probe_then_undone(
        store: JournalStore, db_url: str, tmp_path: Path) -> None:
    task = setup_task(store, tmp_path)
    run_step(store, REGISTRY, task, 1)
    assert in_subprocess(db_url, 2, crash="after_execute") == -signal.SIGKILL
    store.set_control(task, "stopped", "crashed", "ops")
    assert store.undo_candidates(task) == [2, 1]
    assert unwind_step(store, REGISTRY, task, 2).status == "undone"
    row2 = store.step_row(task, 2)
    assert row2 is not None and row2.resolved_by == "probe" and row2.status == "done"
    assert unwind_step(store, REGISTRY, task, 1).status == "undone"
    assert names(tmp_path) == ["draft-0.txt", "draft-1.txt", "draft-2.txt"]


def test_a_forward_step_that_never_acted_is_closed_not_executed(
        store: JournalStore, db_url: str, tmp_path: Path) -> None:
    task = setup_task(store, tmp_path)
    assert in_subprocess(db_url, 1, crash="after_intent") == -signal.SIGKILL
    store.set_control(task, "stopped", "crashed", "ops")
    assert unwind_step(store, REGISTRY, task, 1).status == "nothing_to_undo"
    row = store.step_row(task, 1)
    assert row is not None and row.status == "failed" and row.resolved_by == "probe"
    assert names(tmp_path) == ["draft-0.txt", "draft-1.txt", "draft-2.txt"]  # never renamed


def test_a_compensation_in_doubt_is_applied_again_safely(
        store: JournalStore, db_url: str, tmp_path: Path) -> None:
    task = setup_task(store, tmp_path)
    run_step(store, REGISTRY, task, 1)
    store.set_control(task, "stopped", "undo", "ops")
    assert in_subprocess(db_url, 1, "undo", crash="undo_after_execute") == -signal.SIGKILL
    assert "draft-0.txt" in names(tmp_path)  # the compensation applied...
    doubt = store.progress(task).in_doubt
    assert doubt is not None and doubt.phase == "undo"  # ...and is in doubt
    result = unwind_step(store, REGISTRY, task, 1)
    assert result.status == "undone" and result.outcome["note"] == "already at its original name"
    assert store.progress(task).in_doubt is None


def test_a_file_changed_by_someone_else_is_not_put_back(store: JournalStore,
                                                        tmp_path: Path) -> None:
    task = setup_task(store, tmp_path, n=1)
    run_step(store, REGISTRY, task, 1)
    (tmp_path / "final-0.txt").rename(tmp_path / "theirs.txt")
    store.set_control(task, "stopped", "undo", "ops")
    with pytest.raises(StepFailed, match=r"cannot restore draft-0\.txt"):
        unwind_step(store, REGISTRY, task, 1)
    assert names(tmp_path) == ["theirs.txt"]
    undo = store.step_row(task, 1, "undo")
    assert undo is not None and undo.status == "failed"


def test_drive_rename_compensation_is_journaled_and_restores_the_name(
        store: JournalStore, server: StagingServer, drive: DriveTarget) -> None:
    f = drive.seed("scan-7.pdf")
    registry = worker_registry({"TIDEMARK_STAGING_URL": server.url,
                                "TIDEMARK_FS_ROOTS": FS_ROOTS})
    plan = load_plan({"task_id": "uw-drive", "steps": [
        {"action": "drive.rename", "args": {"file_id": f.id, "name": "2026-Q3 invoice 7.pdf"}}]},
        registry)
    store.persist_plan(plan)
    done = run_step(store, registry, "uw-drive", 1)
    assert drive.files[f.id].name == "2026-Q3 invoice 7.pdf"
    store.set_control("uw-drive", "stopped", "wrong scheme", "ops")
    assert unwind_step(store, registry, "uw-drive", 1).status == "undone"
    assert drive.files[f.id].name == "scan-7.pdf"
    undo = store.step_row("uw-drive", 1, "undo")
    assert undo is not None and (undo.status, undo.resolved_by) == ("done", "execute")
    assert undo.before_state == done.outcome  # what the step left, recorded before undoing it
    assert undo.idem_key == documented_undo_key("uw-drive", 1, "drive.rename",
                                                plan.steps[0].args)
    updates = effects(server, "drive", "files.update")
    assert [e["detail"]["name"] for e in updates] == ["2026-Q3 invoice 7.pdf", "scan-7.pdf"]


def test_a_partly_unwound_run_blocks_its_series_until_every_step_is_undone(
        store: JournalStore, tmp_path: Path) -> None:
    """A partly unwound run blocks its series until every step is undone.

    A run counts as settled by its unwind only once every reversible step it did is compensated.
    With one of two renames still in place it leaves wreckage the next run of its series must not
    act on."""
    store.declare_series("pu", "ops", "ops")
    for i in range(2):
        (tmp_path / f"draft-{i}.txt").write_text(str(i))
    store.persist_plan(load_plan({"task_id": "pu-1", "series": "pu", "steps": [
        {"action": "fs.rename", "args": {"path": str(tmp_path / f"draft-{i}.txt"),
                                         "name": f"final-{i}.txt"}} for i in range(2)]},
        spec_registry(LedgerRecord)))
    series.admit(store, "pu-1", "pu")
    for step in (1, 2):
        assert run_step(store, REGISTRY, "pu-1", step).status == "done"
    store.set_control("pu-1", "stopped", "wrong folder", "ops")
    assert unwind_step(store, REGISTRY, "pu-1", 2).status == "undone"
    assert names(tmp_path) == ["draft-1.txt", "final-0.txt"]  # step 1's rename still stands
    with pytest.raises(SeriesBlocked) as blocked:
        series.check(store, "pu", "pu-2")
    assert [b["task_id"] for b in blocked.value.details()["blockers"]] == ["pu-1"]
    assert unwind_step(store, REGISTRY, "pu-1", 1).status == "undone"
    series.check(store, "pu", "pu-2")  # wholly unwound: settled, the next run may start
    assert [r["state"] for r in series.listing(store, "pu")["runs"]] == ["unwound"]
