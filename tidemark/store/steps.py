"""A step's attempt as the store serves it.

What an attempt reads when it begins, the lease keeper's hold, the fast path's batches, the events
an attempt journals."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tidemark.errors import JournalMismatch, UnknownTask
from tidemark.plan import Step
from tidemark.store.base import StoreBase
from tidemark.store.journal import _JOURNAL_COLUMNS, _UNWOUND, JournalRow
from tidemark.store.leases import LEASE_S
from tidemark.store.session import StepSession
from tidemark.words import EventKind, Phase


class StepsMixin(StoreBase):
    """Statements of a step's attempt, outside its StepSession."""

    @contextmanager
    def execution(self, task_id: str, step: int, phase: Phase = Phase.DO) -> Iterator[StepSession]:
        """One attempt at the step's row of ``phase``: the reads it begins with.

        It reads the plan step, its latest journal row (with its owner and what is left of its
        lease) and the task's stop state, in one statement. Raises UnknownTask or JournalMismatch
        if the plan has no such step.

        Nothing is locked here: the attempt owns the step only once its intent is written (or
        an open intent taken over), by statements conditional on its owner token
        (tidemark.store.session.StepSession), so no connection is held across the call.
        """
        session = StepSession(borrow=self._conn, token=uuid.uuid4())
        with self._conn() as conn:
            r = conn.execute(
                f"""
                SELECT p.step_count, s.action AS plan_action, s.args AS plan_args,
                       s.irreversible AS plan_irreversible,
                       coalesce(nullif(c.stop->>'reason', ''), c.stop->>'state')
                         AS stopped,
                       coalesce(c.stop @> '{{"state": "killed", "for_unwind": false}}', false)
                         AS killed,
                       c.stop->>'scope' AS stop_scope,
                       {_UNWOUND} AS unwound,
                       extract(epoch FROM coalesce(j.lease_until, j.started_at
                         + make_interval(secs => %(lease)s)) - clock_timestamp()
                       )::float8 AS lease_left, j.*
                FROM tidemark.plans p
                CROSS JOIN tidemark.stop_of(p.task_id) AS c(stop)
                LEFT JOIN tidemark.plan_steps s
                  ON s.task_id = p.task_id AND s.step = %(step)s
                LEFT JOIN LATERAL (
                  SELECT {_JOURNAL_COLUMNS}, owner AS seen_owner, xmin::text AS seen_version,
                         coalesce(lease_s, extract(epoch FROM coalesce(lease_until, started_at
                           + make_interval(secs => %(lease)s)) - started_at))::float8
                           AS lease_length
                  FROM tidemark.journal
                  WHERE task_id = p.task_id AND phase = %(phase)s AND step = %(step)s
                  ORDER BY attempt DESC LIMIT 1) j ON true
                WHERE p.task_id = %(task_id)s
                """, {"task_id": task_id, "phase": phase, "step": step,
                      "lease": LEASE_S}).fetchone()
        if r is None:
            raise UnknownTask(task_id)
        session.stopped = r["stopped"]
        session.killed = bool(r["killed"])
        session.stop_scope = r["stop_scope"]
        session.unwound = r["unwound"]
        session.lease_left = r["lease_left"]
        session.seen_owner = r["seen_owner"]
        session.seen_version = r["seen_version"]
        session.lease_length = r["lease_length"] or 0.0
        if r["plan_action"] is None:
            raise JournalMismatch(
                f"task {task_id!r} has steps 1..{r['step_count']}, not {step}")
        session.spec = Step(step, r["plan_action"], r["plan_args"], r["plan_irreversible"])
        session.row = JournalRow(**{k: r[k] for k in JournalRow.__dataclass_fields__}
                                 ) if r["idem_key"] else None
        yield session

    def step_row(self, task_id: str, step: int, phase: Phase = Phase.DO) -> JournalRow | None:
        with self._conn() as conn:
            return StepSession(conn).get(task_id, step, phase)

    @contextmanager
    def keep_lease(self, key: str, owner: uuid.UUID, seconds: float, *, horizon_s: float,
                   covered_until: float, deadline_s: float) -> Iterator[None]:
        """While the block runs, the lease keeper extends the lease of the intent ``key``.

        While the block runs, the lease keeper extends the attempt lease of the open intent
        ``key`` (while ``owner`` owns it) to at least ``seconds`` from each renewal (on its own
        connection), and ends the
        process before the lease could lapse while the block still runs (LeaseKeeper); it
        stops before the block's end is journaled. ``covered_until`` (monotonic) is how long
        the lease committed before the block covers a request that leaves us, ``deadline_s``
        the call's declared deadline."""
        self.leases.hold(key, owner, seconds, horizon_s=horizon_s, covered_until=covered_until,
                         deadline_s=deadline_s)
        try:
            yield
        finally:
            self.leases.drop(key)

    def cover_lease(self, key: str, until: float, deadline_s: float) -> None:
        """Notes the cover of a new call on ``key``: requests leaving before ``until``.

        A lease committed for a new call on ``key`` (its staged send) covers requests that
        leave before ``until`` (monotonic); the call's declared deadline runs from now."""
        self.leases.cover(key, until, deadline_s)

    def covers(self, key: str) -> bool:
        """Whether the lease committed for the call on ``key`` covers a request now.

        Whether the lease committed for the call on ``key`` covers a request that leaves now
        (LeaseKeeper.covers, on this machine's monotonic clock)."""
        return self.leases.covers(key)

    def end_batch(self, task_id: str, steps: int) -> None:
        """Counts a fast-path batch of ``steps`` steps, in a commit that waits for the disk.

        Counts a batch of the fast path that settled ``steps`` steps, in a commit that waits
        for the disk: it returns once every commit before it is durable, such as the outcomes
        the batch committed with ``complete(flush=False)`` (Postgres writes its log in order)."""
        with self._conn() as conn:
            conn.execute(
                "INSERT INTO tidemark.batches (task_id, batches, steps) VALUES (%s, 1, %s)"
                " ON CONFLICT (task_id) DO UPDATE SET batches = batches.batches + 1,"
                " steps = batches.steps + EXCLUDED.steps, last_at = clock_timestamp()",
                (task_id, steps))

    def record_event(self, task_id: str, kind: EventKind, detail: dict[str, Any],
                     step: int | None = None, actor: str = "tidemark") -> None:
        with self._conn() as conn:
            StepSession(conn).event(task_id, kind, detail, step, actor)
