"""The decider's one activity: a decision sent to a run as an update.

The decision is recorded in the journal under the decider's login role.

A worker never registers it: a worker's role decides nothing, and the journal would refuse it.
A decider (`tidemark decider`, tools/operate/decider.py) is a process an approver or
operator runs with a login role the journal lets decide; Temporal's updates then decide
through it, and the journal checks each decision as it checks `tidemark approve`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.steps import outcome_category
from tidemark.activity_names import ActivityName
from tidemark.errors import TidemarkError
from tidemark.payloads import DecisionInput
from tidemark.store import JournalStore
from tidemark.words import Decision, DecisionVia


class DecisionActivities:
    """Records decisions on one journal, as the login role its store connects as."""

    def __init__(self, store: JournalStore) -> None:
        self.store = store

    @activity.defn(name=ActivityName.RECORD_DECISION)
    def record_decision(self, inp: DecisionInput) -> dict[str, Any]:
        """Records ``inp`` as the journal allows (tidemark.check_decision).

        Otherwise raises a non-retryable ApplicationError with the journal's one line, having
        recorded nothing."""
        try:
            stored = self.store.progress(inp.task_id).plan_hash
            row = self.store.decide(inp.task_id, Decision(inp.decision), stored, os_user=None,
                                    label=inp.by or None, note=inp.note,
                                    via=DecisionVia.TEMPORAL)
        except TidemarkError as e:
            raise ApplicationError(str(e), type=type(e).__name__, non_retryable=True,
                                   category=outcome_category(e)) from None
        return {"task_id": inp.task_id, "decision": row["decision"], "by": row["decided_by"],
                "label": row["label"], "epoch": row["epoch"], "holds": row["holds"],
                "at": row["at"].isoformat()}

    def all(self) -> list[Callable[..., Any]]:
        return [self.record_decision]
