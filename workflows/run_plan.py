"""RunPlan: run a plan's steps one at a time through the two-phase journal.

Start it with the plan file itself as input::

    temporal workflow start --task-queue tidemark --type RunPlan \\
        --workflow-id tidemark-<task> --input-file plan.json

``{"task_id": "<task>"}`` as input means "the stored plan of that task": that is how a stopped
or crashed task is resumed, and how the workflow continues as new. The workflow id must be
``tidemark-<task>``; a run under any other id, or with an input that is not an object, ends
``failed`` with a PlanError and persists nothing. A task that was unwound ends ``unwound`` at
once, whatever starts it. Deterministic code only: every read and write of the world happens
in activities (activities/steps.py).

``"execution": "fast"`` beside the plan (or beside ``task_id`` on a resume) runs consecutive
steps in batches, one activity per batch instead of one per step: every step still goes
through the same journal, lock, lease, probe and stop check, at a fraction of the cost per step
(see FAST_* below and docs/benchmarks.md). A batch ends at the first step that does not
complete, or after FAST_BATCH_STEPS steps or FAST_BATCH_BUDGET, whichever comes first; the run
then goes on (or ends) exactly as it would have after that step alone. It is a choice of this run,
kept across continue-as-new, not part of the plan: it changes how the steps run, not what
they do, so the plan hash and task id do not depend on it. The default, ``"activity"``, shows
every step as its own activity in the Web UI and answers a halt within a step.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as TemporalTimeout

with workflow.unsafe.imports_passed_through():
    from tidemark.activity_names import ActivityName
    from tidemark.errors import END_STATES, InputError
    from tidemark.limits import ID_RE, LABEL_MAX, NOTE_MAX, cut, within
    from tidemark.needs import Act, Need, command, headline, need_of, sentence
    from tidemark.payloads import (
        AWAITING_APPROVAL,
        COMPLETED,
        FAILED,
        HALTED,
        KILLED,
        RUNNING,
        STOPPED,
        UNWOUND,
        VERIFICATION_FAILED,
        BoundaryInput,
        BoundaryOutcome,
        DecisionInput,
        HaltInput,
        Prepared,
        PrepareInput,
        RunEndInput,
        RunResult,
        StepBatchInput,
        StepBatchOutput,
        StepError,
        StepInput,
        StepOutput,
        TaskNeed,
    )
    from tidemark.words import Decision
    from workflows.needs_person import hold, release
    from workflows.outcome import ended
    from workflows.shared import (
        BOOKKEEPING_HEARTBEAT,
        BOOKKEEPING_RETRY,
        BOOKKEEPING_TIMEOUT,
        DECIDER_WAIT,
        DECISION_RETRY,
        GATE_PER_STEP,
        KILL_WAIT,
        NEEDS,
        NO_INPUT,
        STATE,
        STEP_HEARTBEAT,
        STEP_RETRY,
        STEP_START_TO_CLOSE,
        TASK_ID,
        already_set,
        decisions_queue,
        decoded,
        end_state_of,
        signal_note,
        signal_text,
    )


# Continue as new after this many steps. A step costs about 6 history events (activity
# scheduled/started/completed plus a workflow task), so a run stays near 1,500 events: far below
# Temporal's 51,200-event limit, and small enough that replaying it after a worker crash is quick.
STEPS_PER_RUN = 250
# The fast path records about 6 events per batch (up to FAST_BATCH_STEPS steps): 1,000 quick
# steps make about 100 events. Steps slower than the batch budget make one-step batches, so a
# run also continues as new once its history passes FAST_HISTORY_EVENTS.
FAST_STEPS_PER_RUN = 1000
FAST_HISTORY_EVENTS = 2000
EXECUTION_MODES = ("activity", "fast")
# A fast-path batch runs at most this many steps, and starts no step after this much time: a
# halt is seen between batches, so it waits at most the budget plus the one step under way.
FAST_BATCH_STEPS = 64
FAST_BATCH_BUDGET = timedelta(milliseconds=150)
# A batch is an activity, not a local activity: its end ends the workflow task, which is where
# signals (a halt, an approval) are delivered, and it heartbeats like a step does. A run of
# local activities keeps its workflow task open until the worker heartbeats that task, at 80%
# of the workflow task timeout (8 s by default), and forcing a workflow task between local
# activities costs a timer (about 1 s on the dev server: timers fire at a second's
# granularity) or an activity (more than the local activity saved). See docs/benchmarks.md.


@workflow.defn(name="RunPlan")
class RunPlan:
    def __init__(self) -> None:
        self._halt_reason: str | None = None
        self._halt_recorded = False
        self._result = RunResult(task_id="", state=RUNNING, steps=0, confirmed=0)
        self._current: int | None = None
        self._approval_news = False
        self._fast = False
        self._killed: dict[str, Any] | None = None
        self._unwinding: str | None = None
        self._releasing: asyncio.Task[None] | None = None
        self._began = False  # prepare returned: it journaled this run's beginning
        self._unread = False  # refused before it read a plan: it opens no worklist row
        self._waiting = False  # waits at the boundary for a person (or for a stop's release)
        self._approvers = ""  # who may decide the approval it asks for, in words (status query)
        self._release: str | None = None  # the release of the stop it waits under, if any

    async def _released(self) -> None:
        """Waits for the answer to the worklist release this run sent at its start.

        A new run sends the release of its task's worklist row and goes on to its first step
        without waiting; it waits here, before it opens a row or closes: a row it opens (hold)
        must reach the holder after the release, not cross it on the way, and Temporal drops a
        signal whose run closed before it was sent. A continue-as-new hop sends none."""
        if self._releasing is not None:
            await self._releasing

    @workflow.signal
    def kill(self, note: RawValue = NO_INPUT) -> None:
        """``tidemark kill`` announces itself before it terminates the run.

        The search attribute says ``killed`` at once (a terminated run cannot change it
        afterwards). The attempt under way may finish, so that its step is settled rather than
        left in doubt, and nothing after it starts. The run then waits for its termination. Any
        payload is taken (``{"by", "reason"}``, cut to the journal's limits; anything else:
        none)."""
        if self._killed is not None:
            return
        self._killed = dict(signal_note(note, "kill signal"))
        self._result.state = KILLED
        workflow.upsert_search_attributes([STATE.value_set(KILLED), NEEDS.value_set(Need.KILLED)])
        said = f"by {self._killed.get('by', '?')}: {self._killed.get('reason', '')}"
        self._show(KILLED, Need.KILLED,
                   sentence(self._result.task_id, KILLED, {"message": f"killed {said}"})
                   + f"\n\n**killed** {said}; the attempt under way may finish, nothing after "
                   "it starts")

    @workflow.signal
    def approval(self, decision: RawValue = NO_INPUT) -> None:
        """A person approved or rejected, and the run wakes to read the journal.

        ``tidemark approve`` / ``reject`` journal it first. The run reads the decision from the
        journal, which is what counts."""
        self._approval_news = True

    @workflow.update(name="approve", unfinished_policy=workflow.HandlerUnfinishedPolicy.ABANDON)
    async def approve_update(self, request: dict[str, Any] | None = None) -> dict[str, Any]:
        """Approves the run's irreversible steps from Temporal's side.

        It does what ``tidemark approve`` does (``temporal workflow update execute --name
        approve --workflow-id tidemark-T --input '{"by": "ana", "note": "checked"}'``, or the
        Web UI's update form). A decider records it under its login role in the journal, which
        may refuse it. The answer is what the journal committed, or why it refused."""
        return await self._decided(Decision.APPROVE, request)

    @approve_update.validator
    def _validate_approve(self, request: dict[str, Any] | None = None) -> None:
        self._check_decision(request)

    @workflow.update(name="reject", unfinished_policy=workflow.HandlerUnfinishedPolicy.ABANDON)
    async def reject_update(self, request: dict[str, Any] | None = None) -> dict[str, Any]:
        """Rejects the run's irreversible steps (as ``tidemark reject``); see approve."""
        return await self._decided(Decision.REJECT, request)

    @reject_update.validator
    def _validate_reject(self, request: dict[str, Any] | None = None) -> None:
        self._check_decision(request)

    def _check_decision(self, request: Any) -> None:
        """Refuses at once an update this run cannot take.

        That is when it waits for no approval now, or its input is not ``{"by"?, "note"?}`` of
        strings within the journal's lengths."""
        if not (self._waiting and self._result.state == AWAITING_APPROVAL):
            raise ApplicationError(
                f"tidemark-{self._result.task_id} is {self._result.state}, not waiting for "
                "approval; nothing was decided", type="NotWaiting", non_retryable=True)
        limits = {"by": LABEL_MAX, "note": NOTE_MAX}
        if request is not None and (
                not isinstance(request, dict) or set(request) - set(limits)
                or any(not isinstance(v, str) or len(v) > limits[k]
                       for k, v in request.items())):
            raise ApplicationError(
                f'the input is {{"by": NAME, "note": TEXT}}, both optional strings, by at most '
                f"{LABEL_MAX} characters and note at most {NOTE_MAX}; nothing "
                "was decided", type="BadInput", non_retryable=True)

    async def _decided(self, decision: str, request: dict[str, Any] | None) -> dict[str, Any]:
        """Has a decider record the decision in the journal; wakes the run on success."""
        req = request or {}
        inp = DecisionInput(self._result.task_id, decision, str(req.get("by") or ""),
                            str(req.get("note") or ""))
        try:
            done: dict[str, Any] = await workflow.execute_activity(
                ActivityName.RECORD_DECISION, inp, result_type=dict,
                task_queue=decisions_queue(workflow.info().task_queue),
                schedule_to_start_timeout=DECIDER_WAIT,
                start_to_close_timeout=BOOKKEEPING_TIMEOUT, retry_policy=DECISION_RETRY,
                summary=f"{decision}, recorded by a decider")
        except ActivityError as e:
            raise ApplicationError(_decider_refusal(e, self._result.task_id),
                                   type="DecisionRefused", non_retryable=True) from None
        self._approval_news = True
        return done

    @workflow.signal
    def unwinding(self, unwind_workflow_id: RawValue = NO_INPUT) -> None:
        """An unwind of this task began (UnwindPlan sends it once the task is stopped).

        A run that waits for a person at the boundary ends ``stopped`` instead of waiting for
        ever for a decision that can no longer come. A run between steps needs no word: its next
        step meets the stop state."""
        self._unwinding = signal_text(unwind_workflow_id, "unwinding signal", LABEL_MAX) \
            or "an unwind"

    @workflow.signal
    def recheck(self, by: RawValue = NO_INPUT) -> None:
        """A person stopped or released the task; a waiting run checks again.

        The commands are `tidemark stop` and `release` (tools/operate/rows.py). A run waiting at
        the boundary runs its gate again and reads the stop state, so that its state and
        TidemarkNeeds say what holds it (stopped, or approval once released). A run at work
        meets the stop before its next step by itself."""
        if self._waiting:
            self._approval_news = True

    @workflow.signal
    def halt(self, reason: RawValue = NO_INPUT) -> None:
        """Stop the task durably.

        The attempt under way finishes, nothing after it starts, and a step that keeps failing
        stops at its next attempt. Whatever the payload: a reason that is not a string, too long
        or not decodable halts all the same. The reason is made one line the journal holds
        (workflows.shared.signal_text)."""
        self._halt_reason = signal_text(reason, "halt signal") or "halt signal"

    @workflow.query
    def status(self) -> dict[str, Any]:
        r = self._result
        return {"task_id": r.task_id, "state": r.state, "current_step": self._current,
                "steps": r.steps, "confirmed": r.confirmed, "executed": r.executed,
                "resolved_by_probe": r.resolved_by_probe, "skipped": r.skipped,
                "halt_requested": self._halt_reason, "killed": self._killed,
                "execution": "fast" if self._fast else "activity",
                "approvers": self._approvers}

    @workflow.run
    async def run(self, document: RawValue = NO_INPUT) -> RunResult:
        """Completes only when every step is done; every other end fails the workflow.

        It fails with the typed error that carries the RunResult (workflows/outcome.py), so the
        Web UI tells the runs that need a person from the finished ones. The input is decoded
        here (workflows.shared.decoded): an input that cannot be ends the run at once."""
        result = await self._run(document)
        await self._released()
        state, need = result.state, need_of(result.state, result.error)
        said = sentence(result.task_id, result.state, result.error,
                        f"{result.confirmed}/{result.steps} steps confirmed")
        # A run whose prepare journaled its beginning journals its end when it ends other
        # than completed (record_run_end), before it opens a worklist row: from the journal
        # alone, `tidemark inbox` and `status` then tell a task nothing runs (its stop
        # released since, say) from one whose run goes on between steps.
        journaled = self._began and result.state != COMPLETED
        if journaled and self._killed is None:
            word = await self._journal_end(result)
            # The row says what the journal says, as `tidemark inbox` and `status` do: a
            # stopped task whose stop is a halt asks for its resume, a task whose every step
            # is done needs nobody. Only where the journal reads a run going on (an attempt
            # still under its lease) does the run's own word stand.
            if word.need != Need.NOTHING or word.settled:
                state, need, said = word.state, Need(word.need), word.sentence
        if need != Need.NOTHING and self._unwinding is not None:
            # Its task's unwind began while it ran (UnwindPlan told it before it released the
            # row): whatever ended the run, the unwind says what the task needs, in the row
            # it opens if it does not finish. Once the unwind ended, the journal's word is the
            # unwind's too; while it still works, the run's word (stopped) would be wrong.
            need = Need.NOTHING
        # A run refused before it read a plan opens no row: it names no task, only its
        # workflow id does, and a row under that id would speak for a task the journal may
        # hold and know better.
        if need != Need.NOTHING and result.task_id and not self._unread:
            await hold(result.task_id, state, need, said)
        if self._killed is not None:
            # Ended by `tidemark kill`, which terminates the run as soon as it took the kill
            # signal (--grace 0): the row opened first, and the kill journals the end of a run
            # it terminated before this. Waiting for it is what makes the run end Terminated,
            # as a killed run should, rather than Failed.
            if journaled:
                await self._journal_end(result)
            await workflow.sleep(KILL_WAIT)
        return ended(result)

    async def _journal_end(self, result: RunResult) -> TaskNeed:
        """Journals the run's end (record_run_end).

        Returns what the journal then says the task needs."""
        word: TaskNeed = await workflow.execute_activity(
            ActivityName.RECORD_RUN_END, RunEndInput(result.task_id, result.state, result.error,
                                                     result.confirmed, result.steps),
            result_type=TaskNeed, start_to_close_timeout=BOOKKEEPING_TIMEOUT,
            heartbeat_timeout=BOOKKEEPING_HEARTBEAT,
            retry_policy=BOOKKEEPING_RETRY, summary=f"journal the run's end: {result.state}")
        return word

    async def _run(self, document: Any) -> RunResult:
        """The run's phases, in the order their commands enter the history.

        Read the input. Prepare: persist the plan, read the journal and the stop state, describe
        the window of steps this run takes. Run them (in batches on the fast path). Then
        continue as new or complete. Each phase returns the run's end when it ends the run."""
        try:
            read: Any = decoded(document, "input")
        except InputError as e:
            read = e
        execution = self._read_input(read)
        if isinstance(execution, RunResult):
            return execution
        prep = await self._prepare(read)
        if isinstance(prep, RunResult):
            return prep
        first = prep.next_step
        assert first is not None  # _prepare ended a run with nothing left to do
        last = min(prep.step_count, first + self._window() - 1)
        lines = prep.lines  # prepare describes the window of a run that goes on
        assert lines is not None
        reached = await self._run_window(prep, first, last, lines)
        if isinstance(reached, RunResult):
            return reached
        return await self._after_window(prep, reached, execution)

    def _window(self) -> int:
        """The most steps this run takes before it continues as new."""
        return FAST_STEPS_PER_RUN if self._fast else STEPS_PER_RUN

    def _read_input(self, document: Any) -> str | RunResult:
        """The execution mode the input asks for, or the run's end.

        The end is ``failed``, a PlanError, with nothing persisted. It comes for an input that
        is not a plan object, could not be decoded (an InputError) or names no known mode. The
        run's task id (its worklist row's) is the one the input names. For an input that is not
        an object it is the one its workflow id names, and only when the journal could hold it:
        else the run opens no row."""
        wid = workflow.info().workflow_id
        named = document.get("task_id") if isinstance(document, dict) else \
            wid.removeprefix("tidemark-") if wid.startswith("tidemark-") else None
        task_id = named if isinstance(named, str) and ID_RE.fullmatch(named) else ""
        self._result.task_id = task_id
        if not isinstance(document, dict):
            self._unread = True
            if task_id:
                workflow.upsert_search_attributes([TASK_ID.value_set(task_id)])
            message = (str(document) if isinstance(document, InputError) else
                       "the input must be a plan object {task_id?, steps} or {task_id} of a "
                       f"stored plan, not {type(document).__name__}")
            return self._end(FAILED, {"type": "PlanError", "message": message, "step": None})
        execution = document.get("execution", "activity")
        if execution not in EXECUTION_MODES:
            self._unread = True
            return self._end(FAILED, {"type": "PlanError", "message":
                                      f"execution must be one of {', '.join(EXECUTION_MODES)}, "
                                      f"not {execution!r}", "step": None})
        self._fast = execution == "fast"
        return str(execution)

    async def _prepare(self, document: dict[str, Any]) -> Prepared | RunResult:
        """Persists the plan and reads the journal and the stop state.

        The plan's gates are checked on a new start, not on a continue-as-new hop. Returns the
        prepared task, or the run's end when the task was unwound, is stopped, or has no step
        left."""
        # Only a continue-as-new hop carries counts and skips the plan gates; an input that
        # merely says "continued" is a new start like any other.
        hop = workflow.info().continued_run_id is not None
        carried = (document.get("continued") or {}) if hop else {}
        try:
            prep: Prepared = await workflow.execute_activity(
                ActivityName.PREPARE, PrepareInput({k: v for k, v in document.items()
                                                    if k not in ("continued", "execution")},
                                                   check_gates=not hop,
                                                   workflow_id=workflow.info().workflow_id,
                                                   parent_workflow_id=self._parent_id(),
                                                   window=self._window(), boundary=not hop,
                                                   release=not hop),
                result_type=Prepared, start_to_close_timeout=BOOKKEEPING_TIMEOUT,
                heartbeat_timeout=BOOKKEEPING_HEARTBEAT,
                retry_policy=BOOKKEEPING_RETRY, summary="persist plan, read journal and stop state")
        except ActivityError as e:
            return self._end_on(e, step=None)
        self._began = True
        r = self._result
        r.task_id, r.steps, r.confirmed = prep.task_id, prep.step_count, prep.confirmed
        r.executed = carried.get("executed", 0)
        r.resolved_by_probe = carried.get("resolved_by_probe", 0)
        r.skipped = carried.get("skipped", 0)
        shown = [TASK_ID.value_set(prep.task_id), STATE.value_set(
            KILLED if self._killed is not None else RUNNING), NEEDS.value_set(
            Need.KILLED if self._killed is not None else Need.NOTHING)]
        # A new start whose starter gave these very values (start_attributes) needs no upsert.
        # A hop's values were carried over from the run before, and its history (recorded
        # before starters gave any) holds the upsert: it stays.
        if hop or not already_set(shown):
            workflow.upsert_search_attributes(shown)
        if self._killed is None:
            self._show(RUNNING, Need.NOTHING, f"{prep.step_count} steps, {prep.confirmed} "
                       "confirmed before this run")
        if not hop and not prep.released:
            # A new run of the task: its worklist row, if any, closes (_released). Prepare
            # closed it already on a worker that can (Prepared.released).
            self._releasing = asyncio.create_task(
                release(prep.task_id, workflow.info().workflow_id))
        if prep.unwound:
            return self._end(UNWOUND, {"type": "TaskUnwound", "message":
                                       f"task {prep.task_id!r} was unwound; it does not run "
                                       "again (a new plan needs a new task id)"})
        line = prep.release or command(Act.RELEASE, prep.task_id)  # of the stop, if any
        if prep.stopped is not None:
            return self._end(STOPPED, {"type": "TaskStopped", "message":
                                       f"task is stopped ({prep.stopped}); release it with "
                                       f"`{line}`"}, release=line)
        if prep.next_step is None:  # finished earlier, or failed earlier: act on nothing
            return self._end(FAILED) if prep.failed else await self._complete(prep)
        return prep

    async def _run_window(self, prep: Prepared, first: int, last: int,
                          lines: list[str]) -> RunResult | int:
        """Runs steps ``first``..``last``, and returns the run's end or the last step done.

        On the fast path the steps run in batches, else one activity per step."""
        if self._fast:
            return await self._run_batches(prep, first, last, lines)
        for step in range(first, last + 1):
            ended_at = await self._run_one(prep, step, lines[step - first])
            if ended_at is not None:
                return ended_at
        return last

    async def _run_one(self, prep: Prepared, step: int, line: str) -> RunResult | None:
        """One step as its own activity.

        The kill, a halt and the irreversible boundary are checked before it starts. Returns the
        run's end, or None to go on."""
        if self._killed is not None:
            return self._end(KILLED)
        if self._halt_reason is not None:
            return await self._halt(step)
        # A history from before the boundary existed has no first_irreversible in its
        # prepare result (None), so its replay schedules no boundary activity.
        if step == prep.first_irreversible:
            held = await self._boundary(prep.task_id, step, prep.step_count,
                                        given=_taken(prep))
            if held is not None:
                return held
        self._current = step
        r = self._result
        self._show(
            RUNNING, Need.NOTHING, f"**step {step}/{prep.step_count}** {line}\n\n"
            f"{r.confirmed} confirmed, {r.executed} executed, {r.resolved_by_probe} "
            "resolved by probe in this run")
        attempt = workflow.start_activity(
            ActivityName.RUN_STEP, StepInput(prep.task_id, step), result_type=StepOutput,
            start_to_close_timeout=STEP_START_TO_CLOSE, heartbeat_timeout=STEP_HEARTBEAT,
            retry_policy=STEP_RETRY, summary=f"{step}/{prep.step_count} {line}"[:400])
        # A halt that arrives while the step runs is written at once: the attempt under
        # way finishes, but a step that keeps failing (its target is down) meets the stop
        # state at its next attempt instead of retrying until the target is back.
        await workflow.wait_condition(
            lambda a=attempt: a.done() or self._halt_unrecorded())  # type: ignore[misc]
        if not attempt.done():
            await self._record_halt(step)
        try:
            out: StepOutput = await attempt
        except (ActivityError, ApplicationError) as e:
            if _approval_required(e):
                # The journal refused the irreversible intent: no approval holds in the task's
                # current epoch (a stop, kill or release since voided it). Ask again, then the
                # step again.
                held = await self._boundary(prep.task_id, step, prep.step_count)
                return held if held is not None else await self._run_one(prep, step, line)
            return await self._failed(e, step)
        if out.status == "failed":
            if self._halt_unrecorded():
                await self._record_halt(step)
            return self._end(FAILED, {"type": "StepFailed", "step": step})
        self._count(out)
        return None

    async def _after_window(self, prep: Prepared, last: int, execution: str) -> RunResult:
        """After the window's last step: continue as new, or complete.

        The run continues as new while steps are left (unless a kill or a halt came meanwhile),
        else it completed."""
        self._current = None
        if last < prep.step_count:
            if self._killed is not None:
                return self._end(KILLED)
            if self._halt_reason is not None:
                return await self._halt(last + 1)
            await self._released()  # the next run sends none
            r = self._result
            workflow.continue_as_new({"task_id": prep.task_id, "execution": execution,
                                      "continued": {
                "executed": r.executed, "resolved_by_probe": r.resolved_by_probe,
                "skipped": r.skipped}})
        return await self._complete(prep)

    async def _complete(self, prep: Prepared) -> RunResult:
        """Every step is done: the run completes once the verification at the end holds.

        It verifies the steps it can check cheaply (the last step of each target the plan set
        more than once: verify_end, tidemark/boundary.py), and ends verification_failed, never
        completed, when a target shows an earlier step's state. A plan that sets no target
        twice has nothing to verify there (Prepared.verify_end): it completes."""
        if not prep.verify_end:
            return self._end(COMPLETED)
        task_id, count = prep.task_id, prep.step_count
        self._show(RUNNING, Need.NOTHING,
                   f"**verifying** the targets steps 1-{count} set more than once")
        try:
            out: BoundaryOutcome = await workflow.execute_activity(
                ActivityName.VERIFY_END, BoundaryInput(task_id, count + 1),
                result_type=BoundaryOutcome,
                start_to_close_timeout=STEP_START_TO_CLOSE + GATE_PER_STEP * count,
                heartbeat_timeout=STEP_HEARTBEAT, retry_policy=STEP_RETRY,
                summary=f"verify the end of steps 1-{count}")
        except ActivityError as e:
            return self._end_on(e, None)
        if not out.passed:
            return self._end(VERIFICATION_FAILED, {
                "type": "VerificationFailed", "message": out.summary, "step": None,
                "failures": out.failures})
        return self._end(COMPLETED)

    def _count(self, out: StepOutput) -> None:
        r = self._result
        r.confirmed += 1  # a skipped step was settled during this run by a live twin
        if out.skipped:
            r.skipped += 1
        elif out.resolved_by == "probe":
            r.resolved_by_probe += 1
        else:
            r.executed += 1

    async def _run_batches(self, prep: Prepared, first: int, last: int,
                           lines: list[str]) -> RunResult | int:
        """The fast path: steps ``first``..``last`` in batches.

        Returns the run's end, or the last step it completed (``last``, or fewer when the
        history grew long first). Each batch is one activity. A halt that arrives meanwhile is
        recorded at once, and the batch meets the stop state at its next step; the run goes on
        where the batch ended."""
        count, step = prep.step_count, first
        while step <= last:
            if self._killed is not None:
                return self._end(KILLED)
            if self._halt_reason is not None:
                return await self._halt(step)
            if step == prep.first_irreversible:
                held = await self._boundary(prep.task_id, step, count, given=_taken(prep))
                if held is not None:
                    return held
            end = last  # a batch never crosses the boundary: it must run first
            if prep.first_irreversible is not None and step < prep.first_irreversible:
                end = min(last, prep.first_irreversible - 1)
            self._current = step
            r = self._result
            self._show(
                RUNNING, Need.NOTHING, f"**steps {step}-{end}/{count}** (a batch ends within "
                f"{FAST_BATCH_STEPS} steps or {FAST_BATCH_BUDGET.total_seconds():g} s) "
                f"{lines[step - first]}\n\n{r.confirmed} confirmed, {r.executed} executed, "
                f"{r.resolved_by_probe} resolved by probe in this run")
            attempt = workflow.start_activity(
                ActivityName.RUN_STEPS, StepBatchInput(prep.task_id, step, end, FAST_BATCH_STEPS,
                                                       FAST_BATCH_BUDGET.total_seconds()),
                # every step but the last ended within the budget; the last may take a step's time
                result_type=StepBatchOutput,
                start_to_close_timeout=STEP_START_TO_CLOSE + FAST_BATCH_BUDGET,
                heartbeat_timeout=STEP_HEARTBEAT, retry_policy=STEP_RETRY,
                summary=f"steps {step}-{end}/{count}, from {lines[step - first]}"[:400])
            await workflow.wait_condition(
                lambda a=attempt: a.done() or self._halt_unrecorded())  # type: ignore[misc]
            if not attempt.done():
                await self._record_halt(step)
            try:
                out: StepBatchOutput = await attempt
            except (ActivityError, ApplicationError) as e:
                if _approval_required(e):
                    held = await self._reask(prep, step)
                    if held is not None:
                        return held
                    continue
                return await self._failed(e, step)
            r.confirmed += out.ran - (out.failed is not None)
            r.executed += out.executed
            r.resolved_by_probe += out.resolved_by_probe
            r.skipped += out.skipped
            if out.failed is not None:
                if self._halt_unrecorded():
                    await self._record_halt(out.failed)
                return self._end(FAILED, {"type": "StepFailed", "step": out.failed})
            step += out.ran
            if out.error is not None:
                failure = _as_failure(out.error)
                if _approval_required(failure):  # as on the activity path: ask again
                    held = await self._reask(prep, step)
                    if held is not None:
                        return held
                    continue
                if failure.non_retryable or failure.type in END_STATES:
                    return await self._failed(failure, out.error.step)
                # Retried as the step alone would be: after the retry policy's first interval
                # (a durable timer, so a halt is delivered meanwhile), by a batch it begins.
                await workflow.sleep(STEP_RETRY.initial_interval or timedelta(seconds=1))
            if workflow.info().get_current_history_length() > FAST_HISTORY_EVENTS:
                return step - 1
        return last

    async def _reask(self, prep: Prepared, step: int) -> RunResult | None:
        """Meets the boundary again after the journal asked for an approval.

        The journal refused step ``step``'s irreversible intent for want of an approval. The
        next batch passes the boundary anyway when ``step`` is the first irreversible one.
        Returns the run's end, or None to go on."""
        if step == prep.first_irreversible:
            return None
        return await self._boundary(prep.task_id, step, prep.step_count)

    async def _failed(self, e: ActivityError | ApplicationError, step: int) -> RunResult:
        """The run's end after a step's typed failure, with a halt that came meanwhile."""
        state, error = end_state_of(e, step)
        if self._halt_reason is not None:
            # Whatever ended the run, the stop a person asked for must hold.
            if self._halt_unrecorded():
                await self._record_halt(step)
            if error["type"] == "TaskStopped":  # it met the halt's own stop state
                state, error = HALTED, {"type": "Halted", "message": self._halt_reason,
                                        "step": step}
                self._result.stopped_at = step
        return self._end(state, error)

    @staticmethod
    def _parent_id() -> str | None:
        parent = workflow.info().parent
        return parent.workflow_id if parent is not None else None

    async def _boundary(self, task_id: str, step: int, count: int,
                        given: BoundaryOutcome | None = None) -> RunResult | None:
        """The irreversible boundary (tidemark/boundary.py).

        The verification gate and the plan gates, then a person's approval if the plan asks for
        one. Not a numbered step: keys and step numbers do not move. Returns the run's end, or
        None to go on. ``given``: the outcome prepare checked a moment ago (Prepared.boundary),
        taken instead of the activity's the first time round.

        After a decision arrives the gate runs once more: the world may have changed while
        the run waited, and a gate is never trusted from earlier."""
        self._current = step
        # A run waiting for approval that reads a stop (`tidemark stop` sends it ``recheck``)
        # waits on, saying it is stopped, and asks for the approval again once released; a run
        # that arrives at the boundary stopped ends ``stopped``.
        waited = False
        while True:
            if given is not None:
                out, given = given, None
            else:
                out_or_end = await self._reach_boundary(task_id, step, count)
                if isinstance(out_or_end, RunResult):
                    return out_or_end
                out = out_or_end
            if self._killed is not None:
                return self._end(KILLED)
            if not out.passed:
                return self._end(VERIFICATION_FAILED, {
                    "type": "VerificationFailed", "message": out.summary, "step": step,
                    "failures": out.failures, **({"failed": out.failed} if out.failed else {})})
            if self._halt_reason is not None:
                return await self._halt(step)
            if out.decision == "reject":
                self._result.stopped_at = step
                return self._end(STOPPED, {
                    "type": "Rejected", "step": step, "message":
                    f"{out.decided_by} rejected the irreversible steps; nothing from step "
                    f"{step} on was attempted. Unwind with `{command(Act.UNWIND, task_id)}`"})
            release = out.release or command(Act.RELEASE, task_id)
            if out.stopped is not None and not waited:
                return self._end(STOPPED, {"type": "TaskStopped", "step": step, "message":
                                           f"task is stopped ({out.stopped}); release it with "
                                           f"`{release}`"}, release=release)
            if out.stopped is None and (not out.approval_required or out.decision == "approve"):
                if self._result.state != RUNNING:
                    self._result.state = RUNNING
                    workflow.upsert_search_attributes([STATE.value_set(RUNNING),
                                                       NEEDS.value_set(Need.NOTHING)])
                return None
            if out.stopped is not None:
                # Stopped while it waited (`tidemark stop` told it): it waits on, its
                # irreversible steps held back by the stop as a run at work is held before its
                # next step; released, it asks for the approval again.
                self._result.state = STOPPED
                self._release = release
                self._show(STOPPED, Need.STOPPED,
                    f"Task {task_id} is stopped ({out.stopped}) while it waits for approval of "
                    f"its irreversible steps from step {step}/{count}; `{release}` lets it ask "
                    "for the approval again, "
                    f"`{command(Act.UNWIND, task_id)}` puts its reversible steps back.",
                    line=release)
                workflow.upsert_search_attributes([STATE.value_set(STOPPED),
                                                   NEEDS.value_set(Need.STOPPED)])
            else:
                self._ask(task_id, step, count, out)
            ended = await self._wait_for_person(task_id, step)
            if ended is not None:
                return ended
            waited = True

    async def _reach_boundary(self, task_id: str, step: int,
                              count: int) -> BoundaryOutcome | RunResult:
        """The boundary activity's outcome before ``step``, or the run's end if it failed."""
        self._show(self._result.state, need_of(self._result.state),
                   f"**verifying** the reversible steps before irreversible step "
                   f"{step}/{count}",
                   line=self._release if self._result.state == STOPPED else None)
        try:
            out: BoundaryOutcome = await workflow.execute_activity(
                ActivityName.REACH_BOUNDARY, BoundaryInput(task_id, step),
                result_type=BoundaryOutcome,
                start_to_close_timeout=STEP_START_TO_CLOSE + GATE_PER_STEP * (step - 1),
                heartbeat_timeout=STEP_HEARTBEAT, retry_policy=STEP_RETRY,
                summary=f"boundary before step {step}/{count}: "
                        + (f"verify steps 1-{step - 1}, " if step > 1 else "")
                        + "plan gates, approval")
        except ActivityError as e:
            return self._end_on(e, step)
        return out

    def _ask(self, task_id: str, step: int, count: int, out: BoundaryOutcome) -> None:
        """The run waits for approval: its state, need and details say what it asks."""
        self._result.state = AWAITING_APPROVAL
        waiting = max(out.waiting, len(out.irreversible))  # results from before: all listed
        who = (", ".join(out.approvers) if out.approvers
               else "any member of tidemark_approver")
        self._approvers = who
        listed = within(out.irreversible)
        more = waiting - len(listed)
        self._show(
            AWAITING_APPROVAL, Need.APPROVAL,
            f"Task {task_id} waits for approval of its irreversible steps from step "
            f"{step}/{count}" + (f", first {out.irreversible[0]}" if out.irreversible
                                 else "") + f" — `{command(Act.APPROVE, task_id)}` or "
            f"`{command(Act.REJECT, task_id)}`, by a database role the journal lets decide: "
            f"{who}.\n\n**awaiting approval** ({out.summary})"
            + (f"; {out.why}" if out.why else "") + "."
            + (f"\n\n**In all:** {out.glance}" if out.glance else "")
            + "\n\nThe irreversible steps will do:\n\n"
            + "\n".join(f"- {line}" for line in listed)
            + (f"\n- … and {more} more irreversible steps (`tidemark status {task_id}` lists "
               "every one)" if more else ""))
        workflow.upsert_search_attributes([STATE.value_set(AWAITING_APPROVAL),
                                           NEEDS.value_set(Need.APPROVAL)])

    async def _wait_for_person(self, task_id: str, step: int) -> RunResult | None:
        """Waits at the boundary for news.

        A decision or a stop's change to read returns None: the gate runs again. A kill, a halt
        or the task's unwind returns the run's end."""
        self._waiting = True
        await workflow.wait_condition(
            lambda: self._approval_news or self._halt_reason is not None
            or self._killed is not None or self._unwinding is not None)
        self._waiting = False
        if self._killed is not None:
            return self._end(KILLED)
        if self._halt_reason is not None:
            return await self._halt(step)
        if self._unwinding is not None:
            return self._end_unwinding(task_id, step)
        self._approval_news = False
        return None

    def _end_unwinding(self, task_id: str, step: int) -> RunResult:
        """The end of a run that waited at the boundary when its task's unwind began.

        The task is stopped (the unwind requires it) and its reversible steps are being put
        back, so the irreversible ones never run."""
        self._result.stopped_at = step
        return self._end(STOPPED, {
            "type": "Unwinding", "step": step, "message":
            f"{self._unwinding} puts the reversible steps back; nothing from step {step} on "
            f"was attempted, and task {task_id} does not run forward"})

    async def _halt(self, next_step: int) -> RunResult:
        if self._halt_unrecorded():
            await self._record_halt(next_step)
        self._result.stopped_at = next_step
        return self._end(HALTED, {"type": "Halted", "message": self._halt_reason})

    def _halt_unrecorded(self) -> bool:
        return self._halt_reason is not None and not self._halt_recorded

    async def _record_halt(self, next_step: int) -> None:
        self._halt_recorded = True
        await workflow.execute_activity(
            ActivityName.RECORD_HALT,
            HaltInput(self._result.task_id, self._halt_reason or "halt signal"),
            start_to_close_timeout=BOOKKEEPING_TIMEOUT,
            heartbeat_timeout=BOOKKEEPING_HEARTBEAT, retry_policy=BOOKKEEPING_RETRY,
            summary=cut(f"halt before step {next_step}: {self._halt_reason}", 200))
        self._result.stopped_at = next_step

    def _end_on(self, e: ActivityError, step: int | None) -> RunResult:
        return self._end(*end_state_of(e, step))

    def _show(self, state: str, need: Need, body: str, *, line: str | None = None,
              step: int | str | None = None, progress: str = "") -> None:
        """The run's current details: its state, need and command first, then ``body``.

        The Web UI shows them on the run's page (tidemark.needs.headline)."""
        workflow.set_current_details(
            headline(self._result.task_id, state, need, line=line, step=step,
                     progress=progress) + "\n\n" + body)

    def _end(self, state: str, error: dict[str, Any] | None = None, *,
             release: str | None = None) -> RunResult:
        if self._killed is not None:
            # Whatever ended the run after the kill (most often its next step meeting the stop
            # state `killed`), the run was killed: that is its state, the rest is the detail.
            k = self._killed
            error = {"type": "Killed", "message": f"killed by {k.get('by', '?')}: "
                     f"{k.get('reason', '')}", "step": (error or {}).get("step"),
                     **({"then": error} if error and state != KILLED else {})}
            state = KILLED
        self._current = None
        self._result.state = state
        self._result.error = error or {}
        r = self._result
        self._show(state, need_of(state, error),
                   sentence(r.task_id, state, error, f"{r.confirmed}/{r.steps} steps confirmed")
                   + (f"\n\n{error.get('type')}: {error.get('message')}" if error else ""),
                   line=release if state == STOPPED else None,
                   step=(error or {}).get("step"),
                   progress=f"{r.confirmed}/{r.steps} steps confirmed")
        workflow.upsert_search_attributes([STATE.value_set(state),
                                           NEEDS.value_set(need_of(state, error))])
        return self._result


def _decider_refusal(e: ActivityError, task_id: str) -> str:
    """Why a decision sent as an update was not recorded.

    The journal's line, or that no decider took it."""
    cause = e.cause
    if isinstance(cause, ApplicationError):
        return cause.message
    if isinstance(cause, TemporalTimeout):
        return (f"no decider took the decision within {DECIDER_WAIT.total_seconds():g} s: run "
                "`tidemark decider` with an approver's DATABASE_URL for this task queue, or "
                f"`{command(Act.APPROVE, task_id)}`; nothing was decided")
    return f"the decider failed: {cause}; nothing was decided"


def _taken(prep: Prepared) -> BoundaryOutcome | None:
    """The boundary's outcome prepare checked (Prepared.boundary), given out once.

    The boundary met again later (after an approval the journal asked for) is checked anew."""
    given, prep.boundary = prep.boundary, None
    return given


def _approval_required(e: ActivityError | ApplicationError) -> bool:
    """Whether a step failed because the journal wanted an approval.

    That is, the journal refused its irreversible intent for want of an approval in the task's
    current epoch (tidemark.errors.ApprovalRequired)."""
    cause = e.cause if isinstance(e, ActivityError) else e
    return isinstance(cause, ApplicationError) and cause.type == "ApprovalRequired"


def _as_failure(error: StepError) -> ApplicationError:
    """A step's error reported by a batch, as the failure the step alone would have raised."""
    return ApplicationError(error.message, error.details, type=error.type,
                            non_retryable=error.non_retryable)
