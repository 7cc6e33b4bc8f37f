"""The journal's rows as Python reads them, and shared conditions on a task's state.

The journal's rows as Python reads them, and the conditions on a task's state that several
of the store's statements share (each is a constant piece of SQL, never a value)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

# The one piece of SQL that is composed in Python: a constant column list, never a value.
_JOURNAL_COLUMNS = ("task_id, phase, step, idem_key, action, args, before_state, started_at, "
                    "outcome, status, finished_at, resolved_by, lease_until, staged, attempt, "
                    "sent_at, returned_at")
# The stop state of task %(task_id)s as a condition (its own, its series' or the global one,
# stopped or killed), for statements
# that must not act once a stop is committed.
_STOPPED = "(tidemark.stop_of(%(task_id)s) IS NOT NULL)"
_UNWOUND = "EXISTS (SELECT 1 FROM tidemark.unwinds w WHERE w.task_id = %(task_id)s)"
# A compensation may act only while no kill holds the task (stop_of() puts an unlifted kill
# first, so its row tells); a kill an operator lifted by `tidemark release T --for-unwind` stays a
# kill for everything but compensations. A task with any compensation (partly unwound included)
# never runs forward.
_COMPENSATED = ("EXISTS (SELECT 1 FROM tidemark.journal u WHERE u.task_id = %(task_id)s"
                " AND u.phase = 'undo')")
_KILLED = ("coalesce(tidemark.stop_of(%(task_id)s)"
           " @> '{\"state\": \"killed\", \"for_unwind\": false}', false)")


@dataclass(frozen=True)
class JournalRow:
    task_id: str
    phase: str
    step: int
    idem_key: str
    action: str
    args: dict[str, Any]
    before_state: dict[str, Any] | None
    started_at: datetime
    outcome: dict[str, Any] | None
    status: str | None
    finished_at: datetime | None
    resolved_by: str | None
    lease_until: datetime | None = None
    staged: dict[str, Any] | None = None
    attempt: int = 1  # undo rows: which try of the compensation (a refused one is tried anew)
    sent_at: datetime | None = None  # the mark: an effect request of its attempt may have left
    returned_at: datetime | None = None  # that attempt reported back (tidemark.wire)

    @property
    def in_doubt(self) -> bool:
        return self.outcome is None

    def as_json(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        for k in ("started_at", "finished_at", "lease_until", "sent_at", "returned_at"):
            d[k] = d[k].isoformat() if d[k] else None
        return d


@dataclass(frozen=True)
class Progress:
    """Where a task stands, from a constant number of queries."""

    task_id: str
    plan_hash: str
    step_count: int
    rows: int
    confirmed: int
    failed: int
    last_step: int
    in_doubt: JournalRow | None
    first_irreversible: int | None
    stop: dict[str, Any] | None
    undo_rows: int
    unwound: dict[str, Any] | None = None  # when and by whom the task was unwound (terminal)

    @property
    def next_step(self) -> int | None:
        """The first step without an outcome, or None when every step has one."""
        if self.in_doubt is not None and self.in_doubt.phase == "do":
            return self.in_doubt.step
        if self.failed or self.last_step >= self.step_count:
            return None
        return self.last_step + 1

    @property
    def finished(self) -> bool:
        return self.confirmed == self.step_count
