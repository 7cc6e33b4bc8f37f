"""The irreversible boundary: what happens before a run's first irreversible step.

Irreversible work happens last, after the verification gates have passed. When a run reaches
the first irreversible step of its plan it first

1. re-probes every earlier reversible step whose outcome is done (the verification gate): each
   action's own probe, against the journaled key, intent time, before_state and staged handle;
   the step must still be *done*. A file somebody renamed since answers *unknown* (our stamp,
   another name) and stops the task for a person, naming the step and what the probe saw;
2. runs the plan-level gates again (the per-task payment limit);
3. if the operator's policy (tidemark/approval.py) or the plan asks for it, waits for a person
   to approve or reject (``tidemark approve`` / ``tidemark reject``), journaled as events.

The gate never executes or records an outcome: it only reads the targets and logs one
``verification`` event. It costs one probe per verified step. Steps a person settled as done
(``tidemark resolve --as done``, resolved_by operator) are not re-probed: their probe could not
tell when the person decided, and the person's word is what the journal holds; they are listed
in the event as such.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tidemark.actions import ProbeResult, ProbeStatus, Registry, StepContext
from tidemark.approval import ApprovalPolicy, effective, steps_needing_person
from tidemark.errors import ConfigError, TidemarkError, Unauthorized
from tidemark.limits import cut
from tidemark.money import shown
from tidemark.plan import Plan
from tidemark.words import EventKind, ResolvedBy

# Named in annotations only: the commands that show what a step will do (`tidemark approve`, the
# inbox) import this module without the store and its driver.
if TYPE_CHECKING:
    from tidemark.store import JournalRow, JournalStore

log = logging.getLogger(__name__)

# The gate's result crosses to the workflow as one payload (Temporal refuses one over 2 MiB, and
# an activity whose result it refuses is retried for ever): it carries the count of failures and
# the first of them, each cut to FIELD_CHARS per field; the verification event holds them all.
BRIEF_FAILURES = 20
FIELD_CHARS = 300


@dataclass
class Verification:
    """What the gate found: ``failures`` lists the steps that no longer hold, with the probe's
    status, reason and observation."""

    boundary: int
    verified: int = 0
    on_word: list[int] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def passed(self) -> bool:
        return not self.failures

    def as_json(self) -> dict[str, Any]:
        return {"boundary": self.boundary, "passed": self.passed, "verified": self.verified,
                "on_word": self.on_word, "failures": self.failures,
                "elapsed_ms": round(self.elapsed_s * 1000, 1)}

    def brief(self) -> list[dict[str, Any]]:
        """The first BRIEF_FAILURES failures, each cut to what a person reads first (step,
        action, what it does, status, reason): what crosses to the workflow, whatever the
        plan's length. The verification event holds every failure in full."""
        return [{"step": f["step"], "action": f["action"],
                 "describe": cut(str(f["describe"]), FIELD_CHARS), "status": f["status"],
                 "reason": cut(str(f["reason"]), FIELD_CHARS),
                 "observed": _small(f.get("observed"))}
                for f in self.failures[:BRIEF_FAILURES]]

    def summary(self) -> str:
        if self.passed:
            return (f"verified {self.verified} reversible step(s) before step {self.boundary}: "
                    "all hold")
        steps = ", ".join(str(f["step"]) for f in self.failures[:BRIEF_FAILURES]) + (
            f" … ({len(self.failures):,} in all)" if len(self.failures) > BRIEF_FAILURES
            else "")
        named = "; ".join(f"step {f['step']} {f['action']} {cut(str(f['describe']), FIELD_CHARS)}"
                          f": {cut(str(f['reason']), FIELD_CHARS)}" for f in self.failures[:5])
        more = f"; and {len(self.failures) - 5} more" if len(self.failures) > 5 else ""
        return (f"verified {self.verified} reversible step(s) before step {self.boundary}: "
                f"step(s) {steps} no longer hold: {named}{more}")


def _small(value: Any) -> Any:
    """``value`` when its JSON fits FIELD_CHARS; else that JSON, cut."""
    text = json.dumps(value, sort_keys=True, default=str)
    return value if len(text) <= FIELD_CHARS else cut(text, FIELD_CHARS)


def probe_row(registry: Registry, row: JournalRow) -> ProbeResult:
    """The action's probe of a done row, with the context its run journaled. A probe that
    fails to run cannot confirm, so it answers unknown; a rejected credential stops the task."""
    action = registry.bound(row.action)
    ctx = StepContext(task_id=row.task_id, step=row.step, action=row.action, args=row.args,
                      key=row.idem_key, started_at=row.started_at,
                      before_state=row.before_state, staged=row.staged)
    try:
        return action.probe(ctx)
    except Unauthorized:
        raise
    except Exception as e:  # a read-only probe that cannot run cannot confirm either
        log.warning("verification probe of step %s %s failed: %r", row.step, row.action, e)
        return ProbeResult.unknown(f"probe failed: {type(e).__name__}: {e}")


def verify_reversible(store: JournalStore, registry: Registry, task_id: str, boundary: int,
                      *, tick: Any = None) -> Verification:
    """Re-probes every done reversible step before ``boundary`` and logs the result as one
    ``verification`` event. Never executes anything and never changes the journal's rows.

    ``tick`` (optional, no arguments) is called after each probe: the activity heartbeats.
    """
    started = time.perf_counter()
    result = Verification(boundary=boundary)
    for row in store.verifiable_rows(task_id, boundary):
        if row.resolved_by == ResolvedBy.OPERATOR:
            result.on_word.append(row.step)
            continue
        probed = probe_row(registry, row)
        result.verified += 1
        if probed.status is not ProbeStatus.DONE:
            spec = registry.spec(row.action)
            result.failures.append({"step": row.step, "action": row.action,
                                    "describe": spec.describe(row.args) if spec else "",
                                    "args": row.args, "status": str(probed.status),
                                    "reason": probed.reason, "observed": probed.observed})
        if tick is not None:
            tick()
    result.elapsed_s = time.perf_counter() - started
    store.record_event(task_id, EventKind.VERIFICATION, result.as_json(), boundary)
    return result


# -- what the irreversible steps will do ----------------------------------------------------

def _money(amount: Any, currency: Any) -> str:
    """In the currency's own units (50,000 JPY, 42.00 EUR), with the minor units the target is
    sent."""
    cur = str(currency or "")
    if isinstance(amount, int) and not isinstance(amount, bool) and cur:
        return f"amount {shown(amount, cur)} ({amount} minor units)"
    return f"amount {amount} {cur.upper()}"


def what_it_will_do(number: int, action: str, args: dict[str, Any]) -> str:
    """One line per irreversible step for the person who approves: every recipient, subject,
    amount and currency, whatever the action."""
    parts = []
    for k in ("to", "cc", "bcc"):
        if args.get(k):
            v = args[k]
            parts.append(f"{k} {', '.join(v) if isinstance(v, list) else v}")
    if "subject" in args:
        parts.append(f"subject {args['subject']!r}")
    if "amount" in args:
        parts.append(_money(args["amount"], args.get("currency")))
    for k in ("customer", "description"):
        if args.get(k):
            parts.append(f"{k} {args[k]!r}")
    shown_keys = {"to", "cc", "bcc", "subject", "amount", "currency", "customer",
                  "description", "body"}
    parts += [f"{k} {args[k]!r}" for k in sorted(set(args) - shown_keys)]
    return f"step {number} {action}: " + "; ".join(parts)


def irreversible_lines(plan: Plan) -> list[str]:
    return [what_it_will_do(s.number, s.action, s.args) for s in plan.steps if s.irreversible]


def approval_needed(store: JournalStore, worker: ApprovalPolicy,
                    plan: Plan) -> dict[str, Any] | None:
    """What a person must approve before the plan's irreversible steps, under the operator's
    policy (the series' declaration, else the worker's) and the plan's own ask for more; None
    when nothing waits. Recorded (``approval_requests``), so that ``tidemark approve`` checks
    the decider against these approvers and shows these lines."""
    series = store.series_of(plan.task_id)
    declared = store.declared_series(series) if series else None
    try:
        policy, plan_asks = effective(worker, declared, plan.approval is not None)
    except ConfigError as e:  # a declaration that no longer parses: the safest reading
        log.warning("%s; every irreversible step waits for a person", e)
        policy, plan_asks = worker, True
    waiting = steps_needing_person(policy, plan_asks, [(s.number, s.args) for s in plan.steps
                                                       if s.irreversible])
    if not waiting:
        return None
    lines = irreversible_lines(plan)
    store.ask_approval(plan.task_id, policy.text + (" + plan" if plan_asks else ""),
                       list(policy.approvers), waiting, lines)
    return {"approvers": list(policy.approvers), "lines": lines, "steps": waiting,
            "policy": policy.text}


def check_approver(asked: dict[str, Any] | None, task_id: str, user: str) -> None:
    """Raises ApprovalError unless a run of the task waits for a person and the operating-
    system user ``user`` is among the approvers the operator configured."""
    if asked is None:
        raise ApprovalError(f"task {task_id!r} is not waiting for approval: no run of it "
                            "reached its irreversible steps under a policy that asks a person")
    approvers = list(asked["approvers"])
    if user not in approvers:
        who = ", ".join(approvers) if approvers else (
            "nobody: set TIDEMARK_APPROVERS on the worker, or the series' --approvers")
        raise ApprovalError(f"{user} (the operating-system user running this command) may not "
                            f"decide on task {task_id!r}; its approvers are {who}")


class ApprovalError(TidemarkError):
    """An approve or reject that the operator's policy or the journal does not allow."""
