"""Series: their declarations and the admission of runs, in order, one settled after another."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from tidemark.store.base import StoreBase
from tidemark.store.connection import _translated
from tidemark.store.session import StepSession
from tidemark.words import EventKind


class SeriesMixin(StoreBase):
    """Series declarations and admissions (tidemark.series)."""

    def declare_series(self, series: str, by: str, os_user: str, approval: str | None = None,
                       approvers: list[str] | None = None, *,
                       rules: dict[str, Any] | None = None, admits: str | None = None) -> None:
        """Declares a series: an operator's act.

        Any other role gets NotAuthorized. Declared again, the policy (``approval`` and its parsed
        ``rules``), approvers or admission given replace the earlier ones and those not given
        (None) are kept: a schedule created later without --approval does not lower the series'
        policy."""
        with self._conn() as conn:
            conn.execute(
                "INSERT INTO tidemark.series (series, approval, rules, approvers, admits,"
                " declared_by, os_user) VALUES (%s, %s, %s, %s, coalesce(%s, 'any'), %s, %s)"
                " ON CONFLICT (series) DO UPDATE SET"
                " approval = coalesce(EXCLUDED.approval, tidemark.series.approval),"
                " rules = CASE WHEN EXCLUDED.approval IS NULL THEN tidemark.series.rules"
                "         ELSE EXCLUDED.rules END,"
                " approvers = coalesce(EXCLUDED.approvers, tidemark.series.approvers),"
                " admits = coalesce(%s, tidemark.series.admits),"
                " declared_by = EXCLUDED.declared_by, os_user = EXCLUDED.os_user,"
                " declared_at = clock_timestamp()",
                (series, approval, Jsonb(rules) if rules is not None else None, approvers,
                 admits, by, os_user, admits))

    def declared_series(self, series: str) -> dict[str, Any] | None:
        """The declaration of a series, or None when it was never declared."""
        with self._conn() as conn:
            return conn.execute(
                "SELECT series, approval, rules, approvers, admits, declared_by, declared_role,"
                " os_user, declared_at FROM tidemark.series WHERE series = %s",
                (series,)).fetchone()

    def series_of(self, task_id: str) -> str | None:
        """The series a run was admitted to, or None."""
        with self._conn() as conn:
            r = conn.execute("SELECT series FROM tidemark.series_runs WHERE task_id = %s",
                             (task_id,)).fetchone()
        return r["series"] if r else None

    def series_runs(self, series: str, before: str | None = None) -> list[dict[str, Any]]:
        """The admitted runs of a series in order, with what tells if each is settled.

        The admitted runs of a series in order, each with the journal counts and the stop
        state that tell whether it is settled (tidemark.series.run_state); with ``before``,
        only the runs admitted before that one."""
        with self._conn() as conn:
            return self._series_runs(conn, series, before)

    @staticmethod
    def _series_runs(conn: psycopg.Connection[dict[str, Any]], series: str,
                     before: str | None) -> list[dict[str, Any]]:
        with _translated():
            return conn.execute(
                """
                SELECT r.task_id, r.position, r.admitted_at, p.step_count,
                  (SELECT count(*) FROM tidemark.journal j WHERE j.task_id = r.task_id
                     AND j.phase = 'do' AND j.status = 'done') AS confirmed,
                  (SELECT count(*) FROM tidemark.journal j WHERE j.task_id = r.task_id
                     AND j.phase = 'do' AND j.status = 'failed') AS failed,
                  (SELECT count(*) FROM tidemark.journal j WHERE j.task_id = r.task_id
                     AND j.outcome IS NULL) AS open,
                  (SELECT count(*) FROM tidemark.journal j WHERE j.task_id = r.task_id
                     AND j.phase = 'undo' AND j.status = 'done') AS undone,
                  (SELECT count(*) FROM tidemark.journal j
                     JOIN tidemark.plan_steps s ON s.task_id = j.task_id AND s.step = j.step
                     LEFT JOIN tidemark.journal u ON u.task_id = j.task_id
                       AND u.phase = 'undo' AND u.step = j.step
                     WHERE j.task_id = r.task_id AND j.phase = 'do' AND NOT s.irreversible
                       AND (j.status = 'done' OR j.outcome IS NULL)
                       AND u.status IS DISTINCT FROM 'done') AS to_undo,
                  tidemark.stop_of(r.task_id) AS stop
                FROM tidemark.series_runs r JOIN tidemark.plans p ON p.task_id = r.task_id
                WHERE r.series = %(series)s AND (%(before)s::text IS NULL OR r.position <
                  (SELECT position FROM tidemark.series_runs WHERE task_id = %(before)s))
                ORDER BY r.position
                """, {"series": series, "before": before}).fetchall()

    def admit_to_series(
            self, task_id: str, series: str,
            unsettled: Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
    ) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        """Admits a run to its series unless something blocks it, atomically with the check.

        ``unsettled(rows)`` picks the blocking runs from ``series_runs`` rows. Returns
        ``(stop, blockers)``: the series' (or global) stop state and the earlier runs that are
        not settled; both empty means admitted (once: a run keeps its first place). A refusal
        is logged as a ``blocked`` event of the task.
        """
        with self._conn() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                         ("tidemark-series:" + series,))
            stop = conn.execute(
                "SELECT to_jsonb(c) AS stop FROM tidemark.controls c"
                " WHERE c.scope IN (%s, '*') AND c.state IN ('stopped', 'killed')"
                " ORDER BY c.state = 'killed' DESC LIMIT 1", ("series:" + series,)).fetchone()
            mine = conn.execute("SELECT series FROM tidemark.series_runs WHERE task_id = %s",
                                (task_id,)).fetchone()
            earlier = [r for r in self._series_runs(conn, series, task_id if mine else None)
                       if r["task_id"] != task_id]
            blockers = unsettled(earlier)
            stop_row = stop["stop"] if stop else None
            if stop_row is None and not blockers:
                if mine is None:
                    conn.execute("INSERT INTO tidemark.series_runs (task_id, series)"
                                 " VALUES (%s, %s)", (task_id, series))
                return None, []
            StepSession(conn).event(task_id, EventKind.BLOCKED, {
                "series": series, "stop": stop_row and {k: str(v) for k, v in stop_row.items()},
                "blockers": [b["task_id"] for b in blockers]}, None, "tidemark")
            return stop_row, blockers

    def blocked_runs(self, series: str) -> list[dict[str, Any]]:
        """Refused starts of a series (``blocked`` events), oldest first."""
        with self._conn() as conn:
            return conn.execute(
                "SELECT task_id, detail, at FROM tidemark.events WHERE kind = 'blocked'"
                " AND detail->>'series' = %s ORDER BY id", (series,)).fetchall()
