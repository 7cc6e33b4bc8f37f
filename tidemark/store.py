"""JournalStore: every read and write of the journal, in one place.

Synchronous psycopg 3, on purpose: a step holds its execution lock on one live connection for
the whole action, and the actions call synchronous SDKs (google-api-python-client, stripe) from
worker threads. A thread per step with a blocking connection is the simplest shape in which
"the lock lives exactly as long as the attempt" is obviously true.

All SQL of the project lives here and in ``migrations/``; values are always parameters.
"""

from __future__ import annotations

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
    PlanChanged,
    StepBusy,
    StoreUnavailable,
    UnknownTask,
)
from tidemark.keys import lock_id
from tidemark.migrate import migrate
from tidemark.plan import Plan, Step

# A step waits this long for a pooled connection before its attempt fails as retryable; long
# enough to ride out a burst, short enough that a dead database surfaces within one heartbeat.
POOL_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 5  # libpq connect_timeout: a blackholed host fails fast, not after minutes
POOL_MAX = 16
# An attempt acting on an intent holds a lease on it for this long and renews it while it acts
# (tidemark.run_step.keep_lease renews every half second: four renewals missed in a row). It
# guards what the execution lock cannot: the acting attempt lost its database connection (a
# restart, a failover, a blip), which frees the lock, while its call to the target is still in
# flight. An attempt cut off from the database for longer than this while its call still lands
# is not covered.
LEASE_S = 2.0  # one connection per concurrent step plus a few for reports; steps are sequential

# The one piece of SQL that is composed in Python: a constant column list, never a value.
_JOURNAL_COLUMNS = ("task_id, phase, step, idem_key, action, args, before_state, started_at, "
                    "outcome, status, finished_at, resolved_by, lease_until, staged")


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
        self._pool = ConnectionPool(
            conninfo, min_size=1, max_size=max_size, open=False, timeout=timeout,
            kwargs={"autocommit": True, "row_factory": dict_row,
                    "connect_timeout": CONNECT_TIMEOUT_S})

    def open(self, *, wait: bool = True) -> JournalStore:
        with _translated():
            self._pool.open(wait=wait, timeout=self.timeout)
        return self

    def close(self) -> None:
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
                "INSERT INTO tidemark.plans (task_id, plan_hash, step_count) VALUES (%s, %s, %s)"
                " ON CONFLICT (task_id) DO NOTHING RETURNING task_id",
                (plan.task_id, new_hash, len(plan.steps))).fetchone()
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
        if not rows:
            raise UnknownTask(task_id)
        return Plan(task_id, tuple(Step(r["step"], r["action"], r["args"], r["irreversible"])
                                   for r in rows))

    # steps -----------------------------------------------------------------------------------

    @contextmanager
    def execution(self, task_id: str, step: int, phase: str = "do") -> Iterator[StepSession]:
        """Holds the step's execution lock on one live connection for the whole block.

        Taking the lock, reading the plan step and reading its journal row is one round trip.
        Raises StepBusy at once if another live attempt holds the lock, UnknownTask or
        JournalMismatch if the plan has no such step. ``session.stopped`` carries the task's
        stop reason, read in the same round trip. If this process dies, the server ends
        the session and frees the lock; nothing else can free it.
        """
        lock = lock_id(task_id, phase, step)
        with self._conn() as conn:
            with _translated():
                r = conn.execute(
                    f"""
                    SELECT pg_try_advisory_lock(%(lock)s) AS got, p.step_count,
                           s.action AS plan_action, s.args AS plan_args,
                           s.irreversible AS plan_irreversible,
                           (SELECT coalesce(nullif(c->>'reason', ''), c->>'state')
                              FROM tidemark.stop_of(p.task_id) c) AS stopped,
                           extract(epoch FROM coalesce(j.lease_until, j.started_at
                                   + make_interval(secs => %(lease)s)) - clock_timestamp())::float8
                             AS lease_left, j.*
                    FROM tidemark.plans p
                    LEFT JOIN tidemark.plan_steps s
                      ON s.task_id = p.task_id AND s.step = %(step)s
                    LEFT JOIN (SELECT {_JOURNAL_COLUMNS} FROM tidemark.journal) j
                      ON j.task_id = p.task_id AND j.phase = %(phase)s AND j.step = %(step)s
                    WHERE p.task_id = %(task_id)s
                    """, {"lock": lock, "task_id": task_id, "phase": phase, "step": step,
                          "lease": LEASE_S},
                ).fetchone()
            if r is None:
                raise UnknownTask(task_id)
            if not r["got"]:
                raise StepBusy(f"{task_id}/{phase}/{step}")
            session = StepSession(conn)
            session.stopped = r["stopped"]
            session.lease_left = r["lease_left"]
            try:
                if r["plan_action"] is None:
                    raise JournalMismatch(
                        f"task {task_id!r} has steps 1..{r['step_count']}, not {step}")
                session.spec = Step(step, r["plan_action"], r["plan_args"],
                                    r["plan_irreversible"])
                session.row = JournalRow(**{k: r[k] for k in JournalRow.__dataclass_fields__}
                                         ) if r["idem_key"] else None
                yield session
            finally:
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

    def renew_lease(self, key: str, seconds: float) -> None:
        """Renews the attempt lease of an open intent from any connection (the lease keeper's:
        the step's own connection is busy, or gone)."""
        with self._conn() as conn:
            StepSession(conn).renew_lease(key, seconds)

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
                  tidemark.stop_of(p.task_id) AS stop
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
                        first_irreversible=r["first_irreversible"], stop=r["stop"])

    def undo_candidates(self, task_id: str) -> list[int]:
        """Steps an unwind must visit, last first: reversible 'do' steps that are done or in
        doubt, whose compensation has no 'done' outcome yet."""
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT j.step FROM tidemark.journal j"
                " JOIN tidemark.plan_steps s ON s.task_id = j.task_id AND s.step = j.step"
                " LEFT JOIN tidemark.journal u"
                "   ON u.task_id = j.task_id AND u.phase = 'undo' AND u.step = j.step"
                " WHERE j.task_id = %s AND j.phase = 'do' AND NOT s.irreversible"
                "   AND (j.status = 'done' OR j.outcome IS NULL)"
                "   AND (u.status IS DISTINCT FROM 'done')"
                " ORDER BY j.step DESC", (task_id,)).fetchall()
        return [r["step"] for r in rows]

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
        """Sets the durable stop state of a task (or ``*``) and logs it as an event."""
        with self._conn() as conn, conn.transaction():
            conn.execute(
                "INSERT INTO tidemark.controls (scope, state, reason, set_by) VALUES (%s,%s,%s,%s)"
                " ON CONFLICT (scope) DO UPDATE SET state = EXCLUDED.state,"
                " reason = EXCLUDED.reason, set_by = EXCLUDED.set_by, set_at = clock_timestamp()",
                (scope, state, reason, set_by))
            StepSession(conn).event(scope, "stop" if state == "stopped" else "release",
                                    {"reason": reason}, None, set_by)

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
                    handle: str, ttl_s: float) -> dict[str, Any] | None:
        """Records a new grant, unless a stop state applies to the task (None then)."""
        with self._conn() as conn, _translated():
            return conn.execute(
                "INSERT INTO tidemark.grants (task_id, target, scope, kind, issuer, handle,"
                " expires) SELECT %s, %s, %s, %s, %s, %s,"
                " clock_timestamp() + make_interval(secs => %s)"
                " WHERE tidemark.stop_of(%s) IS NULL RETURNING id, issued, expires",
                (task_id, target, scope, kind, issuer, handle, ttl_s, task_id)).fetchone()

    def grant_state(self, grant_id: int) -> dict[str, Any] | None:
        """``{live, revoked, revoked_by}`` of a grant; live: neither revoked nor expired."""
        with self._conn() as conn, _translated():
            return conn.execute(
                "SELECT revoked IS NULL AND expires > clock_timestamp() AS live, revoked,"
                " revoked_by FROM tidemark.grants WHERE id = %s", (grant_id,)).fetchone()

    def revoke_grants(self, task_id: str | None, by: str) -> list[dict[str, Any]]:
        """Revokes every unrevoked grant of a task (None: of every task); returns them."""
        with self._conn() as conn, _translated(), conn.transaction():
            rows = conn.execute(
                "UPDATE tidemark.grants SET revoked = clock_timestamp(), revoked_by = %s"
                " WHERE revoked IS NULL AND (%s::text IS NULL OR task_id = %s)"
                " RETURNING id, task_id, target, scope, kind, issuer, handle, issued, expires,"
                " revoked, revoked_by", (by, task_id, task_id)).fetchall()
            for r in rows:
                StepSession(conn).event(r["task_id"], "grant", {
                    "revoked": r["id"], "target": r["target"], "scope": r["scope"]}, None, by)
            return rows

    def grants(self, task_id: str) -> list[dict[str, Any]]:
        """Every grant of a task, without its handle."""
        with self._conn() as conn, _translated():
            return conn.execute(
                "SELECT id, task_id, target, scope, kind, issuer, issued, expires, revoked,"
                " revoked_by FROM tidemark.grants WHERE task_id = %s ORDER BY id",
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
        self.lease_left: float | None = None  # seconds the row's last attempt may still act

    def get(self, task_id: str, step: int, phase: str = "do") -> JournalRow | None:
        with _translated():
            r = self.conn.execute(
                f"SELECT {_JOURNAL_COLUMNS} FROM tidemark.journal"
                " WHERE task_id = %s AND phase = %s AND step = %s",
                (task_id, phase, step)).fetchone()
        return JournalRow(**r) if r else None

    def begin(self, *, task_id: str, step: int, key: str, action: str, args: dict[str, Any],
              before_state: dict[str, Any], phase: str = "do") -> JournalRow:
        """Commits the intent. Only when this returns may the action run.

        The statement itself refuses a 'do' step whose predecessor has no 'done' outcome, and
        the partial unique index refuses a second open intent in the task.
        """
        try:
            with _translated():
                r = self.conn.execute(
                    f"""
                    INSERT INTO tidemark.journal
                      (task_id, phase, step, idem_key, action, args, before_state)
                    SELECT %(task_id)s, %(phase)s, %(step)s, %(key)s, %(action)s, %(args)s,
                           %(before)s
                    WHERE %(phase)s = 'undo' OR %(step)s = 1 OR EXISTS (
                      SELECT 1 FROM tidemark.journal
                      WHERE task_id = %(task_id)s AND phase = 'do' AND step = %(step)s - 1
                        AND status = 'done')
                    RETURNING {_JOURNAL_COLUMNS}
                    """,
                    {"task_id": task_id, "phase": phase, "step": step, "key": key,
                     "action": action, "args": Jsonb(args), "before": Jsonb(before_state)},
                ).fetchone()
        except psycopg.errors.UniqueViolation as e:
            constraint = e.diag.constraint_name
            if constraint == "journal_one_in_doubt":
                raise InvariantViolation(
                    f"task {task_id!r} already has a step in doubt; step {step} may not start"
                ) from e
            raise JournalMismatch(
                f"task {task_id!r} step {step}: the journal already holds a different "
                f"entry ({constraint})") from e
        if r is None:
            raise InvariantViolation(
                f"task {task_id!r}: step {step} may not start before step {step - 1} is done")
        return JournalRow(**r)

    def complete(self, *, key: str, outcome: dict[str, Any], status: str,
                 resolved_by: str) -> JournalRow:
        """Commits the outcome of the open intent ``key``.

        The execution lock is let go only afterwards (when the session ends): a session-level
        unlock takes effect at once, so unlocking inside this statement would let a twin read
        the intent as still open before the outcome's commit is visible.
        """
        with _translated():
            r = self.conn.execute(
                "UPDATE tidemark.journal SET outcome = %s, status = %s, resolved_by = %s,"
                " finished_at = clock_timestamp() WHERE idem_key = %s AND outcome IS NULL"
                f" RETURNING {_JOURNAL_COLUMNS}",
                (Jsonb(outcome), status, resolved_by, key)).fetchone()
        if r is None:
            raise InvariantViolation(f"no open intent with key {key} to complete")
        return JournalRow(**r)

    def renew_lease(self, key: str, seconds: float = 0.0) -> None:
        """Sets the attempt lease of the open intent ``key`` to end ``seconds`` from now
        (LEASE_S by default; 0 ends it: the attempt is over)."""
        with _translated():
            self.conn.execute(
                "UPDATE tidemark.journal"
                " SET lease_until = clock_timestamp() + make_interval(secs => %s)"
                " WHERE idem_key = %s AND outcome IS NULL", (seconds, key))

    def stage(self, key: str, staged: dict[str, Any]) -> None:
        """Journals the handle an action staged for the open intent ``key`` (once)."""
        with _translated():
            r = self.conn.execute(
                "UPDATE tidemark.journal SET staged = %s"
                " WHERE idem_key = %s AND outcome IS NULL AND staged IS NULL RETURNING step",
                (Jsonb(staged), key)).fetchone()
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
