"""The Temporal activities around the journal.

They prepare a run, describe steps, run one step, and record a halt. They are synchronous (see
tidemark.store), on the worker's thread pool, except run_step: a coroutine whose blocking parts
run on the worker's step threads (tidemark.step_threads). A step borrows a pooled connection
only for each journal statement, never across its action's call.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, ParamSpec, Protocol, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from activities.acting import acting_for
from tidemark import metrics, needs_journal, series
from tidemark.actions import Registry
from tidemark.activity_names import ActivityName
from tidemark.boundary import may_set_a_target_twice, sets_a_target_twice
from tidemark.errors import (
    ActionNotConfigured,
    ActionUnavailable,
    InputError,
    InvariantViolation,
    JournalMismatch,
    PartlyUnwound,
    PlanChanged,
    PlanError,
    PreconditionFailed,
    StepFailed,
    Throttled,
    TidemarkError,
    UnknownTask,
    one_line,
)
from tidemark.faults import crash_point
from tidemark.grants import GrantBroker, revoke_task_grants
from tidemark.limits import ID_RE, LABEL_MAX, REASON_MAX, cut
from tidemark.needs import release_of
from tidemark.payloads import (
    BoundaryOutcome,
    HaltInput,
    Prepared,
    PrepareInput,
    RunEndInput,
    StepBatchInput,
    StepBatchOutput,
    StepError,
    StepInput,
    StepOutput,
    TaskNeed,
    UndoOutput,
    UnwindPlanned,
    UnwoundInput,
)
from tidemark.plan import Step, load_plan
from tidemark.run_step import (
    StepResult,
    check_stored_plan_gates,
    run_step_async,
    run_steps,
)
from tidemark.step_threads import StepThreads
from tidemark.store import JournalStore
from tidemark.unwind import unwind_step
from tidemark.words import (
    ControlState,
    EventKind,
    GrantPurpose,
    ResolvedBy,
    StepStatus,
    TaskState,
)

log = logging.getLogger(__name__)

# How often a running step tells Temporal it is alive. Well under the workflow's heartbeat
# timeout (STEP_HEARTBEAT, 2 s), so that only a dead worker misses it: the SDK sends the latest
# beat every 80% of that timeout, so a beat must be pending by then; at 0.5 s, this thread may be
# held up for more than a second (GIL, a loaded machine) before the server misses one.
HEARTBEAT_EVERY_S = 0.5
# A step's line (the Web UI's details, an activity's summary, which the Web UI cuts at 400):
# a window of FAST_STEPS_PER_RUN of them (1,000) stays a small payload.
LINE_CHARS = 200


# Our errors that say the journal broke a rule of its own: a bug, whose trace must be seen. Every
# other TidemarkError is an outcome the design expects (a step busy, a task stopped or killed, an
# approval asked, a target refusing): one log line says it, and the SDK logs the activity's
# failure at DEBUG only (the BENIGN category), so no traceback buries the log.
BUGS = (InvariantViolation, JournalMismatch)


def outcome_category(e: TidemarkError) -> ApplicationErrorCategory:
    """The category of ``e``'s ApplicationError; for an expected outcome, logs its one line."""
    if isinstance(e, BUGS):
        return ApplicationErrorCategory.UNSPECIFIED
    where = ""
    if activity.in_activity():
        info = activity.info()
        where = f"{info.workflow_id} {info.activity_type} attempt {info.attempt}: "
    log.info("%s%s: %s", where, type(e).__name__, one_line(str(e)))
    return ApplicationErrorCategory.BENIGN


def _as_application_error(e: TidemarkError) -> ApplicationError:
    """Carries our error class across to the workflow by name, with its fields."""
    # A target that turned a request away says when to come back: the next attempt waits that
    # long rather than the retry policy's shorter first intervals.
    after = e.retry_after if isinstance(e, Throttled) else None
    return ApplicationError(str(e), e.details(), type=type(e).__name__,
                            non_retryable=not e.retryable,
                            next_retry_delay=timedelta(seconds=after) if after else None,
                            category=outcome_category(e))


def _count_stop(e: BaseException) -> None:
    """Counts a run that ends waiting for a person, under the reason its error declares."""
    if isinstance(e, TidemarkError) and e.stop_reason is not None:
        metrics.task_stopped(e.stop_reason)


def _plan_error(message: str) -> ApplicationError:
    return ApplicationError(message, type="PlanError", non_retryable=True)


def _check_workflow_id(workflow_id: str | None, task_id: str) -> None:
    """Refuses any workflow id but ``tidemark-<task_id>``.

    The run that acts on a task is ``tidemark-<task_id>``, so that halt, resume and the runbook
    always address it. Any other id is refused before anything is persisted."""
    if workflow_id is not None and workflow_id != f"tidemark-{task_id}":
        raise _plan_error(f"workflow id {workflow_id!r} does not match the task: start task "
                          f"{task_id!r} as workflow id 'tidemark-{task_id}'")


# The errors of a start refused before its plan was stored: the plan, its input or the
# worker's configuration could not be taken, or it named a task no plan is stored for (prepare
# journals them as ``refused`` events).
REFUSALS = frozenset(cls.__name__ for cls in (PlanError, InputError, PlanChanged, UnknownTask,
                                              ActionNotConfigured, ActionUnavailable))


class BoundaryCheck(Protocol):
    """The boundary's check before ``step`` (activities.boundary.BoundaryActivities.outcome)."""

    def __call__(self, task_id: str, step: int, *, gates: bool = True) -> BoundaryOutcome: ...


P = ParamSpec("P")
R = TypeVar("R")


def beats(fn: Callable[P, R]) -> Callable[P, R]:
    """A blocking bookkeeping activity that heartbeats while it runs (``_heartbeating``).

    Its workflows schedule it with a heartbeat timeout (workflows.shared.BOOKKEEPING_HEARTBEAT):
    one on a worker that died is tried again once its beats stop, seconds later, not once its
    start-to-close timeout has passed (BOOKKEEPING_TIMEOUT, 30 s). A run whose worker is killed
    while the run prepares waits that much less. Its first beat comes HEARTBEAT_EVERY_S after it
    began, so one that ends sooner sends none: it costs no Temporal action more than before."""
    @functools.wraps(fn)
    def beating(*args: P.args, **kwargs: P.kwargs) -> R:
        with _heartbeating():
            return fn(*args, **kwargs)
    return beating


class StepActivities:
    """Activities bound to one journal and one registry of bound actions."""

    def __init__(self, store: JournalStore, registry: Registry,
                 grants: GrantBroker | None = None, *, executor: Executor,
                 boundary: BoundaryCheck | None = None,
                 release_row: Callable[[str, str], None] | None = None) -> None:
        self.store = store
        self.registry = registry
        self.grants = grants  # per-task credentials (activities/granted.py)
        # The boundary's check (activities.boundary.BoundaryActivities.outcome), for a start
        # whose first step is irreversible; None: prepare leaves it to the boundary activity.
        self.boundary = boundary
        # Closes the task's open worklist row, given the task and who asks (worker.row_release);
        # None: the run sends that signal itself (Prepared.released).
        self.release_row = release_row
        # The worker's step threads: a coroutine activity's blocking parts run there.
        self.threads = StepThreads(executor)

    @activity.defn(name=ActivityName.PREPARE)
    @beats
    def prepare(self, inp: PrepareInput) -> Prepared:
        """Persists the plan (or finds the stored one) and reads where the task stands.

        A start refused before its plan was stored is journaled (``refused``) for the task id it
        names. That happens when the journal can hold that id and knows no plan of it."""
        crash_point("in_prepare", 0)
        try:
            return self._prepare(inp)
        except ApplicationError as e:
            if e.type in REFUSALS:
                self._refused(inp, e)
            raise

    def _refused(self, inp: PrepareInput, e: ApplicationError) -> None:
        """Journals a start refused before its plan was stored.

        So `tidemark inbox` and `status` say what the run's worklist row says (the row opens
        under the same id)."""
        doc = inp.document if isinstance(inp.document, dict) else {}
        named = doc.get("task_id")
        task_id = named if isinstance(named, str) and ID_RE.fullmatch(named) else None
        if task_id is None or self.store.task_known(task_id):
            return  # an id no task can have, or a stored task this start did not change
        self.store.record_event(task_id, EventKind.REFUSED, {
            "error": {"type": e.type, "message": cut(e.message, REASON_MAX)}},
            actor=cut(inp.workflow_id or "a run", LABEL_MAX))

    def _prepare(self, inp: PrepareInput) -> Prepared:
        try:
            doc = inp.document
            if not isinstance(doc, dict):
                raise _plan_error("the input must be a plan object {task_id?, steps} or "
                                  f"{{task_id}} of a stored plan, not {type(doc).__name__}")
            if "steps" in doc:
                plan = load_plan(doc, self.registry)
                task_id = plan.task_id
                _check_workflow_id(inp.workflow_id, task_id)  # before anything is persisted
                series.check_declared(self.store, plan.series)
                series.check_scheduled_id(task_id, plan.series, inp.parent_workflow_id)
                series.check_admitted_by_hand(self.store, task_id, plan.series)
                for action in sorted({s.action for s in plan.steps}):
                    self.registry.bound(action)  # refuse before persisting, not at step 30
                if plan.series is not None and inp.check_gates:
                    series.admit(self.store, plan.task_id, plan.series)  # before anything acts
                self.store.persist_plan(plan)
            else:
                named_task = doc.get("task_id")
                if not isinstance(named_task, str):
                    raise _plan_error("input must be a plan {task_id?, steps} or "
                                      "{task_id} of a stored plan")
                task_id = named_task
                _check_workflow_id(inp.workflow_id, task_id)
                named = self.store.series_of(task_id)
                if named is not None and inp.check_gates:
                    series.admit(self.store, task_id, named)
            progress = self.store.progress(task_id)
            if progress.undo_rows and progress.unwound is None:
                raise PartlyUnwound(task_id)  # never forward, even with every step done
            # A run of the task begins: an earlier run's journaled end no longer says that
            # nothing runs it (record_run_end).
            info = activity.info()
            self.store.record_run_began(task_id, info.workflow_run_id or "",
                                        info.workflow_id or "a run")
            if (inp.check_gates and progress.next_step is not None
                    and progress.unwound is None):  # again on every start
                with acting_for(self.grants, task_id):  # a gate that reads presents the grant
                    self._gates(task_id)
            stop, first = progress.stop, progress.next_step
            goes_on = first is not None and stop is None and progress.unwound is None
            whole = self.store.load_window(task_id, 1, progress.step_count) if (
                goes_on and progress.step_count <= inp.window) else None
            at_boundary = None
            if (goes_on and inp.boundary and inp.check_gates and self.boundary is not None
                    and first == progress.first_irreversible == 1):
                # The gates ran just above; step 1 has nothing before it to verify.
                with acting_for(self.grants, task_id):
                    at_boundary = self.boundary(task_id, 1, gates=False)
        except TidemarkError as e:
            raise _as_application_error(e) from e
        released = inp.release and self.release_row is not None
        if released:
            assert self.release_row is not None
            self.release_row(task_id, inp.workflow_id or "a run")
        # Whether the end has anything to verify, for a run that reaches it: read from the whole
        # plan when it fits a run, else from its distinct actions (one index scan, no step).
        ends = first is None or first + inp.window > progress.step_count
        verify_end = not ends or (
            sets_a_target_twice(self.registry, whole) if whole is not None
            else may_set_a_target_twice(self.registry, self.store.plan_actions(task_id)))
        lines = None  # the window's, for a run that goes on to its steps
        if inp.window > 0 and goes_on:
            assert first is not None
            last = min(progress.step_count, first + inp.window - 1)
            lines = ([self._describe(s) for s in whole[first - 1:last]] if whole is not None
                     else self._lines(task_id, first, last))
        return Prepared(task_id=task_id, step_count=progress.step_count,
                        next_step=first, confirmed=progress.confirmed,
                        failed=progress.failed,
                        stopped=(stop["reason"] or "stopped") if stop else None,
                        release=release_of(task_id, stop),
                        first_irreversible=progress.first_irreversible,
                        unwound=progress.unwound is not None, lines=lines,
                        boundary=at_boundary,
                        verify_end=verify_end,
                        released=released)

    def _gates(self, task_id: str) -> None:
        """The plan's gates, on a start.

        One that refuses ends the run before its first step, with the plan stored. That end is
        journaled here (the run never learnt it began). So `tidemark inbox` and `status` say the
        task waits for its gate, as its worklist row does."""
        try:
            check_stored_plan_gates(self.store, self.registry, task_id)
        except PreconditionFailed as e:
            info = activity.info()
            self.store.record_run_ended(
                task_id, TaskState.PRECONDITION_FAILED,
                {"type": type(e).__name__, "message": str(e), "step": e.step},
                info.workflow_id or "a run", run_id=info.workflow_run_id)
            raise

    def _lines(self, task_id: str, first: int, last: int) -> list[str]:
        return [self._describe(s) for s in self.store.load_window(task_id, first, last)]

    def _describe(self, step: Step) -> str:
        """One line of a step, cut to LINE_CHARS.

        A window of them crosses to the workflow in one payload, whatever the plan's arguments
        hold."""
        spec = self.registry.spec(step.action)
        return cut(f"{step.action} {spec.describe(step.args) if spec else ''}".strip(),
                   LINE_CHARS)

    @activity.defn(name=ActivityName.RUN_STEP)
    async def run_step(self, inp: StepInput) -> StepOutput:
        """One step through the two-phase journal, heartbeating while it runs.

        A coroutine on the worker's event loop: an action that awaits its call (Action.awaits)
        waits on its target holding neither a thread nor a connection, so one worker holds
        hundreds of such steps in flight; the attempt's blocking parts (the journal, gates,
        probe) run on the worker's step threads (tidemark.run_step.run_step_async)."""
        with acting_for(self.grants, inp.task_id):
            async with _heartbeating_async():
                try:
                    result = await run_step_async(self.store, self.registry, inp.task_id,
                                                  inp.step, self.threads)
                except TidemarkError as e:
                    _count_stop(e)
                    raise _as_application_error(e) from e
        return _output(result)

    @activity.defn(name=ActivityName.RUN_STEPS)
    def run_steps(self, inp: StepBatchInput) -> StepBatchOutput:
        """Consecutive steps in one call (RunPlan's fast path).

        Each goes through the two-phase journal as run_step runs it; see
        tidemark.run_step.run_steps for where a batch ends."""
        with _heartbeating(), acting_for(self.grants, inp.task_id):
            try:
                batch = run_steps(self.store, self.registry, inp.task_id, inp.first, inp.last,
                                  max_steps=inp.max_steps, budget_s=inp.budget_s)
            except TidemarkError as e:
                _count_stop(e)
                raise _as_application_error(e) from e
        error = None
        if batch.error is not None:
            failure = batch.error
            _count_stop(failure)
            # As the step alone would have failed: ours say whether another attempt can help,
            # anything else (a bug, an action's unforeseen exception) is retried.
            final, details = ((not failure.retryable, failure.details())
                              if isinstance(failure, TidemarkError) else (False, {}))
            error = StepError(step=inp.first + len(batch.results), type=type(failure).__name__,
                              message=str(failure), non_retryable=final, details=details)
        out = StepBatchOutput(ran=len(batch.results), error=error)
        for r in batch.results:
            if r.status == StepStatus.FAILED:
                out.failed = r.step
            elif r.skipped:
                out.skipped += 1
            elif r.resolved_by == ResolvedBy.PROBE:
                out.resolved_by_probe += 1
            else:
                out.executed += 1
        return out

    @activity.defn(name=ActivityName.RECORD_HALT)
    @beats
    def record_halt(self, inp: HaltInput) -> None:
        """Writes the durable stop state: nothing restarts the task until it is released.

        The reason and the label are cut to the journal's limits. A halt must hold whatever its
        signal carried (a run that recorded one before its workflow cut it retries this)."""
        try:
            self.store.set_control(inp.task_id, ControlState.STOPPED, cut(inp.reason, REASON_MAX),
                                   cut(inp.by, LABEL_MAX) or "halt signal")
        except TidemarkError as e:
            raise _as_application_error(e) from e
        metrics.task_stopped("halt")

    @activity.defn(name=ActivityName.RECORD_RUN_END)
    @beats
    def record_run_end(self, inp: RunEndInput) -> TaskNeed:
        """Journals that the run ended other than completed.

        Until a run of the task begins again (prepare journals each beginning), nothing runs it.
        `tidemark inbox` says so once no other fact of the journal holds it (a released stop, a
        worker's error). Returns what the journal then says the task needs: the word of the row
        the run opens."""
        info = activity.info()
        try:
            self.store.record_run_ended(inp.task_id, TaskState(inp.state), inp.error,
                                        info.workflow_id or "a run", confirmed=inp.confirmed,
                                        steps=inp.steps, run_id=info.workflow_run_id)
            return needs_journal.task_need(self.store, inp.task_id)
        except TidemarkError as e:
            raise _as_application_error(e) from e

    @activity.defn(name=ActivityName.TASK_NEED)
    @beats
    def task_need(self, task_id: str) -> TaskNeed:
        """What the journal says the task needs from a person now (tidemark.needs_journal).

        It is the word of the worklist row an unwind that did not finish opens."""
        try:
            return needs_journal.task_need(self.store, task_id)
        except TidemarkError as e:
            raise _as_application_error(e) from e

    @activity.defn(name=ActivityName.PLAN_UNWIND)
    @beats
    def plan_unwind(self, task_id: str) -> UnwindPlanned:
        """The steps an unwind visits, with their summaries, and what it will not touch."""
        try:
            stop = self.store.stop_state(task_id)
            steps = self.store.undo_candidates(task_id)
            irreversible = self.store.irreversible_steps(task_id)
            plan = self.store.load_plan(task_id) if steps else None
            summaries = [f"undo {n} {self._describe(plan.step(n))}" for n in steps if plan]
        except TidemarkError as e:
            raise _as_application_error(e) from e
        return UnwindPlanned(
            task_id=task_id, steps=steps, summaries=summaries,
            irreversible_done=[f"{n} {a}" for n, a, status, _ in irreversible
                               if status == StepStatus.DONE],
            stopped=(stop["reason"] or "stopped") if stop else None)

    @activity.defn(name=ActivityName.UNWIND_STEP)
    def unwind_step(self, inp: StepInput) -> UndoOutput:
        """One compensation through the journal (phase undo), heartbeating while it runs.

        A refusal by the target is journaled as that attempt's outcome and reported as
        ``refused``. The unwind goes on with the other steps and counts it apart."""
        with _heartbeating(), acting_for(self.grants, inp.task_id, GrantPurpose.UNDO):
            try:
                result = unwind_step(self.store, self.registry, inp.task_id, inp.step)
            except StepFailed as e:
                return UndoOutput(step=inp.step, status="refused", reason=e.reason)
            except TidemarkError as e:
                raise _as_application_error(e) from e
        return UndoOutput(step=result.step, status=result.status)

    @activity.defn(name=ActivityName.RECORD_UNWOUND)
    @beats
    def record_unwound(self, inp: UnwoundInput) -> list[int]:
        """Marks the task unwound (terminal) if nothing is left to compensate.

        Returns the steps still to visit otherwise."""
        try:
            return self.store.record_unwound(inp.task_id, inp.by, inp.detail)
        except TidemarkError as e:
            raise _as_application_error(e) from e

    @activity.defn(name=ActivityName.END_UNWIND)
    @beats
    def end_unwind(self, inp: UnwoundInput) -> int:
        """Revokes the task's undo grants when its unwind ends, however it ends.

        They would expire on their own, but an unwind's credential should not outlive it. Also
        journals an unwind that leaves its task to be unwound again (``detail["unfinished"]``).
        Returns how many grants were revoked."""
        try:
            if inp.detail.get("unfinished"):
                self.store.record_event(inp.task_id, EventKind.UNWIND_UNFINISHED,
                                        inp.detail["unfinished"], actor=inp.by)
            return len(revoke_task_grants(self.store, inp.task_id, inp.by,
                                          purpose=GrantPurpose.UNDO))
        except TidemarkError as e:
            raise _as_application_error(e) from e

    def all(self) -> list[Callable[..., Any]]:
        return [self.prepare, self.run_step, self.run_steps,
                self.record_halt, self.record_run_end, self.task_need, self.plan_unwind,
                self.unwind_step, self.record_unwound, self.end_unwind]


def _output(result: StepResult) -> StepOutput:
    return StepOutput(step=result.step, status=result.status, resolved_by=result.resolved_by,
                      skipped=result.skipped)


@dataclass
class _Beat:
    """One running activity's heartbeat, as the shared heartbeat thread sees it."""

    beat: Callable[[], None]
    due: float  # monotonic: when its next heartbeat is due
    lock: threading.Lock = field(default_factory=threading.Lock)  # held while it beats
    over: bool = False  # its activity returned: it never beats again


class Heartbeats:
    """One thread of this process that heartbeats for every activity in ``beating``.

    It beats every ``every`` seconds from the activity's start.

    A thread per activity did the same, but starting it and joining it cost each step two
    hand-overs of the interpreter lock between threads. That is 0.5-1 ms a step on a loaded
    2-core machine (docs/benchmarks.md), for steps that mostly end before their first beat. The
    shared thread is started once and never ends. Between two steps of the activity path no
    activity runs, and a thread that ended then would be started again for the next step."""

    def __init__(self, every: float) -> None:
        self.every = every
        self._mutex = threading.Lock()  # guards _beats and _thread
        self._beats: dict[int, _Beat] = {}
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def beating(self, beat: Callable[[], None]) -> Iterator[None]:
        """Calls ``beat`` every ``every`` seconds while the block runs.

        None is called after the block ends (a beat in flight is waited for, as joining a thread
        would)."""
        b = _Beat(beat, time.monotonic() + self.every)
        with self._mutex:
            self._beats[id(b)] = b
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="tidemark-heartbeats")
                self._thread.start()
        try:
            yield
        finally:
            with self._mutex:
                del self._beats[id(b)]
            with b.lock:
                b.over = True

    def _run(self) -> None:
        # No wake-up is needed when an activity registers: the thread never sleeps longer than
        # `every`, and a new activity's first beat is due `every` after it registered.
        while True:
            with self._mutex:
                now = time.monotonic()
                due = [b for b in self._beats.values() if b.due <= now]
                wake = min((b.due for b in self._beats.values() if b.due > now),
                           default=now + self.every)
            for b in due:
                self._send(b)
            time.sleep(max(0.0, min(wake, time.monotonic() + self.every) - time.monotonic()))

    def _send(self, b: _Beat) -> None:
        with b.lock:
            if b.over:
                return
            try:
                b.beat()
            except Exception as e:  # one activity's failed beat must not stop the others'
                log.warning("heartbeat failed: %r", e)
            b.due = time.monotonic() + self.every


_HEARTBEATS = Heartbeats(HEARTBEAT_EVERY_S)


@contextlib.contextmanager
def _heartbeating() -> Iterator[None]:
    """Heartbeats while the block runs, from this process's shared heartbeat thread.

    So a worker that dies mid-step is noticed within the heartbeat timeout, while a slow but
    live step is not.

    A local activity has no heartbeat: the worker keeps its workflow task alive instead, and a
    dead worker is noticed when that task times out. (RunPlan schedules none since 0.1.0.)"""
    if activity.info().is_local:
        yield
        return
    ctx = contextvars.copy_context()  # the heartbeat thread needs the activity context
    with _HEARTBEATS.beating(functools.partial(ctx.run, activity.heartbeat)):
        yield


@contextlib.asynccontextmanager
async def _heartbeating_async() -> AsyncIterator[None]:
    """``_heartbeating`` for a coroutine activity.

    A task on the event loop beats every HEARTBEAT_EVERY_S while the block runs. It does so
    whether the attempt is waiting on its target, on a step thread, or for one to be free."""
    if activity.info().is_local:
        yield
        return

    async def beat() -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_EVERY_S)
            activity.heartbeat()

    beating = asyncio.create_task(beat())
    try:
        yield
    finally:
        beating.cancel()
