"""What a probe's answer allows.

A probe that fails cannot tell, and a file is ours by its identity, never by its name."""

from __future__ import annotations

from pathlib import Path

import pytest

from activities.catalog import spec_registry
from activities.fs import FsRename
from helpers.fs_roots import FS_ROOTS
from helpers.ledger import LedgerRecord, ledger_lines, ledger_step
from helpers.steps import crash_at, persist
from tidemark.actions import Registry
from tidemark.errors import NeedsDecision, PreconditionFailed
from tidemark.run_step import run_step
from tidemark.store import JournalStore

SPECS = spec_registry(LedgerRecord)
REGISTRY = Registry([FsRename([FS_ROOTS]), LedgerRecord()])


def fs_step(tmp_path: Path) -> dict[str, object]:
    (tmp_path / "draft.txt").write_text("ours")
    return {"action": "fs.rename",
            "args": {"path": str(tmp_path / "draft.txt"), "name": "final.txt"}}


def probe_events(store: JournalStore, task: str) -> list[str]:
    return [e["detail"]["status"] for e in store.events(task) if e["kind"] == "probe"]


def test_a_probe_that_raises_stops_for_a_person_and_acts_on_nothing(
        store: JournalStore, db_url: str, tmp_path: Path) -> None:
    broken = tmp_path / "disk-error"
    broken.write_text("")
    task = persist(store, SPECS, [ledger_step(tmp_path, probe_raises_while=str(broken))])
    crash_at(db_url, task, 1, "after_intent")  # in doubt; nothing was written
    with pytest.raises(NeedsDecision, match="probe failed: OSError"):
        run_step(store, REGISTRY, task, 1)
    assert ledger_lines(tmp_path / "ledger") == []
    assert probe_events(store, task) == ["unknown"]
    row = store.step_row(task, 1)
    assert row is not None and row.in_doubt
    broken.unlink()  # the probe can read again: absent, so the step runs, once
    result = run_step(store, REGISTRY, task, 1)
    assert (result.status, result.resolved_by) == ("done", "execute")
    assert len(ledger_lines(tmp_path / "ledger")) == 1


def test_fs_another_file_under_the_target_name_is_not_done(
        store: JournalStore, db_url: str, tmp_path: Path) -> None:
    task = persist(store, SPECS, [fs_step(tmp_path)])
    crash_at(db_url, task, 1, "after_intent")
    # Someone moved our file away and put another file under the name we wanted.
    (tmp_path / "draft.txt").rename(tmp_path / "moved.txt")
    (tmp_path / "final.txt").write_text("theirs")
    with pytest.raises(NeedsDecision):
        run_step(store, REGISTRY, task, 1)
    assert probe_events(store, task) == ["unknown"]
    assert store.progress(task).confirmed == 0
    assert (tmp_path / "final.txt").read_text() == "theirs"


def test_fs_another_file_under_the_source_name_is_not_absent(
        store: JournalStore, db_url: str, tmp_path: Path) -> None:
    task = persist(store, SPECS, [fs_step(tmp_path)])
    crash_at(db_url, task, 1, "after_intent")
    # Our file went elsewhere and somebody wrote a new file under its old name.
    (tmp_path / "draft.txt").rename(tmp_path / "moved.txt")
    (tmp_path / "draft.txt").write_text("theirs")
    with pytest.raises(NeedsDecision):
        run_step(store, REGISTRY, task, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["draft.txt", "moved.txt"]
    assert (tmp_path / "draft.txt").read_text() == "theirs"


def test_fs_gate_refuses_to_overwrite_another_file(store: JournalStore, tmp_path: Path) -> None:
    task = persist(store, SPECS, [fs_step(tmp_path)])
    (tmp_path / "final.txt").write_text("theirs")
    with pytest.raises(PreconditionFailed, match="exists already"):
        run_step(store, REGISTRY, task, 1)
    assert (tmp_path / "final.txt").read_text() == "theirs"
    assert (tmp_path / "draft.txt").read_text() == "ours"
    assert store.step_row(task, 1) is None
