"""ScheduledRun: what a series' Temporal Schedule starts (tools/operate/schedules.py).

It reads the stop and series state first (activity ``series_gate``); if anything says stop it
ends ``blocked`` without calling the planner. Otherwise it calls the planner (activity
``call_planner``), and runs the validated plan with RunPlan as a child workflow
``tidemark-<task_id>``, the task id ``sched-<series>-<time>`` derived from the series and the
scheduled time (a namespace no plan submitted by hand may take). Its end
follows RunPlan's (workflows/outcome.py): Completed only when the run completed.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RawValue, RetryPolicy, SearchAttributeKey
from temporalio.exceptions import ActivityError, ChildWorkflowError

with workflow.unsafe.imports_passed_through():
    from tidemark.activity_names import ActivityName
    from tidemark.errors import InputError
    from tidemark.payloads import FAILED, KILLED, PlannerInput, RunResult
    from tidemark.series_names import scheduled_task_id
    from workflows.outcome import ended, result_of
    from workflows.shared import (
        BOOKKEEPING_RETRY,
        BOOKKEEPING_TIMEOUT,
        KILL_WAIT,
        NO_INPUT,
        STATE,
        TASK_ID,
        decoded,
        end_state_of,
    )

SCHEDULED_START = SearchAttributeKey.for_datetime("TemporalScheduledStartTime")
SCHEDULED_BY = SearchAttributeKey.for_keyword("TemporalScheduledById")
# An agent may think for a while; a planner that fails is tried a few times, then the run fails.
PLANNER_TIMEOUT = timedelta(minutes=10)
PLANNER_RETRY = RetryPolicy(initial_interval=timedelta(seconds=2), maximum_attempts=3,
                            non_retryable_error_types=["PlanError", "SeriesBlocked"])


def task_id_for(series: str, when: datetime) -> str:
    """``sched-<series>-<time>``: a namespace only this workflow may start plans in."""
    return scheduled_task_id(series, f"{when:%Y%m%dT%H%M%SZ}")


@workflow.defn(name="ScheduledRun")
class ScheduledRun:
    def __init__(self) -> None:
        self._killed = False

    @workflow.signal
    def kill(self, note: RawValue = NO_INPUT) -> None:
        """``tidemark kill`` announces itself before it terminates this run and its child.

        The list shows ``killed`` from now on, also after the termination."""
        self._killed = True
        workflow.upsert_search_attributes([STATE.value_set(KILLED)])

    def _state(self, state: str) -> None:
        if not self._killed:  # a killed run keeps saying so whatever its child did
            workflow.upsert_search_attributes([STATE.value_set(state)])

    @workflow.run
    async def run(self, inp: RawValue = NO_INPUT) -> RunResult:
        """Decodes its input itself (workflows.shared.decoded).

        An input that cannot be, or is not an object, ends the run at once, failed."""
        try:
            read: Any = decoded(inp, "input")
        except InputError as e:
            read = e
        if not isinstance(read, dict):
            return ended(RunResult(task_id="", state=FAILED, steps=0, confirmed=0, error={
                "type": "PlanError", "message": str(read) if isinstance(read, InputError)
                else "the input must be {series, planner, args}"}))
        result = await self._run(read)
        if self._killed:
            # `tidemark kill` terminates it (after its child) meanwhile: it ends Terminated, not
            # Failed on the child it was running.
            await workflow.sleep(KILL_WAIT)
            result.state = KILLED
        return ended(result)

    async def _run(self, inp: dict[str, Any]) -> RunResult:
        series = str(inp.get("series") or "")
        when = workflow.info().typed_search_attributes.get(SCHEDULED_START) or workflow.now()
        task_id = task_id_for(series, when)
        result = RunResult(task_id=task_id, state="running", steps=0, confirmed=0)
        workflow.upsert_search_attributes([TASK_ID.value_set(task_id), STATE.value_set(
            KILLED if self._killed else "running")])
        ask = PlannerInput(series, str(inp.get("planner") or ""), dict(inp.get("args") or {}),
                           when.isoformat(), task_id,
                           workflow.info().typed_search_attributes.get(SCHEDULED_BY))
        try:
            await workflow.execute_activity(
                ActivityName.SERIES_GATE, ask, start_to_close_timeout=BOOKKEEPING_TIMEOUT,
                retry_policy=BOOKKEEPING_RETRY, summary=f"stop and series state of {series}")
            plan: dict[str, Any] = await workflow.execute_activity(
                ActivityName.CALL_PLANNER, ask, result_type=dict,
                start_to_close_timeout=PLANNER_TIMEOUT,
                retry_policy=PLANNER_RETRY, summary=f"plan {task_id} with {inp.get('planner')}")
        except ActivityError as e:
            cause = getattr(e.cause, "type", None)
            if cause == "PlannerFailed":
                state, error = FAILED, {"type": cause, "message": str(e.cause)}
            else:
                state, error = end_state_of(e, None)
            result.state, result.error = state, error
            self._state(state)
            workflow.set_current_details(f"**{state}**: {error.get('message')}")
            return result
        if self._killed:  # killed while it planned: the plan is not run
            result.state = KILLED
            return result
        try:
            done: RunResult = await workflow.execute_child_workflow(
                "RunPlan", plan, id=f"tidemark-{task_id}", result_type=RunResult)
        except ChildWorkflowError as e:
            found = result_of(e)
            if found is None and self._killed:  # the kill terminated the child first
                result.state = KILLED
                return result
            if found is None:
                raise
            done = found
        self._state(done.state)
        return done

