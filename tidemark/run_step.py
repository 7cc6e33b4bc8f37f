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

Only the connection that holds the lock writes the intent and the outcome, so two live attempts
of one step can never both act, and a crash leaves exactly one row in doubt. The attempt lease
(see tidemark.store.LEASE_S) covers what the lock cannot: an attempt whose database session (and
so its lock) was lost while its call to the target may still be in flight. It is written before
the call to cover the action's deadline plus its horizon, kept fresh by renewals that may fail
without harm, and after an ambiguous failure held for the target's horizon: a request that left
us may still be applied until then, so a probe's *absent* is not asked for before. A call that
runs past its deadline while renewals fail ends the worker before its lease could lapse
(guarded_call): an overrunning attempt is covered while it is renewed, and stopped before a
twin could take the step.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from tidemark import metrics
from tidemark.actions import Action, GateRefused, ProbeResult, ProbeStatus, Registry, StepContext
from tidemark.errors import (
    JournalMismatch,
    NeedsDecision,
    PreconditionFailed,
    Refused,
    StepBusy,
    StepFailed,
    TaskStopped,
    TaskUnwound,
    TidemarkError,
    Unauthorized,
)
from tidemark.faults import crash_point
from tidemark.keys import key_for
from tidemark.plan import Plan, Step
from tidemark.store import LEASE_S, JournalRow, JournalStore, StepSession

log = logging.getLogger(__name__)


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
    with store.execution(task_id, step) as s:
        if s.unwound:
            raise TaskUnwound(task_id)
        if s.stopped is not None:
            raise TaskStopped(task_id, s.stopped)
        spec, row = s.spec, s.row
        action = registry.bound(spec.action)
        key = key_for(task_id, step, spec.action, spec.args)
        ctx = StepContext(task_id=task_id, step=step, action=spec.action, args=spec.args,
                          key=key)
        if row is not None and row.idem_key != key:
            raise JournalMismatch(f"task {task_id!r} step {step}: journal holds {row.action} "
                                  f"with key {row.idem_key}, the plan says {spec.action} {key}")
        if row is not None and row.outcome is not None:
            return StepResult.from_row(row, skipped=True)

        if row is not None:
            # In doubt: an earlier attempt wrote the intent and died. Ask the target.
            check_lease(s, ctx)
            ctx = replace(ctx, started_at=row.started_at, before_state=row.before_state,
                          staged=row.staged)
            done = resolve_in_doubt(action, ctx, s)
            if done is not None:
                return StepResult.from_row(done, skipped=False)
            _gate(action, ctx, s)  # absent: the world is as before; gates are never trusted
            lease_from = time.monotonic()  # before the statement: the cover it gives errs early
            s.claim(task_id, key, call_lease(action))  # a stop since the lock was taken holds
        else:
            _gate(action, ctx, s)
            before = action.snapshot(ctx)
            crash_point("before_intent", step)
            lease_from = time.monotonic()
            row = s.begin(task_id=task_id, step=step, key=key, action=spec.action,
                          args=spec.args, before_state=before, lease_s=call_lease(action))
            ctx = replace(ctx, started_at=row.started_at, before_state=row.before_state)

        crash_point("after_intent", step)
        return _execute(store, action, ctx, s, flush_outcome, lease_from)


@dataclass(frozen=True)
class Batch:
    """What one call of run_steps settled: the steps it ran in order, and the error of the step
    after them when that step did not complete (None when the batch ended on its bounds)."""

    results: list[StepResult]
    error: Exception | None = None


def run_steps(store: JournalStore, registry: Registry, task_id: str, first: int, last: int,
              *, max_steps: int, budget_s: float,
              clock: Callable[[], float] = time.monotonic) -> Batch:
    """Runs steps ``first``..``last`` one after another, each through run_step (its own lock,
    lease, stop check, intent and outcome), until one does not complete with ``done``, or
    ``max_steps`` have run, or ``budget_s`` seconds have passed (checked after each step: the
    first step always runs, and a step that started is never cut short).

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
    """check_plan_gates over the stored plan of ``task_id``, reading only the steps of actions
    that have a plan-level gate: starting again a long plan whose actions have none (a resume)
    transfers no step, so it costs the same for ten steps as for ten thousand."""
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
            store.record_event(task_id, "precondition", {"refused": str(e), "plan": True},
                               steps[0][0])
            raise PreconditionFailed(steps[0][0], name, str(e)) from None


def check_lease(s: StepSession, ctx: StepContext) -> None:
    """Raises StepBusy while the attempt on this open intent may still be acting."""
    if s.lease_left is not None and s.lease_left > 0:
        metrics.lease_wait(ctx.action)
        raise StepBusy(f"{ctx.task_id}/{ctx.step}: an earlier attempt may still be acting "
                       f"on it for {s.lease_left:.1f}s")


def covered_call_s(action: Action) -> float:
    """Seconds of an action's call that the lease written before it covers with no renewal:
    its declared deadline, but never less than what one renewal adds (LEASE_S). Past it, only
    committed renewals cover the call, and the deadline watch ends the process rather than let
    the lease lapse under a call still running; the floor leaves a short-deadline action time
    for its first renewal (LEASE_RENEW_S later) before the watch would have to act."""
    return max(float(action.deadline_s), LEASE_S)


def call_lease(action: Action) -> float:
    """Seconds the lease written before an action's call must cover: the call itself (its
    deadline) and then the time the target may still apply the request (its horizon)."""
    return covered_call_s(action) + float(action.horizon_s)


def renewal_lease(action: Action) -> float:
    """Seconds each renewal extends the lease to while the action is still running."""
    return LEASE_S + float(action.horizon_s)


def guarded_call(store: JournalStore, key: str, action: Action,
                 lease_from: float) -> contextlib.AbstractContextManager[None]:
    """The block in which an action's call runs: its lease is renewed, and the process ends
    before the lease could lapse while the call still runs (tidemark.store.LeaseKeeper).

    ``lease_from`` is this machine's monotonic time just before the statement that wrote the
    call's lease (call_lease seconds from then, on the database's clock): a request that leaves
    us before ``lease_from + covered_call_s(action)`` is covered by it whether or not any
    renewal succeeds. Past that, only committed renewals cover the call."""
    return store.keep_lease(key, renewal_lease(action), horizon_s=float(action.horizon_s),
                            covered_until=lease_from + covered_call_s(action),
                            deadline_s=float(action.deadline_s))


def end_attempt(s: StepSession, key: str, action: Action) -> None:
    """After an ambiguous failure: the attempt is over, but its request may still be applied
    for the target's horizon, so the lease is held that long (not cut to zero). If this write
    fails, the lease written before the call still covers it."""
    with contextlib.suppress(TidemarkError):
        s.renew_lease(key, float(action.horizon_s))


def resolve_in_doubt(action: Action, ctx: StepContext, s: StepSession) -> JournalRow | None:
    """Probes the step in doubt and records what the target says.

    Returns the completed row when the probe says done, None when it says absent (the world is
    as before_state recorded). Raises NeedsDecision when the probe cannot tell.
    """
    probed = _probe(action, ctx)
    s.event(ctx.task_id, "probe", probed.as_json(), ctx.step)
    metrics.probe_answered(ctx.action, probed.status.value)
    if probed.status is ProbeStatus.DONE:
        done = s.complete(key=ctx.key, outcome=probed.observed, status="done",
                          resolved_by="probe")
        metrics.step_settled(ctx.action, "probe", "done")
        return done
    if probed.status is ProbeStatus.UNKNOWN:
        # The target cannot tell; only a person who looked may (`tidemark resolve`).
        # A decision licenses one execution: using it is logged as the newer decision.
        assert ctx.started_at is not None
        decided = s.operator_decision(ctx.task_id, ctx.step, ctx.started_at)
        if decided is None or decided["detail"].get("as") != "absent":
            raise NeedsDecision(ctx.step, ctx.action, probed.reason)
        s.event(ctx.task_id, "decision", {"as": "used", "decided_by": decided["actor"],
                                          "decided_at": decided["at"].isoformat()}, ctx.step)
        log.info("step %s %s: probe cannot tell; %s decided it did not happen",
                 ctx.step, ctx.action, decided["actor"])
    return None


def _probe(action: Action, ctx: StepContext) -> ProbeResult:
    """Runs the probe; a probe that fails to run could not decide, so it answers unknown.

    A rejected credential is the exception: it is how a task is stopped from outside (the
    grant was revoked), so it stops the task as such rather than asking a person to decide.
    """
    try:
        return action.probe(ctx)
    except Unauthorized:
        raise
    except Exception as e:  # any other failure of a read-only probe means "cannot tell"
        log.warning("probe of step %s %s failed: %r", ctx.step, ctx.action, e)
        return ProbeResult.unknown(f"probe failed: {type(e).__name__}: {e}")


def _gate(action: Action, ctx: StepContext, s: StepSession) -> None:
    try:
        action.preconditions(ctx)
    except GateRefused as e:
        s.event(ctx.task_id, "precondition", {"refused": str(e)}, ctx.step)
        raise PreconditionFailed(ctx.step, ctx.action, str(e)) from None


def _execute(store: JournalStore, action: Action, ctx: StepContext,
             s: StepSession, flush_outcome: bool, lease_from: float) -> StepResult:
    try:
        with guarded_call(store, ctx.key, action, lease_from):
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
            outcome = action.execute(ctx)
    except Refused as e:
        s.complete(key=ctx.key, outcome={"error": str(e), "type": type(e).__name__},
                   status="failed", resolved_by="execute")
        metrics.step_settled(ctx.action, "execute", "failed")
        log.info("step %s %s refused by the target: %s", ctx.step, ctx.action, e)
        raise StepFailed(ctx.step, ctx.action, str(e)) from e
    except Exception as e:
        # Unauthorized, TargetUnavailable or anything unforeseen: the action may or may not
        # have applied, so the intent stays open and the next attempt probes it, once the
        # target's horizon has passed.
        end_attempt(s, ctx.key, action)
        note_error(s, ctx, e)
        metrics.left_in_doubt(ctx.action, type(e).__name__)
        raise
    crash_point("after_execute", ctx.step)
    done = s.complete(key=ctx.key, outcome=outcome, status="done", resolved_by="execute",
                      flush=flush_outcome)
    metrics.step_settled(ctx.action, "execute", "done")
    crash_point("after_outcome", ctx.step)
    return StepResult.from_row(done, skipped=False)


def note_error(s: StepSession, ctx: StepContext, e: Exception) -> None:
    """Logs an action's failure as an event (the intent stays open)."""
    # If the database is gone too, the open intent already tells the story.
    with contextlib.suppress(TidemarkError):
        s.event(ctx.task_id, "error", {"type": type(e).__name__, "message": str(e),
                                       "retryable": getattr(e, "retryable", True),
                                       "known": isinstance(e, TidemarkError)}, ctx.step)
