"""Grants: the credentials a run or an unwind was issued, their revocation and liveness."""

from __future__ import annotations

from typing import Any

from tidemark.store.base import StoreBase
from tidemark.store.journal import _KILLED, _STOPPED, _UNWOUND
from tidemark.store.session import StepSession
from tidemark.words import EventKind, GrantKind, GrantPurpose, GrantScope

# An undo grant (tidemark.grants) is issued only while a compensation could act.
_UNDO_ALLOWED = f"({_STOPPED} AND NOT {_KILLED} AND NOT {_UNWOUND})"


class GrantsMixin(StoreBase):
    """The grants of tasks (tidemark.grants)."""

    def issue_grant(self, task_id: str, target: str, scope: GrantScope, kind: GrantKind,
                    issuer: str, handle: str, ttl_s: float,
                    purpose: GrantPurpose = GrantPurpose.RUN) -> dict[str, Any] | None:
        """Records a new grant, or returns None.

        A ``run`` grant only while no stop state applies to the task; an ``undo`` grant (a person's
        unwind) only while the task is stopped, not killed, and not unwound. An undo grant is
        logged (a ``grant`` event)."""
        with self._conn() as conn, conn.transaction():
            row = conn.execute(
                "INSERT INTO tidemark.grants (task_id, target, scope, kind, issuer, handle,"
                " expires, purpose) SELECT %(task_id)s, %(target)s, %(scope)s, %(kind)s,"
                " %(issuer)s, %(handle)s, clock_timestamp() + make_interval(secs => %(ttl)s),"
                " %(purpose)s"
                " WHERE CASE WHEN %(purpose)s = 'undo'"
                f"  THEN {_UNDO_ALLOWED}"
                "   ELSE tidemark.stop_of(%(task_id)s) IS NULL END"
                " RETURNING id, issued, expires",
                {"task_id": task_id, "target": target, "scope": scope, "kind": kind,
                 "issuer": issuer, "handle": handle, "ttl": ttl_s,
                 "purpose": purpose}).fetchone()
            if row is not None and purpose == GrantPurpose.UNDO:
                StepSession(conn).event(task_id, EventKind.GRANT, {
                    "issued": row["id"], "target": target, "scope": scope, "purpose": purpose,
                    "expires": row["expires"].isoformat()}, None, "tidemark")
            return row

    def grant_state(self, grant_id: int) -> dict[str, Any] | None:
        """``{live, revoked, revoked_by}`` of a grant; live: neither revoked nor expired."""
        with self._conn() as conn:
            return conn.execute(
                "SELECT revoked IS NULL AND expires > clock_timestamp() AS live, revoked,"
                " revoked_by FROM tidemark.grants WHERE id = %s", (grant_id,)).fetchone()

    def revoke_grants(self, task_id: str | None, by: str,
                      purpose: GrantPurpose | None = None) -> list[dict[str, Any]]:
        """Revokes a task's unrevoked grants and returns them.

        Revokes every unrevoked grant of a task (None: of every task), or only those of
        one ``purpose``; returns them."""
        with self._conn() as conn, conn.transaction():
            rows = conn.execute(
                "UPDATE tidemark.grants SET revoked = clock_timestamp(), revoked_by = %s"
                " WHERE revoked IS NULL AND (%s::text IS NULL OR task_id = %s)"
                " AND (%s::text IS NULL OR purpose = %s)"
                " RETURNING id, task_id, target, scope, kind, issuer, handle, issued, expires,"
                " revoked, revoked_by, purpose",
                (by, task_id, task_id, purpose, purpose)).fetchall()
            for r in rows:
                StepSession(conn).event(r["task_id"], EventKind.GRANT, {
                    "revoked": r["id"], "target": r["target"], "scope": r["scope"],
                    "purpose": r["purpose"]}, None, by)
            return rows

    def grants(self, task_id: str) -> list[dict[str, Any]]:
        """Every grant of a task, without its handle."""
        with self._conn() as conn:
            return conn.execute(
                "SELECT id, task_id, target, scope, kind, issuer, issued, expires, revoked,"
                " revoked_by, purpose FROM tidemark.grants WHERE task_id = %s ORDER BY id",
                (task_id,)).fetchall()
