"""StepSession: the journal operations of one attempt, each owner-conditional.

StepSession: the journal operations of one attempt (intent, take-over, claim, stage,
outcome, lease), each conditional on the attempt's owner token, on a connection borrowed for
the attempt's bookkeeping and given back before the action's call."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from tidemark.errors import (
    ApprovalRequired,
    InvariantViolation,
    JournalMismatch,
    NotStopped,
    PartlyUnwound,
    StepBusy,
    TaskKilled,
    TaskStopped,
    TaskUnwound,
)
from tidemark.needs import Act, command
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
from tidemark.words import ControlState, EventKind, Phase, ResolvedBy, StepStatus

# Checked, with the stop and unwound state, in the statements that let an attempt act (begin,
# claim): a forward step not once anything was compensated, a compensation not under a kill.
_ACT_GUARDS = (f"CASE WHEN %(phase)s = 'undo' THEN NOT {_KILLED}"
               f" ELSE NOT {_COMPENSATED} END")
# The attempt lease of an open intent has passed (database clock); a row written before
# lease_until existed counts from its start (tidemark.store.LEASE_S, given as %(legacy)s).
_LEASE_PASSED = ("coalesce(lease_until, started_at + make_interval(secs => %(legacy)s))"
                 " <= clock_timestamp()")

Borrow = Callable[[], Any]  # a context manager factory lending a pooled connection


class StepSession:
    """Journal operations of one attempt at a step.

    ``spec`` is the plan's step and ``row`` its journal row as read when the attempt began;
    ``stopped`` is the reason of the task's durable stop state, or None; ``lease_left`` the
    seconds (database clock) for which the last attempt on an open intent may still be acting;
    ``seen_owner`` that attempt's token as read.

    **Ownership without a held connection.** An attempt owns its step's open intent through a
    token (``token``, written into the row's ``owner``), not through a database session: every
    write of the attempt after its intent (stage, lease, outcome) is conditional on the token,
    and a later attempt takes an open intent over only in a statement that checks both that its
    lease has passed and that the owner is still the one it read (``take_over``). So:

    * two live attempts never both act: the intent is written by one INSERT (a twin's INSERT of
      the same row fails on the primary key: StepBusy), and an open intent is taken over only
      once its lease has passed, by exactly one attempt (the token check), and only after that
      does anything probe or act again;
    * a lost connection costs nothing: the attempt borrows another for its next write, and the
      lease, not a session, keeps a twin out while the call may still be in flight (the lease
      rules and the deadline watch of tidemark.store.leases are unchanged);
    * an attempt that lost its intent anyway (its process froze past its lease) finds its later
      writes refused (StepBusy) and records nothing: the owner's probe settles the step;
    * at most one step in doubt: the partial unique index of the journal, as before.

    Each statement (or transaction) borrows a connection from the pool for itself alone, so
    none is held while the attempt waits on the target, whether for its gates, its snapshot,
    its probe or its call. Nothing of it is session state: every statement stands alone or in
    its own transaction, so it runs through a transaction-mode pooler. Built on a bare
    connection (``StepSession(conn)``), it runs its statements on that one.
    """

    def __init__(self, conn: psycopg.Connection[dict[str, Any]] | None = None, *,
                 borrow: Borrow | None = None, token: uuid.UUID | None = None) -> None:
        self._conn = conn
        self._borrow = borrow
        self.token = token  # this attempt's owner token (None: a session that owns nothing)
        self.began = time.monotonic()  # when the attempt began: its latency runs from here
        self.spec: Step
        self.row: JournalRow | None = None
        self.stopped: str | None = None
        self.killed: bool = False  # the stop that applies is a kill
        self.stop_scope: str | None = None  # whose stop it is: the task, ``series:S`` or ``*``
        self.unwound: bool = False
        self.lease_left: float | None = None  # seconds the row's last attempt may still act
        self.seen_owner: uuid.UUID | None = None  # the row's owner when it was read
        self.seen_version: str | None = None  # the row's version (xmin) when it was read
        self.lease_length: float = 0.0  # seconds its lease covers from its last write

    @contextmanager
    def _use(self) -> Iterator[psycopg.Connection[dict[str, Any]]]:
        """The connection for one statement (or one transaction).

        The session's own, or one borrowed from the pool for it alone."""
        with _translated():
            if self._conn is not None:
                yield self._conn
            elif self._borrow is not None:
                with self._borrow() as conn:
                    yield conn
            else:
                raise InvariantViolation("a step session without a connection")

    def get(self, task_id: str, step: int, phase: Phase = Phase.DO) -> JournalRow | None:
        with self._use() as conn:
            r = conn.execute(
                f"SELECT {_JOURNAL_COLUMNS} FROM tidemark.journal"
                " WHERE task_id = %s AND phase = %s AND step = %s"
                " ORDER BY attempt DESC LIMIT 1", (task_id, phase, step)).fetchone()
        return JournalRow(**r) if r else None

    def begin(self, *, task_id: str, step: int, key: str, action: str, args: dict[str, Any],
              before_state: dict[str, Any], lease_s: float, phase: Phase = Phase.DO,
              attempt: int = 1) -> JournalRow:
        """Commits the intent, owned by this attempt's token, with an attempt lease.

        The lease runs ``lease_s`` seconds from now (the action's deadline plus its horizon). Only
        when this returns may the action run.

        The statement itself refuses a 'do' step whose predecessor has no 'done' outcome, a
        'do' step of a stopped task (TaskStopped: a stop committed before this statement began
        prevents the intent), an 'undo' step of a task that is not stopped (NotStopped), and
        any step of an unwound task (TaskUnwound); the partial unique index refuses a second
        open intent in the task. A twin attempt that wrote this very row first (the same
        attempt number of the step and phase) makes it StepBusy.

        It runs in a transaction that first takes a share lock on the task's plan row, which an
        unwind's list of steps to compensate (undo_candidates) takes exclusively: an intent
        whose statement could still miss a stop committed before that list is read is either
        committed before the list is read or written after, by a statement that sees the stop.
        """
        params = {"task_id": task_id, "phase": phase, "step": step, "key": key,
                  "action": action, "args": Jsonb(args), "before": Jsonb(before_state),
                  "lease": lease_s, "attempt": attempt, "owner": self.attempt_token()}
        try:
            # One round trip, one transaction: the two statements go out together and the
            # pipeline's one Sync ends them, so they commit together or not at all (an extended
            # protocol transaction runs to the Sync; no BEGIN, whose own Sync would wait). Each
            # statement still takes its own snapshot, so the insert sees what committed before
            # the lock was granted.
            with self._use() as conn:
                if not conn.autocommit:  # the Sync would not end a transaction the caller began
                    raise InvariantViolation("an intent is written on a connection in autocommit"
                                             " mode, in a transaction of its own")
                with conn.pipeline():
                    conn.execute("SELECT 1 FROM tidemark.plans WHERE task_id = %s FOR SHARE",
                                 (task_id,))
                    cur = conn.execute(
                    f"""
                    INSERT INTO tidemark.journal (task_id, phase, step, attempt, idem_key,
                                                  action, args, before_state, lease_until,
                                                  lease_s, owner)
                    SELECT %(task_id)s, %(phase)s, %(step)s, %(attempt)s, %(key)s, %(action)s,
                           %(args)s, %(before)s,
                           clock_timestamp() + make_interval(secs => %(lease)s), %(lease)s,
                           %(owner)s
                    WHERE (%(phase)s = 'undo' OR %(step)s = 1 OR EXISTS (
                      SELECT 1 FROM tidemark.journal
                      WHERE task_id = %(task_id)s AND phase = 'do' AND step = %(step)s - 1
                        AND status = 'done'))
                      AND {_ACT_GUARDS}
                      AND (%(phase)s = 'undo') = {_STOPPED} AND NOT {_UNWOUND}
                      AND (%(phase)s = 'undo' OR tidemark.approval_holds(
                             %(task_id)s, %(step)s, %(action)s, %(args)s))
                    RETURNING {_JOURNAL_COLUMNS}
                    """, params)
                r = cur.fetchone()
        except psycopg.errors.UniqueViolation as e:
            if self._written(task_id, phase, step, attempt):
                raise StepBusy(f"{task_id}/{phase}/{step}",
                               "a twin attempt wrote its intent first") from e
            constraint = e.diag.constraint_name
            if constraint == "journal_one_in_doubt":
                raise InvariantViolation(
                    f"task {task_id!r} already has a step in doubt ({self._open_row(task_id)});"
                    f" step {step} ({phase}) may not start until it is settled: resume the "
                    "task, or record what happened with "
                    f"`{command(Act.RESOLVE, task_id, verdict='done')}` (or `--as never` for "
                    "a stopped task)") from e
            raise JournalMismatch(
                f"task {task_id!r} step {step}: the journal already holds a different "
                f"entry ({constraint})") from e
        if r is None:
            self._refusal(task_id, phase, step)
            raise InvariantViolation(
                f"task {task_id!r}: step {step} may not start before step {step - 1} is done")
        return JournalRow(**r)

    def _written(self, task_id: str, phase: Phase, step: int, attempt: int) -> bool:
        """Whether the row of this attempt number exists (a twin's insert won the race)."""
        with self._use() as conn:
            return conn.execute(
                "SELECT 1 FROM tidemark.journal WHERE task_id = %s AND phase = %s"
                " AND step = %s AND attempt = %s", (task_id, phase, step, attempt)
            ).fetchone() is not None

    def take_over(self, key: str, lease_s: float, legacy_lease_s: float) -> float | None:
        """This attempt takes over the open intent ``key`` whose last attempt ended.

        This attempt takes over the open intent ``key`` whose last attempt has ended or lost
        its lease, for ``lease_s`` seconds (its probe), in the statement that checks both: the
        lease has passed on the database's clock, and the row is still the one read with it
        (the same owner, ``seen_owner``, and the same version of the row, ``seen_version``: no
        renewal, claim or stage since), so that nothing acts on a read another attempt has made
        stale. Exactly one of several attempts that read the same lapsed intent gets it. That
        this attempt has also seen that version for the lease's whole length on its own clock
        is the caller's to check first (tidemark.attempt.taken_over).

        Returns None when taken over; otherwise the seconds the lease still runs (0.0 when
        another attempt took the intent over, or settled it, first)."""
        with self._use() as conn:
            r = conn.execute(
                "UPDATE tidemark.journal SET owner = %(owner)s, lease_s = %(lease)s,"
                " lease_until = clock_timestamp() + make_interval(secs => %(lease)s)"
                " WHERE idem_key = %(key)s AND outcome IS NULL"
                f" AND owner IS NOT DISTINCT FROM %(seen)s AND {_LEASE_PASSED}"
                " AND (%(version)s::text IS NULL OR xmin::text = %(version)s)"
                " RETURNING step",
                {"owner": self.attempt_token(), "lease": lease_s, "key": key,
                 "seen": self.seen_owner, "legacy": legacy_lease_s,
                 "version": self.seen_version}).fetchone()
            if r is not None:
                return None
            left = conn.execute(
                "SELECT extract(epoch FROM coalesce(lease_until, started_at + make_interval("
                "   secs => %(legacy)s)) - clock_timestamp())::float8 AS left"
                " FROM tidemark.journal WHERE idem_key = %(key)s AND outcome IS NULL"
                " AND owner IS NOT DISTINCT FROM %(seen)s",
                {"key": key, "seen": self.seen_owner, "legacy": legacy_lease_s}).fetchone()
        return max(0.0, left["left"]) if left is not None else 0.0

    def give_back(self, key: str) -> None:
        """Gives back the lease of an intent this attempt took over and left alone.

        Ends the lease of the open intent ``key`` this attempt took over and did not act on
        (its probe or gates ended the attempt; no request left it): the next attempt need not
        wait for it."""
        with self._use() as conn:
            conn.execute("UPDATE tidemark.journal SET lease_until = clock_timestamp(),"
                         " lease_s = 0 WHERE idem_key = %s AND outcome IS NULL AND owner = %s",
                         (key, self.attempt_token()))

    def claim(self, task_id: str, key: str, lease_s: float, phase: Phase = Phase.DO) -> None:
        """This attempt acts now on the open intent ``key`` it took over.

        It was probed absent. Sets its lease to ``lease_s`` from now, in the statement that checks
        once more that the task may act (TaskStopped / NotStopped / TaskUnwound otherwise) and that
        this attempt still owns the intent (StepBusy otherwise)."""
        with self._use() as conn:
            r = conn.execute(
                "UPDATE tidemark.journal SET lease_s = %(lease)s,"
                " lease_until = clock_timestamp() + make_interval(secs => %(lease)s)"
                " WHERE idem_key = %(key)s AND outcome IS NULL AND owner = %(owner)s"
                f"  AND {_ACT_GUARDS}"
                f"  AND (%(phase)s = 'undo') = {_STOPPED} AND NOT {_UNWOUND}"
                "  AND (%(phase)s = 'undo'"
                "       OR tidemark.approval_holds(task_id, step, action, args))"
                " RETURNING step",
                {"task_id": task_id, "key": key, "lease": lease_s, "phase": phase,
                 "owner": self.attempt_token()}).fetchone()
        if r is None:
            self._refusal(task_id, phase, self._open_step(key))
            self._lost(key)
            raise InvariantViolation(f"no open intent with key {key} to act on")

    def attempt_token(self) -> uuid.UUID:
        if self.token is None:
            raise InvariantViolation("this step session owns no attempt")
        return self.token

    def _lost(self, key: str) -> None:
        """Raises StepBusy if the open intent ``key`` is owned by another attempt now."""
        with self._use() as conn:
            r = conn.execute("SELECT owner FROM tidemark.journal"
                             " WHERE idem_key = %s AND outcome IS NULL", (key,)).fetchone()
        if r is not None and r["owner"] != self.token:
            raise StepBusy(key, "another attempt took the intent over")

    def _open_row(self, task_id: str) -> str:
        """Names the task's row in doubt, for an error message."""
        with self._use() as conn:
            r = conn.execute("SELECT step, phase, action FROM tidemark.journal"
                             " WHERE task_id = %s AND outcome IS NULL", (task_id,)).fetchone()
        return f"step {r['step']} {r['action']} ({r['phase']})" if r else "settled meanwhile"

    def _open_step(self, key: str) -> int | None:
        """The step of the open intent ``key``, for a refusal's reason."""
        with self._use() as conn:
            r = conn.execute("SELECT step FROM tidemark.journal WHERE idem_key = %s",
                             (key,)).fetchone()
        return r["step"] if r else None

    def _refusal(self, task_id: str, phase: Phase, step: int | None = None) -> None:
        """Raises why the task may not act now, if anything stops it.

        Raises why the task may not act now, if it is its stop or unwound state, or (for an
        irreversible step) that no approval of the current epoch covers it."""
        with self._use() as conn:
            r = conn.execute(
                f"SELECT {_UNWOUND} AS unwound, {_COMPENSATED} AS compensated,"
                " c.stop->>'state' AS state, c.stop->>'for_unwind' = 'true' AS for_unwind,"
                " coalesce(nullif(c.stop->>'reason', ''), c.stop->>'state') AS stopped,"
                " c.stop->>'scope' AS stop_scope,"
                " coalesce((SELECT s.irreversible FROM tidemark.plan_steps s"
                "           WHERE s.task_id = %(task_id)s AND s.step = %(step)s), false)"
                "   AND tidemark.approval_needed(%(task_id)s)"
                "   AND NOT tidemark.approved(%(task_id)s) AS unapproved"
                " FROM tidemark.stop_of(%(task_id)s) AS c(stop)",
                {"task_id": task_id, "step": step}).fetchone()
        assert r is not None
        if r["unwound"]:
            raise TaskUnwound(task_id)
        if phase == Phase.DO and r["stopped"] is not None:
            raise TaskStopped(task_id, r["stopped"], r["stop_scope"])
        if phase == Phase.DO and r["compensated"]:
            raise PartlyUnwound(task_id)
        if phase == Phase.UNDO and r["stopped"] is None:
            raise NotStopped(task_id)
        if phase == Phase.UNDO and r["state"] == ControlState.KILLED and not r["for_unwind"]:
            raise TaskKilled(task_id)
        if phase == Phase.DO and step is not None and r["unapproved"]:
            raise ApprovalRequired(task_id, step)

    def complete(self, *, key: str, outcome: dict[str, Any], status: StepStatus,
                 resolved_by: ResolvedBy, flush: bool = True, owned: bool = True) -> JournalRow:
        """Commits the outcome of the open intent ``key``, if this attempt still owns it.

        StepBusy otherwise: another attempt took it over, and its probe settles the step.
        ``owned=False`` is a person's decision (`tidemark resolve`), which owns no attempt.

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
        with self._use() as conn:
            r = conn.execute(
                "UPDATE tidemark.journal SET outcome = %(outcome)s, status = %(status)s,"
                " resolved_by = %(by)s, finished_at = clock_timestamp()"
                " WHERE idem_key = %(key)s AND outcome IS NULL"
                " AND (NOT %(owned)s OR owner = %(owner)s)"
                f"{unflushed} RETURNING {_JOURNAL_COLUMNS}",
                {"outcome": Jsonb(outcome), "status": status, "by": resolved_by, "key": key,
                 "owned": owned, "owner": self.token}).fetchone()
        if r is None:
            if owned:
                self._lost(key)
            raise InvariantViolation(f"no open intent with key {key} to complete")
        return JournalRow(**r)

    def renew_lease(self, key: str, seconds: float) -> None:
        """Sets the lease of the open intent ``key`` to end ``seconds`` from now.

        Sets the attempt lease of the open intent ``key`` this attempt owns to end
        ``seconds`` from now: after an ambiguous failure, the target's horizon (its request may
        still land until then). The attempt's call has returned, so a request it marked as
        leaving can no longer leave later: the mark is answered (returned_at)."""
        with self._use() as conn:
            conn.execute(
                "UPDATE tidemark.journal"
                " SET lease_until = clock_timestamp() + make_interval(secs => %s), lease_s = %s,"
                "     returned_at = CASE WHEN sent_at IS NOT NULL THEN clock_timestamp() END"
                " WHERE idem_key = %s AND outcome IS NULL AND owner = %s",
                (seconds, seconds, key, self.attempt_token()))

    def mark_sent(self, key: str) -> bool:
        """The mark: this attempt's effect request on ``key`` may leave from now on.

        See tidemark.wire. Written on the sending thread just before the request leaves, and only
        while this attempt still owns the intent: False when it does not (a twin took it over, or
        settled it), and then the request must not leave.

        It commits without waiting for the disk (synchronous_commit off for this transaction
        only, as StepSession.complete(flush=False)): visible to every twin at once, lost only if
        Postgres itself crashes before its WAL writer flushes (within wal_writer_delay, 200 ms by
        default) while this worker stands still between the mark and its socket. The wait for
        the disk cost a step about 1.6 ms (docs/provider-assumptions.md)."""
        with self._use() as conn:
            r = conn.execute(
                "UPDATE tidemark.journal SET sent_at = clock_timestamp(), returned_at = NULL"
                " WHERE idem_key = %s AND outcome IS NULL AND owner = %s"
                " AND set_config('synchronous_commit', 'off', true) = 'off' RETURNING step",
                (key, self.attempt_token())).fetchone()
        return r is not None

    def not_sent(self, key: str) -> None:
        """After NotSent: takes the mark back and gives the lease back.

        After NotSent: nothing of this attempt's effect reached the target, so its mark is
        taken back and its lease given back (the next attempt need not wait, and its probe's
        *absent* is a verdict again)."""
        with self._use() as conn:
            conn.execute(
                "UPDATE tidemark.journal SET sent_at = NULL, returned_at = NULL,"
                " lease_until = clock_timestamp(), lease_s = 0"
                " WHERE idem_key = %s AND outcome IS NULL AND owner = %s",
                (key, self.attempt_token()))

    def stage(self, key: str, staged: dict[str, Any], lease_s: float) -> None:
        """Journals the handle an action staged for the open intent ``key`` (once).

        It extends its lease to cover the call that consumes it (``lease_s`` from now, never
        shorter)."""
        with self._use() as conn:
            r = conn.execute(
                "UPDATE tidemark.journal SET staged = %s, lease_until = greatest(lease_until,"
                " clock_timestamp() + make_interval(secs => %s)),"
                " lease_s = greatest(coalesce(lease_s, 0), %s)"
                " WHERE idem_key = %s AND outcome IS NULL AND staged IS NULL AND owner = %s"
                " RETURNING step",
                (Jsonb(staged), lease_s, lease_s, key, self.attempt_token())).fetchone()
        if r is None:
            self._lost(key)
            raise InvariantViolation(f"no open, unstaged intent with key {key} to stage")

    def operator_decision(self, task_id: str, step: int, since: datetime) -> dict[str, Any] | None:
        """The latest decision a person recorded about this step since its intent, if any."""
        with self._use() as conn:
            return conn.execute(
                "SELECT detail, actor, at FROM tidemark.events"
                " WHERE task_id = %s AND step = %s AND kind = 'decision' AND at >= %s"
                " ORDER BY id DESC LIMIT 1", (task_id, step, since)).fetchone()

    def event(self, task_id: str, kind: EventKind, detail: dict[str, Any], step: int | None = None,
              actor: str = "tidemark") -> None:
        with self._use() as conn:
            conn.execute(
                "INSERT INTO tidemark.events (task_id, step, kind, detail, actor)"
                " VALUES (%s, %s, %s, %s, %s)", (task_id, step, kind, Jsonb(detail), actor))
