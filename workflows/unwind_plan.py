"""UnwindPlan: compensate a stopped task's completed reversible steps, last first.

Start it (workflow id ``tidemark-unwind-<task>``) with ``{"task_id": "<task>"}`` once the task
is stopped — ``tidemark unwind <task> --yes`` does both. Every compensation is journaled (phase
``undo``) through the same algorithm as a step; irreversible steps that happened are reported in
the result, never touched.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from workflows.run_plan import (
        BOOKKEEPING_RETRY,
        BOOKKEEPING_TIMEOUT,
        STATE,
        STEP_HEARTBEAT,
        STEP_RETRY,
        STEP_START_TO_CLOSE,
        TASK_ID,
        end_state_of,
    )
    from workflows.types import (
        RUNNING,
        STOPPED,
        UNWOUND,
        StepInput,
        UndoOutput,
        UnwindPlanned,
        UnwindResult,
    )


@workflow.defn(name="UnwindPlan")
class UnwindPlan:
    def __init__(self) -> None:
        self._result = UnwindResult(task_id="", state=RUNNING)

    @workflow.query
    def status(self) -> dict[str, Any]:
        r = self._result
        return {"task_id": r.task_id, "state": r.state, "undone": r.undone,
                "nothing_to_undo": r.nothing_to_undo}

    @workflow.run
    async def run(self, document: dict[str, Any]) -> UnwindResult:
        task_id = str(document.get("task_id") or "")
        r = self._result
        r.task_id = task_id
        try:
            planned: UnwindPlanned = await workflow.execute_activity(
                "plan_unwind", task_id, result_type=UnwindPlanned,
                start_to_close_timeout=BOOKKEEPING_TIMEOUT, retry_policy=BOOKKEEPING_RETRY,
                summary="find completed reversible steps")
        except ActivityError as e:
            return self._end_on(e, None)
        workflow.upsert_search_attributes([TASK_ID.value_set(task_id),
                                           STATE.value_set("unwinding")])
        r.irreversible_done = planned.irreversible_done
        if planned.stopped is None:
            return self._end(STOPPED, {"type": "NotStopped", "message":
                                       f"stop the task first: `tidemark stop {task_id}`"})
        for step, summary in zip(planned.steps, planned.summaries, strict=True):
            try:
                out: UndoOutput = await workflow.execute_activity(
                    "unwind_step", StepInput(task_id, step), result_type=UndoOutput,
                    start_to_close_timeout=STEP_START_TO_CLOSE, heartbeat_timeout=STEP_HEARTBEAT,
                    retry_policy=STEP_RETRY, summary=summary[:400])
            except ActivityError as e:
                return self._end_on(e, step)
            if out.status == "nothing_to_undo":
                r.nothing_to_undo.append(step)
            else:
                r.undone.append(step)
        return self._end(UNWOUND)

    def _end_on(self, e: ActivityError, step: int | None) -> UnwindResult:
        return self._end(*end_state_of(e, step))

    def _end(self, state: str, error: dict[str, Any] | None = None) -> UnwindResult:
        self._result.state = state
        self._result.error = error or {}
        workflow.upsert_search_attributes([STATE.value_set(state)])
        return self._result
