"""Login roles: who the journal knows a connection as.

Migration 0016 makes the three group roles, tidemark_worker, tidemark_operator and
tidemark_approver, and gives each its rights."""

from __future__ import annotations

from psycopg import sql

from tidemark.store.base import StoreBase
from tidemark.words import JournalRole


class RolesMixin(StoreBase):
    """Login roles for a laptop stack and a harness.

    They are made by a connection that may make them (the embedded Postgres's superuser): in
    production an operator makes them."""

    def make_login_role(self, role: str, *groups: JournalRole) -> bool:
        """Makes the login role ``role`` a member of ``groups``.

        It creates the role if it does not exist, with no password: the laptop's Postgres trusts
        its Unix socket. Returns whether it was created."""
        with self._conn() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                         ("tidemark-role:" + role,))
            known = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s",
                                 (role,)).fetchone() is not None
            if not known:
                conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
            for group in groups:
                conn.execute(sql.SQL("GRANT {} TO {}").format(
                    sql.Identifier(str(JournalRole(group))), sql.Identifier(role)))
        return not known
