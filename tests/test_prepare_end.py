"""Prepare says whether a run's end has anything to verify, and never says no wrongly.

The verification at the end probes the last step of each target the plan set more than once
(tidemark.boundary). A run completes without it only when prepare found that no two steps set
one target: from the whole plan when it fits the run, else from its distinct actions (only an
action that names its targets can set one twice). A run that does not reach the end is told
to verify, the default."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

import pytest
from temporalio.testing import ActivityEnvironment

from activities.steps import StepActivities
from helpers.ledger import LedgerRecord, ledger_step
from tidemark.actions import Registry
from tidemark.payloads import Prepared, PrepareInput
from tidemark.plan import load_plan
from tidemark.run_step import run_step
from tidemark.store import JournalStore


class EntryLedger(LedgerRecord):
    """A ledger step whose target is its entry: two steps of one entry set one target."""

    name: ClassVar[str] = "ledger.entry"

    @classmethod
    def target(cls, args: dict[str, Any]) -> str | None:
        return str(args["entry"])


REGISTRY = Registry([LedgerRecord(), EntryLedger()])


def prepared(store: JournalStore, threads: ThreadPoolExecutor, task: str,
             window: int) -> Prepared:
    activities = StepActivities(store, REGISTRY, executor=threads)
    out: Prepared = ActivityEnvironment().run(
        activities.prepare, PrepareInput(document={"task_id": task}, window=window))
    return out


def plan(store: JournalStore, tmp_path: Path, task: str, action: str,
         entries: list[str]) -> None:
    steps = [{**ledger_step(tmp_path, e), "action": action} for e in entries]
    store.persist_plan(load_plan({"task_id": task, "steps": steps}, REGISTRY))


@pytest.mark.parametrize(("action", "entries", "verify"), [
    ("ledger.record", ["a", "a", "b"], False),  # names no target
    ("ledger.entry", ["a", "b", "c"], False),  # each target set once
    ("ledger.entry", ["a", "b", "a"], True),
])
def test_a_plan_read_whole_is_verified_at_its_end_only_when_it_sets_a_target_twice(
        store: JournalStore, tmp_path: Path, step_threads: ThreadPoolExecutor, action: str,
        entries: list[str], verify: bool) -> None:
    plan(store, tmp_path, "t", action, entries)
    assert prepared(store, step_threads, "t", window=3).verify_end is verify


@pytest.mark.parametrize(("action", "verify"), [("ledger.record", False),
                                                ("ledger.entry", True)])
def test_a_plan_too_long_to_read_whole_is_judged_by_its_actions(
        store: JournalStore, tmp_path: Path, step_threads: ThreadPoolExecutor, action: str,
        verify: bool) -> None:
    """Its window (2) is shorter than the plan (3): prepare reads the plan's distinct actions."""
    plan(store, tmp_path, "t", action, ["a", "b", "c"])
    assert prepared(store, step_threads, "t", window=2).verify_end  # not at its end: verify
    for step in (1, 2):
        run_step(store, REGISTRY, "t", step)
    last = prepared(store, step_threads, "t", window=2)
    assert (last.next_step, last.verify_end) == (3, verify)
