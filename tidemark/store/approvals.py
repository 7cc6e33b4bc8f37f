"""The irreversible boundary: gate, approval asks and decisions.

The irreversible boundary: what the verification gate re-probes, what a run asks a
person to approve, and the decisions recorded."""

from __future__ import annotations

from typing import Any

from psycopg.types.json import Jsonb

from tidemark.store.base import StoreBase
from tidemark.store.journal import _JOURNAL_COLUMNS, JournalRow
from tidemark.words import Decision, DecisionVia


class ApprovalsMixin(StoreBase):
    """The irreversible boundary's reads and writes."""

    def verifiable_rows(self, task_id: str, before_step: int) -> list[JournalRow]:
        """The 'do' rows of reversible steps that the verification gate re-probes.

        The 'do' rows of reversible steps before ``before_step`` whose outcome is done:
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

    def current_decision(self, task_id: str) -> dict[str, Any] | None:
        """The decision of the task's current epoch, or None.

        A decision of an earlier epoch (a stop, kill, release or reject came since) counts for
        nothing."""
        with self._conn() as conn:
            return conn.execute(
                "SELECT d.decision, d.decided_by, d.label, d.note, d.epoch, d.at, d.via"
                " FROM tidemark.decisions d WHERE d.task_id = %s"
                " AND d.epoch = tidemark.epoch_of(d.task_id)", (task_id,)).fetchone()

    def boundary_state(self, task_id: str) -> dict[str, Any]:
        """A task's boundary, approval and verification state, for the report.

        The plan's approval ask, what a run asked a person to approve under the operator's
        policy, the latest decision (with whether it still holds: a stop, kill or release since
        voids it), whether the journal says a person must approve, the latest verification of
        the boundary's gate and the latest verification at the end of the plan
        (tidemark.boundary) of a task (for the report)."""
        with self._conn() as conn:
            return conn.execute(
                """
                SELECT p.approval,
                  (SELECT jsonb_build_object('decision', d.decision, 'by', d.decided_by,
                                             'label', d.label, 'at', d.at, 'epoch', d.epoch,
                                             'holds', d.epoch = tidemark.epoch_of(p.task_id))
                     FROM tidemark.decisions d WHERE d.task_id = p.task_id
                     ORDER BY d.epoch DESC LIMIT 1) AS decision,
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
                     FROM tidemark.approval_requests a WHERE a.task_id = p.task_id) AS asked,
                  tidemark.approval_needed(p.task_id) AS needed
                FROM tidemark.plans p WHERE p.task_id = %s
                """, (task_id,)).fetchone() or {}

    def decide(self, task_id: str, decision: Decision, plan_hash: str, *, os_user: str | None,
               label: str | None, note: str = "",
               via: DecisionVia = DecisionVia.CLI) -> dict[str, Any]:
        """Records a person's approve or reject of the task's irreversible steps.

        Records a person's approve or reject of the task's irreversible steps under the
        login role of this store's connection, in one statement the journal checks
        (tidemark.check_decision): the role an approver every list names, ``plan_hash`` the
        stored plan's, the task waiting for a decision, no stop holding it (no kill, for a
        reject), and no decision of its current epoch yet: the first decision of an epoch wins.

        Returns the recorded row, with ``holds`` False when a stop, kill or release committed
        meanwhile moved the task to a later epoch. Raises DecisionRefused (``why`` names the
        rule) or NotAuthorized, having recorded nothing."""
        with self._conn() as conn:
            r = conn.execute(
                "INSERT INTO tidemark.decisions (task_id, epoch, decision, plan_hash, decided_by,"
                " os_user, label, note, via) VALUES (%s, 0, %s, %s, session_user, %s, %s, %s, %s)"
                " RETURNING decision, decided_by, label, note, epoch, at, via",
                (task_id, decision, plan_hash, os_user, label, note, via)).fetchone()
            now = conn.execute("SELECT tidemark.epoch_of(%s) AS epoch", (task_id,)).fetchone()
        assert r is not None and now is not None
        return {**r, "holds": r["epoch"] == now["epoch"]}

    def ask_approval(self, task_id: str, policy: str, approvers: list[str], steps: list[int],
                     lines: list[str]) -> None:
        """Records what the run waits for a person to approve.

        The latest ask replaces the one before: the boundary asks again on every pass.
        ``approvers`` narrows who may decide (the worker's TIDEMARK_APPROVERS; empty: no
        narrowing). The journal counts an ask as a need of approval: a worker can ask for more,
        never for less."""
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

    def approval_needed(self, task_id: str) -> bool:
        """Whether the journal says a person must approve the task's irreversible steps.

        The strictest of the operator's policy, the series', the plan's ask and a worker's ask
        decides."""
        with self._conn() as conn:
            r = conn.execute("SELECT tidemark.approval_needed(%s) AS needed",
                             (task_id,)).fetchone()
        return bool(r and r["needed"])

    def policy(self) -> dict[str, Any] | None:
        """The operator's approval policy as the journal holds it, or None.

        None: none is set, and every irreversible step waits for a person."""
        with self._conn() as conn:
            return conn.execute(
                "SELECT approval, rules, approvers, set_role, set_by, set_at"
                " FROM tidemark.approval_policy").fetchone()

    def set_policy(self, approval: str, rules: dict[str, Any], approvers: list[str] | None,
                   by: str) -> dict[str, Any]:
        """Sets the operator's approval policy.

        An operator's act: NotAuthorized for any other role. ``approvers`` None: every member of
        tidemark_approver may decide."""
        with self._conn() as conn:
            r = conn.execute(
                "INSERT INTO tidemark.approval_policy (approval, rules, approvers, set_by)"
                " VALUES (%s, %s, %s, %s) ON CONFLICT (one) DO UPDATE SET"
                " approval = EXCLUDED.approval, rules = EXCLUDED.rules,"
                " approvers = EXCLUDED.approvers, set_by = EXCLUDED.set_by,"
                " set_at = clock_timestamp()"
                " RETURNING approval, rules, approvers, set_role, set_by, set_at",
                (approval, Jsonb(rules), approvers, by)).fetchone()
        assert r is not None
        return r
