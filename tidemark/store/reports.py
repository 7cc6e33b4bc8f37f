"""Reads for reports: where a task stands, its rows and events, its irreversible steps."""

from __future__ import annotations

from typing import Any

from tidemark.errors import UnknownTask
from tidemark.store.base import StoreBase
from tidemark.store.journal import _JOURNAL_COLUMNS, JournalRow, Progress


class ReportsMixin(StoreBase):
    """Reads of a task for reports and the operator's commands."""

    def progress(self, task_id: str) -> Progress:
        """The task's counts and its one row in doubt, in two queries whatever its length."""
        with self._conn() as conn:
            r = conn.execute(
                """
                SELECT p.plan_hash, p.step_count,
                  (SELECT count(*) FROM tidemark.journal j
                     WHERE j.task_id = p.task_id AND j.phase = 'do') AS rows,
                  (SELECT count(*) FROM tidemark.journal j
                     WHERE j.task_id = p.task_id AND j.phase = 'do' AND j.status = 'done')
                     AS confirmed,
                  (SELECT count(*) FROM tidemark.journal j
                     WHERE j.task_id = p.task_id AND j.phase = 'do' AND j.status = 'failed')
                     AS failed,
                  (SELECT coalesce(max(step), 0) FROM tidemark.journal j
                     WHERE j.task_id = p.task_id AND j.phase = 'do') AS last_step,
                  (SELECT count(*) FROM tidemark.journal j
                     WHERE j.task_id = p.task_id AND j.phase = 'undo') AS undo_rows,
                  (SELECT min(step) FROM tidemark.plan_steps s
                     WHERE s.task_id = p.task_id AND s.irreversible) AS first_irreversible,
                  tidemark.stop_of(p.task_id) AS stop,
                  (SELECT to_jsonb(w) FROM tidemark.unwinds w WHERE w.task_id = p.task_id)
                     AS unwound
                FROM tidemark.plans p WHERE p.task_id = %s
                """, (task_id,)).fetchone()
            if r is None:
                raise UnknownTask(task_id)
            doubt = conn.execute(f"SELECT {_JOURNAL_COLUMNS} FROM tidemark.journal"
                                 " WHERE task_id = %s AND outcome IS NULL", (task_id,)).fetchone()
        return Progress(task_id=task_id, plan_hash=r["plan_hash"], step_count=r["step_count"],
                        rows=r["rows"], confirmed=r["confirmed"], failed=r["failed"],
                        last_step=r["last_step"], undo_rows=r["undo_rows"],
                        in_doubt=JournalRow(**doubt) if doubt else None,
                        first_irreversible=r["first_irreversible"], stop=r["stop"],
                        unwound=r["unwound"])

    def rows(self, task_id: str) -> list[JournalRow]:
        with self._conn() as conn:
            cur = conn.execute(f"SELECT {_JOURNAL_COLUMNS} FROM tidemark.journal"
                               " WHERE task_id = %s ORDER BY phase, step", (task_id,))
            return [JournalRow(**r) for r in cur.fetchall()]

    def events(self, task_id: str) -> list[dict[str, Any]]:
        with self._conn() as conn:
            return conn.execute("SELECT id, step, kind, detail, actor, at FROM tidemark.events"
                                " WHERE task_id = %s ORDER BY id", (task_id,)).fetchall()

    def irreversible_steps(self, task_id: str
                           ) -> list[tuple[int, str, str | None, dict[str, Any]]]:
        """(step, action, journal status, args) of every irreversible step of the plan.

        The status is None when the step has no journal row or no outcome yet."""
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT s.step, s.action, j.status, s.args FROM tidemark.plan_steps s"
                " LEFT JOIN tidemark.journal j"
                "   ON j.task_id = s.task_id AND j.phase = 'do' AND j.step = s.step"
                " WHERE s.task_id = %s AND s.irreversible ORDER BY s.step",
                (task_id,)).fetchall()
        return [(r["step"], r["action"], r["status"], r["args"]) for r in rows]
