"""UnwindPlan: compensate a stopped task's completed reversible steps, last first.

Start it (workflow id ``tidemark-unwind-<task>``) with ``{"task_id": "<task>"}`` once the task
is stopped — ``tidemark unwind <task> --yes`` does both. Every compensation is journaled (phase
``undo``) through the same algorithm as a step; irreversible steps that happened are reported in
the result, never touched.

The result counts restored, already restored, refused and nothing-to-undo steps apart. A
compensation the target refused does not stop the others; the run then ends ``failed`` and
names it, and a later unwind (after a person cleared the way) tries it again. Only when nothing
is left to compensate is the task marked ``unwound`` — terminal — in the statement that checks
it; the candidates are listed again until that holds.
"""

from __future__ import annotations

import contextlib
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
        FAILED,
        RUNNING,
        STOPPED,
        UNWOUND,
        StepInput,
        UndoOutput,
        UnwindPlanned,
        UnwindResult,
        UnwoundInput,
    )

# The patch that revokes the undo grants when an unwind ends (workflow.patched).
UNDO_GRANTS = "undo-grants"
# The candidates are listed again after each pass; a pass finds new ones only when an intent
# landed while the previous one ran, so a few passes are plenty.
MAX_PASSES = 5


@workflow.defn(name="UnwindPlan")
class UnwindPlan:
    def __init__(self) -> None:
        self._result = UnwindResult(task_id="", state=RUNNING)

    @workflow.query
    def status(self) -> dict[str, Any]:
        r = self._result
        return {"task_id": r.task_id, "state": r.state, "undone": r.undone,
                "already_undone": r.already_undone, "refused": r.refused,
                "nothing_to_undo": r.nothing_to_undo}

    @workflow.run
    async def run(self, document: Any) -> UnwindResult:
        if not isinstance(document, dict):
            return self._end(FAILED, {"type": "PlanError", "message":
                                      "the input must be {\"task_id\": ...}, not "
                                      f"{type(document).__name__}"})
        task_id = str(document.get("task_id") or "")
        result = await self._unwind(task_id)
        # The compensations' undo grants end with the unwind, however it ended. Histories from
        # before undo grants existed schedule no such activity.
        if workflow.patched(UNDO_GRANTS):
            # If it cannot, they expire on their own (GRANT_TTL_S); the result stands.
            with contextlib.suppress(ActivityError):
                await workflow.execute_activity(
                    "end_unwind", UnwoundInput(task_id, workflow.info().workflow_id),
                    result_type=int, start_to_close_timeout=BOOKKEEPING_TIMEOUT,
                    retry_policy=BOOKKEEPING_RETRY, summary="revoke the undo grants")
        return result

    async def _unwind(self, task_id: str) -> UnwindResult:
        r = self._result
        r.task_id = task_id
        visited: set[int] = set()
        for _ in range(MAX_PASSES):
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
            todo = [(n, line) for n, line in zip(planned.steps, planned.summaries, strict=True)
                    if n not in visited]
            for step, summary in todo:
                visited.add(step)
                try:
                    out: UndoOutput = await workflow.execute_activity(
                        "unwind_step", StepInput(task_id, step), result_type=UndoOutput,
                        start_to_close_timeout=STEP_START_TO_CLOSE,
                        heartbeat_timeout=STEP_HEARTBEAT, retry_policy=STEP_RETRY,
                        summary=summary[:400])
                except ActivityError as e:
                    return self._end_on(e, step)
                if out.status == "refused":
                    r.refused.append(step)
                    r.reasons[str(step)] = out.reason
                elif out.status == "nothing_to_undo":
                    r.nothing_to_undo.append(step)
                elif out.status == "already_undone":
                    r.already_undone.append(step)
                else:
                    r.undone.append(step)
            if r.refused:
                steps = ", ".join(str(n) for n in r.refused)
                return self._end(FAILED, {"type": "CompensationRefused", "message":
                                          f"the target refused to restore step(s) {steps}; "
                                          "nothing else was left undone. Clear the way, then "
                                          f"`tidemark unwind {task_id} --yes` tries again",
                                          "steps": r.refused, "reasons": r.reasons})
            try:
                left: list[int] = await workflow.execute_activity(
                    "record_unwound", UnwoundInput(task_id, workflow.info().workflow_id, {
                        "undone": r.undone, "already_undone": r.already_undone,
                        "irreversible_done": r.irreversible_done}),
                    result_type=list[int], start_to_close_timeout=BOOKKEEPING_TIMEOUT,
                    retry_policy=BOOKKEEPING_RETRY, summary="mark the task unwound")
            except ActivityError as e:
                return self._end_on(e, None)
            if not left:
                return self._end(UNWOUND)
        return self._end(FAILED, {"type": "UnwindUnsettled", "message":
                                  f"steps still to compensate after {MAX_PASSES} passes; "
                                  "run the unwind again"})

    def _end_on(self, e: ActivityError, step: int | None) -> UnwindResult:
        return self._end(*end_state_of(e, step))

    def _end(self, state: str, error: dict[str, Any] | None = None) -> UnwindResult:
        self._result.state = state
        self._result.error = error or {}
        workflow.upsert_search_attributes([STATE.value_set(state)])
        return self._result
