"""The activity of the irreversible boundary (tidemark/boundary.py): the verification gate,
the plan gates, and a person's decision as the journal holds it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from temporalio import activity

from activities.steps import _as_application_error, _heartbeating
from tidemark.actions import Registry
from tidemark.boundary import irreversible_lines, verify_reversible
from tidemark.errors import TidemarkError
from tidemark.run_step import check_plan_gates
from tidemark.store import JournalStore
from workflows.types import BoundaryInput, BoundaryOutcome


class BoundaryActivities:
    def __init__(self, store: JournalStore, registry: Registry) -> None:
        self.store = store
        self.registry = registry

    @activity.defn(name="reach_boundary")
    def reach_boundary(self, inp: BoundaryInput) -> BoundaryOutcome:
        """Verifies the done reversible steps before ``inp.step``, runs the plan gates, and
        reads whether a person must still approve (the latest decision in the journal: a
        signal only wakes the run) and the stop state. Reads only; logs one verification
        event."""
        with _heartbeating():
            try:
                plan = self.store.load_plan(inp.task_id)
                checked = verify_reversible(self.store, self.registry, inp.task_id, inp.step)
                if not checked.passed:
                    return BoundaryOutcome(passed=False, summary=checked.summary(),
                                           failures=checked.failures,
                                           verified=checked.verified)
                check_plan_gates(self.store, self.registry, plan)  # PreconditionFailed
                decided = (self.store.approval_decision(inp.task_id)
                           if plan.approval else None)
                approvers = (plan.approval or {}).get("approvers")
                if decided and approvers is not None and decided["actor"] not in approvers:
                    # Only `tidemark approve` writes these, and it checks the list; a decision
                    # by anybody else is not one, however it got into the journal.
                    activity.logger.warning("ignoring an approval event by %s, who is not "
                                            "among the plan's approvers", decided["actor"])
                    decided = None
                stop = self.store.stop_state(inp.task_id)
            except TidemarkError as e:
                raise _as_application_error(e) from e
        return BoundaryOutcome(
            passed=True, summary=checked.summary(), verified=checked.verified,
            approval_required=plan.approval is not None,
            approvers=(plan.approval or {}).get("approvers"),
            decision=decided["detail"].get("decision") if decided else None,
            decided_by=decided["actor"] if decided else None,
            irreversible=irreversible_lines(plan),
            stopped=(stop["reason"] or "stopped") if stop else None)

    def all(self) -> list[Callable[..., Any]]:
        return [self.reach_boundary]
