"""StepSession: the journal operations of one attempt, on the connection that holds its step's
execution lock (intent, claim, stage, outcome, lease)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from tidemark.errors import (
    InvariantViolation,
    JournalMismatch,
    NotStopped,
    PartlyUnwound,
    TaskKilled,
    TaskStopped,
    TaskUnwound,
)
from tidemark.plan import Step
from tidemark.store.connection import _translated
from tidemark.store.journal import (
    _COMPENSATED,
    _JOURNAL_COLUMNS,
    _KILLED,
    _STOPPED,
    _UNWOUND,
    JournalRow,
)

# Checked, with the stop and unwound state, in the statements that let an attempt act (begin,
# claim): a forward step not once anything was compensated, a compensation not under a kill.
_ACT_GUARDS = (f"CASE WHEN %(phase)s = 'undo' THEN NOT {_KILLED}"
               f" ELSE NOT {_COMPENSATED} END")


class StepSession:
    """Journal operations on the connection that holds a step's execution lock.

    ``spec`` is the plan's step and ``row`` its journal row as read when the lock was taken;
    ``stopped`` is the reason of the task's durable stop state, or None; ``lease_left`` the
    seconds (database clock) for which the last attempt on an open intent may still be acting.
    """

    def __init__(self, conn: psycopg.Connection[dict[str, Any]]) -> None:
        self.conn = conn
        self.spec: Step
        self.row: JournalRow | None = None
        self.stopped: str | None = None
        self.killed: bool = False  # the stop that applies is a kill
        self.stop_scope: str | None = None  # whose stop it is: the task, ``series:S`` or ``*``
        self.unwound: bool = False
        self.lease_left: float | None = None  # seconds the row's last attempt may still act

    def get(self, task_id: str, step: int, phase: str = "do") -> JournalRow | None:
        with _translated():
            r = self.conn.execute(
                f"SELECT {_JOURNAL_COLUMNS} FROM tidemark.journal"
                " WHERE task_id = %s AND phase = %s AND step = %s"
                " ORDER BY attempt DESC LIMIT 1", (task_id, phase, step)).fetchone()
        return JournalRow(**r) if r else None

    def begin(self, *, task_id: str, step: int, key: str, action: str, args: dict[str, Any],
              before_state: dict[str, Any], lease_s: float, phase: str = "do",
              attempt: int = 1) -> JournalRow:
        """Commits the intent, with an attempt lease of ``lease_s`` seconds from now (the
        action's deadline plus its horizon). Only when this returns may the action run.

        The statement itself refuses a 'do' step whose predecessor has no 'done' outcome, a
        'do' step of a stopped task (TaskStopped: a stop committed before this statement began
        prevents the intent), an 'undo' step of a task that is not stopped (NotStopped), and
        any step of an unwound task (TaskUnwound); the partial unique index refuses a second
        open intent in the task.
        """
        try:
            with _translated():
                r = self.conn.execute(
                    f"""
                    INSERT INTO tidemark.journal (task_id, phase, step, attempt, idem_key,
                                                  action, args, before_state, lease_until)
                    SELECT %(task_id)s, %(phase)s, %(step)s, %(attempt)s, %(key)s, %(action)s,
                           %(args)s, %(before)s,
                           clock_timestamp() + make_interval(secs => %(lease)s)
                    WHERE (%(phase)s = 'undo' OR %(step)s = 1 OR EXISTS (
                      SELECT 1 FROM tidemark.journal
                      WHERE task_id = %(task_id)s AND phase = 'do' AND step = %(step)s - 1
                        AND status = 'done'))
                      AND {_ACT_GUARDS}
                      AND (%(phase)s = 'undo') = {_STOPPED} AND NOT {_UNWOUND}
                    RETURNING {_JOURNAL_COLUMNS}
                    """,
                    {"task_id": task_id, "phase": phase, "step": step, "key": key,
                     "action": action, "args": Jsonb(args), "before": Jsonb(before_state),
                     "lease": lease_s, "attempt": attempt},
                ).fetchone()
        except psycopg.errors.UniqueViolation as e:
            constraint = e.diag.constraint_name
            if constraint == "journal_one_in_doubt":
                raise InvariantViolation(
                    f"task {task_id!r} already has a step in doubt ({self._open_row(task_id)});"
                    f" step {step} ({phase}) may not start until it is settled: resume the "
                    f"task, or record what happened with `tidemark resolve {task_id} --step N "
                    "--as done` (or `--as never` for a stopped task)") from e
            raise JournalMismatch(
                f"task {task_id!r} step {step}: the journal already holds a different "
                f"entry ({constraint})") from e
        if r is None:
            self._refusal(task_id, phase)
            raise InvariantViolation(
                f"task {task_id!r}: step {step} may not start before step {step - 1} is done")
        return JournalRow(**r)

    def claim(self, task_id: str, key: str, lease_s: float, phase: str = "do") -> None:
        """This attempt acts now on the open intent ``key`` (found in doubt, probed absent):
        sets its lease to ``lease_s`` from now, in the statement that checks once more that the
        task may act (TaskStopped / NotStopped / TaskUnwound otherwise)."""
        with _translated():
            r = self.conn.execute(
                "UPDATE tidemark.journal"
                " SET lease_until = clock_timestamp() + make_interval(secs => %(lease)s)"
                " WHERE idem_key = %(key)s AND outcome IS NULL"
                f"  AND {_ACT_GUARDS}"
                f"  AND (%(phase)s = 'undo') = {_STOPPED} AND NOT {_UNWOUND}"
                " RETURNING step",
                {"task_id": task_id, "key": key, "lease": lease_s, "phase": phase}).fetchone()
        if r is None:
            self._refusal(task_id, phase)
            raise InvariantViolation(f"no open intent with key {key} to act on")

    def _open_row(self, task_id: str) -> str:
        """Names the task's row in doubt, for an error message."""
        with _translated():
            r = self.conn.execute("SELECT step, phase, action FROM tidemark.journal"
                                  " WHERE task_id = %s AND outcome IS NULL", (task_id,)).fetchone()
        return f"step {r['step']} {r['action']} ({r['phase']})" if r else "settled meanwhile"

    def _refusal(self, task_id: str, phase: str) -> None:
        """Raises why the task may not act now, if it is its stop or unwound state."""
        with _translated():
            r = self.conn.execute(
                f"SELECT {_UNWOUND} AS unwound, {_COMPENSATED} AS compensated,"
                " c.stop->>'state' AS state,"
                " coalesce(nullif(c.stop->>'reason', ''), c.stop->>'state') AS stopped,"
                " c.stop->>'scope' AS stop_scope"
                " FROM tidemark.stop_of(%(task_id)s) AS c(stop)",
                {"task_id": task_id}).fetchone()
        assert r is not None
        if r["unwound"]:
            raise TaskUnwound(task_id)
        if phase == "do" and r["stopped"] is not None:
            raise TaskStopped(task_id, r["stopped"], r["stop_scope"])
        if phase == "do" and r["compensated"]:
            raise PartlyUnwound(task_id)
        if phase == "undo" and r["stopped"] is None:
            raise NotStopped(task_id)
        if phase == "undo" and r["state"] == "killed":
            raise TaskKilled(task_id)

    def complete(self, *, key: str, outcome: dict[str, Any], status: str,
                 resolved_by: str, flush: bool = True) -> JournalRow:
        """Commits the outcome of the open intent ``key``.

        The execution lock is let go only afterwards (when the session ends): a session-level
        unlock takes effect at once, so unlocking inside this statement would let a twin read
        the intent as still open before the outcome's commit is visible.

        ``flush=False`` commits without waiting for the write-ahead log to reach the disk
        (synchronous_commit off for this transaction only): the commit is visible at once and
        survives any crash of ours, but a crash of Postgres itself within a fraction of a second
        may lose it, which leaves the step in doubt, as if we had died before the outcome.
        Postgres flushes its log in order, so the next synchronous commit (the next step's
        intent, or JournalStore.end_batch) makes it durable; until then it must not be reported
        outside the journal. An intent is always flushed before its action runs.
        """
        # set_config(..., true) holds for this statement's own transaction only; as a filter
        # on the one row the key finds, it is set whenever the outcome is written.
        unflushed = "" if flush else " AND set_config('synchronous_commit', 'off', true) = 'off'"
        with _translated():
            r = self.conn.execute(
                "UPDATE tidemark.journal SET outcome = %s, status = %s, resolved_by = %s,"
                " finished_at = clock_timestamp() WHERE idem_key = %s AND outcome IS NULL"
                f"{unflushed} RETURNING {_JOURNAL_COLUMNS}",
                (Jsonb(outcome), status, resolved_by, key)).fetchone()
        if r is None:
            raise InvariantViolation(f"no open intent with key {key} to complete")
        return JournalRow(**r)

    def renew_lease(self, key: str, seconds: float) -> None:
        """Sets the attempt lease of the open intent ``key`` to end ``seconds`` from now: after
        an ambiguous failure, the target's horizon (its request may still land until then)."""
        with _translated():
            self.conn.execute(
                "UPDATE tidemark.journal"
                " SET lease_until = clock_timestamp() + make_interval(secs => %s)"
                " WHERE idem_key = %s AND outcome IS NULL", (seconds, key))

    def stage(self, key: str, staged: dict[str, Any], lease_s: float) -> None:
        """Journals the handle an action staged for the open intent ``key`` (once), and extends
        its lease to cover the call that consumes it (``lease_s`` from now, never shorter)."""
        with _translated():
            r = self.conn.execute(
                "UPDATE tidemark.journal SET staged = %s, lease_until = greatest(lease_until,"
                " clock_timestamp() + make_interval(secs => %s))"
                " WHERE idem_key = %s AND outcome IS NULL AND staged IS NULL RETURNING step",
                (Jsonb(staged), lease_s, key)).fetchone()
        if r is None:
            raise InvariantViolation(f"no open, unstaged intent with key {key} to stage")

    def operator_decision(self, task_id: str, step: int, since: datetime) -> dict[str, Any] | None:
        """The latest decision a person recorded about this step since its intent, if any."""
        with _translated():
            return self.conn.execute(
                "SELECT detail, actor, at FROM tidemark.events"
                " WHERE task_id = %s AND step = %s AND kind = 'decision' AND at >= %s"
                " ORDER BY id DESC LIMIT 1", (task_id, step, since)).fetchone()

    def event(self, task_id: str, kind: str, detail: dict[str, Any], step: int | None = None,
              actor: str = "tidemark") -> None:
        with _translated():
            self.conn.execute(
                "INSERT INTO tidemark.events (task_id, step, kind, detail, actor)"
                " VALUES (%s, %s, %s, %s, %s)", (task_id, step, kind, Jsonb(detail), actor))
