"""The irreversible boundary: what happens before a run's first irreversible step.

Irreversible work happens last, after the verification gates have passed. When a run reaches
the first irreversible step of its plan it first

1. re-probes every earlier reversible step whose outcome is done (the verification gate): each
   action's own probe, against the journaled key, intent time, before_state and staged handle;
   the step must still be *done*. A file somebody renamed since answers *unknown* (our stamp,
   another name) and stops the task for a person, naming the step and what the probe saw;
2. runs the plan-level gates again (the per-task payment limit);
3. if the operator's policy (tidemark/approval.py) or the plan asks for it, waits for a person
   to approve or reject (``tidemark approve`` / ``tidemark reject``). The decision is the
   journal's (``tidemark.decisions``): the irreversible intent is refused without it.

The gate never executes or records an outcome: it only reads the targets and logs one
``verification`` event. It costs one probe per verified step. Steps a person settled as done
(``tidemark resolve --as done``, resolved_by operator) are not re-probed: their probe could not
tell when the person decided, and the person's word is what the journal holds; they are listed
in the event as such. A step whose target (Action.target) a later done step set again is not
probed either: the later step's state is what must show, and its probe checks it.

The same verification runs at the end of every plan (``verify_end``, before a run says
``completed``), for the steps it can check cheaply: the last step of each target that the plan
set more than once, where a request of an earlier step that landed late (a frozen worker's) would
show an earlier step's state. A plan that sets each target once costs no probe there.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tidemark.actions import ProbeResult, ProbeStatus, Registry, StepContext
from tidemark.approval import (
    DEFAULT_POLICY,
    ApprovalPolicy,
    narrowed,
    parse_policy,
    series_policy,
    why_asked,
)
from tidemark.errors import TidemarkError, Unauthorized
from tidemark.limits import cut
from tidemark.plan import Plan, Step
from tidemark.reads import patient_reads
from tidemark.will_do import at_a_glance, what_it_will_do
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
    """What the gate found.

    ``failures`` lists the steps that no longer hold, with the probe's status, reason and
    observation."""

    boundary: int
    verified: int = 0
    on_word: list[int] = field(default_factory=list)
    superseded: list[int] = field(default_factory=list)  # a later step set the same target
    at_end: bool = False  # the verification at the end of the plan (verify_end)
    failures: list[dict[str, Any]] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def passed(self) -> bool:
        return not self.failures

    def as_json(self) -> dict[str, Any]:
        return {"boundary": self.boundary, "passed": self.passed, "verified": self.verified,
                "on_word": self.on_word, "superseded": self.superseded,
                "at_end": self.at_end, "failures": self.failures,
                "elapsed_ms": round(self.elapsed_s * 1000, 1)}

    @property
    def _where(self) -> str:
        return "at the end of the plan" if self.at_end else f"before step {self.boundary}"

    def brief(self) -> list[dict[str, Any]]:
        """The first BRIEF_FAILURES failures, each cut to what a person reads first.

        Each holds step, action, what it does, status and reason. This is what crosses to the
        workflow, whatever the plan's length. The verification event holds every failure in
        full."""
        return [{"step": f["step"], "action": f["action"],
                 "describe": cut(str(f["describe"]), FIELD_CHARS), "status": f["status"],
                 "reason": cut(str(f["reason"]), FIELD_CHARS),
                 "observed": _small(f.get("observed"))}
                for f in self.failures[:BRIEF_FAILURES]]

    def summary(self) -> str:
        if self.passed:
            return f"verified {self.verified} reversible step(s) {self._where}: all hold"
        steps = ", ".join(str(f["step"]) for f in self.failures[:BRIEF_FAILURES]) + (
            f" … ({len(self.failures):,} in all)" if len(self.failures) > BRIEF_FAILURES
            else "")
        named = "; ".join(f"step {f['step']} {f['action']} {cut(str(f['describe']), FIELD_CHARS)}"
                          f": {cut(str(f['reason']), FIELD_CHARS)}" for f in self.failures[:5])
        more = f"; and {len(self.failures) - 5} more" if len(self.failures) > 5 else ""
        return (f"verified {self.verified} reversible step(s) {self._where}: "
                f"step(s) {steps} no longer hold: {named}{more}")


def _small(value: Any) -> Any:
    """``value`` when its JSON fits FIELD_CHARS; else that JSON, cut."""
    text = json.dumps(value, sort_keys=True, default=str)
    return value if len(text) <= FIELD_CHARS else cut(text, FIELD_CHARS)


def probe_row(registry: Registry, row: JournalRow) -> ProbeResult:
    """The action's probe of a done row, with the context its run journaled.

    A probe that fails to run cannot confirm, so it answers unknown; a rejected credential stops
    the task."""
    action = registry.bound(row.action)
    ctx = StepContext(task_id=row.task_id, step=row.step, action=row.action, args=row.args,
                      key=row.idem_key, started_at=row.started_at,
                      before_state=row.before_state, staged=row.staged)
    try:
        with patient_reads():
            return action.probe(ctx)
    except Unauthorized:
        raise
    except Exception as e:  # a read-only probe that cannot run cannot confirm either
        log.warning("verification probe of step %s %s failed: %r", row.step, row.action, e)
        return ProbeResult.unknown(f"probe failed: {type(e).__name__}: {e}")


def verify_reversible(store: JournalStore, registry: Registry, task_id: str, boundary: int,
                      *, tick: Any = None, at_end: bool = False) -> Verification:
    """Re-probes every done reversible step before ``boundary`` and logs one event.

    The result is one ``verification`` event. Never executes anything and never changes the
    journal's rows.

    With ``at_end`` (the end of the plan: ``boundary`` is past its last step) only the last
    step of each target set more than once is probed. ``tick`` (optional, no arguments) is
    called after each probe: the activity heartbeats.
    """
    started = time.perf_counter()
    result = Verification(boundary=boundary, at_end=at_end)
    rows = store.verifiable_rows(task_id, boundary)
    later = _last_of_each_target(registry, rows)
    for row in rows:
        if row.resolved_by == ResolvedBy.OPERATOR:
            result.on_word.append(row.step)
            continue
        last = later.get(row.step)
        if last is not None and last != row.step:
            result.superseded.append(row.step)
            continue
        if at_end and last is None:
            continue  # its target was set once: nothing of an earlier step can show there
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


def _last_of_each_target(registry: Registry, rows: list[JournalRow]) -> dict[int, int]:
    """For each step whose target a later step also sets: that last step.

    For each step (of ``rows``, in step order) whose target another step of ``rows`` also
    set: the last step that set it."""
    return _last_setters(registry, ((r.step, r.action, r.args) for r in rows))


def sets_a_target_twice(registry: Registry, steps: list[Step]) -> bool:
    """Whether two of ``steps`` (a whole plan) set the same target.

    Only then can the verification at the end of the plan probe anything: it probes the last
    step of each target set more than once, among the done reversible steps, which are some of
    the plan's."""
    return bool(_last_setters(registry, ((s.number, s.action, s.args) for s in steps)))


def may_set_a_target_twice(registry: Registry, actions: list[str]) -> bool:
    """Whether a plan of ``actions`` (its distinct actions) might set one target twice.

    Read without its steps, for a plan too long to read whole: only an action that names its
    targets can set one (Action.names_targets)."""
    return any(spec is not None and spec.names_targets()
               for spec in (registry.spec(a) for a in actions))


def _last_setters(registry: Registry,
                  steps: Iterable[tuple[int, str, dict[str, Any]]]) -> dict[int, int]:
    steps_of: dict[tuple[str, str], list[int]] = {}
    for number, action, args in steps:
        spec = registry.spec(action)
        target = spec.target(args) if spec is not None else None
        if target is not None:
            steps_of.setdefault((action, target), []).append(number)
    return {step: steps[-1] for steps in steps_of.values() if len(steps) > 1 for step in steps}


def irreversible_lines(plan: Plan) -> list[str]:
    return [what_it_will_do(s.number, s.action, s.args) for s in plan.steps if s.irreversible]


def approval_needed(store: JournalStore, worker: ApprovalPolicy,
                    plan: Plan) -> dict[str, Any] | None:
    """What a person must approve before the plan's irreversible steps, or None.

    None when nothing waits. The answer is the strictest of the operator's policy in the journal,
    the series' declared policy, the plan's own ask and this worker's policy. The journal is asked
    too (its word is the one the intent's statement enforces: a series' daily limit, say). Recorded
    as the run's ask (``approval_requests``), which the journal also counts as a need: a worker
    asks for more, never less."""
    irreversible = [s for s in plan.steps if s.irreversible]
    if not irreversible:
        return None
    series = store.series_of(plan.task_id)
    declared = store.declared_series(series) if series else None
    held = store.policy()
    operator = (series_policy({"series": "*", **held}) if held is not None
                else parse_policy(DEFAULT_POLICY))
    why = why_asked([operator, series_policy(declared), worker], plan.approval is not None,
                    [s.args for s in irreversible])
    if why is None and store.approval_needed(plan.task_id):
        why = "the journal's policy asks a person (a daily limit of the series)"
    if why is None:
        return None
    lines = irreversible_lines(plan)
    waiting = [s.number for s in irreversible]
    store.ask_approval(plan.task_id, why, list(worker.approvers), waiting, lines)
    approvers = narrowed([held["approvers"] if held else None,
                          declared["approvers"] if declared else None, worker.approvers])
    return {"approvers": approvers, "lines": lines, "steps": waiting, "policy": why,
            "glance": at_a_glance([(s.action, s.args) for s in irreversible])}


class ApprovalError(TidemarkError):
    """An approve or reject that the command refuses before asking the journal.

    For example a word that is no decision, or a task with nothing irreversible."""
