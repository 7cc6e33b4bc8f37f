"""The interruption report: each irreversible step's verdict follows from the journal rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from activities.catalog import spec_registry
from activities.fs import FsRename
from helpers.fs_roots import FS_ROOTS
from helpers.ledger import LedgerRecord, ledger_step
from helpers.steps import crash_at, persist
from tidemark.actions import Registry
from tidemark.errors import StepFailed
from tidemark.report import build_report
from tidemark.run_step import run_step
from tidemark.store import JournalStore

SPECS = spec_registry(LedgerRecord)
REGISTRY = Registry([FsRename([FS_ROOTS]), LedgerRecord()])


def test_each_irreversible_step_gets_the_verdict_its_rows_prove(
        store: JournalStore, db_url: str, tmp_path: Path) -> None:
    # ledger.record is irreversible: step 1 done, step 2 in doubt, steps 3 and 4 never started.
    task = persist(store, SPECS, [ledger_step(tmp_path, f"e{i}") for i in range(1, 5)])
    run_step(store, REGISTRY, task, 1)
    crash_at(db_url, task, 2, "after_intent")
    report = build_report(store, task)
    verdicts = [line.split(": ", 1)[1] for line in report.text().splitlines()
                if line.startswith("  irreversible")]
    assert verdicts == [
        "done (journaled)",
        "IN DOUBT: only its probe may say whether it happened",
        "provably not attempted (last journal row is step 2)",
        "provably not attempted (last journal row is step 2)",
    ]
    doc = report.as_json()
    assert [(i["step"], i["status"], i["provably_not_attempted"]) for i in doc["irreversible"]
            ] == [(1, "done", False), (2, None, False), (3, None, True), (4, None, True)]
    assert (doc["state"], doc["confirmed"], doc["not_started"], doc["next_step"]) == (
        "in_doubt", 1, 2, 2)


def test_a_failed_step_is_counted_as_failed_never_as_confirmed(
        store: JournalStore, tmp_path: Path) -> None:
    # Step 2's target refuses it for good: a journaled failed outcome, the last step of the plan.
    refuse = tmp_path / "closed"
    refuse.touch()
    task = persist(store, SPECS, [ledger_step(tmp_path, "e1"),
                                  ledger_step(tmp_path, "e2", refused_while=str(refuse))],
                   task_id="refused")
    run_step(store, REGISTRY, task, 1)
    with pytest.raises(StepFailed):
        run_step(store, REGISTRY, task, 2)
    doc = build_report(store, task).as_json()
    assert (doc["state"], doc["rows"], doc["confirmed"], doc["failed"]) == ("failed", 2, 1, 1)
    assert [(i["step"], i["status"]) for i in doc["irreversible"]] == [(1, "done"),
                                                                        (2, "failed")]
    text = build_report(store, task).text()
    assert "confirmed      1" in text and "failed         1" in text
