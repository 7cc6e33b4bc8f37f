"""RunPlan end states for a Drive refusal and a Stripe 500 saved under the step's key.

On a real Temporal dev server with real worker processes, real Postgres and the staging servers:
a refusal ends the task ``failed`` at that step, without stopping it as a revoked credential
would; a saved 500 (the outcome unknown) stops it for a person. Neither retries without end."""

from __future__ import annotations

import asyncio

from temporalio.testing import WorkflowEnvironment

from helpers.runs import start
from helpers.staging_fixtures import effects, post
from staging.core import StagingServer
from staging.drive import DriveTarget
from tidemark.store import JournalStore
from workflows.outcome import run_result


async def test_a_drive_file_shared_read_only_fails_the_task_at_that_step(
        temporal_env: WorkflowEnvironment, store: JournalStore, server: StagingServer,
        drive: DriveTarget, workers, task_queue: str) -> None:
    theirs = drive.seed("theirs.pdf", owner="carol", shared={"default": "reader"})
    ours = drive.seed("scan.pdf")
    workers.start(TIDEMARK_STAGING_URL=server.url)
    doc = {"task_id": "drive-403", "steps": [
        {"action": "drive.rename", "args": {"file_id": theirs.id, "name": "x.pdf"}},
        {"action": "drive.rename", "args": {"file_id": ours.id, "name": "y.pdf"}}]}
    result = await asyncio.wait_for(run_result(await start(temporal_env.client, doc, task_queue)),
                                    timeout=60)
    assert (result.state, result.error["type"]) == ("failed", "StepFailed")
    assert "insufficientFilePermissions" in result.error["message"]
    assert store.progress("drive-403").stop is None  # not stopped as a revoked grant would be
    row = store.step_row("drive-403", 1)
    assert row is not None and row.status == "failed"
    assert store.step_row("drive-403", 2) is None and drive.files[ours.id].name == "scan.pdf"


async def test_a_saved_stripe_500_stops_the_task_for_a_person_not_retrying_forever(
        temporal_env: WorkflowEnvironment, store: JournalStore, server: StagingServer,
        workers, task_queue: str) -> None:
    post(server, "/_staging/stripe/execution_errors", {"status": 500})
    workers.start(TIDEMARK_STAGING_URL=server.url)
    doc = {"task_id": "stripe-500", "steps": [
        {"action": "stripe.payment_intent", "args": {"amount": 2500, "currency": "usd"}}]}
    result = await asyncio.wait_for(run_result(await start(temporal_env.client, doc, task_queue)),
                                    timeout=60)
    assert (result.state, result.error["type"]) == ("needs_decision", "NeedsDecision")
    assert "saved a 500" in result.error["message"]
    assert "new task" not in result.error["message"]
    assert effects(server, "stripe", "payment_intents.create") == []
    row = store.step_row("stripe-500", 1)
    assert row is not None and row.in_doubt  # never closed as failed: a 5xx proves nothing
    kinds = [e["kind"] for e in store.events("stripe-500")]
    assert kinds.count("probe") == 1  # one retry probed, then the replay stopped it
