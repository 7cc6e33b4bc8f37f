"""JournalStore: every read and write of the journal, in one place.

Synchronous psycopg 3, on purpose: a step holds its execution lock on one live connection for
the whole action, and the actions call synchronous SDKs (google-api-python-client, stripe) from
worker threads. A thread per step with a blocking connection is the simplest shape in which
"the lock lives exactly as long as the attempt" is obviously true.

All SQL of the project lives here and in ``migrations/``; values are always parameters.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool, PoolTimeout

from tidemark.errors import (
    InvariantViolation,
    JournalMismatch,
    NotStopped,
    PartlyUnwound,
    PlanChanged,
    StepBusy,
    StoreUnavailable,
    TaskKilled,
    TaskStopped,
    TaskUnwound,
    UnknownTask,
)
from tidemark.keys import lock_id
from tidemark.migrate import migrate
from tidemark.plan import Plan, Step

log = logging.getLogger(__name__)

# A step waits this long for a pooled connection before its attempt fails as retryable; long
# enough to ride out a burst, short enough that a dead database surfaces within one heartbeat.
POOL_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 5  # libpq connect_timeout: a blackholed host fails fast, not after minutes
POOL_MAX = 16  # one connection per concurrent step plus a few for reports
# The attempt lease of an open intent says until when the attempt acting on it may still be
# acting; a twin neither probes nor acts before it has passed. It guards what the execution lock
# cannot: the acting attempt lost its database session (a restart, a failover, a terminated
# backend), which frees the lock, while its call to the target is still in flight. The lease
# does not depend on renewals succeeding:
#
# * before an action's call (stage or execute) the attempt writes
#   lease_until = now + deadline_s + horizon_s, in the statement that writes the intent (or, on a
#   resume, claims it): the call cannot outlive its deadline, and the target may still apply it
#   up to horizon_s after that;
# * while the attempt acts, a LeaseKeeper extends it every LEASE_RENEW_S on a connection of its
#   own (never from the step pool, which is empty at full load) to at least now + LEASE_S +
#   horizon_s, never shortening it; a failed renewal costs nothing but this extension;
# * when the call fails ambiguously, the lease is set to now + horizon_s (the attempt is over,
#   its request may still land); when it ends with an outcome, the lease no longer matters.
#
# LEASE_S is the margin a renewal adds (four renewals missed in a row), and the lease of a row
# written before lease_until existed (started_at + LEASE_S).
LEASE_S = 2.0
LEASE_RENEW_S = 0.5
# The lease keeper's statements give up after this long, so a hung database cannot hold up the
# end of an attempt that waits for a renewal in flight.
RENEW_TIMEOUT_MS = 2000

# The one piece of SQL that is composed in Python: a constant column list, never a value.
_JOURNAL_COLUMNS = ("task_id, phase, step, idem_key, action, args, before_state, started_at, "
                    "outcome, status, finished_at, resolved_by, lease_until, staged, attempt")
# The stop state of task %(task_id)s as a condition (its own, its series' or the global one,
# stopped or killed), for statements
# that must not act once a stop is committed.
_STOPPED = "(tidemark.stop_of(%(task_id)s) IS NOT NULL)"
_UNWOUND = "EXISTS (SELECT 1 FROM tidemark.unwinds w WHERE w.task_id = %(task_id)s)"
# A compensation may act only while no kill applies to the task (stop_of() puts a kill first,
# so its state tells); a kill lifted by a person's `tidemark release T --for-unwind` becomes a
# plain stop again. A task with any compensation (partly unwound included) never runs forward.
_COMPENSATED = ("EXISTS (SELECT 1 FROM tidemark.journal u WHERE u.task_id = %(task_id)s"
                " AND u.phase = 'undo')")
_KILLED = "(tidemark.stop_of(%(task_id)s)->>'state' IS NOT DISTINCT FROM 'killed')"
# Checked, with the stop and unwound state, in the statements that let an attempt act (begin,
# claim): a forward step not once anything was compensated, a compensation not under a kill.
_ACT_GUARDS = (f"CASE WHEN %(phase)s = 'undo' THEN NOT {_KILLED}"
               f" ELSE NOT {_COMPENSATED} END")
# An undo grant (tidemark.grants) is issued only while a compensation could act.
_UNDO_ALLOWED = f"({_STOPPED} AND NOT {_KILLED} AND NOT {_UNWOUND})"


@dataclass(frozen=True)
class JournalRow:
    task_id: str
    phase: str
    step: int
    idem_key: str
    action: str
    args: dict[str, Any]
    before_state: dict[str, Any] | None
    started_at: datetime
    outcome: dict[str, Any] | None
    status: str | None
    finished_at: datetime | None
    resolved_by: str | None
    lease_until: datetime | None = None
    staged: dict[str, Any] | None = None
    attempt: int = 1  # undo rows: which try of the compensation (a refused one is tried anew)

    @property
    def in_doubt(self) -> bool:
        return self.outcome is None

    def as_json(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        for k in ("started_at", "finished_at", "lease_until"):
            d[k] = d[k].isoformat() if d[k] else None
        return d


@dataclass(frozen=True)
class Progress:
    """Where a task stands, from a constant number of queries."""

    task_id: str
    plan_hash: str
    step_count: int
    rows: int
    confirmed: int
    failed: int
    last_step: int
    in_doubt: JournalRow | None
    first_irreversible: int | None
    stop: dict[str, Any] | None
    undo_rows: int
    unwound: dict[str, Any] | None = None  # when and by whom the task was unwound (terminal)

    @property
    def next_step(self) -> int | None:
        """The first step without an outcome, or None when every step has one."""
        if self.in_doubt is not None and self.in_doubt.phase == "do":
            return self.in_doubt.step
        if self.failed or self.last_step >= self.step_count:
            return None
        return self.last_step + 1

    @property
    def finished(self) -> bool:
        return self.confirmed == self.step_count


@contextmanager
def _translated() -> Iterator[None]:
    """Turns connection-level failures into the retryable StoreUnavailable."""
    try:
        yield
    except PoolTimeout as e:
        raise StoreUnavailable(f"no database connection in time: {e}") from e
    except (psycopg.OperationalError, psycopg.errors.SerializationFailure,
            psycopg.errors.DeadlockDetected) as e:
        raise StoreUnavailable(f"database unavailable: {e}".strip()) from e


class JournalStore:
    """The journal on one Postgres database."""

    def __init__(self, conninfo: str, *, max_size: int = POOL_MAX,
                 timeout: float = POOL_TIMEOUT_S) -> None:
        self.conninfo = conninfo
        self.timeout = timeout
        self._pool: ConnectionPool[psycopg.Connection[dict[str, Any]]] = ConnectionPool(
            conninfo, min_size=1, max_size=max_size, open=False, timeout=timeout,
            kwargs={"autocommit": True, "row_factory": dict_row,
                    "connect_timeout": CONNECT_TIMEOUT_S})
        self.leases = LeaseKeeper(conninfo)

    def open(self, *, wait: bool = True) -> JournalStore:
        with _translated():
            self._pool.open(wait=wait, timeout=self.timeout)
        return self

    def close(self) -> None:
        self.leases.close()
        self._pool.close()

    def __enter__(self) -> JournalStore:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _conn(self) -> Iterator[psycopg.Connection[dict[str, Any]]]:
        with _translated(), self._pool.connection() as conn:
            yield conn

    # schema ----------------------------------------------------------------------------------

    def migrate(self) -> list[str]:
        with self._conn() as conn:
            return migrate(conn)

    # plans -----------------------------------------------------------------------------------

    def persist_plan(self, plan: Plan, actor: str = "tidemark") -> bool:
        """Stores the plan before its first step. Returns True if it was new.

        The same task id with the same hash is a no-op; a different hash raises PlanChanged.
        """
        new_hash = plan.plan_hash
        with self._conn() as conn, conn.transaction():
            inserted = conn.execute(
                "INSERT INTO tidemark.plans (task_id, plan_hash, step_count, approval)"
                " VALUES (%s, %s, %s, %s) ON CONFLICT (task_id) DO NOTHING RETURNING task_id",
                (plan.task_id, new_hash, len(plan.steps),
                 Jsonb(plan.approval) if plan.approval is not None else None)).fetchone()
            if inserted is None:
                row = conn.execute("SELECT plan_hash FROM tidemark.plans WHERE task_id = %s",
                                   (plan.task_id,)).fetchone()
                assert row is not None
                if row["plan_hash"] != new_hash:
                    raise PlanChanged(plan.task_id, row["plan_hash"], new_hash)
                return False
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO tidemark.plan_steps (task_id, step, action, args, irreversible)"
                    " VALUES (%s, %s, %s, %s, %s)",
                    [(plan.task_id, s.number, s.action, Jsonb(s.args), s.irreversible)
                     for s in plan.steps])
            conn.execute("INSERT INTO tidemark.events (task_id, kind, detail, actor)"
                         " VALUES (%s, 'plan', %s, %s)",
                         (plan.task_id, Jsonb({"plan_hash": new_hash,
                                               "steps": len(plan.steps)}), actor))
            return True

    def load_plan(self, task_id: str) -> Plan:
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT step, action, args, irreversible FROM tidemark.plan_steps"
                " WHERE task_id = %s ORDER BY step", (task_id,)).fetchall()
            approval = conn.execute("SELECT approval FROM tidemark.plans WHERE task_id = %s",
                                    (task_id,)).fetchone()
        if not rows or approval is None:
            raise UnknownTask(task_id)
        return Plan(task_id, tuple(Step(r["step"], r["action"], r["args"], r["irreversible"])
                                   for r in rows), approval["approval"])

    # the irreversible boundary ---------------------------------------------------------------

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
        """The plan's approval requirement, the latest approval decision and the latest
        verification event of a task (for the report)."""
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
                     ORDER BY e.id DESC LIMIT 1) AS verification
                FROM tidemark.plans p WHERE p.task_id = %s
                """, (task_id,)).fetchone() or {}

    def record_approval(self, task_id: str, decision: str, by: str, note: str = "") -> None:
        """Journals a person's approve or reject; a reject also sets the durable stop state,
        in the same transaction, so that nothing starts the irreversible steps afterwards."""
        with self._conn() as conn, conn.transaction():
            StepSession(conn).event(task_id, "approval", {"decision": decision, "note": note},
                                    None, by)
            if decision == "reject":
                reason = f"irreversible steps rejected by {by}" + (f": {note}" if note else "")
                conn.execute(
                    "INSERT INTO tidemark.controls (scope, state, reason, set_by)"
                    " VALUES (%s, 'stopped', %s, %s) ON CONFLICT (scope) DO UPDATE SET"
                    " state = EXCLUDED.state, reason = EXCLUDED.reason,"
                    " set_by = EXCLUDED.set_by, set_at = clock_timestamp()",
                    (task_id, reason, by))
                StepSession(conn).event(task_id, "stop", {"reason": reason}, None, by)

    # steps -----------------------------------------------------------------------------------

    @contextmanager
    def execution(self, task_id: str, step: int, phase: str = "do") -> Iterator[StepSession]:
        """Holds the step's execution lock on one live connection for the whole block.

        The lock is taken in a statement of its own and only then are the plan step, its latest
        journal row and the task's stop state read, so the read sees everything an earlier
        holder committed before letting go (a statement reads the database as it was when the
        statement began). Both go in one network round trip (pipeline mode). Raises StepBusy at
        once if another live attempt holds the lock, UnknownTask or JournalMismatch if the plan
        has no such step. If this process dies, the server ends the session and frees the lock;
        nothing else can free it.
        """
        lock = lock_id(task_id, phase, step)
        with self._conn() as conn:
            with _translated():
                with conn.pipeline():
                    locked = conn.execute("SELECT pg_try_advisory_lock(%s) AS got", (lock,))
                    read = conn.execute(
                        f"""
                        SELECT p.step_count, s.action AS plan_action, s.args AS plan_args,
                               s.irreversible AS plan_irreversible,
                               (SELECT coalesce(nullif(c->>'reason', ''), c->>'state')
                                  FROM tidemark.stop_of(p.task_id) c) AS stopped,
                               (SELECT c->>'state' = 'killed'
                                  FROM tidemark.stop_of(p.task_id) c) AS killed,
                               {_UNWOUND} AS unwound,
                               extract(epoch FROM coalesce(j.lease_until, j.started_at
                                 + make_interval(secs => %(lease)s)) - clock_timestamp()
                               )::float8 AS lease_left, j.*
                        FROM tidemark.plans p
                        LEFT JOIN tidemark.plan_steps s
                          ON s.task_id = p.task_id AND s.step = %(step)s
                        LEFT JOIN LATERAL (
                          SELECT {_JOURNAL_COLUMNS} FROM tidemark.journal
                          WHERE task_id = p.task_id AND phase = %(phase)s AND step = %(step)s
                          ORDER BY attempt DESC LIMIT 1) j ON true
                        WHERE p.task_id = %(task_id)s
                        """, {"task_id": task_id, "phase": phase, "step": step,
                              "lease": LEASE_S})
                got = bool((locked.fetchone() or {}).get("got"))
                r = read.fetchone()
            try:
                if not got:
                    if r is None:
                        raise UnknownTask(task_id)
                    raise StepBusy(f"{task_id}/{phase}/{step}")
                if r is None:
                    raise UnknownTask(task_id)
                session = StepSession(conn)
                session.stopped = r["stopped"]
                session.killed = bool(r["killed"])
                session.unwound = r["unwound"]
                session.lease_left = r["lease_left"]
                if r["plan_action"] is None:
                    raise JournalMismatch(
                        f"task {task_id!r} has steps 1..{r['step_count']}, not {step}")
                session.spec = Step(step, r["plan_action"], r["plan_args"],
                                    r["plan_irreversible"])
                session.row = JournalRow(**{k: r[k] for k in JournalRow.__dataclass_fields__}
                                         ) if r["idem_key"] else None
                yield session
            finally:
                if got:
                    try:
                        conn.execute("SELECT pg_advisory_unlock(%s)", (lock,))
                    except psycopg.Error:
                        conn.close()  # the pool discards it; closing the session frees the lock

    def load_window(self, task_id: str, first: int, last: int) -> list[Step]:
        """Steps first..last of a stored plan (a continue-as-new window)."""
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT step, action, args, irreversible FROM tidemark.plan_steps"
                " WHERE task_id = %s AND step BETWEEN %s AND %s ORDER BY step",
                (task_id, first, last)).fetchall()
        return [Step(r["step"], r["action"], r["args"], r["irreversible"]) for r in rows]

    def plan_actions(self, task_id: str) -> list[str]:
        """The distinct actions of a stored plan (one index scan, no step is transferred)."""
        with self._conn() as conn:
            rows = conn.execute("SELECT DISTINCT action FROM tidemark.plan_steps"
                                " WHERE task_id = %s ORDER BY action", (task_id,)).fetchall()
        return [r["action"] for r in rows]

    def load_steps_of(self, task_id: str, actions: list[str]) -> list[Step]:
        """The steps of a stored plan whose action is one of ``actions``, in order."""
        if not actions:
            return []
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT step, action, args, irreversible FROM tidemark.plan_steps"
                " WHERE task_id = %s AND action = ANY(%s) ORDER BY step",
                (task_id, actions)).fetchall()
        return [Step(r["step"], r["action"], r["args"], r["irreversible"]) for r in rows]

    def step_row(self, task_id: str, step: int, phase: str = "do") -> JournalRow | None:
        with self._conn() as conn:
            return StepSession(conn).get(task_id, step, phase)

    def rows(self, task_id: str) -> list[JournalRow]:
        with self._conn() as conn:
            cur = conn.execute(f"SELECT {_JOURNAL_COLUMNS} FROM tidemark.journal"
                               " WHERE task_id = %s ORDER BY phase, step", (task_id,))
            return [JournalRow(**r) for r in cur.fetchall()]

    def events(self, task_id: str) -> list[dict[str, Any]]:
        with self._conn() as conn:
            return conn.execute("SELECT id, step, kind, detail, actor, at FROM tidemark.events"
                                " WHERE task_id = %s ORDER BY id", (task_id,)).fetchall()

    @contextmanager
    def keep_lease(self, key: str, seconds: float) -> Iterator[None]:
        """While the block runs, the lease keeper extends the attempt lease of the open intent
        ``key`` to at least ``seconds`` from each renewal (on its own connection); it stops
        before the block's end is journaled."""
        self.leases.hold(key, seconds)
        try:
            yield
        finally:
            self.leases.drop(key)

    def end_batch(self, task_id: str, steps: int) -> None:
        """Counts a batch of the fast path that settled ``steps`` steps, in a commit that waits
        for the disk: it returns once every commit before it is durable, such as the outcomes
        the batch committed with ``complete(flush=False)`` (Postgres writes its log in order)."""
        with self._conn() as conn:
            conn.execute(
                "INSERT INTO tidemark.batches (task_id, batches, steps) VALUES (%s, 1, %s)"
                " ON CONFLICT (task_id) DO UPDATE SET batches = batches.batches + 1,"
                " steps = batches.steps + EXCLUDED.steps, last_at = clock_timestamp()",
                (task_id, steps))

    def record_event(self, task_id: str, kind: str, detail: dict[str, Any],
                     step: int | None = None, actor: str = "tidemark") -> None:
        with self._conn() as conn:
            StepSession(conn).event(task_id, kind, detail, step, actor)

    # reports ---------------------------------------------------------------------------------

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

    def undo_candidates(self, task_id: str) -> list[int]:
        """Steps an unwind must visit, last first: reversible 'do' steps that are done or in
        doubt, whose compensation has no 'done' outcome yet.

        Complete once the task is stopped: the only step that could still get an intent is the
        one after the last journaled step (an intent needs its predecessor done), and an attempt
        on it writes its intent while holding that step's execution lock. So the list is read
        while holding that lock (StepBusy while an attempt holds it): an intent whose statement
        began before the stop was committed has landed by then and is listed, and any later one
        is refused by the stop state its own statement checks.
        """
        with self._conn() as conn, _translated():
            r = conn.execute(
                "SELECT p.step_count, (SELECT coalesce(max(step), 0) FROM tidemark.journal j"
                "   WHERE j.task_id = p.task_id AND j.phase = 'do') + 1 AS next"
                " FROM tidemark.plans p WHERE p.task_id = %s", (task_id,)).fetchone()
            if r is None:
                raise UnknownTask(task_id)
            lock = lock_id(task_id, "do", r["next"]) if r["next"] <= r["step_count"] else None
            if lock is not None:
                got = conn.execute("SELECT pg_try_advisory_lock(%s) AS got", (lock,)).fetchone()
                if not (got and got["got"]):
                    raise StepBusy(f"{task_id}/do/{r['next']}: an attempt is at work on it")
            try:
                rows = conn.execute(
                    "SELECT j.step FROM tidemark.journal j"
                    " JOIN tidemark.plan_steps s ON s.task_id = j.task_id AND s.step = j.step"
                    " WHERE j.task_id = %s AND j.phase = 'do' AND NOT s.irreversible"
                    "   AND (j.status = 'done' OR j.outcome IS NULL)"
                    "   AND NOT EXISTS (SELECT 1 FROM tidemark.journal u WHERE u.task_id ="
                    "     j.task_id AND u.phase = 'undo' AND u.step = j.step"
                    "     AND u.status = 'done')"
                    " ORDER BY j.step DESC", (task_id,)).fetchall()
            finally:
                if lock is not None:
                    conn.execute("SELECT pg_advisory_unlock(%s)", (lock,))
        return [r["step"] for r in rows]

    def record_unwound(self, task_id: str, by: str, detail: dict[str, Any]) -> list[int]:
        """Marks a stopped task unwound (terminal), in the statement that checks that nothing
        is left to compensate or in doubt. Returns the steps still to visit: empty when the
        mark was written (or already there)."""
        left = self.undo_candidates(task_id)
        if left:
            return left
        with self._conn() as conn, _translated(), conn.transaction():
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
                StepSession(conn).event(task_id, "unwound", detail, None, by)
                return []
            unwound = conn.execute(f"SELECT {_UNWOUND} AS u", {"task_id": task_id}).fetchone()
            if unwound is not None and unwound["u"]:
                return []
        left = self.undo_candidates(task_id)
        if not left:
            raise InvariantViolation(f"task {task_id!r} cannot be marked unwound: it is not "
                                     "stopped, or a step is in doubt")
        return left

    def irreversible_steps(self, task_id: str) -> list[tuple[int, str, str | None]]:
        """(step, action, journal status) of every irreversible step of the plan; the status
        is None when the step has no journal row or no outcome yet."""
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT s.step, s.action, j.status FROM tidemark.plan_steps s"
                " LEFT JOIN tidemark.journal j"
                "   ON j.task_id = s.task_id AND j.phase = 'do' AND j.step = s.step"
                " WHERE s.task_id = %s AND s.irreversible ORDER BY s.step",
                (task_id,)).fetchall()
        return [(r["step"], r["action"], r["status"]) for r in rows]

    # stop state ------------------------------------------------------------------------------

    def set_control(self, scope: str, state: str, reason: str, set_by: str) -> None:
        """Sets the durable stop state of a task (or ``*``) and logs it as an event. A stop
        never turns a kill into a plain stop (an unwind's stop, a halt): only a release does."""
        with self._conn() as conn, conn.transaction():
            conn.execute(
                "INSERT INTO tidemark.controls (scope, state, reason, set_by) VALUES (%s,%s,%s,%s)"
                " ON CONFLICT (scope) DO UPDATE SET state = EXCLUDED.state,"
                " reason = EXCLUDED.reason, set_by = EXCLUDED.set_by, set_at = clock_timestamp()"
                " WHERE NOT (tidemark.controls.state = 'killed' AND EXCLUDED.state = 'stopped')",
                (scope, state, reason, set_by))
            StepSession(conn).event(scope, "stop" if state == "stopped" else "release",
                                    {"reason": reason}, None, set_by)

    def release_kill_for_unwind(self, task_id: str, reason: str, by: str) -> bool:
        """Turns the task's own kill into a plain stop, so that a person's unwind may act (an
        undo grant is issued, compensations are journaled) while nothing runs it forward.
        False if the task itself is not killed."""
        with self._conn() as conn, _translated(), conn.transaction():
            r = conn.execute(
                "UPDATE tidemark.controls SET state = 'stopped', reason = %s, set_by = %s,"
                " set_at = clock_timestamp() WHERE scope = %s AND state = 'killed'"
                " RETURNING scope", (reason, by, task_id)).fetchone()
            if r is not None:
                StepSession(conn).event(task_id, "release", {"reason": reason,
                                                             "for_unwind": True}, None, by)
            return r is not None

    def task_known(self, task_id: str) -> bool:
        """Whether a plan is stored under ``task_id`` or a control row names it (a task
        stopped before its plan arrived)."""
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

    # series, kill and grants (tidemark.series, tidemark.grants, tidemark.kill) --------------

    def series_of(self, task_id: str) -> str | None:
        """The series a run was admitted to, or None."""
        with self._conn() as conn:
            r = conn.execute("SELECT series FROM tidemark.series_runs WHERE task_id = %s",
                             (task_id,)).fetchone()
        return r["series"] if r else None

    def series_runs(self, series: str, before: str | None = None) -> list[dict[str, Any]]:
        """The admitted runs of a series in order, each with the journal counts and the stop
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
        with self._conn() as conn, _translated(), conn.transaction():
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
            StepSession(conn).event(task_id, "blocked", {
                "series": series, "stop": stop_row and {k: str(v) for k, v in stop_row.items()},
                "blockers": [b["task_id"] for b in blockers]}, None, "tidemark")
            return stop_row, blockers

    def blocked_runs(self, series: str) -> list[dict[str, Any]]:
        """Refused starts of a series (``blocked`` events), oldest first."""
        with self._conn() as conn:
            return conn.execute(
                "SELECT task_id, detail, at FROM tidemark.events WHERE kind = 'blocked'"
                " AND detail->>'series' = %s ORDER BY id", (series,)).fetchall()

    def set_killed(self, scope: str, reason: str, by: str) -> None:
        """Sets the durable stop state ``killed`` (only a release lifts it) and logs it."""
        with self._conn() as conn, _translated(), conn.transaction():
            conn.execute(
                "INSERT INTO tidemark.controls (scope, state, reason, set_by)"
                " VALUES (%s, 'killed', %s, %s) ON CONFLICT (scope) DO UPDATE SET"
                " state = 'killed', reason = EXCLUDED.reason, set_by = EXCLUDED.set_by,"
                " set_at = clock_timestamp()", (scope, reason, by))
            StepSession(conn).event(scope, "kill", {"reason": reason}, None, by)

    def issue_grant(self, task_id: str, target: str, scope: str, kind: str, issuer: str,
                    handle: str, ttl_s: float, purpose: str = "run") -> dict[str, Any] | None:
        """Records a new grant, or returns None: a ``run`` grant only while no stop state
        applies to the task; an ``undo`` grant (a person's unwind) only while the task is
        stopped, not killed, and not unwound. An undo grant is logged (a ``grant`` event)."""
        with self._conn() as conn, _translated(), conn.transaction():
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
            if row is not None and purpose == "undo":
                StepSession(conn).event(task_id, "grant", {
                    "issued": row["id"], "target": target, "scope": scope, "purpose": purpose,
                    "expires": row["expires"].isoformat()}, None, "tidemark")
            return row

    def grant_state(self, grant_id: int) -> dict[str, Any] | None:
        """``{live, revoked, revoked_by}`` of a grant; live: neither revoked nor expired."""
        with self._conn() as conn, _translated():
            return conn.execute(
                "SELECT revoked IS NULL AND expires > clock_timestamp() AS live, revoked,"
                " revoked_by FROM tidemark.grants WHERE id = %s", (grant_id,)).fetchone()

    def revoke_grants(self, task_id: str | None, by: str,
                      purpose: str | None = None) -> list[dict[str, Any]]:
        """Revokes every unrevoked grant of a task (None: of every task), or only those of
        one ``purpose``; returns them."""
        with self._conn() as conn, _translated(), conn.transaction():
            rows = conn.execute(
                "UPDATE tidemark.grants SET revoked = clock_timestamp(), revoked_by = %s"
                " WHERE revoked IS NULL AND (%s::text IS NULL OR task_id = %s)"
                " AND (%s::text IS NULL OR purpose = %s)"
                " RETURNING id, task_id, target, scope, kind, issuer, handle, issued, expires,"
                " revoked, revoked_by, purpose",
                (by, task_id, task_id, purpose, purpose)).fetchall()
            for r in rows:
                StepSession(conn).event(r["task_id"], "grant", {
                    "revoked": r["id"], "target": r["target"], "scope": r["scope"],
                    "purpose": r["purpose"]}, None, by)
            return rows

    def grants(self, task_id: str) -> list[dict[str, Any]]:
        """Every grant of a task, without its handle."""
        with self._conn() as conn, _translated():
            return conn.execute(
                "SELECT id, task_id, target, scope, kind, issuer, issued, expires, revoked,"
                " revoked_by, purpose FROM tidemark.grants WHERE task_id = %s ORDER BY id",
                (task_id,)).fetchall()


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
                " (SELECT c->>'state' FROM tidemark.stop_of(%(task_id)s) c) AS state,"
                " (SELECT coalesce(nullif(c->>'reason', ''), c->>'state')"
                " FROM tidemark.stop_of(%(task_id)s) c) AS stopped",
                {"task_id": task_id}).fetchone()
        assert r is not None
        if r["unwound"]:
            raise TaskUnwound(task_id)
        if phase == "do" and r["stopped"] is not None:
            raise TaskStopped(task_id, r["stopped"])
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


class LeaseKeeper:
    """Extends the attempt leases of the actions running in this process, all in one statement
    every LEASE_RENEW_S, on a connection of its own (opened when first needed, opened again
    after a failure). A renewal that fails is logged and changes nothing else: the lease written
    before the call already covers the call's deadline."""

    def __init__(self, conninfo: str, every: float = LEASE_RENEW_S) -> None:
        self.conninfo = conninfo
        self.every = every
        self._leases: dict[str, float] = {}
        self._mutex = threading.Lock()  # guards _leases and _thread
        self._renewing = threading.Lock()  # held while a renewal is read and written
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: psycopg.Connection[Any] | None = None

    def hold(self, key: str, seconds: float) -> None:
        with self._mutex:
            self._leases[key] = seconds
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="tidemark-leases")
                self._thread.start()

    def drop(self, key: str) -> None:
        """Stops renewing ``key``; when this returns, no renewal of it is still to come (unless
        a renewal in flight hangs past RENEW_TIMEOUT_MS, which can only lengthen the lease)."""
        with self._mutex:
            self._leases.pop(key, None)
        if self._renewing.acquire(timeout=RENEW_TIMEOUT_MS / 1000 + 1):
            self._renewing.release()

    def close(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=RENEW_TIMEOUT_MS / 1000 + 1)
        with self._renewing:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            with self._renewing:
                with self._mutex:
                    leases = dict(self._leases)
                if leases:
                    self._renew(leases)

    def _renew(self, leases: dict[str, float]) -> None:
        try:
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(
                    self.conninfo, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S,
                    options=f"-c statement_timeout={RENEW_TIMEOUT_MS}")
            self._conn.execute(
                "UPDATE tidemark.journal j SET lease_until = greatest(j.lease_until,"
                "   clock_timestamp() + make_interval(secs => v.secs))"
                " FROM unnest(%s::text[], %s::float8[]) AS v(key, secs)"
                " WHERE j.idem_key = v.key AND j.outcome IS NULL",
                (list(leases), list(leases.values())))
        except psycopg.Error as e:  # the database is away; the lock may be too
            log.warning("cannot renew %d attempt lease(s): %s", len(leases), e)
            if self._conn is not None:
                self._conn.close()
                self._conn = None
