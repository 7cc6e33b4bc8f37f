"""The step algorithm: the two-phase journal around one action.

::

    lock the step (a live twin attempt -> StepBusy, retry later), then read its row
    stopped task -> TaskStopped; unwound task -> TaskUnwound
    row = journal[task, step]
    outcome recorded            -> return it; nothing acts
    intent without outcome      -> its last attempt's lease still fresh -> StepBusy; else
                                   probe the target (read-only):
                                     done    -> record it (resolved_by=probe), return
                                     absent  -> gates again, then claim the intent (the stop
                                                state is checked once more in that statement)
                                                and execute under it
                                     unknown -> NeedsDecision: a person decides, nothing acts
                                                (unless a person already said "absent")
    no row                      -> gates, snapshot, commit intent (refused if a stop was
                                   committed meanwhile), execute, commit outcome

The sequence of an attempt (lock, stop check, lease, intent, act, settle) is tidemark.attempt's,
shared with a compensation's (tidemark.unwind); what is the forward step's own is here
(``Forward``): its gates, its snapshot as before_state, its probe when found in doubt, and a
staged handle journaled before the call that consumes it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from tidemark.actions import Action, GateRefused, Registry, StepContext
from tidemark.attempt import (
    DO,
    Call,
    Direction,
    act,
    act_async,
    call_lease,
    covered_call_s,
    locked,
    open_attempt,
    resolve_in_doubt,
)
from tidemark.errors import JournalMismatch, PreconditionFailed
from tidemark.faults import crash_point
from tidemark.keys import key_for
from tidemark.plan import Plan, Step
from tidemark.reads import patient_reads
from tidemark.step_threads import StepThreads, to_its_end
from tidemark.store import JournalRow, JournalStore, StepSession
from tidemark.words import EventKind


@dataclass(frozen=True)
class StepResult:
    """What one call of run_step settled."""

    task_id: str
    step: int
    action: str
    key: str
    status: str  # done | failed
    outcome: dict[str, Any]
    resolved_by: str  # execute | probe | operator
    skipped: bool  # True when the outcome was already recorded and nothing ran

    @classmethod
    def from_row(cls, row: JournalRow, *, skipped: bool) -> StepResult:
        assert row.outcome is not None and row.status and row.resolved_by
        return cls(row.task_id, row.step, row.action, row.idem_key, row.status, row.outcome,
                   row.resolved_by, skipped)


def run_step(store: JournalStore, registry: Registry, task_id: str, step: int, *,
             flush_outcome: bool = True) -> StepResult:
    """Runs step ``step`` of the stored plan of ``task_id`` at most once in the outside world.

    With ``flush_outcome=False`` the outcome of an execution is committed without waiting for
    the disk (tidemark.store.StepSession.complete): the caller makes it durable before it reports
    the result anywhere else. run_steps does, once per batch (``store.end_batch``).

    Raises:
        StepBusy: another live attempt holds the step, or the last one may still be acting
            (its lease is fresh); retryable.
        TaskStopped: the task is stopped, also when the stop was committed after the lock was
            taken but before the intent (or, for a step in doubt, before acting again).
        TaskUnwound: the task was unwound; it never runs forward again.
        StoreUnavailable: Postgres is unreachable (retryable; no action ran after it).
        PreconditionFailed: a gate refused; nothing ran.
        NeedsDecision: the step is in doubt and its probe cannot tell; nothing ran.
        StepFailed: the target refused the action for good; recorded as the outcome.
        Unauthorized, TargetUnavailable: from the action; the step stays in doubt.
    """
    with locked(store, task_id, step, acting=DO) as s:
        begun = _begin(store, registry, s, task_id, step)
        if isinstance(begun, StepResult):
            return begun
        side, call = begun
        return _done(act(store, s, side, call, flush_outcome))


async def run_step_async(store: JournalStore, registry: Registry, task_id: str, step: int,
                         threads: StepThreads) -> StepResult:
    """``run_step`` for a worker's event loop.

    When the step's action awaits its call (Action.awaits), the call is awaited on the loop and
    holds no thread while it waits; every other part of the attempt runs on ``threads``, in the
    same order and under the same lease. Any other action's attempt runs as ``run_step`` on one
    step thread. Raises as run_step; if the caller is cancelled meanwhile, the attempt still runs
    to its end (to_its_end) and CancelledError is raised after it."""

    def begin() -> StepResult | tuple[StepSession, Forward, Call]:
        with locked(store, task_id, step, acting=DO) as s:
            begun = _begin(store, registry, s, task_id, step)
            if isinstance(begun, StepResult):
                return begun
            side, call = begun
            if not side.action.awaits:
                return _done(act(store, s, side, call, True))
            return s, side, call

    async def whole() -> StepResult:
        begun = await threads.run(begin)
        if isinstance(begun, StepResult):
            return begun
        s, side, call = begun
        return _done(await act_async(store, s, side, call, threads))

    return await to_its_end(whole())


def _begin(store: JournalStore, registry: Registry, s: StepSession, task_id: str,
           step: int) -> StepResult | tuple[Forward, Call]:
    """The attempt ``s`` began, up to its call.

    The result when nothing is left to act on (recorded before, or settled by the probe), or the
    side and the owned intent to act on."""
    spec, row = s.spec, s.row
    action = registry.bound(spec.action)
    key = key_for(task_id, step, spec.action, spec.args)
    ctx = StepContext(task_id=task_id, step=step, action=spec.action, args=spec.args, key=key)
    if row is not None and row.idem_key != key:
        raise JournalMismatch(f"task {task_id!r} step {step}: journal holds {row.action} "
                              f"with key {row.idem_key}, the plan says {spec.action} {key}")
    if row is not None and row.outcome is not None:
        return StepResult.from_row(row, skipped=True)
    side = Forward(action, ctx)
    opened = open_attempt(s, side)
    if isinstance(opened, JournalRow):
        return _done(opened)
    return side, opened


def _done(row: JournalRow) -> StepResult:
    return StepResult.from_row(row, skipped=False)


@dataclass(frozen=True)
class Forward:
    """The forward side of an attempt (tidemark.attempt.Side): the action's execute."""

    action: Action
    ctx: StepContext

    @property
    def direction(self) -> Direction:
        return DO

    @property
    def name(self) -> str:
        return self.ctx.action

    def key(self, attempt: int) -> str:
        # A forward step has one journal row: once it has an outcome, run_step returns it and
        # nothing acts again, so there is no second attempt to name.
        return self.ctx.key

    def context(self, intent: JournalRow) -> StepContext:
        return replace(self.ctx, started_at=intent.started_at,
                       before_state=intent.before_state, staged=intent.staged,
                       sent_at=intent.sent_at, answered=intent.returned_at is not None)

    def resume(self, s: StepSession, ctx: StepContext) -> JournalRow | None:
        """Asks the target whether the step in doubt happened.

        Asks the target (read-only) whether the step in doubt happened: done is recorded
        and returned; absent runs the gates again before the step acts again."""
        done = resolve_in_doubt(self.action, ctx, s)
        if done is not None:
            return done
        _gate(self.action, ctx, s)  # absent: the world is as before; gates are never trusted
        return None

    def before_state(self, s: StepSession) -> dict[str, Any]:
        _gate(self.action, self.ctx, s)
        with patient_reads():
            return self.action.snapshot(self.ctx)

    def call(self, store: JournalStore, s: StepSession, ctx: StepContext) -> dict[str, Any]:
        """Stages the call if the action stages, then executes."""
        return self.action.execute(self.staged(store, s, ctx))

    async def call_async(self, store: JournalStore, s: StepSession, ctx: StepContext,
                         threads: StepThreads) -> dict[str, Any]:
        """``call`` with the execute awaited.

        Staging, a blocking call, runs on a step thread; an action without a stage of its own goes
        to the execute at once."""
        if ctx.staged is None and self.action.stages:
            ctx = await threads.run(self.staged, store, s, ctx)
        return await self.action.execute_async(ctx)

    def staged(self, store: JournalStore, s: StepSession, ctx: StepContext) -> StepContext:
        """The context to execute with, staged once if the action stages.

        The context to execute with: staged once if the action stages (a staged handle found
        in the intent is consumed as is), journaled before anything consumes it."""
        action = self.action
        if ctx.staged is None:
            staged = action.stage(ctx)
            if staged is not None:
                # journaled before anything consumes it; the lease now covers the send
                staged_from = time.monotonic()
                s.stage(ctx.key, staged, call_lease(action))
                store.cover_lease(ctx.key, staged_from + covered_call_s(action),
                                  float(action.deadline_s))
                ctx = replace(ctx, staged=staged)
                crash_point("after_stage", ctx.step)
        return ctx


@dataclass(frozen=True)
class Batch:
    """What one call of run_steps settled.

    The steps it ran in order, and the error of the step after them when that step did not complete
    (None when the batch ended on its bounds)."""

    results: list[StepResult]
    error: Exception | None = None


def run_steps(store: JournalStore, registry: Registry, task_id: str, first: int, last: int,
              *, max_steps: int, budget_s: float,
              clock: Callable[[], float] = time.monotonic) -> Batch:
    """Runs steps ``first``..``last`` one after another, each through run_step.

    Each has its own lock, lease, stop check, intent and outcome. The batch runs until one does not
    complete with ``done``, or ``max_steps`` have run, or ``budget_s`` seconds have passed (checked
    after each step: the first step always runs, and a step that started is never cut short).

    A step that fails as run_step fails ends the batch: the first step's error is raised as is,
    so the caller's retries see exactly what they would for that step alone; a later step's error
    is returned in ``Batch.error`` after the steps that completed before it, so that what they
    did is reported and none of them runs again. A ``failed`` outcome (the target refused) is the
    last result. A crash anywhere leaves at most the one step under way in doubt.

    The outcomes are committed without waiting for the disk, and flushed once before the batch
    returns (or raises after the first step): each step's intent, always flushed before its
    action, flushes the outcome before it. A crash of Postgres itself may thus lose the outcome
    of the last step that completed, which is then in doubt (its probe settles it); never two,
    and never one the workflow was told of."""
    results: list[StepResult] = []
    error: Exception | None = None
    started = clock()
    for step in range(first, last + 1):
        try:
            # Each step's intent is flushed before it acts, and with it the outcome before it;
            # the last outcome is flushed below, before the batch reports anything.
            result = run_step(store, registry, task_id, step, flush_outcome=False)
        except Exception as e:
            if not results:
                raise
            error = e
            break
        results.append(result)
        if (result.status != "done" or len(results) >= max_steps
                or clock() - started >= budget_s):
            break
    store.end_batch(task_id, len(results))
    return Batch(results, error)


def check_plan_gates(store: JournalStore, registry: Registry, plan: Plan) -> None:
    """Runs every bound action's plan-level gate over its steps of ``plan``.

    Raises:
        PreconditionFailed: naming the first step of the action whose gate refused.
    """
    for step in plan.steps:
        registry.bound(step.action)  # ActionNotConfigured for an action this worker lacks
    _run_plan_gates(store, registry, plan.task_id, plan.steps)


def check_stored_plan_gates(store: JournalStore, registry: Registry, task_id: str) -> None:
    """check_plan_gates over the stored plan of ``task_id``.

    It reads only the steps of actions that have a plan-level gate: starting again a long plan
    whose actions have none (a resume) transfers no step, so it costs the same for ten steps as for
    ten thousand."""
    gated = [name for name in store.plan_actions(task_id)
             if type(registry.bound(name)).plan_gate is not Action.plan_gate]
    _run_plan_gates(store, registry, task_id, store.load_steps_of(task_id, gated))


def _run_plan_gates(store: JournalStore, registry: Registry, task_id: str,
                    plan_steps: Iterable[Step]) -> None:
    by_action: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for step in plan_steps:
        by_action.setdefault(step.action, []).append((step.number, step.args))
    for name, steps in by_action.items():
        try:
            registry.bound(name).plan_gate(task_id, steps)
        except GateRefused as e:
            store.record_event(task_id, EventKind.PRECONDITION, {"refused": str(e), "plan": True},
                               steps[0][0])
            raise PreconditionFailed(steps[0][0], name, str(e)) from None


def _gate(action: Action, ctx: StepContext, s: StepSession) -> None:
    try:
        with patient_reads():
            action.preconditions(ctx)
    except GateRefused as e:
        s.event(ctx.task_id, EventKind.PRECONDITION, {"refused": str(e)}, ctx.step)
        raise PreconditionFailed(ctx.step, ctx.action, str(e)) from None
