"""The durable stop state: a stopped task acts on nothing until released.

A stopped task acts on nothing, whatever starts it. Unwind needs it and never touches an
irreversible step."""

from __future__ import annotations

from pathlib import Path

import pytest

from activities.catalog import spec_registry
from activities.fs import FsRename
from helpers.fs_roots import FS_ROOTS
from helpers.ledger import LedgerRecord, ledger_lines, ledger_step
from helpers.steps import persist
from tidemark.actions import Registry
from tidemark.errors import NotStopped, Refused, TaskStopped
from tidemark.report import build_report
from tidemark.run_step import run_step
from tidemark.store import JournalStore
from tidemark.unwind import unwind_step

SPECS = spec_registry(LedgerRecord)
REGISTRY = Registry([FsRename([FS_ROOTS]), LedgerRecord()])


def test_a_stopped_task_acts_on_nothing_until_released(store: JournalStore,
                                                       tmp_path: Path) -> None:
    task = persist(store, SPECS, [ledger_step(tmp_path, "a"), ledger_step(tmp_path, "b")])
    run_step(store, REGISTRY, task, 1)
    store.set_control(task, "stopped", "looks wrong", "ops@example")
    with pytest.raises(TaskStopped, match="looks wrong"):
        run_step(store, REGISTRY, task, 2)
    assert len(ledger_lines(tmp_path / "ledger")) == 1
    assert store.step_row(task, 2) is None
    assert build_report(store, task).state == "stopped"
    store.set_control(task, "released", "checked", "ops@example")
    assert build_report(store, task).state == "partial"
    assert build_report(store, task).as_json()["stop"] is None
    assert run_step(store, REGISTRY, task, 2).status == "done"
    assert len(ledger_lines(tmp_path / "ledger")) == 2


def test_the_global_stop_stops_every_task(store: JournalStore, tmp_path: Path) -> None:
    one = persist(store, SPECS, [ledger_step(tmp_path, "a")], task_id="one")
    two = persist(store, SPECS, [ledger_step(tmp_path, "b")], task_id="two")
    store.set_control("*", "stopped", "incident", "ops@example")
    for task in (one, two):
        with pytest.raises(TaskStopped, match="incident"):
            run_step(store, REGISTRY, task, 1)
        assert build_report(store, task).state == "stopped"
    assert ledger_lines(tmp_path / "ledger") == []
    store.set_control("*", "released", "over", "ops@example")
    assert run_step(store, REGISTRY, one, 1).status == "done"


def test_unwind_refuses_a_task_that_is_not_stopped(store: JournalStore, tmp_path: Path) -> None:
    (tmp_path / "draft.txt").write_text("x")
    task = persist(store, SPECS, [{"action": "fs.rename", "args": {
        "path": str(tmp_path / "draft.txt"), "name": "final.txt"}}])
    run_step(store, REGISTRY, task, 1)
    with pytest.raises(NotStopped):
        unwind_step(store, REGISTRY, task, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final.txt"]
    assert [r.phase for r in store.rows(task)] == ["do"]


def test_unwind_never_touches_an_irreversible_step(store: JournalStore, tmp_path: Path) -> None:
    task = persist(store, SPECS, [ledger_step(tmp_path, "sent")])
    run_step(store, REGISTRY, task, 1)
    store.set_control(task, "stopped", "unwind", "ops@example")
    with pytest.raises(Refused, match="irreversible"):
        unwind_step(store, REGISTRY, task, 1)
    assert [r.phase for r in store.rows(task)] == ["do"]
    assert len(ledger_lines(tmp_path / "ledger")) == 1


def test_a_stop_or_kill_holds_the_task_it_names_and_no_task_whose_id_it_begins(
        store: JournalStore, tmp_path: Path) -> None:
    """A stop or kill holds the task it names, and no task whose id it begins.

    A stop's scope is a task id matched whole. Stopping or killing ``sync-1`` leaves ``sync-10``
    and ``sync-1-retry`` running, whatever the ids have in common."""
    named = persist(store, SPECS, [ledger_step(tmp_path, "a")], task_id="sync-1")
    others = [persist(store, SPECS, [ledger_step(tmp_path, t)], task_id=t)
              for t in ("sync-10", "sync-1-retry")]
    for state in ("stopped", "killed"):
        store.set_control(named, state, "wrong folder", "ops@example")
        assert (store.stop_state(named) or {}).get("state") == state
        assert [store.stop_state(t) for t in others] == [None, None]
        with pytest.raises(TaskStopped):
            run_step(store, REGISTRY, named, 1)
    assert [run_step(store, REGISTRY, t, 1).status for t in others] == ["done", "done"]
    assert [line.split()[-1] for line in ledger_lines(tmp_path / "ledger")] == [
        "sync-10", "sync-1-retry"]
