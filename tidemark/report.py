"""The interruption report: how far a task got, what happened outside, whether re-running is safe.

Every figure comes from counting journal rows, not from reconstruction: rows = confirmed +
failed + in doubt, and an irreversible step whose number is past the last journal row was
provably never attempted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tidemark.store import JournalStore, Progress
from tidemark.will_do import what_it_will_do
from tidemark.words import HALT_ACTOR, ControlState, StepStatus, TaskState

# Failures shown one by one in the report's text; the rest are counted (the verification event
# of the journal holds every one, and `--json` gives them all).
SHOWN_FAILURES = 20
# What a journaled run end names the task's state by, when the rows alone read as a run going
# on: the gate that refused the run at its start, a failure that refused no step. Any other end
# (a stop, a halt, a kill, since released) leaves a task nothing runs: ``ended``.
_END_STATES = (TaskState.PRECONDITION_FAILED, TaskState.FAILED)


@dataclass(frozen=True)
class Report:
    progress: Progress
    irreversible: list[tuple[int, str, str | None, dict[str, Any]]]
    boundary: dict[str, Any] = field(default_factory=dict)  # store.boundary_state
    # The task's latest run event when that run ended other than completed and none began
    # since (store.run_ended): nothing runs the task.
    run_end: dict[str, Any] | None = None

    @property
    def state(self) -> TaskState:
        p = self.progress
        if p.unwound is not None:
            return TaskState.UNWOUND  # terminal: nothing runs the task forward again
        if p.undo_rows:
            return TaskState.PARTLY_UNWOUND  # some steps put back: it never runs forward either
        if p.stop is not None:
            # A kill is named as such: it was out of band (workflow terminated, grants revoked),
            # and a person reading the report at 03:14 must not take it for a plain stop; a
            # halt is the run's own stop, taken from its halt signal.
            if p.stop.get("state") == ControlState.KILLED:
                return TaskState.KILLED
            own = p.stop.get("scope") in (None, p.task_id)
            return TaskState.HALTED if own and p.stop.get("set_by") == HALT_ACTOR \
                else TaskState.STOPPED
        return self._rows_state()

    def _rows_state(self) -> TaskState:
        """The state the rows, the boundary and the latest run's end say.

        For a task nothing stops."""
        p = self.progress
        if p.finished:
            return TaskState.VERIFICATION_FAILED if self.end_unverified else TaskState.COMPLETED
        if p.failed:
            return TaskState.FAILED
        if p.in_doubt is not None:
            return TaskState.IN_DOUBT
        verification = self.boundary.get("verification")
        if self._at_boundary and verification is not None and not verification["passed"]:
            return TaskState.VERIFICATION_FAILED
        if self.run_end is not None:  # its run ended: nobody runs it, whatever the rows say
            ended = self.run_end["detail"].get("ended")
            return TaskState(ended) if ended in _END_STATES else TaskState.ENDED
        if self.asks_approval:
            return TaskState.AWAITING_APPROVAL
        return TaskState.NOT_STARTED if p.rows == 0 else TaskState.PARTIAL

    @property
    def end_unverified(self) -> bool:
        """Every step is done, but the end verification found an earlier state: not completed.

        Every step is done, but the latest verification, the one at the end of the plan,
        found a target showing an earlier step's state (tidemark.boundary): not completed."""
        end = self.boundary.get("end_verification")
        return self.progress.finished and end is not None and not end["passed"]

    @property
    def _at_boundary(self) -> bool:
        """Every step before the first irreversible one is done, and the gate ran.

        Every step before the first irreversible one is done, and the boundary's gate ran
        there (a verification is journaled for it)."""
        p, verification = self.progress, self.boundary.get("verification")
        return (p.first_irreversible is not None and p.last_step == p.first_irreversible - 1
                and verification is not None
                and verification.get("boundary") == p.first_irreversible)

    @property
    def asks_approval(self) -> bool:
        """The task is at its boundary, its approval asked and no decision holds.

        The task is at its boundary, its approval asked and no decision holds (none was
        made, or a stop, kill or release since voided it): a run of it waits there (whatever
        else holds it, a stop say), or the next run will."""
        return self._at_boundary and bool(self.approval) and \
            not (self.approval or {}).get("holds")

    @property
    def approval(self) -> dict[str, Any] | None:
        """What a run asked a person to approve and the latest decision.

        ``decision`` and ``by`` (the login role the journal recorded), ``label`` (the name given),
        ``holds`` (False once a stop, kill, release or the reject's own stop started a later
        epoch)."""
        # What a run asked under the operator's policy; before any run reached the boundary,
        # only the plan's own ask is known (its approvers are the operator's, not yet read).
        asked = self.boundary.get("asked") or self.boundary.get("approval")
        if not asked:
            return None
        decided = self.boundary.get("decision") or {}
        return {"approvers": asked.get("approvers"), "decision": decided.get("decision"),
                "by": decided.get("by"), "at": _jsonable(decided.get("at")),
                "label": decided.get("label"), "holds": bool(decided.get("holds"))}

    @property
    def will_do(self) -> list[str]:
        """What each irreversible step not yet done will do.

        Every recipient, subject, body excerpt and amount in the currency's own units
        (tidemark.boundary.what_it_will_do)."""
        return [what_it_will_do(n, action, args) for n, action, status, args in self.irreversible
                if status != StepStatus.DONE]

    def as_json(self) -> dict[str, Any]:
        p = self.progress
        doubt = p.in_doubt.as_json() if p.in_doubt else None
        return {
            "task_id": p.task_id, "state": self.state, "plan_hash": p.plan_hash,
            "steps": p.step_count, "rows": p.rows, "confirmed": p.confirmed, "failed": p.failed,
            "in_doubt": doubt, "not_started": p.step_count - p.rows, "next_step": p.next_step,
            "last_step": p.last_step,
            "irreversible": [
                {"step": n, "action": a, "status": status,
                 "provably_not_attempted": n > p.last_step}
                for n, a, status, _ in self.irreversible],
            "will_do": self.will_do,
            "stop": _jsonable(p.stop), "undo_rows": p.undo_rows,
            "approval": self.approval,
            "verification": _jsonable(self.boundary.get("verification")),
            "end_verification": _jsonable(self.boundary.get("end_verification")),
            "unwound": _jsonable(p.unwound),
        }

    def text(self) -> str:
        p = self.progress
        lines = [
            f"task {p.task_id}  ({self.state})  plan {p.plan_hash[:12]}  {p.step_count} steps",
            f"  journal rows   {p.rows}",
            f"  confirmed      {p.confirmed}",
        ]
        if p.failed:
            lines.append(f"  failed         {p.failed}")
        lines += self._doubt_lines()
        not_started = p.step_count - p.rows
        span = f" (steps {p.last_step + 1}-{p.step_count})" if not_started > 1 else (
            f" (step {p.step_count})" if not_started == 1 else "")
        lines.append(f"  not started    {not_started}{span}")
        lines += self._irreversible_lines()
        if p.stop:
            at = str(p.stop.get("set_at") or "")[:19].replace("T", " ")
            lines.append(f"  stop state     {p.stop['state']} by {p.stop['set_by']}"
                         + (f" at {at}" if at else "") + f": {p.stop['reason']}"
                         + ("" if p.stop.get("scope") in (None, p.task_id)
                            else f" (scope {p.stop['scope']})"))
        if p.undo_rows:
            lines.append(f"  unwind rows    {p.undo_rows}")
        lines += self._gate_lines() + self._approval_lines()
        will_do = self.will_do
        if will_do:
            lines.append("  will do        " + "\n                 ".join(will_do))
        if p.unwound:
            lines.append(f"  unwound        by {p.unwound['unwound_by']} at "
                         f"{p.unwound['unwound_at']}; the task does not run again")
        return "\n".join(lines)

    def _doubt_lines(self) -> list[str]:
        d = self.progress.in_doubt
        if d is None:
            return ["  in doubt       none"]
        return [
            f"  in doubt       step {d.step} {d.action} ({d.phase}), intent at "
            f"{d.started_at:%Y-%m-%d %H:%M:%S%z}, key {d.idem_key}",
            f"                 args          {json.dumps(d.args, sort_keys=True)}",
            f"                 before_state  {json.dumps(d.before_state, sort_keys=True)}",
        ]

    def _irreversible_lines(self) -> list[str]:
        p = self.progress
        lines = []
        for n, action, status, _ in self.irreversible:
            if n > p.last_step:
                verdict = f"provably not attempted (last journal row is step {p.last_step})"
            elif status is None:
                verdict = "IN DOUBT: only its probe may say whether it happened"
            else:
                verdict = f"{status} (journaled)"
            lines.append(f"  irreversible   step {n} {action}: {verdict}")
        return lines

    def _gate_lines(self) -> list[str]:
        """The boundary's verification gate, and the one at the end of the plan if it failed."""
        lines = []
        v = self.boundary.get("verification")
        if v:
            failures = v["failures"]
            more = len(failures) - SHOWN_FAILURES
            verdict = (f"passed, {v['verified']} step(s) verified" if v["passed"] else
                       f"FAILED ({len(failures)} step(s)): " + "; ".join(
                           f"step {f['step']} {f['action']} {f.get('describe', '')}: "
                           f"{f['reason']}" for f in failures[:SHOWN_FAILURES])
                       + (f"; and {more} more (`tidemark status --json`)" if more > 0 else ""))
            lines.append(f"  boundary gate  before step {v['boundary']}: {verdict}")
        end = self.boundary.get("end_verification")
        if end and not end["passed"]:
            lines.append("  at the end     FAILED: " + "; ".join(
                f"step {f['step']} {f['action']} {f.get('describe', '')}: {f['reason']}"
                for f in end["failures"]))
        return lines

    def _approval_lines(self) -> list[str]:
        a = self.approval
        if not a:
            return []
        who = (", ".join(a["approvers"]) if a["approvers"]
               else "any member of tidemark_approver")
        said = (f"{a['decision']} by {a['by']}" + (f" ({a['label']})" if a["label"] else "")
                if a["decision"] else "awaited")
        if a["decision"] and not a["holds"]:
            said += (", stopped since" if a["decision"] == "reject" else
                     ", void since (a stop, kill or release came after it): asked again")
        return [f"  approval       {said} (may decide: {who})"]


def build_report(store: JournalStore, task_id: str) -> Report:
    """Five queries, whatever the plan's length."""
    return Report(store.progress(task_id), store.irreversible_steps(task_id),
                  store.boundary_state(task_id), store.run_ended(task_id))


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value
