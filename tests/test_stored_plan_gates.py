"""The plan-level gates of a stored plan, as every start of a task runs them.

Only the steps of actions that have a plan gate are read (a resume of a long plan without one
reads no step), and they refuse exactly as check_plan_gates over the whole plan does."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest

from activities.fs import FsRename
from helpers.ledger import LedgerRecord
from tidemark.actions import Registry
from tidemark.errors import ActionNotConfigured, PreconditionFailed
from tidemark.plan import load_plan
from tidemark.run_step import check_plan_gates, check_stored_plan_gates
from tidemark.store import JournalStore


class GatedLedger(LedgerRecord):
    """ledger.record with a plan gate that remembers which steps it was given."""

    name: ClassVar[str] = "ledger.gated"
    seen: ClassVar[list[int]] = []

    def plan_gate(self, task_id: str, steps: list[tuple[int, dict[str, Any]]]) -> None:
        GatedLedger.seen = [n for n, _ in steps]


def ledger(tmp_path: Path, action: str = "ledger.record") -> dict[str, Any]:
    return {"action": action, "args": {"ledger": str(tmp_path / "ledger"), "entry": "e"}}


def test_only_the_steps_of_gated_actions_are_given_to_their_gates(
        store: JournalStore, tmp_path: Path) -> None:
    registry = Registry([LedgerRecord(), GatedLedger()])
    steps = [ledger(tmp_path), ledger(tmp_path, "ledger.gated"), ledger(tmp_path),
             ledger(tmp_path, "ledger.gated")]
    store.persist_plan(load_plan({"task_id": "gates-1", "steps": steps}, registry))
    GatedLedger.seen = []
    check_stored_plan_gates(store, registry, "gates-1")
    assert GatedLedger.seen == [2, 4]
    assert store.plan_actions("gates-1") == ["ledger.gated", "ledger.record"]
    assert [s.number for s in store.load_steps_of("gates-1", [])] == []


def test_a_stored_plan_is_refused_like_the_whole_plan(store: JournalStore, tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "in.txt").write_text("in")
    outside = tmp_path / "outside.txt"
    steps = [{"action": "fs.rename", "args": {"path": str(root / "in.txt"), "name": "a.txt"}},
             {"action": "fs.rename", "args": {"path": str(outside), "name": "b.txt"}},
             ledger(tmp_path), ledger(tmp_path)]  # reversible steps first
    registry = Registry([FsRename([root]), LedgerRecord()])
    plan = load_plan({"task_id": "gates-2", "steps": steps}, registry)
    store.persist_plan(plan)
    with pytest.raises(PreconditionFailed) as whole:
        check_plan_gates(store, registry, plan)
    with pytest.raises(PreconditionFailed) as stored:
        check_stored_plan_gates(store, registry, "gates-2")
    assert str(stored.value) == str(whole.value) and "step 2" in str(stored.value)
    # A worker without one of the plan's actions refuses the start, as before.
    with pytest.raises(ActionNotConfigured):
        check_stored_plan_gates(store, Registry([LedgerRecord()]), "gates-2")
