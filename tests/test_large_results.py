"""Large results stay small: 10,000 failed checks end in one attempt of the gate.

This is case 4 of "Hostile input and the emergency controls". A plan of 10,000 steps whose every
step fails the verification gate ends ``verification_failed`` in one attempt of the gate. The
gate's result carries the count and the first failures; the journal's verification event holds
all 10,000; `tidemark status` and `inbox` name the first and count the rest. Real Postgres, a
real worker process, the Temporal dev server."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import psycopg
from temporalio.testing import WorkflowEnvironment

from activities.catalog import spec_registry
from helpers.ledger import LedgerRecord
from helpers.runs import ended_in_one_go
from tidemark.activity_names import ActivityName
from tidemark.boundary import BRIEF_FAILURES
from tidemark.plan import load_plan
from tidemark.store import JournalStore
from tools.operate.starter import start_plan

STEPS = 10_000
# Long names, as the fuzz run that found it had: each failure carries its path and name, so
# that all of them together are several times Temporal's 2 MiB payload limit.
NAME = "2026-Q3 supplier statement, reconciled and countersigned by the auditors " * 2


def seed_done(conninfo: str, task_id: str, steps: int) -> None:
    """Journals steps 1..``steps`` of the stored plan as done, with a file that never existed.

    Each has a before_state whose file never existed: at the boundary every probe answers that it
    no longer holds. Seeded directly, as the recovery point the test starts from (10,000 real
    renames would take a minute)."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO tidemark.journal (task_id, phase, step, idem_key, action, args,"
            " before_state, outcome, status, finished_at, resolved_by)"
            " SELECT task_id, 'do', step, md5(task_id || ':' || step), action, args,"
            " '{\"dev\": 0, \"inode\": 0}'::jsonb, '{}'::jsonb, 'done', clock_timestamp(),"
            " 'execute' FROM tidemark.plan_steps WHERE task_id = %s AND step <= %s",
            (task_id, steps))


async def test_case4_a_plan_whose_every_step_fails_verification_ends_in_one_attempt(
        temporal_env: WorkflowEnvironment, store: JournalStore, workers: Any, task_queue: str,
        tmp_path: Path, cli: Any) -> None:
    client = temporal_env.client
    task = f"big-{uuid.uuid4().hex[:6]}"
    docs = tmp_path / "docs"
    docs.mkdir()
    doc = {"task_id": task, "steps": [
        *({"action": "fs.rename", "args": {"path": str(docs / f"scan-{i:05}.pdf"),
                                           "name": f"{NAME}{i}.pdf"}} for i in range(STEPS)),
        {"action": "ledger.record", "args": {"ledger": str(tmp_path / "ledger"),
                                             "entry": "pay"}}]}
    store.persist_plan(load_plan(doc, spec_registry(LedgerRecord)))
    seed_done(store.conninfo, task, STEPS)
    workers.start()
    handle = await start_plan(client, {"task_id": task}, task, task_queue)
    result = await ended_in_one_go(handle, 120)  # a gate's result too large is retried
    assert result.state == "verification_failed", result
    assert len(result.error["failures"]) == BRIEF_FAILURES
    assert result.error["failed"] == STEPS
    history = await handle.fetch_history()
    attempts = [e.activity_task_started_event_attributes.attempt for e in history.events
                if e.HasField("activity_task_started_event_attributes")]
    scheduled = [e.activity_task_scheduled_event_attributes.activity_type.name
                 for e in history.events
                 if e.HasField("activity_task_scheduled_event_attributes")]
    gate = scheduled.index(ActivityName.REACH_BOUNDARY)
    assert attempts[gate] == 1, attempts  # one attempt: its result fitted
    verification = store.boundary_state(task)["verification"]
    assert len(verification["failures"]) == STEPS  # the journal holds every one

    code, out, _ = await cli("status", task)
    assert code == 0 and len(out) < 20_000, len(out)
    assert f"and {STEPS - 20} more" in out
    code, out, _ = await cli("inbox", "--json")
    assert code == 0 and len(out) < 20_000, len(out)
