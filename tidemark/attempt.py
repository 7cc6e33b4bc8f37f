"""One attempt at a step, forward or backward, written once.

One attempt at a step, forward (phase ``do``: the action's execute) or backward (phase
``undo``: its compensation): the sequence every attempt follows, written once.

::

    read the step's row of the phase and the task's stop state; check the stop state
    open intent (an earlier attempt wrote it and ended, or may still be acting)
        its last attempt's lease still fresh -> StepBusy, nothing probes or acts
        take it over (one statement: the lease has passed and the owner is the one read;
            a twin that took it first -> StepBusy)
        the side decides: settled without acting (a forward step's probe said done), or act
        again on it: claim the intent (the stop state and the ownership checked once more)
    no open intent (none yet, or a settled earlier attempt of a compensation)
        the side's before_state (a forward step: gates, then a snapshot of the target)
        commit the intent, owned by this attempt, with the call's lease (refused if a stop was
        committed meanwhile; a twin that wrote it first -> StepBusy)
    give the connection back, act under the lease keeper, then settle:
        an outcome           -> recorded as done (resolved_by=execute)
        Refused              -> recorded as failed; StepFailed
        anything else        -> in doubt: the intent stays open, its lease held for the target's
                                horizon, the error journaled as an event; raised as is

What differs between doing and undoing a step is a ``Side`` (tidemark.run_step.Forward,
tidemark.unwind.Compensation): the phase, the key of each attempt, what the intent's
before_state is, what the action is given, what an open intent needs before it is acted on
again, and the call itself. Everything else, above, is this module's.

Ownership is a fenced lease, not a held connection (tidemark.store.session.StepSession): the
attempt that wrote the intent, or took it over, owns it by a token, and every later write of
the attempt is conditional on that token. So two live attempts of one step never both act, a
crash leaves exactly one row in doubt, and no database connection is held across the call to
the target. The attempt lease (tidemark.store.LEASE_S) keeps a twin from probing or acting
while the owner's call may still be in flight: it is written before the call to cover the
action's deadline plus its horizon, kept fresh by renewals that may fail without harm, and after
an ambiguous failure held for the target's horizon: a request that left us may still be applied
until then, so a probe's *absent* is not asked for before. A call that runs past its deadline
while renewals fail ends the worker before its lease could lapse (guarded_call): an overrunning
attempt is covered while it is renewed, and stopped before a twin could take the step.

Time is checked where a request leaves, not only before a gap: the call's transports check its
cover on this machine's monotonic clock, and mark an effect whose target cannot fence a late
request, just before the request leaves (``wire_of``, tidemark.wire); a twin takes an intent
over only once the database's clock and its own both say the lease passed (``taken_over``,
tidemark.sightings); after a mark its sender never answered, *absent* is no verdict
(``resolve_in_doubt``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

from tidemark import metrics
from tidemark.actions import Action, ProbeResult, ProbeStatus, StepContext
from tidemark.errors import (
    NeedsDecision,
    NotSent,
    NotStopped,
    Refused,
    StepBusy,
    StepFailed,
    StoreUnavailable,
    TaskKilled,
    TaskStopped,
    TaskUnwound,
    TidemarkError,
    Unauthorized,
)
from tidemark.faults import crash_point
from tidemark.reads import patient_reads
from tidemark.sightings import SIGHTINGS
from tidemark.step_threads import StepThreads
from tidemark.store import LEASE_S, JournalRow, JournalStore, StepSession
from tidemark.wire import Wire, calling
from tidemark.words import EventKind, Phase, ResolvedBy, StepStatus

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Direction:
    """Forward or backward: the journal's phase of an attempt, and what goes with it."""

    phase: Phase  # the journal row's phase
    crash_prefix: str  # the crash points of this phase are named with it (tidemark.faults)
    # The step metrics (settled, left in doubt) count forward attempts: they are labelled with
    # the action's name only, so a compensation counted there would read as the step itself.
    counted: bool


DO = Direction(Phase.DO, "", counted=True)
UNDO = Direction(Phase.UNDO, "undo_", counted=False)


class Side(Protocol):
    """What differs between doing a step and undoing it, for ``attempt``."""

    @property
    def direction(self) -> Direction: ...

    @property
    def action(self) -> Action: ...

    @property
    def ctx(self) -> StepContext:
        """The step as the action sees it, before any intent of this attempt."""
        ...

    @property
    def name(self) -> str:
        """How a refusal names the attempt (StepFailed)."""
        ...

    def key(self, attempt: int) -> str:
        """The idempotency key of the attempt numbered ``attempt`` (1 for the first)."""
        ...

    def context(self, intent: JournalRow) -> StepContext:
        """What the action is given once ``intent`` (its row of this phase) is written."""
        ...

    def resume(self, s: StepSession, ctx: StepContext) -> JournalRow | None:
        """For an open intent whose lease has passed: the settled row, or None.

        For an open intent whose lease has passed: the row settled without acting, or None
        when the attempt acts on the intent again."""
        ...

    def before_state(self, s: StepSession) -> dict[str, Any]:
        """The before_state of a new intent (a forward step runs its gates here first)."""
        ...

    def call(self, store: JournalStore, s: StepSession, ctx: StepContext) -> dict[str, Any]:
        """The call to the target, under the lease; returns the outcome."""
        ...


@contextmanager
def locked(store: JournalStore, task_id: str, step: int, way: Direction = DO, *,
           acting: Direction) -> Iterator[StepSession]:
    """Begins an attempt on the step's row and checks its stop state.

    Begins an attempt on the step's row of ``way`` and checks the stop state read with it
    for an attempt of ``acting`` (check_stop). This early check only saves work: the statement
    that writes (or claims) the intent checks the same state again, so a stop committed after
    the read still prevents the action."""
    with store.execution(task_id, step, way.phase) as s:
        check_stop(s, task_id, acting)
        yield s


def check_stop(s: StepSession, task_id: str, acting: Direction) -> None:
    """Whether the task's stop state lets an attempt of this kind act.

    A forward step acts only on a task neither stopped nor unwound; a compensation only on a
    stopped task no kill applies to (a person lifts a kill for unwinding with ``tidemark release
    T --for-unwind``)."""
    if acting is UNDO:
        if s.stopped is None:
            raise NotStopped(task_id)
        if s.killed:
            raise TaskKilled(task_id)
        return
    if s.unwound:
        raise TaskUnwound(task_id)
    if s.stopped is not None:
        raise TaskStopped(task_id, s.stopped, s.stop_scope)


def attempt(store: JournalStore, s: StepSession, side: Side, *,
            flush_outcome: bool = True) -> JournalRow:
    """Lease, intent, act and settle, for the attempt ``s`` began.

    Its row of ``side.direction``, as read then, is ``s.row``. A recorded outcome the side does not
    act on again is the caller's to return before. Returns the settled row: done by the call, or as
    the side's resume found it.

    ``flush_outcome=False`` commits the outcome without waiting for the disk
    (tidemark.store.StepSession.complete): the caller makes it durable before reporting it.
    """
    opened = open_attempt(s, side)
    if isinstance(opened, JournalRow):
        return opened
    return act(store, s, side, opened, flush_outcome)


@dataclass(frozen=True)
class Call:
    """An attempt whose intent is written (or claimed) and owned: what its call is given."""

    ctx: StepContext  # the step as the action sees it, with the intent's before_state
    key: str  # the intent's idempotency key
    lease_from: float  # guarded_call's lease_from


def open_attempt(s: StepSession, side: Side) -> JournalRow | Call:
    """The part of ``attempt`` before the call.

    The row settled without acting (the side's resume found it done), or the owned intent the call
    is to act on."""
    row = s.row
    if row is not None and row.outcome is None:
        # In doubt: an earlier attempt wrote the intent and ended, or may still be acting.
        with taken_over(s, side.ctx):
            ctx = side.context(row)
            settled = side.resume(s, ctx)
            if settled is not None:
                return settled
            key = row.idem_key
            lease_from = time.monotonic()  # before the statement: the cover it gives errs early
            s.claim(ctx.task_id, key, call_lease(side.action), phase=side.direction.phase)
    else:
        # A settled earlier attempt of this phase is never rewritten: the next one is new.
        number = 1 if row is None else row.attempt + 1
        key = side.key(number)
        lease_from, row = _intent(s, side, key, number)
        ctx = side.context(row)
    crash_point(side.direction.crash_prefix + "after_intent", ctx.step)
    return Call(ctx, key, lease_from)


def _intent(s: StepSession, side: Side, key: str, number: int) -> tuple[float, JournalRow]:
    """Commits a new intent with the lease of the call it precedes.

    Returns this machine's monotonic time just before the statement (guarded_call's ``lease_from``)
    and the row."""
    ctx = side.ctx
    before = side.before_state(s)
    crash_point(side.direction.crash_prefix + "before_intent", ctx.step)
    lease_from = time.monotonic()
    row = s.begin(task_id=ctx.task_id, step=ctx.step, key=key, action=ctx.action,
                  args=ctx.args, before_state=before, lease_s=call_lease(side.action),
                  phase=side.direction.phase, attempt=number)
    return lease_from, row


def act(store: JournalStore, s: StepSession, side: Side, call: Call,
        flush_outcome: bool) -> JournalRow:
    """Runs the side's call under its lease and settles the intent with the result.

    Runs the side's call under its lease and settles the intent with what came of it: an
    outcome is done, a refusal is failed (StepFailed), anything else leaves it in doubt."""
    try:
        with guarded_call(store, s, call.key, side.action, call.lease_from), \
                calling(wire_of(store, s, side, call)):
            outcome = side.call(store, s, call.ctx)
    except Refused as e:
        refused(s, side, call.ctx, call.key, e)
    except Exception as e:
        in_doubt(s, side, call, e)
        raise
    return settle(s, side, call, outcome, flush_outcome)


def wire_of(store: JournalStore, s: StepSession, side: Side, call: Call) -> Wire:
    """What the transports of the call's requests check just before each leaves.

    What the transports of the call's requests check just before each leaves
    (tidemark.wire): the call's lease covers it, on this machine's monotonic clock; and for a
    forward step of an action whose target's fence may not stop a late request, the mark,
    journaled first by a statement that fails once this attempt no longer owns its intent."""
    action = side.action
    marks = side.direction is DO and action.marks_sends
    return Wire(call.ctx.step, side.direction.crash_prefix,
                covered=lambda: store.covers(call.key),
                mark=(lambda: s.mark_sent(call.key)) if marks else None)


class AwaitingSide(Side, Protocol):
    """A side whose call can be awaited (a forward step whose action ``awaits``)."""

    async def call_async(self, store: JournalStore, s: StepSession, ctx: StepContext,
                         threads: StepThreads) -> dict[str, Any]:
        """``call``, with the blocking parts on ``threads``.

        ``call`` with the wait on the target awaited on the event loop and every blocking part on
        ``threads``."""
        ...


async def act_async(store: JournalStore, s: StepSession, side: AwaitingSide, call: Call,
                    threads: StepThreads) -> JournalRow:
    """``act`` for a call awaited on the event loop.

    The same lease, the same settling, with each journal statement on a step thread. A caller
    cancelled meanwhile must let this run to its end (tidemark.step_threads.to_its_end): cancelling
    the call would not stop a request that has left, and would leave the step in doubt, to be
    probed before the target applied it."""
    lease = guarded_call(store, s, call.key, side.action, call.lease_from)
    lease.__enter__()  # only registers the key with the lease keeper
    outcome: dict[str, Any] = {}
    failed: BaseException | None = None
    try:
        with calling(wire_of(store, s, side, call)):
            outcome = await side.call_async(store, s, call.ctx, threads)
    except (Exception, asyncio.CancelledError) as e:  # the call itself cancelled: in doubt
        failed = e
    done = await threads.run(_after_call, lease, s, side, call, outcome, failed)
    if failed is not None:
        raise failed
    assert done is not None
    return done


def _after_call(lease: contextlib.AbstractContextManager[None], s: StepSession, side: Side,
                call: Call, outcome: dict[str, Any], failed: BaseException | None
                ) -> JournalRow | None:
    """What follows an awaited call, in one hand-over to a step thread.

    The end of the lease's renewal (it may wait for a renewal in flight), then the call settled as
    ``act`` settles it. Returns the done row; None when the call failed and the step is left in
    doubt (the caller raises the call's error); a refusal raises StepFailed."""
    lease.__exit__(None, None, None)
    if failed is None:
        return settle(s, side, call, outcome, True)
    if isinstance(failed, Refused):
        refused(s, side, call.ctx, call.key, failed)
    in_doubt(s, side, call, failed)
    return None


def settle(s: StepSession, side: Side, call: Call, outcome: dict[str, Any],
           flush_outcome: bool) -> JournalRow:
    """Records the call's outcome: the step (or its compensation) is done."""
    ctx = call.ctx
    crash_point(side.direction.crash_prefix + "after_execute", ctx.step)
    done = s.complete(key=call.key, outcome=outcome, status=StepStatus.DONE,
                      resolved_by=ResolvedBy.EXECUTE,
                      flush=flush_outcome)
    if side.direction.counted:
        metrics.step_settled(ctx.action, "execute", "done", s.began)
    crash_point(side.direction.crash_prefix + "after_outcome", ctx.step)
    return done


def in_doubt(s: StepSession, side: Side, call: Call, e: BaseException) -> None:
    """Leaves the intent open after a call that ended in doubt.

    After a call that ended without an outcome or a refusal (Unauthorized, TargetUnavailable,
    anything unforeseen, a cancelled wait): the action may or may not have applied, so the
    intent stays open and the next attempt probes it (or, for a compensation, applies it
    again), once the target's horizon has passed. NotSent (held at the wire, or Throttled:
    turned away) says nothing reached the target: the mark is taken back and the lease given
    back instead, so the next attempt probes at once."""
    if isinstance(e, NotSent):  # turned away or held back: nothing of it can land later
        with contextlib.suppress(TidemarkError):
            s.not_sent(call.key)
    else:
        end_attempt(s, call.key, side.action)
    note_error(s, call.ctx, e)
    if side.direction.counted:
        metrics.left_in_doubt(call.ctx.action, type(e).__name__)


def refused(s: StepSession, side: Side, ctx: StepContext, key: str, e: Refused) -> NoReturn:
    """The target refused for good: the attempt fails as StepFailed.

    The target refused for good: the refusal is the attempt's outcome (failed), and the
    attempt fails as StepFailed. A compensation refused is tried again only by a later unwind,
    under a new attempt."""
    s.complete(key=key, outcome={"error": str(e), "type": type(e).__name__},
               status=StepStatus.FAILED, resolved_by=ResolvedBy.EXECUTE)
    if side.direction.counted:
        metrics.step_settled(ctx.action, "execute", "failed", s.began)
    log.info("step %s %s refused by the target: %s", ctx.step, side.name, e)
    raise StepFailed(ctx.step, side.name, str(e)) from e


# A twin whose own count of a lapsed lease (tidemark.sightings) has at most this long to run
# waits for it within the attempt rather than going back to Temporal as StepBusy: a retry's
# interval doubles from 0.5 s (workflows.shared.STEP_RETRY), so a wait of a few seconds ends
# sooner here. Twice LEASE_S covers the whole count of a dead attempt's last renewal (LEASE_S)
# with room; a longer count goes back as StepBusy, so that no step thread waits long.
INLINE_WAIT_S = 2 * LEASE_S


@contextmanager
def taken_over(s: StepSession, ctx: StepContext) -> Iterator[None]:
    """This attempt takes over the open intent ``s.row`` before it probes or acts.

    This attempt takes over the open intent ``s.row`` before it probes or acts on it, in the
    one statement that checks the lease and the row (StepSession.take_over): StepBusy while
    the last attempt's lease runs, and StepBusy if another attempt took it over first.

    The lease must have passed on two clocks, so that no single clock decides: on the
    database's, where it is written, and on this process's monotonic clock, which must have
    seen the row unchanged for the lease's whole length (tidemark.sightings): a step of the
    database's clock alone never hands the step to a twin while the last attempt may still be
    acting. A count with a few seconds left is waited out here (INLINE_WAIT_S).

    The take-over's own lease (LEASE_S) covers the probe: an attempt whose probe outlasts it
    may find the intent taken over by a twin, whose writes then win; both only read the target
    until one of them claims the intent, and the other's claim or outcome is refused. If the
    block ends in an error before anything acted (the probe cannot tell, a gate refuses, the
    task was stopped), the lease is given back: the next attempt need not wait for it. The
    block must end before the action's call, which the claimed lease covers."""
    assert s.row is not None
    key = s.row.idem_key
    seen = SIGHTINGS.left(key, (s.seen_owner, s.seen_version), s.lease_length)
    if 0 < seen <= INLINE_WAIT_S and (s.lease_left or 0.0) <= 0:
        time.sleep(seen)  # the row is read again by the take-over's statement
        seen = SIGHTINGS.left(key, (s.seen_owner, s.seen_version), s.lease_length)
    left = s.take_over(key, LEASE_S, LEASE_S) if seen <= 0 else max(seen, s.lease_left or 0.0)
    if left is not None and left > 0:
        metrics.lease_wait(ctx.action)
        raise StepBusy(f"{ctx.task_id}/{ctx.step}", "an earlier attempt may still be acting "
                       f"on it for {left:.1f}s")
    if left is not None:
        raise StepBusy(f"{ctx.task_id}/{ctx.step}", "another attempt took it over, or settled "
                       "it, first")
    SIGHTINGS.forget(key)
    try:
        yield
    except BaseException:
        with contextlib.suppress(TidemarkError):
            s.give_back(key)
        raise


def covered_call_s(action: Action) -> float:
    """Seconds of an action's call that its first lease covers with no renewal.

    Seconds of an action's call that the lease written before it covers with no renewal:
    its declared deadline, but never less than what one renewal adds (LEASE_S). Past it, only
    committed renewals cover the call, and the deadline watch ends the process rather than let
    the lease lapse under a call still running; the floor leaves a short-deadline action time
    for its first renewal (LEASE_RENEW_S later) before the watch would have to act."""
    return max(float(action.deadline_s), LEASE_S)


def call_lease(action: Action) -> float:
    """Seconds the lease written before an action's call must cover.

    The call itself (its deadline) and then the time the target may still apply the request (its
    horizon)."""
    return covered_call_s(action) + float(action.horizon_s)


def renewal_lease(action: Action) -> float:
    """Seconds each renewal extends the lease to while the action is still running."""
    return LEASE_S + float(action.horizon_s)


def guarded_call(store: JournalStore, s: StepSession, key: str, action: Action,
                 lease_from: float) -> contextlib.AbstractContextManager[None]:
    """The block in which an action's call runs under a renewed lease.

    Its lease is renewed, and the process ends before the lease could lapse while the call still
    runs (tidemark.store.LeaseKeeper).

    ``lease_from`` is this machine's monotonic time just before the statement that wrote the
    call's lease (call_lease seconds from then, on the database's clock): a request that leaves
    us before ``lease_from + covered_call_s(action)`` is covered by it whether or not any
    renewal succeeds. Past that, only committed renewals cover the call."""
    return store.keep_lease(key, s.attempt_token(), renewal_lease(action),
                            horizon_s=float(action.horizon_s),
                            covered_until=lease_from + covered_call_s(action),
                            deadline_s=float(action.deadline_s))


def end_attempt(s: StepSession, key: str, action: Action) -> None:
    """Ends an attempt after an ambiguous failure, holding the lease for the horizon.

    After an ambiguous failure: the attempt is over, but its request may still be applied
    for the target's horizon, so the lease is held that long (not cut to zero). If this write
    fails, the lease written before the call still covers it."""
    with contextlib.suppress(TidemarkError):
        s.renew_lease(key, float(action.horizon_s))


def note_error(s: StepSession, ctx: StepContext, e: BaseException) -> None:
    """Logs an action's failure as an event (the intent stays open)."""
    # If the database is gone too, the open intent already tells the story.
    with contextlib.suppress(TidemarkError):
        s.event(ctx.task_id, EventKind.ERROR, {"type": type(e).__name__, "message": str(e),
                                       "retryable": getattr(e, "retryable", True),
                                       "known": isinstance(e, TidemarkError)}, ctx.step)


def resolve_in_doubt(action: Action, ctx: StepContext, s: StepSession) -> JournalRow | None:
    """Probes the forward step in doubt and records what the target says.

    Returns the completed row when the probe says done, None when it says absent (the world is
    as before_state recorded). Raises NeedsDecision when the probe cannot tell.
    """
    probed = _unanswered_mark(action, ctx, _probe(action, ctx))
    s.event(ctx.task_id, EventKind.PROBE, probed.as_json(), ctx.step)
    metrics.probe_answered(ctx.action, probed.status.value)
    if probed.status is ProbeStatus.DONE:
        done = s.complete(key=ctx.key, outcome=probed.observed, status=StepStatus.DONE,
                          resolved_by=ResolvedBy.PROBE)
        metrics.step_settled(ctx.action, "probe", "done", s.began)
        return done
    if probed.status is ProbeStatus.UNKNOWN:
        # The target cannot tell; only a person who looked may (`tidemark resolve`).
        # A decision licenses one execution: using it is logged as the newer decision.
        assert ctx.started_at is not None
        decided = s.operator_decision(ctx.task_id, ctx.step, ctx.started_at)
        if decided is None or decided["detail"].get("as") != "absent":
            raise NeedsDecision(ctx.step, ctx.action, probed.reason)
        s.event(ctx.task_id, EventKind.DECISION, {"as": "used", "decided_by": decided["actor"],
                                          "decided_at": decided["at"].isoformat()}, ctx.step)
        log.info("step %s %s: probe cannot tell; %s decided it did not happen",
                 ctx.step, ctx.action, decided["actor"])
    return None


def _unanswered_mark(action: Action, ctx: StepContext, probed: ProbeResult) -> ProbeResult:
    """A probe's *absent* is no verdict while an earlier effect is unanswered.

    A probe's *absent* is no verdict while an earlier attempt's effect request was marked
    as leaving and that attempt never reported back (tidemark.wire): it may be a process that
    stands still with its request still to leave, after anything done now. Only *done*, or
    *unknown* with what was seen (the lease, written to cover that request and the target's
    horizon, has passed), for an action whose target's fence cannot stop a late request."""
    if (probed.status is not ProbeStatus.ABSENT or not action.marks_sends
            or ctx.sent_at is None or ctx.answered):
        return probed
    return ProbeResult.unknown(
        f"the target shows nothing of this step ({probed.reason}), but an earlier attempt "
        f"marked its request as leaving at {ctx.sent_at.isoformat()} and never reported back: "
        "its process crashed, or stands still (a pause, swap, a suspended VM) with the request "
        "still to leave, and sending again could put a later state under it. Make sure that "
        "worker is gone (or look at the target again later), then decide", probed.observed)


def _probe(action: Action, ctx: StepContext) -> ProbeResult:
    """Runs the probe; a probe that fails to run could not decide, so it answers unknown.

    Two failures are not the target's silence and are raised as they are: a rejected
    credential is how a task is stopped from outside (the grant was revoked), so it stops the
    task as such rather than asking a person to decide; and the journal's own database out of
    reach (StoreUnavailable, e.g. the grant of the probe's credential could not be read) says
    nothing about the target, so the attempt is retried rather than stopped for a person.
    """
    try:
        with patient_reads():  # a throttled or failing read is waited out before unknown
            return action.probe(ctx)
    except (Unauthorized, StoreUnavailable):
        raise
    except Exception as e:  # any other failure of a read-only probe means "cannot tell"
        log.warning("probe of step %s %s failed: %r", ctx.step, ctx.action, e)
        return ProbeResult.unknown(f"probe failed: {type(e).__name__}: {e}")
