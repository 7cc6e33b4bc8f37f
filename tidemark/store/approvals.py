"""The irreversible boundary: what the verification gate re-probes, what a run asks a
person to approve, and the decisions recorded."""

from __future__ import annotations

from typing import Any

from psycopg.types.json import Jsonb

from tidemark.store.base import StoreBase
from tidemark.store.journal import _JOURNAL_COLUMNS, JournalRow
from tidemark.store.session import StepSession


class ApprovalsMixin(StoreBase):
    """The irreversible boundary's reads and writes."""

    def verifiable_rows(self, task_id: str, before_step: int) -> list[JournalRow]:
        """The 'do' rows of reversible steps before ``before_step`` whose outcome is done:
        what the verification gate re-probes, in step order."""
        with self._conn() as conn:
            cur = conn.execute(
                f"SELECT {', '.join('j.' + c.strip() for c in _JOURNAL_COLUMNS.split(','))}"
                " FROM tidemark.journal j"
                " JOIN tidemark.plan_steps s ON s.task_id = j.task_id AND s.step = j.step"
                " WHERE j.task_id = %s AND j.phase = 'do' AND j.step < %s"
                "   AND j.status = 'done' AND NOT s.irreversible ORDER BY j.step",
                (task_id, before_step))
            return [JournalRow(**r) for r in cur.fetchall()]

    def approval_decision(self, task_id: str) -> dict[str, Any] | None:
        """The latest approve or reject a person recorded for the task, or None."""
        with self._conn() as conn:
            return conn.execute(
                "SELECT detail, actor, at FROM tidemark.events"
                " WHERE task_id = %s AND kind = 'approval' ORDER BY id DESC LIMIT 1",
                (task_id,)).fetchone()

    def boundary_state(self, task_id: str) -> dict[str, Any]:
        """The plan's approval ask, what a run asked a person to approve under the operator's
        policy, the latest approval decision, the latest verification of the boundary's gate
        and the latest verification at the end of the plan (tidemark.boundary) of a task (for
        the report)."""
        with self._conn() as conn:
            return conn.execute(
                """
                SELECT p.approval,
                  (SELECT jsonb_build_object('decision', e.detail->'decision', 'by', e.actor,
                                             'at', e.at)
                     FROM tidemark.events e WHERE e.task_id = p.task_id AND e.kind = 'approval'
                     ORDER BY e.id DESC LIMIT 1) AS decision,
                  (SELECT e.detail || jsonb_build_object('at', e.at)
                     FROM tidemark.events e
                     WHERE e.task_id = p.task_id AND e.kind = 'verification'
                       AND e.detail->>'at_end' IS DISTINCT FROM 'true'
                     ORDER BY e.id DESC LIMIT 1) AS verification,
                  (SELECT e.detail || jsonb_build_object('at', e.at)
                     FROM tidemark.events e
                     WHERE e.task_id = p.task_id AND e.kind = 'verification'
                       AND e.detail->>'at_end' = 'true'
                     ORDER BY e.id DESC LIMIT 1) AS end_verification,
                  (SELECT jsonb_build_object('approvers', a.approvers, 'steps', a.steps,
                                             'policy', a.policy)
                     FROM tidemark.approval_requests a WHERE a.task_id = p.task_id) AS asked
                FROM tidemark.plans p WHERE p.task_id = %s
                """, (task_id,)).fetchone() or {}

    def record_approval(self, task_id: str, decision: str, by: str, note: str = "",
                        label: str | None = None) -> None:
        """Journals a person's approve or reject, ``by`` the identity that counts (the
        operating-system user) and ``label`` the name they gave (``--by``); a reject also sets
        the durable stop state, in the same transaction, so that nothing starts the
        irreversible steps afterwards."""
        detail = {"decision": decision, "note": note}
        if label is not None:
            detail["label"] = label
        with self._conn() as conn, conn.transaction():
            StepSession(conn).event(task_id, "approval", detail, None, by)
            if decision == "reject":
                reason = f"irreversible steps rejected by {by}" + (f": {note}" if note else "")
                conn.execute(
                    "INSERT INTO tidemark.controls (scope, state, reason, set_by)"
                    " VALUES (%s, 'stopped', %s, %s) ON CONFLICT (scope) DO UPDATE SET"
                    " state = EXCLUDED.state, reason = EXCLUDED.reason,"
                    " set_by = EXCLUDED.set_by, set_at = clock_timestamp()",
                    (task_id, reason, by))
                StepSession(conn).event(task_id, "stop", {"reason": reason}, None, by)

    def ask_approval(self, task_id: str, policy: str, approvers: list[str], steps: list[int],
                     lines: list[str]) -> None:
        """Records what the run waits for a person to approve (the latest ask replaces the
        one before: the boundary asks again on every pass)."""
        with self._conn() as conn:
            conn.execute(
                "INSERT INTO tidemark.approval_requests (task_id, policy, approvers, steps, lines)"
                " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (task_id) DO UPDATE SET"
                " policy = EXCLUDED.policy, approvers = EXCLUDED.approvers,"
                " steps = EXCLUDED.steps, lines = EXCLUDED.lines, asked_at = clock_timestamp()",
                (task_id, policy, approvers, steps, Jsonb(lines)))

    def approval_request(self, task_id: str) -> dict[str, Any] | None:
        """What a run of the task last asked a person to approve, or None."""
        with self._conn() as conn:
            return conn.execute(
                "SELECT policy, approvers, steps, lines, asked_at FROM tidemark.approval_requests"
                " WHERE task_id = %s", (task_id,)).fetchone()
