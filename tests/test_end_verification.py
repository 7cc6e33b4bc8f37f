"""A plan never ends ``completed`` over a target that shows an earlier step's state.

The verification that runs before irreversible steps also runs at the end of every plan, for the
steps it can check cheaply (the last step of each target the plan set more than once). A mismatch is
``verification_failed``: in the run's end, in ``tidemark status`` and in the inbox.

Real Temporal dev server and worker processes, the staging Drive through the real Google
client; the stale state is put on the file as a request of step 1 landing late would leave it
(step 1's name under step 1's stamp)."""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from activities.catalog import spec_registry
from activities.drive import DriveRename, drive_client
from helpers.staging_fixtures import CLIENT_TIMEOUT_S
from helpers.steps import persist
from probes.drive import STAMP
from staging.core import StagingServer
from staging.drive import DEFAULT_READ_TOKEN, DEFAULT_WRITE_TOKEN, DriveTarget
from tidemark.actions import Registry
from tidemark.boundary import verify_reversible
from tidemark.needs_journal import entry_for
from tidemark.payloads import RunResult
from tidemark.report import build_report
from tidemark.run_step import run_step
from tidemark.store import JournalStore
from tidemark.words import TaskState
from workflows.outcome import run_result

NAMES = ("2026-Q3 report.pdf", "2026-Q3 report (final).pdf")


def plan(f: str, g: str, task: str) -> dict[str, Any]:
    """Renames file ``f`` twice and file ``g`` once."""
    return {"task_id": task, "steps": [
        {"action": "drive.rename", "args": {"file_id": f, "name": NAMES[0]}},
        {"action": "drive.rename", "args": {"file_id": f, "name": NAMES[1]}},
        {"action": "drive.rename", "args": {"file_id": g, "name": "scan-002 (read).pdf"}}]}


async def run(client: Client, doc: dict[str, Any], task_queue: str) -> RunResult:
    handle: WorkflowHandle[Any, RunResult] = await client.start_workflow(
        "RunPlan", doc, id=f"tidemark-{doc['task_id']}", task_queue=task_queue,
        result_type=RunResult)
    return await asyncio.wait_for(run_result(handle), timeout=90)


async def test_a_plan_never_ends_completed_over_a_file_that_shows_an_earlier_steps_name(
        temporal_env: WorkflowEnvironment, store: JournalStore, server: StagingServer,
        drive: DriveTarget, workers: Any, task_queue: str) -> None:
    f, g = drive.seed("scan-001.pdf"), drive.seed("scan-002.pdf")
    workers.start(TIDEMARK_STAGING_URL=server.url)
    doc = plan(f.id, g.id, "end-verified")
    first = await run(temporal_env.client, doc, task_queue)
    assert first.state == "completed"
    [checked] = [e["detail"] for e in store.events("end-verified") if e["kind"] == "verification"]
    assert checked["at_end"] and checked["passed"]
    assert (checked["verified"], checked["superseded"]) == (1, [1])  # only f's last step

    # Step 1's rename lands late: the file shows step 1's name under step 1's stamp.
    step_1 = store.step_row("end-verified", 1)
    assert step_1 is not None
    with server.staging.lock:
        drive.files[f.id].name = NAMES[0]
        drive.files[f.id].app_properties = {STAMP: step_1.idem_key}
    again = await run(temporal_env.client, {"task_id": "end-verified"}, task_queue)
    assert again.state == "verification_failed", again
    assert again.error is not None and [x["step"] for x in again.error["failures"]] == [2]
    report = build_report(store, "end-verified")
    assert report.state == TaskState.VERIFICATION_FAILED
    entry = entry_for(store, "end-verified", report)
    assert entry is not None and entry.why == "verification_failed"
    assert "at the end of the plan" in entry.detail


def test_the_gate_and_the_end_check_the_last_step_of_a_target_set_twice(
        store: JournalStore, server: StagingServer, drive: DriveTarget) -> None:
    """The gate and the end check verify the last step of a target set twice.

    The earlier step of a file renamed twice no longer reads done (the later rename took its
    name). The verification checks the later step only, before a boundary and at the end; at the
    end, a file renamed once costs no probe."""
    f, g = drive.seed("scan-001.pdf"), drive.seed("scan-002.pdf")
    reg = Registry([DriveRename(
        writer=drive_client(server.url, DEFAULT_WRITE_TOKEN, timeout=CLIENT_TIMEOUT_S),
        reader=drive_client(server.url, DEFAULT_READ_TOKEN, timeout=CLIENT_TIMEOUT_S),
        timeout=CLIENT_TIMEOUT_S)])
    task = persist(store, spec_registry(DriveRename), plan(f.id, g.id, "twice")["steps"],
                   "twice")
    for step in (1, 2, 3):
        run_step(store, reg, task, step)
    gate = verify_reversible(store, reg, task, 4)
    assert gate.passed, gate.summary()
    assert (gate.verified, gate.superseded) == (2, [1])
    end = verify_reversible(store, reg, task, 4, at_end=True)
    assert end.passed and (end.verified, end.superseded) == (1, [1])
    drive.files[f.id].name = "renamed by somebody.pdf"
    assert not verify_reversible(store, reg, task, 4, at_end=True).passed
