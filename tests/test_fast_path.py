"""RunPlan's fast path ("execution": "fast": steps as local activities) on the real dev server,
with real worker processes and a real Postgres: the same guarantees as the activity path."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from helpers.ledger import ledger_lines
from helpers.wait import assert_eventually
from tidemark.errors import UnknownTask
from tidemark.faults import CRASH_ENV
from tidemark.store import JournalStore
from tidemark.tools import commands
from workflows.outcome import run_result
from workflows.run_plan import FAST_STEPS_PER_RUN
from workflows.types import RunResult


def fast_plan(tmp_path: Path, task_id: str, n: int, **extra: Any) -> dict[str, Any]:
    return {"task_id": task_id, "execution": "fast", "steps": [
        {"action": "ledger.record",
         "args": {"ledger": str(tmp_path / "ledger"), "entry": f"e{i}", **extra}}
        for i in range(1, n + 1)]}


async def start(client: Client, doc: dict[str, Any],
                task_queue: str) -> WorkflowHandle[Any, RunResult]:
    return await client.start_workflow("RunPlan", doc, id=f"tidemark-{doc['task_id']}",
                                       task_queue=task_queue, result_type=RunResult)


def entries(tmp_path: Path) -> list[str]:
    return [line.split(" ", 1)[1] for line in ledger_lines(tmp_path / "ledger")]


async def event_types(handle: WorkflowHandle[Any, Any]) -> list[int]:
    return [e.event_type async for e in handle.fetch_history_events()]


def probes(store: JournalStore, task_id: str) -> list[dict[str, Any]]:
    return [e for e in store.events(task_id) if e["kind"] == "probe"]


async def test_a_fast_plan_runs_every_step_once_as_local_activities(
        temporal_env: WorkflowEnvironment, store: JournalStore, tmp_path: Path, workers,
        task_queue: str) -> None:
    workers.start()
    handle = await start(temporal_env.client, fast_plan(tmp_path, "fast-1", 20), task_queue)
    result = await run_result(handle)
    assert (result.state, result.confirmed, result.executed) == ("completed", 20, 20)
    assert entries(tmp_path) == [f"e{i}" for i in range(1, 21)]
    progress = store.progress("fast-1")
    assert (progress.rows, progress.confirmed, progress.in_doubt) == (20, 20, None)
    types = await event_types(handle)
    # prepare, describe_steps and the boundary before the first irreversible step are
    # activities; no step is: each is one marker.
    assert types.count(EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED) == 3
    assert types.count(EventType.EVENT_TYPE_MARKER_RECORDED) == 20
    # "execution" is how the run goes, not part of the plan: the same plan without it is the
    # same task (same hash), so a resume on the activity path finds nothing left to do.
    again = await run_result(await start(temporal_env.client, {"task_id": "fast-1"}, task_queue))
    assert (again.state, again.confirmed, again.executed) == ("completed", 20, 0)


async def test_an_unknown_execution_mode_fails_readably_and_writes_nothing(
        temporal_env: WorkflowEnvironment, store: JournalStore, tmp_path: Path, workers,
        task_queue: str) -> None:
    workers.start()
    doc = {**fast_plan(tmp_path, "fast-bad", 2), "execution": "turbo"}
    result = await run_result(await start(temporal_env.client, doc, task_queue))
    assert (result.state, result.error["type"]) == ("failed", "PlanError")
    assert "execution must be one of activity, fast, not 'turbo'" in result.error["message"]
    assert entries(tmp_path) == []
    with pytest.raises(UnknownTask):  # the plan was not stored
        store.progress("fast-bad")


async def test_a_worker_sigkilled_mid_step_on_the_fast_path_resumes_through_the_probe(
        temporal_env: WorkflowEnvironment, store: JournalStore, tmp_path: Path, workers,
        task_queue: str) -> None:
    # The worker dies right after step 3's effect, before its outcome is journaled; steps 1-2
    # completed in the same (never completed) workflow task, so Temporal runs them again.
    doomed = workers.start(**{CRASH_ENV: "after_execute:3"})
    handle = await start(temporal_env.client, fast_plan(tmp_path, "fast-kill", 6), task_queue)
    assert doomed.wait(timeout=60) == -signal.SIGKILL
    doubt = store.progress("fast-kill").in_doubt
    assert doubt is not None and doubt.step == 3
    workers.start()
    result = await run_result(handle)
    assert (result.state, result.confirmed) == ("completed", 6)
    assert entries(tmp_path) == [f"e{i}" for i in range(1, 7)]  # each effect exactly once
    row3 = store.step_row("fast-kill", 3)
    assert row3 is not None and row3.resolved_by == "probe"
    assert [p["step"] for p in probes(store, "fast-kill")] == [3]  # exactly one probe
    # The replayed steps 1-2 were found journaled and skipped, not executed again.
    assert (result.resolved_by_probe, result.executed + result.skipped) == (1, 5)


async def test_a_halt_on_the_fast_path_stops_between_steps_and_the_stop_state_refuses(
        temporal_env: WorkflowEnvironment, store: JournalStore, tmp_path: Path, workers,
        task_queue: str) -> None:
    workers.start()
    n = 60
    handle = await start(temporal_env.client, fast_plan(tmp_path, "fast-halt", n, hold_s=0.3),
                         task_queue)
    assert_eventually(lambda: len(entries(tmp_path)) >= 2, timeout=30)
    sent = time.monotonic()
    await handle.signal("halt", "maintenance window")
    result = await run_result(handle)
    # Delivered when the worker ends its open workflow task (at 80% of its 10 s timeout).
    assert time.monotonic() - sent < 10
    assert result.state == "halted"
    progress = store.progress("fast-halt")
    assert progress.in_doubt is None
    assert progress.stop is not None and progress.stop["reason"] == "maintenance window"
    ran = entries(tmp_path)
    assert 2 <= len(ran) < n and ran == [f"e{i}" for i in range(1, len(ran) + 1)]
    assert progress.confirmed == len(ran) and result.stopped_at == len(ran) + 1

    assert (await handle.query("status"))["execution"] == "fast"
    again = await run_result(await start(temporal_env.client,
                               {"task_id": "fast-halt", "execution": "fast"},
                               task_queue))
    assert again.state == "stopped" and "tidemark release fast-halt" in again.error["message"]
    assert len(entries(tmp_path)) == len(ran)


async def test_a_stop_committed_mid_run_ends_the_fast_path_at_its_next_step(
        temporal_env: WorkflowEnvironment, store: JournalStore, tmp_path: Path, workers,
        task_queue: str) -> None:
    workers.start()
    n = 40
    handle = await start(temporal_env.client, fast_plan(tmp_path, "fast-stop", n, hold_s=0.2),
                         task_queue)
    assert_eventually(lambda: len(entries(tmp_path)) >= 2, timeout=30)
    commands.stop(store.conninfo, "fast-stop", "wrong supplier list", "ana")
    result = await run_result(handle)
    assert (result.state, result.error["type"]) == ("stopped", "TaskStopped")
    ran = entries(tmp_path)
    assert len(ran) < n and store.progress("fast-stop").in_doubt is None
    assert result.error["step"] == len(ran) + 1  # the step after the last one that ran

    commands.release(store.conninfo, "fast-stop", "list fixed", "ana")
    resumed = await run_result(await start(temporal_env.client,
                                 {"task_id": "fast-stop", "execution": "fast"},
                                 task_queue))
    assert (resumed.state, resumed.confirmed) == ("completed", n)
    assert entries(tmp_path) == [f"e{i}" for i in range(1, n + 1)]


async def test_a_long_fast_plan_continues_as_new_and_stays_fast(
        temporal_env: WorkflowEnvironment, store: JournalStore, tmp_path: Path, workers,
        task_queue: str) -> None:
    n = FAST_STEPS_PER_RUN + 150
    workers.start()
    handle = await start(temporal_env.client, fast_plan(tmp_path, "fast-long", n), task_queue)
    result = await run_result(handle)
    assert (result.state, result.confirmed, result.executed) == ("completed", n, n)
    assert entries(tmp_path) == [f"e{i}" for i in range(1, n + 1)]
    chain = [w async for w in temporal_env.client.list_workflows(
        'WorkflowId = "tidemark-fast-long"')]
    assert len(chain) == 2  # one continue-as-new hop
    types = await event_types(handle)  # the last run: still on the fast path
    assert types.count(EventType.EVENT_TYPE_MARKER_RECORDED) == 150
    assert types.count(EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED) == 2  # prepare, describe
