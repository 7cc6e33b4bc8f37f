"""The durable stop state: stops, kills and their release."""

from __future__ import annotations

from typing import Any

from tidemark.store.base import StoreBase
from tidemark.store.session import StepSession
from tidemark.words import ControlState, EventKind


class ControlsMixin(StoreBase):
    """The durable stop state of tasks, series and everything (``*``)."""

    def set_control(self, scope: str, state: ControlState, reason: str, set_by: str) -> None:
        """Sets a task's (or ``*``) durable stop state and logs it as an event.

        A stop never turns a kill into a plain stop (an unwind's stop, a halt): only a release
        does, and only an operator's (the journal refuses it to any other role: NotAuthorized).
        Every change starts a new epoch of the task: a decision made before it is void."""
        with self._conn() as conn, conn.transaction():
            conn.execute(
                "INSERT INTO tidemark.controls (scope, state, reason, set_by) VALUES (%s,%s,%s,%s)"
                " ON CONFLICT (scope) DO UPDATE SET state = EXCLUDED.state, for_unwind = false,"
                " reason = EXCLUDED.reason, set_by = EXCLUDED.set_by, set_at = clock_timestamp()"
                " WHERE NOT (tidemark.controls.state = 'killed' AND EXCLUDED.state = 'stopped')",
                (scope, state, reason, set_by))
            kind = EventKind.STOP if state == ControlState.STOPPED else EventKind.RELEASE
            StepSession(conn).event(scope, kind, {"reason": reason}, None, set_by)

    def release_kill_for_unwind(self, task_id: str, reason: str, by: str) -> bool:
        """Lifts the task's own kill for an unwind only.

        A person's unwind may act (an undo grant is issued, compensations are journaled), while the
        task stays killed for everything else (no resume, no run forward) until `tidemark release
        T` by name. An operator's act. False if the task itself is not killed."""
        with self._conn() as conn, conn.transaction():
            r = conn.execute(
                "UPDATE tidemark.controls SET for_unwind = true, reason = %s, set_by = %s,"
                " set_at = clock_timestamp() WHERE scope = %s AND state = 'killed'"
                " RETURNING scope", (reason, by, task_id)).fetchone()
            if r is not None:
                StepSession(conn).event(task_id, EventKind.RELEASE, {"reason": reason,
                                                                      "for_unwind": True},
                                        None, by)
            return r is not None

    def task_known(self, task_id: str) -> bool:
        """Whether a plan is stored under ``task_id`` or a control row names it.

        A control row may name a task stopped before its plan arrived."""
        with self._conn() as conn:
            row = conn.execute(
                "SELECT EXISTS (SELECT 1 FROM tidemark.plans WHERE task_id = %s)"
                " OR EXISTS (SELECT 1 FROM tidemark.controls WHERE scope = %s) AS known",
                (task_id, task_id)).fetchone()
        return bool(row and row["known"])

    def stop_state(self, task_id: str) -> dict[str, Any] | None:
        """The stop that applies to a task (its own or the global one), or None."""
        with self._conn() as conn:
            r = conn.execute("SELECT tidemark.stop_of(%s) AS stop", (task_id,)).fetchone()
        return r["stop"] if r else None

    def set_killed(self, scope: str, reason: str, by: str) -> None:
        """Sets the durable stop state ``killed`` (only a release lifts it) and logs it."""
        with self._conn() as conn, conn.transaction():
            conn.execute(
                "INSERT INTO tidemark.controls (scope, state, reason, set_by)"
                " VALUES (%s, 'killed', %s, %s) ON CONFLICT (scope) DO UPDATE SET"
                " state = 'killed', for_unwind = false, reason = EXCLUDED.reason,"
                " set_by = EXCLUDED.set_by,"
                " set_at = clock_timestamp()", (scope, reason, by))
            StepSession(conn).event(scope, EventKind.KILL, {"reason": reason}, None, by)
