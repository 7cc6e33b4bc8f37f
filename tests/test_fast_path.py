"""RunPlan's fast path keeps the activity path's guarantees.

The fast path is ``"execution": "fast"``: batches of steps, each one activity. On the real dev
server, with real worker processes and a real Postgres: the same guarantees as the activity path,
and a batch ends where the single-step path would have stopped."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from helpers.ledger import ledger_lines, ledger_registry, persisted
from helpers.runs import start
from helpers.wait import assert_eventually
from tidemark.activity_names import ActivityName
from tidemark.errors import PreconditionFailed, StepFailed, TargetUnavailable, UnknownTask
from tidemark.faults import CRASH_ENV
from tidemark.run_step import run_steps
from tidemark.store import JournalStore
from tools.operate import commands
from workflows.outcome import run_result
from workflows.run_plan import FAST_BATCH_BUDGET, FAST_BATCH_STEPS, FAST_STEPS_PER_RUN


async def batches_started(handle: WorkflowHandle[Any, Any],
                          after_signal: str | None = None) -> list[int]:
    """The first step of every run_steps batch the run scheduled, from its history.

    Only those scheduled after the signal ``after_signal``, if given."""
    firsts = []
    counting = after_signal is None
    async for event in handle.fetch_history_events():
        if (event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
                and event.workflow_execution_signaled_event_attributes.signal_name
                == after_signal):
            counting = True
        if counting and event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == ActivityName.RUN_STEPS:
                firsts.append(json.loads(attrs.input.payloads[0].data)["first"])
    return firsts


async def first_batch_span(handle: WorkflowHandle[Any, Any]) -> tuple[int, int]:
    """The steps (first, last) the run's first run_steps batch was scheduled for."""
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == ActivityName.RUN_STEPS:
                batch = json.loads(attrs.input.payloads[0].data)
                return batch["first"], batch["last"]
    raise AssertionError("the run scheduled no batch")


def fast_plan(tmp_path: Path, task_id: str, n: int, **extra: Any) -> dict[str, Any]:
    return {"task_id": task_id, "execution": "fast", "steps": [
        {"action": "ledger.record",
         "args": {"ledger": str(tmp_path / "ledger"), "entry": f"e{i}", **extra}}
        for i in range(1, n + 1)]}


def entries(tmp_path: Path) -> list[str]:
    return [line.split(" ", 1)[1] for line in ledger_lines(tmp_path / "ledger")]


async def event_types(handle: WorkflowHandle[Any, Any]) -> list[int]:
    return [e.event_type async for e in handle.fetch_history_events()]


async def batches(handle: WorkflowHandle[Any, Any]) -> int:
    """How many step batches (activities ``run_steps``) the run scheduled."""
    return len([e async for e in handle.fetch_history_events()
                if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
                and e.activity_task_scheduled_event_attributes.activity_type.name
                == ActivityName.RUN_STEPS])


def probes(store: JournalStore, task_id: str) -> list[dict[str, Any]]:
    return [e for e in store.events(task_id) if e["kind"] == "probe"]


async def test_a_fast_plan_runs_every_step_once_in_batches(
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
    # prepare is one activity: it also describes the steps and, the first step being
    # irreversible, checks the boundary before it (journaled as its verification event). The
    # plan sets no target twice, so its end has nothing to verify. The steps are a few
    # batches, each one activity; no step is its own.
    assert 1 <= await batches(handle) < 10
    assert types.count(EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED) == 1 + await batches(handle)
    checked = [e for e in store.events("fast-1") if e["kind"] == "verification"]
    assert [(e["step"], e["detail"]["at_end"]) for e in checked] == [(1, False)]
    # no version marker: 0.1.0's workflows carry no patch (tests/test_replay.py, PATCHES)
    assert types.count(EventType.EVENT_TYPE_MARKER_RECORDED) == 0
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
    # completed in the same batch, which never reported, so Temporal runs it again.
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
    # The batch under way met the halt's stop state; no batch started after the halt. A batch
    # scheduled by the workflow task the halt arrived during (a signal is written to the history
    # after that task's commands) may start at the step after the last that ran, and runs
    # nothing; none is scheduled once the run has seen the halt.
    started = await batches_started(handle)
    assert max(started) <= len(ran) + 1
    assert await batches_started(handle, after_signal="halt") == []

    assert (await handle.query("status"))["execution"] == "fast"
    again_handle = await start(temporal_env.client, {"task_id": "fast-halt", "execution": "fast"},
                               task_queue)
    again = await run_result(again_handle)
    assert again.state == "stopped" and "tidemark release fast-halt" in again.error["message"]
    assert len(entries(tmp_path)) == len(ran)
    assert await batches_started(again_handle) == []  # the start-of-run check, on its own


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
    # the last run: still on the fast path, in batches
    assert 150 / FAST_BATCH_STEPS <= await batches(handle) < 150
    # prepare (with the window's lines) and the batches. The plan is too long to read whole,
    # and its one action names no target, so its end has nothing to verify: no verify_end.
    types = await event_types(handle)
    assert types.count(EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED) == 1 + await batches(handle)


# -- batches -------------------------------------------------------------------------------

def test_a_batch_runs_steps_until_its_count_or_its_time_is_spent(
        store: JournalStore, tmp_path: Path) -> None:
    persisted(store, tmp_path, "b-1", 30)
    batch = run_steps(store, ledger_registry(), "b-1", 1, 30, max_steps=8, budget_s=60)
    assert [r.step for r in batch.results] == list(range(1, 9)) and batch.error is None
    # A budget already spent still runs one step: a batch always moves the run on.
    batch = run_steps(store, ledger_registry(), "b-1", 9, 30, max_steps=64, budget_s=0)
    assert [r.step for r in batch.results] == [9]
    # Never beyond the window it was given.
    batch = run_steps(store, ledger_registry(), "b-1", 10, 12, max_steps=64, budget_s=60)
    assert [r.step for r in batch.results] == [10, 11, 12]
    assert entries(tmp_path) == [f"e{i}" for i in range(1, 13)]


def test_a_batch_ends_at_the_first_step_that_does_not_complete_and_reports_its_error(
        store: JournalStore, tmp_path: Path) -> None:
    gate, down = tmp_path / "gate", tmp_path / "down"
    gate.touch()
    down.touch()
    refused = tmp_path / "refused"
    refused.touch()
    persisted(store, tmp_path, "b-2", 10, s4={"gate_file": str(gate)},
              s7={"unavailable_while": str(down)}, s9={"refused_while": str(refused)})
    batch = run_steps(store, ledger_registry(), "b-2", 1, 10, max_steps=64, budget_s=60)
    assert [r.step for r in batch.results] == [1, 2, 3]
    assert isinstance(batch.error, PreconditionFailed) and batch.error.step == 4
    assert [e["step"] for e in store.events("b-2") if e["kind"] == "precondition"] == [4]
    # The same error on a batch's first step is raised, for the retry policy to see.
    with pytest.raises(PreconditionFailed):
        run_steps(store, ledger_registry(), "b-2", 4, 10, max_steps=64, budget_s=60)
    gate.unlink()
    batch = run_steps(store, ledger_registry(), "b-2", 4, 10, max_steps=64, budget_s=60)
    assert [r.step for r in batch.results] == [4, 5, 6]
    assert isinstance(batch.error, TargetUnavailable)
    assert store.progress("b-2").in_doubt.step == 7  # type: ignore[union-attr]
    assert entries(tmp_path) == [f"e{i}" for i in range(1, 7)]
    down.unlink()
    # A step the target refused is journaled ``failed`` and ends the batch with StepFailed;
    # found journaled so by a later batch, it is that batch's last result.
    batch = run_steps(store, ledger_registry(), "b-2", 7, 10, max_steps=64, budget_s=60)
    assert [r.step for r in batch.results] == [7, 8]
    assert isinstance(batch.error, StepFailed) and batch.error.step == 9
    batch = run_steps(store, ledger_registry(), "b-2", 8, 10, max_steps=64, budget_s=60)
    assert [(r.step, r.status) for r in batch.results] == [(8, "done"), (9, "failed")]
    assert batch.error is None and entries(tmp_path) == [f"e{i}" for i in range(1, 9)]


async def test_a_halt_on_the_batched_fast_path_lands_within_the_batch_budget(
        temporal_env: WorkflowEnvironment, store: JournalStore, tmp_path: Path, workers,
        task_queue: str) -> None:
    workers.start()
    n, hold = 400, 0.02
    handle = await start(temporal_env.client, fast_plan(tmp_path, "fast-halt-b", n, hold_s=hold),
                         task_queue)
    assert_eventually(lambda: len(entries(tmp_path)) >= 5, timeout=30)
    at_signal = len(entries(tmp_path))
    sent = time.monotonic()
    await handle.signal("halt", "maintenance window")
    result = await run_result(handle)
    took = time.monotonic() - sent
    assert result.state == "halted"
    # The halt is recorded at once and met by the batch under way at its next step, or by the
    # next batch: within the batch budget, one step that started before it ran out, and a few
    # round trips (generous on a shared machine).
    budget = FAST_BATCH_BUDGET.total_seconds()
    assert took < budget + hold + 1.5, took
    ran = entries(tmp_path)
    assert ran == [f"e{i}" for i in range(1, len(ran) + 1)]
    assert len(ran) - at_signal <= (budget + 1.5) / hold
    progress = store.progress("fast-halt-b")
    assert progress.in_doubt is None and progress.confirmed == len(ran)
    assert result.stopped_at == len(ran) + 1


async def test_a_crash_inside_a_later_batch_resumes_that_batch_with_one_probe(
        temporal_env: WorkflowEnvironment, store: JournalStore, tmp_path: Path, workers,
        task_queue: str) -> None:
    # Step 70 is in the second batch or later: the batches before it reported, so only the
    # dead batch runs again: its steps before 70 are found journaled and skipped.
    n, crash = 90, 70
    doomed = workers.start(**{CRASH_ENV: f"after_execute:{crash}"})
    handle = await start(temporal_env.client, fast_plan(tmp_path, "fast-kill-b", n), task_queue)
    assert doomed.wait(timeout=60) == -signal.SIGKILL
    doubt = store.progress("fast-kill-b").in_doubt
    assert doubt is not None and doubt.step == crash
    workers.start()
    result = await run_result(handle)
    assert (result.state, result.confirmed) == ("completed", n)
    assert entries(tmp_path) == [f"e{i}" for i in range(1, n + 1)]  # each effect exactly once
    assert [p["step"] for p in probes(store, "fast-kill-b")] == [crash]
    assert result.resolved_by_probe == 1
    assert result.executed + result.skipped == n - 1
    assert result.skipped < FAST_BATCH_STEPS  # at most the dead batch ran again


async def outcome_of(temporal_env: WorkflowEnvironment, tmp_path: Path, task_queue: str,
                     execution: str, **per_step: dict[str, Any]) -> tuple[Any, ...]:
    """Runs a ten-step ledger plan on one path and returns what the run reports."""
    where = tmp_path / execution
    where.mkdir()
    doc = fast_plan(where, f"same-{execution}", 10)
    doc["execution"] = execution
    for name, extra in per_step.items():
        doc["steps"][int(name[1:]) - 1]["args"].update(extra)
    r = await run_result(await start(temporal_env.client, doc, task_queue))
    return (r.state, r.error.get("type"), r.error.get("step"), r.confirmed, r.executed,
            r.skipped, r.resolved_by_probe, len(entries(where)))


@pytest.mark.parametrize(("knob", "state", "error"), [
    ("gate_file", "precondition_failed", "PreconditionFailed"),
    ("refused_while", "failed", "StepFailed")])
async def test_a_step_that_ends_the_run_inside_a_batch_ends_it_where_the_single_step_path_does(
        temporal_env: WorkflowEnvironment, store: JournalStore, tmp_path: Path, workers,
        task_queue: str, knob: str, state: str, error: str) -> None:
    workers.start()
    flag = tmp_path / "flag"
    flag.touch()
    fast = await outcome_of(temporal_env, tmp_path, task_queue, "fast", s6={knob: str(flag)})
    assert fast == (state, error, 6, 5, 5, 0, 0, 5)
    single = await outcome_of(temporal_env, tmp_path, task_queue, "activity",
                              s6={knob: str(flag)})
    assert single == fast
    if knob == "gate_file":  # the gate ran once: the batch did not run the step again
        assert [e["step"] for e in store.events("same-fast")
                if e["kind"] == "precondition"] == [6]
    else:
        row = store.step_row("same-fast", 6)
        assert row is not None and row.status == "failed"


async def test_a_step_whose_target_is_down_inside_a_batch_is_retried_and_runs_once(
        temporal_env: WorkflowEnvironment, store: JournalStore, tmp_path: Path, workers,
        task_queue: str) -> None:
    workers.start()
    down = tmp_path / "down"
    down.touch()
    doc = fast_plan(tmp_path, "fast-down", 10)
    doc["steps"][5]["args"]["unavailable_while"] = str(down)
    handle = await start(temporal_env.client, doc, task_queue)
    assert_eventually(lambda: any(e["kind"] == "error" for e in store.events("fast-down")),
                      timeout=30)
    assert entries(tmp_path) == [f"e{i}" for i in range(1, 6)]
    down.unlink()
    result = await run_result(handle)
    assert (result.state, result.confirmed, result.executed) == ("completed", 10, 10)
    assert entries(tmp_path) == [f"e{i}" for i in range(1, 11)]


async def test_a_batch_stops_before_the_boundary_and_waits_for_approval(
        temporal_env: WorkflowEnvironment, store: JournalStore, tmp_path: Path, workers,
        task_queue: str) -> None:
    workers.start()
    docs = tmp_path / "docs"
    docs.mkdir()
    steps: list[dict[str, Any]] = []
    for i in range(1, 6):
        (docs / f"scan-{i}.pdf").write_text(str(i))
        steps.append({"action": "fs.rename", "args": {"path": str(docs / f"scan-{i}.pdf"),
                                                      "name": f"invoice {i}.pdf"}})
    steps += fast_plan(tmp_path, "x", 3)["steps"]
    doc = {"task_id": "fast-appr", "execution": "fast", "steps": steps,
           "approval": {"required": True}}
    handle = await start(temporal_env.client, doc, task_queue)

    async def waiting() -> bool:
        return (await handle.query("status"))["state"] == "awaiting_approval"

    for _ in range(300):
        if await waiting():
            break
        await asyncio.sleep(0.1)
    assert await waiting()
    assert sorted(p.name for p in docs.iterdir()) == [f"invoice {i}.pdf" for i in range(1, 6)]
    assert entries(tmp_path) == []  # nothing irreversible ran before the approval
    assert store.progress("fast-appr").confirmed == 5
    # The batch ended before the boundary: the workflow asks for the approval first, rather
    # than sending step 6 for the journal to refuse (which would also hold it, later).
    assert await first_batch_span(handle) == (1, 5)
    commands.decide_approval(store.conninfo, "fast-appr", "approve", "ana")
    await handle.signal("approval", {"decision": "approve", "by": "ana"})
    result = await run_result(handle)
    assert (result.state, result.confirmed, result.executed) == ("completed", 8, 8)
    assert entries(tmp_path) == ["e1", "e2", "e3"]
