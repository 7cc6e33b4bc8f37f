"""Unwinds: the steps a compensation must still visit, and the terminal unwound mark."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from tidemark.errors import InvariantViolation, StepBusy, UnknownTask
from tidemark.store.base import StoreBase
from tidemark.store.connection import _translated
from tidemark.store.journal import _STOPPED, _UNWOUND
from tidemark.store.session import StepSession
from tidemark.words import EventKind

# How long the list of steps to compensate waits for an intent being written (two statements).
LOCK_WAIT_MS = 5000


class UnwindsMixin(StoreBase):
    """What an unwind reads and the mark it ends with."""

    def undo_candidates(self, task_id: str) -> list[int]:
        """Steps an unwind must visit, last first.

        Reversible 'do' steps that are done or in doubt, whose compensation has no 'done' outcome
        yet.

        Complete once the task is stopped: the only step that could still get an intent is the
        one after the last journaled step (an intent needs its predecessor done), and an
        attempt writes its intent in a transaction that first takes a share lock on the task's
        plan row (StepSession.begin). The list is read in a transaction that takes that row
        exclusively first, so it waits for any intent being written: an intent whose statement
        began before the stop was committed has landed by then and is listed, and any later one
        is refused by the stop state its own statement checks. The wait is bounded
        (LOCK_WAIT_MS; StepBusy after it, retryable).
        """
        with self._conn() as conn, _translated(), _plan_row_taken(conn, task_id):
            rows = conn.execute(
                "SELECT j.step FROM tidemark.journal j"
                " JOIN tidemark.plan_steps s ON s.task_id = j.task_id AND s.step = j.step"
                " WHERE j.task_id = %s AND j.phase = 'do' AND NOT s.irreversible"
                "   AND (j.status = 'done' OR j.outcome IS NULL)"
                "   AND NOT EXISTS (SELECT 1 FROM tidemark.journal u WHERE u.task_id ="
                "     j.task_id AND u.phase = 'undo' AND u.step = j.step"
                "     AND u.status = 'done')"
                " ORDER BY j.step DESC", (task_id,)).fetchall()
        return [r["step"] for r in rows]

    def record_unwound(self, task_id: str, by: str, detail: dict[str, Any]) -> list[int]:
        """Marks a stopped task unwound (terminal), once nothing is left to do.

        Marks a stopped task unwound (terminal), in the statement that checks that nothing
        is left to compensate or in doubt. Returns the steps still to visit: empty when the
        mark was written (or already there).

        The mark's transaction takes the task's plan row exclusively first, as the list does.
        Without it an intent could stand beside a mark that never saw it: a person releases the
        task while the mark is being written (its statement read the task as stopped), and an
        intent whose statement began after the release and before the mark's commit sees the
        task neither stopped nor unwound (when nothing was compensated yet, nothing else
        refuses it). With it, such an intent waits for the mark and then sees the task
        unwound; one that holds the row first has committed before the mark's statement reads
        the journal, and keeps the task from being marked. StepBusy after LOCK_WAIT_MS."""
        left = self.undo_candidates(task_id)
        if left:
            return left
        with self._conn() as conn, _translated(), _plan_row_taken(conn, task_id):
            r = conn.execute(
                f"""
                INSERT INTO tidemark.unwinds (task_id, unwound_by, detail)
                SELECT %(task_id)s, %(by)s, %(detail)s
                WHERE {_STOPPED} AND NOT EXISTS (
                    SELECT 1 FROM tidemark.journal j
                    JOIN tidemark.plan_steps s ON s.task_id = j.task_id AND s.step = j.step
                    WHERE j.task_id = %(task_id)s AND (j.outcome IS NULL OR (
                      j.phase = 'do' AND j.status = 'done' AND NOT s.irreversible
                      AND NOT EXISTS (SELECT 1 FROM tidemark.journal u WHERE u.task_id =
                        j.task_id AND u.phase = 'undo' AND u.step = j.step
                        AND u.status = 'done'))))
                ON CONFLICT (task_id) DO NOTHING RETURNING task_id
                """, {"task_id": task_id, "by": by, "detail": Jsonb(detail)}).fetchone()
            if r is not None:
                StepSession(conn).event(task_id, EventKind.UNWOUND, detail, None, by)
                return []
            unwound = conn.execute(f"SELECT {_UNWOUND} AS u", {"task_id": task_id}).fetchone()
            if unwound is not None and unwound["u"]:
                return []
        left = self.undo_candidates(task_id)
        if not left:
            raise InvariantViolation(f"task {task_id!r} cannot be marked unwound: it is not "
                                     "stopped, or a step is in doubt")
        return left


@contextmanager
def _plan_row_taken(conn: psycopg.Connection[dict[str, Any]], task_id: str) -> Iterator[None]:
    """A transaction on ``conn`` that first takes the task's plan row FOR UPDATE.

    It waits at most LOCK_WAIT_MS for an intent being written (StepSession.begin holds the row FOR
    SHARE while it writes one); StepBusy after that, retryable."""
    try:
        with conn.transaction():
            conn.execute("SELECT set_config('lock_timeout', %s, true)", (str(LOCK_WAIT_MS),))
            found = conn.execute("SELECT 1 FROM tidemark.plans WHERE task_id = %s FOR UPDATE",
                                 (task_id,)).fetchone()
            if found is None:
                raise UnknownTask(task_id)
            yield
    except psycopg.errors.LockNotAvailable as e:
        raise StepBusy(task_id, "an intent is being written; try again") from e
