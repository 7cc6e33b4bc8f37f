"""RunPlan on a real Temporal dev server with real worker processes and a real Postgres."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from temporalio.api.enums.v1 import EventType
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.testing import WorkflowEnvironment

from activities.catalog import spec_registry
from helpers.ledger import LedgerRecord, ledger_lines
from helpers.runs import start
from helpers.staging_fixtures import arm, effects
from helpers.steps import crash_at
from helpers.wait import assert_eventually
from staging.core import StagingServer
from tidemark.activity_names import ActivityName
from tidemark.errors import UnknownTask
from tidemark.faults import CRASH_ENV
from tidemark.payloads import RunResult
from tidemark.plan import load_plan
from tidemark.store import JournalStore
from tools.operate import commands
from tools.operate.starter import start_plan
from tools.stack.devstack import temporal_binary
from workflows.outcome import run_result
from workflows.run_plan import STEPS_PER_RUN
from workflows.shared import NEEDS, STATE, TASK_ID

# The start command of docs/operate.md, "Running plans" (tests/test_readme.py checks it is there).
README_START = ("temporal workflow start --task-queue tidemark --type RunPlan "
                "--workflow-id tidemark-{task} --input-file {file}")


def ledger_plan(tmp_path: Path, task_id: str, n: int, **extra: Any) -> dict[str, Any]:
    return {"task_id": task_id, "steps": [
        {"action": "ledger.record",
         "args": {"ledger": str(tmp_path / "ledger"), "entry": f"e{i}", **extra}}
        for i in range(1, n + 1)]}


def entries(tmp_path: Path) -> list[str]:
    return [line.split(" ", 1)[1] for line in ledger_lines(tmp_path / "ledger")]


async def steps_started(handle: WorkflowHandle[Any, Any]) -> list[int]:
    """The steps whose run_step activity the run scheduled, from its history.

    What it started, whether or not the step then met the stop state."""
    started = []
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == ActivityName.RUN_STEP:
                started.append(json.loads(attrs.input.payloads[0].data)["step"])
    return started


async def steps_started_after_signal(handle: WorkflowHandle[Any, Any], name: str) -> list[int]:
    """The steps whose run_step activity the run scheduled after the signal ``name`` reached it.

    They are read from its history. A signal that arrives while a workflow task runs is written
    after that task's commands, so a step scheduled after it was scheduled by a task that saw it."""
    started: list[int] | None = None
    async for event in handle.fetch_history_events():
        if (event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
                and event.workflow_execution_signaled_event_attributes.signal_name == name):
            started = []
        elif (started is not None
              and event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED):
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == ActivityName.RUN_STEP:
                started.append(json.loads(attrs.input.payloads[0].data)["step"])
    assert started is not None, f"the run never received {name!r}"
    return started


async def test_readme_start_command_renames_the_files(
        temporal_env: WorkflowEnvironment, db_url: str, tmp_path: Path, workers) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(3):
        (docs / f"draft-{i}.txt").write_text(str(i))
    plan = {"task_id": "readme-1", "steps": [
        {"action": "fs.rename", "args": {"path": str(docs / f"draft-{i}.txt"),
                                         "name": f"2026-Q3 report {i}.txt"}} for i in range(3)]}
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan))
    workers.env["TIDEMARK_TASK_QUEUE"] = "tidemark"  # the documented queue
    workers.start()
    cmd = README_START.format(task="readme-1", file=plan_file).split()
    cmd[0] = temporal_binary()
    env = {**os.environ, "TEMPORAL_ADDRESS": workers.env["TEMPORAL_ADDRESS"]}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    handle = temporal_env.client.get_workflow_handle("tidemark-readme-1", result_type=RunResult)
    result = await run_result(handle)
    assert (result.state, result.confirmed, result.executed) == ("completed", 3, 3)
    assert sorted(p.name for p in docs.iterdir()) == [f"2026-Q3 report {i}.txt" for i in range(3)]


async def test_halt_signal_stops_cleanly_and_durably(
        temporal_env: WorkflowEnvironment, store: JournalStore, tmp_path: Path, workers,
        task_queue: str) -> None:
    workers.start()
    doc = ledger_plan(tmp_path, "halt-1", 12, hold_s=0.2)
    handle = await start(temporal_env.client, doc, task_queue)
    assert_eventually(lambda: len(entries(tmp_path)) >= 2, timeout=30)
    signal_cmd = [temporal_binary(), "workflow", "signal", "--workflow-id", "tidemark-halt-1",
                  "--name", "halt", "--input", json.dumps("maintenance window")]
    env = {**os.environ, "TEMPORAL_ADDRESS": workers.env["TEMPORAL_ADDRESS"]}
    subprocess.run(signal_cmd, env=env, check=True, capture_output=True, timeout=30)
    result = await run_result(handle)
    assert result.state == "halted"
    progress = store.progress("halt-1")
    assert progress.in_doubt is None  # the journal is tidy
    assert progress.stop is not None and progress.stop["reason"] == "maintenance window"
    ran = entries(tmp_path)
    assert 2 <= len(ran) < 12 and ran == [f"e{i}" for i in range(1, len(ran) + 1)]
    assert progress.confirmed == len(ran) and result.stopped_at == len(ran) + 1
    # The halt came between two steps or during one: either way no step was started once it
    # had arrived (not merely refused by the stop state once started). The step under way when
    # it came, if it had not yet written its intent, met the stop state and acted on nothing.
    assert await steps_started_after_signal(handle, "halt") == []
    assert await steps_started(handle) in (list(range(1, len(ran) + 1)),
                                           list(range(1, len(ran) + 2)))

    # Starting again, by any means, refuses and acts on nothing: the run's own check of the
    # stop state at its start holds, before any step is started.
    again = await start(temporal_env.client, {"task_id": "halt-1"}, task_queue)
    refused = await run_result(again)
    assert refused.state == "stopped" and "tidemark release halt-1" in refused.error["message"]
    assert len(entries(tmp_path)) == len(ran)
    assert await steps_started(again) == []

    # A person releases it; starting again resumes where it stopped.
    commands.release(store.conninfo, "halt-1", "window over", "ops")
    resumed = await run_result(await start(temporal_env.client, {"task_id": "halt-1"}, task_queue))
    assert (resumed.state, resumed.confirmed) == ("completed", 12)
    assert resumed.executed == 12 - len(ran)
    assert entries(tmp_path) == [f"e{i}" for i in range(1, 13)]


async def test_sigkilled_worker_mid_step_completes_exactly_once(
        temporal_env: WorkflowEnvironment, store: JournalStore, tmp_path: Path, workers,
        task_queue: str) -> None:
    # The first worker dies right after step 3's effect, before its outcome is journaled.
    doomed = workers.start(**{CRASH_ENV: "after_execute:3"})
    handle = await start(temporal_env.client, ledger_plan(tmp_path, "kill-1", 6), task_queue)
    assert doomed.wait(timeout=60) == -signal.SIGKILL
    doubt = store.progress("kill-1").in_doubt
    assert doubt is not None and doubt.step == 3
    workers.start()
    result = await run_result(handle)
    assert (result.state, result.confirmed) == ("completed", 6)
    assert result.resolved_by_probe == 1
    assert entries(tmp_path) == [f"e{i}" for i in range(1, 7)]  # each effect exactly once
    row3 = store.step_row("kill-1", 3)
    assert row3 is not None and row3.resolved_by == "probe"


async def upserts(handle: WorkflowHandle[Any, Any]) -> int:
    return len([e async for e in handle.fetch_history_events() if e.event_type
                == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES])


async def test_a_run_given_its_attributes_at_start_upserts_only_its_end(
        temporal_env: WorkflowEnvironment, tmp_path: Path, workers, task_queue: str) -> None:
    """Search attributes given at the start cost no upsert; others given there are corrected.

    `tidemark start` gives what the run would set after prepare (start_attributes): the run
    upserts only its end. A start that gave none, or a forged state, gets the upsert."""
    workers.start()
    (tmp_path / "a.txt").write_text("x")
    (tmp_path / "b.txt").write_text("x")
    (tmp_path / "c.txt").write_text("x")

    def doc(task: str, name: str) -> dict[str, Any]:
        return {"task_id": task, "steps": [{"action": "fs.rename", "args": {
            "path": str(tmp_path / name), "name": f"{task}.txt"}}]}
    given = await start_plan(temporal_env.client, doc("given-1", "a.txt"), "given-1", task_queue)
    bare = await start(temporal_env.client, doc("bare-1", "b.txt"), task_queue)
    forged = await temporal_env.client.start_workflow(
        "RunPlan", doc("forged-1", "c.txt"), id="tidemark-forged-1", task_queue=task_queue,
        search_attributes=TypedSearchAttributes([SearchAttributePair(TASK_ID, "forged-1"),
                                                 SearchAttributePair(STATE, "completed"),
                                                 SearchAttributePair(NEEDS, "nothing")]))
    for h in (given, bare, forged):
        assert (await run_result(h)).state == "completed"
        attrs = {k.name: v for k, v in (await h.describe()).typed_search_attributes}
        assert (attrs["TidemarkTaskId"], attrs["TidemarkState"], attrs["TidemarkNeeds"]) == (
            h.id.removeprefix("tidemark-"), "completed", "nothing")
    assert [await upserts(h) for h in (given, bare, forged)] == [1, 2, 2]


async def test_history_carries_summaries_and_search_attributes(
        temporal_env: WorkflowEnvironment, tmp_path: Path, workers, task_queue: str) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "draft.txt").write_text("x")
    workers.start()
    doc = {"task_id": "summary-1", "steps": [
        {"action": "fs.rename", "args": {"path": str(docs / "draft.txt"),
                                         "name": "2026-Q3 report.txt"}}]}
    handle = await start(temporal_env.client, doc, task_queue)
    await run_result(handle)
    summaries, activities = [], []
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            payload = event.user_metadata.summary
            summaries.append(json.loads(payload.data))
            activities.append(event.activity_task_scheduled_event_attributes.activity_type.name)
    assert "1/1 fs.rename draft.txt -> 2026-Q3 report.txt" in summaries
    # the step's line came with prepare's result: no activity of its own describes the steps;
    # the plan sets its one target once, so its end has nothing to verify (a plan that sets a
    # target twice is verified before it says completed: tests/test_end_verification.py)
    assert activities == [ActivityName.PREPARE, ActivityName.RUN_STEP]
    metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    assert metadata.current_details == (  # the UI shows it: the state and need, then why
        "**completed** · 1/1 steps confirmed · needs nothing · `tidemark status summary-1`\n\n"
        "Task summary-1 completed (1/1 steps confirmed); nothing to do.")
    desc = await handle.describe()
    attrs = {k.name: v for k, v in desc.typed_search_attributes}
    assert attrs["TidemarkTaskId"] == "summary-1"
    assert attrs["TidemarkState"] == "completed"
    assert attrs["TidemarkNeeds"] == "nothing"
    query = 'TidemarkTaskId = "summary-1" AND TidemarkState = "completed"'
    for _ in range(50):  # visibility trails the workflow by a moment
        found = [w.id async for w in temporal_env.client.list_workflows(query)]
        if found:
            break
        await asyncio.sleep(0.1)
    assert found == ["tidemark-summary-1"]
    # The same query as an operator types it.
    listed = subprocess.run(
        [temporal_binary(), "workflow", "list", "--query", query, "--output", "json"],
        env={**os.environ, "TEMPORAL_ADDRESS": workers.env["TEMPORAL_ADDRESS"]},
        capture_output=True, text=True, timeout=30, check=True)
    assert [w["execution"]["workflowId"] for w in json.loads(listed.stdout)] == [
        "tidemark-summary-1"]


async def test_status_query_and_a_completed_task_acts_on_nothing(
        temporal_env: WorkflowEnvironment, tmp_path: Path, workers, task_queue: str) -> None:
    workers.start()
    doc = ledger_plan(tmp_path, "query-1", 3)
    handle = await start(temporal_env.client, doc, task_queue)
    first = await run_result(handle)
    status = await handle.query("status")
    assert status["state"] == "completed" and status["confirmed"] == 3
    again = await run_result(await start(temporal_env.client, doc, task_queue))
    assert (again.state, again.executed, again.confirmed) == ("completed", 0, 3)
    assert first.executed == 3 and len(entries(tmp_path)) == 3


async def test_changed_plan_under_the_same_task_fails_without_acting(
        temporal_env: WorkflowEnvironment, tmp_path: Path, workers, task_queue: str) -> None:
    workers.start()
    await (await start(temporal_env.client, ledger_plan(tmp_path, "chg-1", 1), task_queue)
           ).result()
    changed = ledger_plan(tmp_path, "chg-1", 2)
    result = await run_result(await start(temporal_env.client, changed, task_queue))
    assert (result.state, result.error["type"]) == ("failed", "PlanChanged")
    assert "a changed plan is a new task" in result.error["message"]
    assert len(entries(tmp_path)) == 1


async def test_a_bad_plan_fails_with_its_clear_error_and_writes_nothing(
        temporal_env: WorkflowEnvironment, store: JournalStore, workers, task_queue: str) -> None:
    workers.start()
    doc = {"task_id": "bad-1", "steps": [{"action": "fs.rename", "args": {"path": "x"}}]}
    result = await run_result(await start(temporal_env.client, doc, task_queue))
    assert (result.state, result.error["type"]) == ("failed", "PlanError")
    assert "steps[0].args" in result.error["message"]
    with pytest.raises(UnknownTask):
        store.progress("bad-1")


async def test_a_long_plan_continues_as_new_twice_and_completes(
        temporal_env: WorkflowEnvironment, store: JournalStore, tmp_path: Path, workers,
        task_queue: str) -> None:
    n = 2 * STEPS_PER_RUN + 5
    workers.start()
    handle = await start(temporal_env.client, ledger_plan(tmp_path, "long-1", n), task_queue)
    result = await run_result(handle)
    assert (result.state, result.confirmed, result.executed) == ("completed", n, n)
    assert entries(tmp_path) == [f"e{i}" for i in range(1, n + 1)]
    chain = [w async for w in temporal_env.client.list_workflows('WorkflowId = "tidemark-long-1"')]
    assert len(chain) == 3  # two continue-as-new hops: three runs
    # Each run's history holds the steps of its own window and grows with them alone (about
    # six events a step: a workflow task and the activity's scheduled, started and completed),
    # so the last run, with five steps, is small however long the plan.
    # Each run's prepare describes that run's own window: every step's summary names it.
    sizes, misnamed = [], []
    for w in chain:
        run = temporal_env.client.get_workflow_handle(w.id, run_id=w.run_id)
        events = [e async for e in run.fetch_history_events()]
        sizes.append((len(await steps_started(run)), len(events)))
        for e in events:
            attrs = e.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == ActivityName.RUN_STEP:
                step = json.loads(attrs.input.payloads[0].data)["step"]
                summary = json.loads(e.user_metadata.summary.data)
                if not summary.startswith(f"{step}/{n} ledger.record entry=e{step}, "):
                    misnamed.append((step, summary[:40]))
    assert misnamed == []
    sizes.sort()
    assert [steps for steps, _ in sizes] == [5, STEPS_PER_RUN, STEPS_PER_RUN], sizes
    assert all(events <= 7 * steps + 40 for steps, events in sizes), sizes


async def test_a_postgres_outage_mid_run_is_ridden_out_without_duplicates(
        temporal_env: WorkflowEnvironment, db_url: str, tmp_path: Path, workers,
        task_queue: str) -> None:
    workers.start()
    handle = await start(temporal_env.client, ledger_plan(tmp_path, "pg-out-1", 10, hold_s=0.1),
                         task_queue)
    assert_eventually(lambda: len(entries(tmp_path)) >= 3, timeout=30)
    dbname = psycopg.conninfo.conninfo_to_dict(db_url)["dbname"]
    admin_url = psycopg.conninfo.make_conninfo(db_url, dbname="postgres")
    with psycopg.connect(admin_url, autocommit=True) as admin:
        # The journal's database refuses connections and drops every open one: an outage.
        admin.execute(sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS false").format(
            sql.Identifier(dbname)))
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                      " WHERE datname = %s", (dbname,))
        during = len(entries(tmp_path))
        await asyncio.sleep(3)
        stalled = len(entries(tmp_path))
        admin.execute(sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS true").format(
            sql.Identifier(dbname)))
    assert stalled <= during + 1  # at most the step already past its intent finished
    result = await run_result(handle)
    assert (result.state, result.confirmed) == ("completed", 10)
    assert entries(tmp_path) == [f"e{i}" for i in range(1, 11)]  # each exactly once
    with JournalStore(db_url) as fresh:  # the fixture's pooled connections died in the outage
        progress = fresh.progress("pg-out-1")
    assert progress.in_doubt is None and progress.confirmed == 10


async def test_the_per_task_payment_limit_is_checked_before_the_first_step_of_every_start(
        temporal_env: WorkflowEnvironment, server: StagingServer, workers,
        task_queue: str) -> None:
    limits = {"TIDEMARK_STAGING_URL": server.url, "TIDEMARK_STRIPE_MAX_AMOUNT": "50000"}
    first = workers.start(**limits, TIDEMARK_STRIPE_MAX_TASK_AMOUNT="100000")
    doc = {"task_id": "budget-1", "steps": [
        {"action": "stripe.payment_intent", "args": {"amount": 40000, "currency": "eur"}}
        for _ in range(3)]}  # each under the per-step limit, 120000 together
    refused = await run_result(await start(temporal_env.client, doc, task_queue))
    assert (refused.state, refused.error["type"]) == ("precondition_failed",
                                                      "PreconditionFailed")
    assert "add up to 1,200.00 EUR, over the per-task limit of 1,000.00 EUR " \
        "(TIDEMARK_STRIPE_MAX_TASK_AMOUNT=100000)" in refused.error["message"]
    assert effects(server, "stripe", "payment_intents.create") == []

    first.send_signal(signal.SIGTERM)
    first.wait(timeout=30)
    workers.start(**limits, TIDEMARK_STRIPE_MAX_TASK_AMOUNT="150000")  # a person raised it
    done = await run_result(await start(temporal_env.client, {"task_id": "budget-1"}, task_queue))
    assert (done.state, done.executed) == ("completed", 3)
    assert len(effects(server, "stripe", "payment_intents.create")) == 3


async def test_halt_stops_a_step_that_keeps_failing_at_its_next_attempt(
        temporal_env: WorkflowEnvironment, store: JournalStore, server: StagingServer,
        drive: Any, workers, task_queue: str) -> None:
    f = drive.seed("scan.pdf")
    arm(server, "drive", "files.update", "fail_before_commit", times=1000)  # Drive is down
    workers.start(TIDEMARK_STAGING_URL=server.url)
    doc = {"task_id": "halt-down", "steps": [
        {"action": "drive.rename", "args": {"file_id": f.id, "name": "invoice.pdf"}},
        {"action": "drive.rename", "args": {"file_id": f.id, "name": "invoice-2.pdf"}}]}
    handle = await start(temporal_env.client, doc, task_queue)
    assert_eventually(lambda: any(e["kind"] == "error" for e in store.events("halt-down")),
                      timeout=30)
    await handle.signal("halt", "drive is down")
    result = await asyncio.wait_for(run_result(handle), timeout=60)
    assert (result.state, result.stopped_at) == ("halted", 1)
    progress = store.progress("halt-down")
    assert progress.stop is not None and progress.stop["reason"] == "drive is down"
    # The failing step is left in doubt for the probe of a later resume; nothing after it ran.
    assert progress.in_doubt is not None and progress.in_doubt.step == 1
    assert progress.rows == 1 and drive.files[f.id].name == "scan.pdf"


async def test_an_undecidable_step_ends_the_run_as_needs_decision(
        temporal_env: WorkflowEnvironment, store: JournalStore, db_url: str, tmp_path: Path,
        workers, task_queue: str) -> None:
    blind = tmp_path / "blind"
    blind.write_text("")
    doc = ledger_plan(tmp_path, "undecided-1", 2, blind_while=str(blind))
    store.persist_plan(load_plan(doc, spec_registry(LedgerRecord)))
    crash_at(db_url, "undecided-1", 1, "after_intent")  # step 1 in doubt, its probe blind
    workers.start()
    result = await run_result(await start(temporal_env.client, doc, task_queue))
    assert result.state == "needs_decision"
    assert (result.error["type"], result.error["step"]) == ("NeedsDecision", 1)
    assert entries(tmp_path) == []  # nothing acted on a guess
    doubt = store.progress("undecided-1").in_doubt
    assert doubt is not None and doubt.step == 1


async def test_a_halt_that_arrives_before_any_step_is_written_and_nothing_runs(
        temporal_env: WorkflowEnvironment, store: JournalStore, tmp_path: Path, workers,
        task_queue: str) -> None:
    """A halt that arrives before any step is written, and nothing runs.

    Signal-with-start. The halt is there before the first step, when no attempt is under way to
    meet the stop state; the run must still write it, so that no restart acts."""
    workers.start()
    doc = ledger_plan(tmp_path, "halt-early", 3)
    handle = await temporal_env.client.start_workflow(
        "RunPlan", doc, id="tidemark-halt-early", task_queue=task_queue, result_type=RunResult,
        start_signal="halt", start_signal_args=["before it began"])
    result = await run_result(handle)
    assert (result.state, result.stopped_at) == ("halted", 1)
    stop = store.stop_state("halt-early")
    assert stop is not None and stop["reason"] == "before it began"
    assert entries(tmp_path) == []
    again = await run_result(await start(temporal_env.client, {"task_id": "halt-early"},
                                         task_queue))
    assert again.state == "stopped" and entries(tmp_path) == []
