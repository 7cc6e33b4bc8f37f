"""Unwinding: compensate a task's completed reversible steps, last first, from before_state.

Each compensation is journaled like a step, as phase ``undo`` with a key of its own, under the
same rules, by the same sequence (tidemark.attempt; ``Compensation`` is its undo side): intent
before the action, outcome after, at most one row in doubt per task. A
compensation states an end state ("the file should be named as before_state says"), so a
compensation found in doubt is simply applied again; the action checks the world first.

A forward step still in doubt is settled by its probe first, never executed: done -> it is
recorded and then compensated; absent -> it is closed as not done and there is nothing to
undo; unknown -> NeedsDecision. Irreversible steps are never touched, only reported.

A compensation the target refused (someone changed the file since) is journaled as failed and
reported as refused, never as undone. Once a person has cleared the way, a new unwind tries it
again under a new undo row (attempt 2, 3, ...), so no outcome is ever rewritten.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from tidemark.actions import Action, Registry, StepContext
from tidemark.attempt import (
    DO,
    UNDO,
    Direction,
    attempt,
    locked,
    resolve_in_doubt,
    taken_over,
)
from tidemark.errors import Refused
from tidemark.keys import key_for
from tidemark.store import JournalRow, JournalStore, StepSession
from tidemark.words import ResolvedBy, StepStatus

# The compensation's key: key_for(task, step, action + "#undo", args) for its first attempt,
# action + "#undo#<n>" for attempt n > 1.
UNDO_SUFFIX = "#undo"


@dataclass(frozen=True)
class UndoResult:
    step: int
    action: str
    status: str  # undone | nothing_to_undo | already_undone
    outcome: dict[str, Any]


def undo_key(task_id: str, step: int, action: str, args: dict[str, Any],
             attempt: int = 1) -> str:
    suffix = UNDO_SUFFIX if attempt == 1 else f"{UNDO_SUFFIX}#{attempt}"
    return key_for(task_id, step, action + suffix, args)


def unwind_step(store: JournalStore, registry: Registry, task_id: str, step: int) -> UndoResult:
    """Compensates one reversible step of a stopped task, at most once.

    Raises:
        NotStopped: the task's stop state is not set.
        TaskKilled: a kill applies to the task (a person lifts it for unwinding with
            ``tidemark release T --for-unwind``); checked before the compensation and again in
            the statement that writes its intent, so none starts once a kill is committed.
        NeedsDecision: the forward step is in doubt and its probe cannot tell.
        StepFailed: the compensation was refused (e.g. someone changed the file since); the
            refusal is its attempt's outcome, and a later unwind tries again under a new one.
        StepBusy, StoreUnavailable, TargetUnavailable, Unauthorized: retry or stop, as for
            a forward step; a compensation left in doubt is applied again next time.
    """
    # The stop state is checked for a compensation when the forward step's row is read; the
    # statement that writes (or claims) the compensation's intent checks it again.
    with locked(store, task_id, step, DO, acting=UNDO) as s:
        spec, row = s.spec, s.row
        action = registry.bound(spec.action)
        ctx = StepContext(task_id=task_id, step=step, action=spec.action, args=spec.args,
                          key=key_for(task_id, step, spec.action, spec.args))
        if spec.irreversible:
            raise Refused(f"step {step} {spec.action} is irreversible; it is reported, "
                          "never compensated")
        if row is None:
            return UndoResult(step, spec.action, "nothing_to_undo", {"reason": "never started"})
        ctx = replace(ctx, started_at=row.started_at, before_state=row.before_state)
        if row.outcome is None:
            with taken_over(s, ctx):
                settled = resolve_in_doubt(action, ctx, s)
                if settled is None:
                    s.complete(key=ctx.key,
                               outcome={"not_done": "absent when the task was unwound"},
                               status=StepStatus.FAILED, resolved_by=ResolvedBy.PROBE)
                    return UndoResult(step, spec.action, "nothing_to_undo",
                                      {"reason": "the probe found it not done"})
            row = settled
        if row.status != "done":
            return UndoResult(step, spec.action, "nothing_to_undo",
                              {"reason": f"step is {row.status}"})
        ctx = replace(ctx, outcome=row.outcome)

    with store.execution(task_id, step, UNDO.phase) as u:
        last = u.row
        if last is not None and last.status == "done":
            return UndoResult(step, spec.action, "already_undone", last.outcome or {})
        # First try, again after a refusal (a new attempt), or in doubt (applied again).
        done = attempt(store, u, Compensation(action, ctx, row.outcome or {}))
        return UndoResult(step, spec.action, "undone", done.outcome or {})


@dataclass(frozen=True)
class Compensation:
    """The backward side of an attempt: the action's compensation.

    A tidemark.attempt.Side. The action's compensation is given the forward step as it was
    journaled (its before_state and its outcome)."""

    action: Action
    ctx: StepContext  # the forward step's, with its outcome
    forward_outcome: dict[str, Any]  # the compensation's before_state: what it undoes

    @property
    def direction(self) -> Direction:
        return UNDO

    @property
    def name(self) -> str:
        return self.ctx.action + UNDO_SUFFIX

    def key(self, attempt: int) -> str:
        return undo_key(self.ctx.task_id, self.ctx.step, self.ctx.action, self.ctx.args,
                        attempt)

    def context(self, intent: JournalRow) -> StepContext:
        return self.ctx

    def resume(self, s: StepSession, ctx: StepContext) -> JournalRow | None:
        """A compensation found in doubt is simply applied again.

        A compensation states an end state, so one found in doubt is simply applied again:
        the action checks the world first."""
        return None

    def before_state(self, s: StepSession) -> dict[str, Any]:
        return self.forward_outcome

    def call(self, store: JournalStore, s: StepSession, ctx: StepContext) -> dict[str, Any]:
        return self.action.compensate(ctx)
