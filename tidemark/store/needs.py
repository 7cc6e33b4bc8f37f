"""Reads for the inbox: tasks that may wait for a person, and their stakes.

Reads for the inbox: which tasks may wait for a person, and what their irreversible steps
still put at stake; and the run events (a run's beginning, its end) that tell a task nothing
runs from one whose run goes on.

The candidates are narrowed here, in SQL, to the tasks with a journal fact that a person must
act on (a stop or kill, a row in doubt whose attempt is gone, a refused step, a compensation,
an approval asked, a failed verification gate), so that the inbox costs a few queries per task
that needs somebody rather than per task ever run. Which of them really waits, and why, is
decided from the task's report (tidemark.report), the same reading `tidemark status` prints.
"""

from __future__ import annotations

from typing import Any

from tidemark.store.base import StoreBase
from tidemark.store.session import StepSession
from tidemark.words import EventKind, TaskState

# The event ``e`` is an unwind_unfinished of the task ``p`` journaled since the stop that
# applies to it now was set: an unwind that did not finish, which the task waits for while it
# stays stopped. One predicate for the candidates and for the task's own read, so that both
# count the same unwinds.
_UNWIND_UNFINISHED = """e.task_id = p.task_id AND e.kind = 'unwind_unfinished'
    AND e.at >= (tidemark.stop_of(p.task_id)->>'set_at')::timestamptz"""

# The latest run of the task ``p`` ended other than completed, and no run of it began since
# (RunPlan journals each beginning in prepare and such an end, and `tidemark kill` the end of
# a run it terminated; ``run`` events): nothing runs the task now. One predicate for the
# candidates and for the task's own read.
_LATEST_RUN = """SELECT e.detail, e.actor, e.at FROM tidemark.events e
    WHERE e.task_id = p.task_id AND e.kind = 'run' ORDER BY e.id DESC LIMIT 1"""
_RUN_ENDED = f"(SELECT r.detail ? 'ended' FROM ({_LATEST_RUN}) r) IS TRUE"


class NeedsMixin(StoreBase):
    """The inbox's reads over every task."""

    def needs_candidates(self, task_id: str | None = None) -> list[dict[str, Any]]:
        """Every task with a fact a person may have to act on, oldest plan first.

        Every task neither unwound nor completed (a completed task with a compensation is
        partly unwound, one stopped after an unwind that did not finish waits for its unwind)
        with a fact a person may have to act on (among them: its latest run ended and no run
        began since), oldest plan first:
        ``task_id``, ``created_at`` (the plan's) and ``last_at`` (its latest event). A task
        whose row in doubt is still under a live attempt lease is left out: a run is acting on
        it now. ``task_id``: that task alone (its own reading, by the primary key)."""
        with self._conn() as conn:
            return conn.execute(
                f"""
                SELECT p.task_id, p.created_at,
                  (SELECT max(e.at) FROM tidemark.events e WHERE e.task_id = p.task_id)
                     AS last_at
                FROM tidemark.plans p
                WHERE (%(task)s::text IS NULL OR p.task_id = %(task)s)
                  AND NOT EXISTS (SELECT 1 FROM tidemark.unwinds w WHERE w.task_id = p.task_id)
                  AND ((SELECT count(*) FROM tidemark.journal j
                        WHERE j.task_id = p.task_id AND j.phase = %(do)s
                          AND j.status = %(done)s) < p.step_count
                       OR EXISTS (SELECT 1 FROM tidemark.journal j
                                  WHERE j.task_id = p.task_id AND j.phase = %(undo)s)
                       OR EXISTS (SELECT 1 FROM tidemark.events e
                                  WHERE {_UNWIND_UNFINISHED})
                       OR EXISTS (SELECT 1 FROM tidemark.events e
                                  WHERE e.task_id = p.task_id AND e.kind = %(verification)s
                                    AND e.detail->>'at_end' = 'true'
                                    AND e.detail->>'passed' = 'false'))
                  AND NOT EXISTS (SELECT 1 FROM tidemark.journal j
                                  WHERE j.task_id = p.task_id AND j.outcome IS NULL
                                    AND j.lease_until > clock_timestamp())
                  AND (tidemark.stop_of(p.task_id) IS NOT NULL
                       OR EXISTS (SELECT 1 FROM tidemark.journal j
                                  WHERE j.task_id = p.task_id
                                    AND (j.outcome IS NULL OR j.status = %(failed)s
                                         OR j.phase = %(undo)s))
                       OR EXISTS (SELECT 1 FROM tidemark.approval_requests a
                                  WHERE a.task_id = p.task_id)
                       OR EXISTS (SELECT 1 FROM tidemark.events e
                                  WHERE e.task_id = p.task_id AND e.kind = %(verification)s
                                    AND e.detail->>'passed' = 'false')
                       OR {_RUN_ENDED})
                ORDER BY p.created_at, p.task_id
                """, {"failed": "failed", "undo": "undo", "do": "do", "done": "done",
                      "verification": "verification", "task": task_id}).fetchall()

    def unwind_unfinished(self, task_id: str) -> dict[str, Any] | None:
        """The latest unfinished unwind of the task since its current stop, or None.

        The latest unwind of the task that ended before the task was unwound (its
        unwind_unfinished event: ``detail``, ``actor``, ``at``), if journaled since the stop
        that applies to the task now was set; None otherwise (no such unwind, or the task was
        released since, or stopped anew for another)."""
        with self._conn() as conn:
            return conn.execute(
                "SELECT e.detail, e.actor, e.at FROM (SELECT %s::text AS task_id) p"
                f" JOIN tidemark.events e ON {_UNWIND_UNFINISHED}"
                " ORDER BY e.id DESC LIMIT 1", (task_id,)).fetchone()

    def person_said(self, task_id: str, step: int, since: Any) -> dict[str, Any] | None:
        """The latest decision a person journaled about the step since ``since``.

        The latest decision a person journaled about the step since ``since`` (its
        intent), as the next attempt reads it (StepSession.operator_decision); None if none."""
        with self._conn() as conn:
            return StepSession(conn).operator_decision(task_id, step, since)

    def record_run_began(self, task_id: str, run_id: str, actor: str) -> None:
        """Journals that a run of the task began (RunPlan's prepare).

        An earlier run's journaled end no longer says that nothing runs the task."""
        with self._conn() as conn:
            StepSession(conn).event(task_id, EventKind.RUN, {"began": run_id}, None, actor)

    def record_run_ended(self, task_id: str, state: TaskState, error: dict[str, Any], actor: str,
                         **detail: Any) -> None:
        """Journals that the task's run ended in ``state`` other than completed.

        Written by RunPlan at its end, or by the kill that terminated it. Until a run begins again,
        nothing runs it."""
        with self._conn() as conn:
            StepSession(conn).event(task_id, EventKind.RUN,
                                    {"ended": state, "error": error, **detail}, None, actor)

    def latest_run(self, task_id: str) -> dict[str, Any] | None:
        """The task's latest ``run`` event, or None.

        It holds ``detail``, ``actor``, ``at``: its beginning (``began``, the run id) while the run
        goes on, its end (``ended``, the end state, and ``error``) once it ended other than
        completed; None when no run journaled either."""
        with self._conn() as conn:
            return conn.execute(f"SELECT r.* FROM (SELECT %s::text AS task_id) p,"
                                f" LATERAL ({_LATEST_RUN}) r", (task_id,)).fetchone()

    def run_ended(self, task_id: str) -> dict[str, Any] | None:
        """How the task's latest run ended, if no run of it began since; else None.

        How the task's latest run ended, when it ended other than completed and no run of
        it began since (latest_run); None otherwise."""
        run = self.latest_run(task_id)
        return run if run is not None and "ended" in run["detail"] else None

    def runs_going_on(self) -> list[dict[str, Any]]:
        """The tasks the journal reads a run going on for.

        The latest run journaled its beginning and no end, and the task is neither finished,
        stopped nor unwound (nor partly unwound): ``task_id`` and ``began_at``. Whether the run is
        in fact open is Temporal's to say (a run terminated outside tidemark journals no end)."""
        with self._conn() as conn:
            return conn.execute(
                f"""
                SELECT p.task_id, r.at AS began_at
                FROM tidemark.plans p, LATERAL ({_LATEST_RUN}) r
                WHERE r.detail ? 'began'
                  AND tidemark.stop_of(p.task_id) IS NULL
                  AND NOT EXISTS (SELECT 1 FROM tidemark.unwinds w WHERE w.task_id = p.task_id)
                  AND NOT EXISTS (SELECT 1 FROM tidemark.journal j
                                  WHERE j.task_id = p.task_id AND j.phase = 'undo')
                  AND (SELECT count(*) FROM tidemark.journal j
                       WHERE j.task_id = p.task_id AND j.phase = 'do'
                         AND j.status = 'done') < p.step_count
                ORDER BY r.at, p.task_id
                """).fetchall()

    def blocked_starts(self) -> list[dict[str, Any]]:
        """The latest refused start of every task whose plan was never stored.

        The latest refused start (``blocked`` event) of every task whose plan was never
        stored: ``task_id``, ``detail``, ``at``. A task started since has a plan and is not
        blocked any more."""
        return self._starts_unstored(EventKind.BLOCKED)

    def refused_starts(self, task_id: str | None = None) -> list[dict[str, Any]]:
        """The latest start refused before its plan was stored, for every such task.

        The latest start refused before its plan was stored (``refused`` event) of every
        task (``task_id``: of that one) whose plan was never stored: ``task_id``, ``detail``,
        ``at``, ``actor``. A task started since has a plan and waits for nothing of it."""
        return self._starts_unstored(EventKind.REFUSED, task_id)

    def _starts_unstored(self, kind: EventKind, task_id: str | None = None) -> list[dict[str, Any]]:
        with self._conn() as conn:
            return conn.execute(
                "SELECT DISTINCT ON (e.task_id) e.task_id, e.detail, e.at, e.actor"
                " FROM tidemark.events e WHERE e.kind = %s"
                " AND (%s::text IS NULL OR e.task_id = %s)"
                " AND NOT EXISTS (SELECT 1 FROM tidemark.plans p WHERE p.task_id = e.task_id)"
                " ORDER BY e.task_id, e.id DESC", (kind, task_id, task_id)).fetchall()

    def irreversible_pending(self, task_id: str) -> list[dict[str, Any]]:
        """The irreversible steps of the task not journaled as done: what is at stake.

        The irreversible steps of the task not journaled as done (``step``, ``action``,
        ``args``, ``status``: None when not attempted or in doubt), in step order: what is
        still at stake."""
        with self._conn() as conn:
            return conn.execute(
                "SELECT s.step, s.action, s.args, j.status FROM tidemark.plan_steps s"
                " LEFT JOIN tidemark.journal j"
                "   ON j.task_id = s.task_id AND j.phase = 'do' AND j.step = s.step"
                " WHERE s.task_id = %s AND s.irreversible"
                "   AND j.status IS DISTINCT FROM 'done' ORDER BY s.step",
                (task_id,)).fetchall()
