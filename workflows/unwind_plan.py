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

Only ``unwound`` ends the workflow Completed; every other end (``failed``, ``stopped``, ``killed``)
ends it Failed with the typed error that carries the UnwindResult (workflows/outcome.py), so a
failed unwind is red in the Web UI like any run that needs a person. ``tidemark kill`` sends
the ``kill`` signal first: the compensation under way may finish, no other one starts, and the
run waits to be terminated.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import ActivityError, ApplicationError, FailureError

with workflow.unsafe.imports_passed_through():
    from tidemark.activity_names import ActivityName
    from tidemark.errors import InputError
    from tidemark.limits import ID_RE, ID_RULE
    from tidemark.needs import Act, Need, command, headline
    from tidemark.payloads import (
        FAILED,
        KILLED,
        RUNNING,
        STOPPED,
        UNWOUND,
        StepInput,
        TaskNeed,
        UndoOutput,
        UnwindPlanned,
        UnwindResult,
        UnwoundInput,
    )
    from workflows.needs_person import hold, release
    from workflows.outcome import failure_type
    from workflows.shared import (
        BOOKKEEPING_HEARTBEAT,
        BOOKKEEPING_RETRY,
        BOOKKEEPING_TIMEOUT,
        KILL_WAIT,
        NEEDS,
        NO_INPUT,
        STATE,
        STEP_HEARTBEAT,
        STEP_RETRY,
        STEP_START_TO_CLOSE,
        TASK_ID,
        decoded,
        end_state_of,
        signal_note,
    )

# The candidates are listed again after each pass; a pass finds new ones only when an intent
# landed while the previous one ran, so a few passes are plenty.
MAX_PASSES = 5


@workflow.defn(name="UnwindPlan")
class UnwindPlan:
    def __init__(self) -> None:
        self._result = UnwindResult(task_id="", state=RUNNING)
        self._killed: dict[str, Any] | None = None
        self._run_told = False

    @workflow.signal
    def kill(self, note: RawValue = NO_INPUT) -> None:
        """``tidemark kill`` announces itself before it terminates the unwind.

        The state says ``killed`` at once, the compensation under way may finish, no other one
        starts. Any payload is taken (workflows.shared.signal_note)."""
        if self._killed is not None:
            return
        self._killed = signal_note(note, "kill signal")
        self._result.state = KILLED
        workflow.upsert_search_attributes([STATE.value_set(KILLED), NEEDS.value_set(Need.KILLED)])
        self._show(KILLED, Need.KILLED, "**killed**: the compensation under way may finish, no "
                   "other one starts")

    @workflow.query
    def status(self) -> dict[str, Any]:
        r = self._result
        return {"task_id": r.task_id, "state": r.state, "undone": r.undone,
                "already_undone": r.already_undone, "refused": r.refused,
                "nothing_to_undo": r.nothing_to_undo}

    @workflow.run
    async def run(self, document: RawValue = NO_INPUT) -> UnwindResult:
        """Decodes its input itself (workflows.shared.decoded).

        An input that cannot be, or names no task id the journal could hold, ends the unwind at
        once, failed."""
        try:
            read: Any = decoded(document, "input")
        except InputError as e:
            read = e
        result = await self._run(read)
        need = self._need()
        if need != Need.NOTHING and result.task_id:
            await self._hold(result, need)
        elif result.state == UNWOUND and self._run_told:
            # Once more: a run of the task that ended while the unwind was at work (a start
            # that met the task partly unwound, a step that met the stop) opened its row after
            # the release the unwind sent as it began, and an unwound task needs nobody.
            await release(result.task_id, workflow.info().workflow_id)
        if self._killed is not None:
            await workflow.sleep(KILL_WAIT)  # `tidemark kill` terminates it meanwhile
        if result.state == UNWOUND:
            return result
        err = result.error or {}
        raise ApplicationError(
            unwind_sentence(result) + "\n\n"
            + f"{result.state}: {err.get('type', '')} {err.get('message', '')}".strip(),
            dataclasses.asdict(result), type=failure_type(result.state), non_retryable=True)

    async def _hold(self, result: UnwindResult, need: Need) -> None:
        """Opens the task's worklist row for an unwind that did not finish.

        The row says what the journal says the task needs, as `tidemark inbox` does (a step in
        doubt asks for its resolution before any unwind can go on); where the journal reads
        nothing to ask for, the unwind's own word stands."""
        state, said = result.state, unwind_sentence(result)
        with contextlib.suppress(ActivityError):  # unreadable: the unwind's word stands
            word: TaskNeed = await workflow.execute_activity(
                ActivityName.TASK_NEED, result.task_id, result_type=TaskNeed,
                start_to_close_timeout=BOOKKEEPING_TIMEOUT,
                heartbeat_timeout=BOOKKEEPING_HEARTBEAT, retry_policy=BOOKKEEPING_RETRY,
                summary="read what the task needs now")
            if word.need != Need.NOTHING:
                state, need, said = word.state, Need(word.need), word.sentence
            elif word.settled:
                return
        await hold(result.task_id, state, need, said)

    async def _run(self, document: Any) -> UnwindResult:
        if isinstance(document, InputError):
            return self._end(FAILED, {"type": "PlanError", "message": str(document)})
        if not isinstance(document, dict):
            return self._end(FAILED, {"type": "PlanError", "message":
                                      "the input must be {\"task_id\": ...}, not "
                                      f"{type(document).__name__}"})
        task_id = str(document.get("task_id") or "")
        if not ID_RE.fullmatch(task_id):  # no task has it: nothing to read, nothing to hold
            return self._end(FAILED, {"type": "PlanError", "message":
                                      f"task_id: must be {ID_RULE}"})
        result = await self._unwind(task_id)
        # The compensations' undo grants end with the unwind, however it ended. If it cannot,
        # they expire on their own (GRANT_TTL_S); the result stands.
        unfinished = self._unfinished()
        with contextlib.suppress(ActivityError):
            await workflow.execute_activity(
                ActivityName.END_UNWIND,
                UnwoundInput(task_id, workflow.info().workflow_id, unfinished),
                result_type=int, start_to_close_timeout=BOOKKEEPING_TIMEOUT,
                heartbeat_timeout=BOOKKEEPING_HEARTBEAT,
                retry_policy=BOOKKEEPING_RETRY,
                summary=("journal the unfinished unwind, " if unfinished else "")
                + "revoke the undo grants")
        return result

    def _unfinished(self) -> dict[str, Any]:
        """What end_unwind journals of an unwind that leaves its task to be unwound again.

        ``unfinished`` holds its end state, error, the steps it put back and those refused, so
        that `tidemark inbox` and `status` read the task as its row does; any other end
        journals an empty detail."""
        r = self._result
        if not r.task_id or self._need() != Need.UNWIND:
            return {}
        return {"unfinished": {"state": r.state, "error": r.error, "undone": r.undone,
                               "refused": r.refused}}

    async def _unwind(self, task_id: str) -> UnwindResult:
        r = self._result
        r.task_id = task_id
        visited: set[int] = set()
        for _ in range(MAX_PASSES):
            try:
                planned: UnwindPlanned = await workflow.execute_activity(
                    ActivityName.PLAN_UNWIND, task_id, result_type=UnwindPlanned,
                    start_to_close_timeout=BOOKKEEPING_TIMEOUT,
                    heartbeat_timeout=BOOKKEEPING_HEARTBEAT, retry_policy=BOOKKEEPING_RETRY,
                    summary="find completed reversible steps")
            except ActivityError as e:
                return self._end_on(e, None)
            if self._killed is not None:
                return self._end(KILLED)
            workflow.upsert_search_attributes([TASK_ID.value_set(task_id),
                                               STATE.value_set("unwinding"),
                                               NEEDS.value_set(Need.NOTHING)])
            if self._killed is None:
                self._show("unwinding", Need.NOTHING, f"{len(planned.steps)} reversible steps "
                           "to put back, last first")
            r.irreversible_done = planned.irreversible_done
            if planned.stopped is None:
                return self._end(STOPPED, {"type": "NotStopped", "message":
                                           f"stop the task first: `tidemark stop {task_id}`"})
            if not self._run_told:  # the task is stopped: the unwind goes ahead
                self._run_told = True
                await self._close_waiting_run(task_id)
                # the unwind settles the task: its worklist row closes
                await release(task_id, workflow.info().workflow_id)
            todo = [(n, line) for n, line in zip(planned.steps, planned.summaries, strict=True)
                    if n not in visited]
            visited.update(n for n, _ in todo)
            ended = await self._compensate(task_id, todo)
            if ended is not None:
                return ended
            if r.refused:
                steps = ", ".join(str(n) for n in r.refused)
                return self._end(FAILED, {"type": "CompensationRefused", "message":
                                          f"the target refused to restore step(s) {steps}; "
                                          "nothing else was left undone. Clear the way, then "
                                          f"`{command(Act.UNWIND, task_id)}` tries again",
                                          "steps": r.refused, "reasons": r.reasons})
            try:
                left: list[int] = await workflow.execute_activity(
                    ActivityName.RECORD_UNWOUND,
                    UnwoundInput(task_id, workflow.info().workflow_id, {
                        "undone": r.undone, "already_undone": r.already_undone,
                        "irreversible_done": r.irreversible_done}),
                    result_type=list[int], start_to_close_timeout=BOOKKEEPING_TIMEOUT,
                    heartbeat_timeout=BOOKKEEPING_HEARTBEAT,
                    retry_policy=BOOKKEEPING_RETRY, summary="mark the task unwound")
            except ActivityError as e:
                return self._end_on(e, None)
            if not left:
                return self._end(UNWOUND)
        return self._end(FAILED, {"type": "UnwindUnsettled", "message":
                                  f"steps still to compensate after {MAX_PASSES} passes; "
                                  "run the unwind again"})

    async def _close_waiting_run(self, task_id: str) -> None:
        """Tells the task's run ``tidemark-<task>`` that its unwind began.

        So a run waiting for a person at the boundary ends rather than stays open for a decision
        that can no longer come. No run open (it ended, or never ran here): nothing to tell."""
        run = workflow.get_external_workflow_handle(f"tidemark-{task_id}")
        with contextlib.suppress(FailureError):
            await run.signal("unwinding", workflow.info().workflow_id)

    async def _compensate(self, task_id: str,
                          todo: list[tuple[int, str]]) -> UnwindResult | None:
        """One pass: compensates each listed step, last first as listed.

        It counts how each went. Returns the unwind's end (killed, or a typed failure), or None
        to go on."""
        r = self._result
        for step, summary in todo:
            if self._killed is not None:
                return self._end(KILLED)
            try:
                out: UndoOutput = await workflow.execute_activity(
                    ActivityName.UNWIND_STEP, StepInput(task_id, step), result_type=UndoOutput,
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
        return None

    def _end_on(self, e: ActivityError, step: int | None) -> UnwindResult:
        return self._end(*end_state_of(e, step))

    def _need(self) -> Need:
        """What the task needs from a person once this unwind ended.

        Nothing when unwound; its release when killed; else its unwind finished. An unwind that
        found the task not stopped before it began (a release came first) released no row and
        undid nothing. It leaves the task as it found it, needing what it needed before."""
        r = self._result
        if r.state == UNWOUND:
            return Need.NOTHING
        if r.state == KILLED:
            return Need.KILLED
        if r.error.get("type") == "NotStopped" and not self._run_told:
            return Need.NOTHING
        return Need.UNWIND

    def _end(self, state: str, error: dict[str, Any] | None = None) -> UnwindResult:
        if self._killed is not None:
            k = self._killed
            error = {"type": "Killed", "message": f"killed by {k.get('by', '?')}: "
                     f"{k.get('reason', '')}",
                     **({"then": error} if error and state != KILLED else {})}
            state = KILLED
        self._result.state = state
        self._result.error = error or {}
        need = self._need()
        workflow.upsert_search_attributes([STATE.value_set(state), NEEDS.value_set(need)])
        self._show(state, need, unwind_sentence(self._result))
        return self._result

    def _show(self, state: str, need: Need, body: str) -> None:
        """The unwind's current details: its state, need and command first, then ``body``.

        A killed unwind is released for its unwind only (tidemark.needs.headline)."""
        line = command(Act.RELEASE_FOR_UNWIND, self._result.task_id) if need == Need.KILLED \
            else command(Act.UNWIND, self._result.task_id) if need == Need.UNWIND else None
        workflow.set_current_details(
            headline(self._result.task_id, state, need, line=line) + "\n\n" + body)


def unwind_sentence(result: UnwindResult) -> str:
    """The one plain sentence that opens an unwind's failure and its Web UI details.

    It says what happened and what to do next (the errors' messages name the command)."""
    t, err = result.task_id, result.error or {}
    if result.state == UNWOUND:
        return (f"Task {t} is unwound: {len(result.undone)} step(s) put back, "
                f"{len(result.already_undone)} already were; nothing to do.")
    msg = " ".join(str(err.get("message") or err.get("type") or "").split()).rstrip(".")
    if result.state == KILLED:
        return (f"The unwind of task {t} was killed ({msg}); "
                f"`{command(Act.RELEASE_FOR_UNWIND, t)}`, then `{command(Act.UNWIND, t)}` "
                "finishes it.")
    return (f"The unwind of task {t} ended {result.state}: {msg}; when the cause is cleared, "
            f"`{command(Act.UNWIND, t)}` runs it again.")
