"""The activity of the irreversible boundary (tidemark/boundary.py).

It holds the verification gate, the plan gates, and a person's decision as the journal holds it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from temporalio import activity

from activities.acting import acting_for
from activities.steps import _as_application_error, _heartbeating
from tidemark.actions import Registry
from tidemark.activity_names import ActivityName
from tidemark.approval import ApprovalPolicy, policy_from_env
from tidemark.boundary import approval_needed, verify_reversible
from tidemark.errors import TidemarkError
from tidemark.grants import GrantBroker
from tidemark.limits import within
from tidemark.needs import release_of
from tidemark.payloads import BoundaryInput, BoundaryOutcome
from tidemark.run_step import check_plan_gates
from tidemark.store import JournalStore


class BoundaryActivities:
    def __init__(self, store: JournalStore, registry: Registry,
                 grants: GrantBroker | None = None,
                 approval: ApprovalPolicy | None = None) -> None:
        self.store = store
        self.registry = registry
        self.grants = grants  # the gate's probes present the task's grant (activities/granted)
        # The operator's policy; without one, every irreversible step waits for a person.
        self.approval = approval or policy_from_env({})

    @activity.defn(name=ActivityName.REACH_BOUNDARY)
    def reach_boundary(self, inp: BoundaryInput) -> BoundaryOutcome:
        """Checks the boundary before ``inp.step`` and reads whether a person must approve.

        Verifies the done reversible steps before ``inp.step`` and runs the plan gates. Reads
        whether a person must still approve (the operator's policy, and the latest decision in
        the journal: a signal only wakes the run) and the stop state. Every call to a target
        presents the task's grant. Logs one verification event, and what the run asks a person
        to approve."""
        with _heartbeating(), acting_for(self.grants, inp.task_id):
            try:
                return self.outcome(inp.task_id, inp.step)
            except TidemarkError as e:
                raise _as_application_error(e) from e

    def outcome(self, task_id: str, step: int, *, gates: bool = True) -> BoundaryOutcome:
        """The boundary before ``step``: what reach_boundary returns.

        Run inside an activity that presents the task's grant. Without ``gates`` the plan gates
        are not run again: the caller (prepare, on a start) ran them a moment ago. Raises
        TidemarkError."""
        plan = self.store.load_plan(task_id)
        checked = verify_reversible(self.store, self.registry, task_id, step)
        if not checked.passed:  # bounded: the journal holds every failure
            return BoundaryOutcome(passed=False, summary=checked.summary(),
                                   failures=checked.brief(), verified=checked.verified,
                                   failed=len(checked.failures))
        if gates:
            check_plan_gates(self.store, self.registry, plan)  # PreconditionFailed
        asked = approval_needed(self.store, self.approval, plan)
        # The decision of the task's current epoch: the journal recorded it only for an
        # approver it knows, and a stop, kill or release since has voided an older one.
        decided = self.store.current_decision(task_id) if asked else None
        stop = self.store.stop_state(task_id)
        return BoundaryOutcome(
            passed=True, summary=checked.summary(), verified=checked.verified,
            approval_required=asked is not None,
            approvers=asked["approvers"] if asked else None,
            decision=decided["decision"] if decided else None,
            decided_by=decided["decided_by"] if decided else None,
            irreversible=within(asked["lines"]) if asked else [],
            waiting=len(asked["lines"]) if asked else 0,
            glance=asked["glance"] if asked else None, why=asked["policy"] if asked else None,
            stopped=(stop["reason"] or "stopped") if stop else None,
            release=release_of(task_id, stop))

    @activity.defn(name=ActivityName.VERIFY_END)
    def verify_end(self, inp: BoundaryInput) -> BoundaryOutcome:
        """The verification at the end of a plan, before its run says completed.

        ``inp.step`` is one past the last step. The last step of each target the plan set more
        than once must still show done (tidemark.boundary). Reads only, as the task (its grant);
        logs one verification event."""
        with acting_for(self.grants, inp.task_id), _heartbeating():
            try:
                checked = verify_reversible(self.store, self.registry, inp.task_id, inp.step,
                                            at_end=True)
            except TidemarkError as e:
                raise _as_application_error(e) from e
        return BoundaryOutcome(passed=checked.passed, summary=checked.summary(),
                               failures=checked.failures, verified=checked.verified)

    def all(self) -> list[Callable[..., Any]]:
        return [self.reach_boundary, self.verify_end]
