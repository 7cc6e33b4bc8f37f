"""A step as run_step sees it, for tests of one action: its context, and its plan in the journal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Generic, TypeVar

import psycopg

from tidemark.actions import Registry, StepContext
from tidemark.keys import key_for
from tidemark.plan import load_plan
from tidemark.sightings import SIGHTINGS
from tidemark.store import LEASE_S, JournalStore


def step_context(action: str, args: dict[str, Any], task_id: str = "t", step: int = 1, *,
                 key: str | None = None, before_state: dict[str, Any] | None = None,
                 outcome: dict[str, Any] | None = None) -> StepContext:
    """The context run_step would build once the intent exists (started now).

    Args:
        action: The action's name, e.g. ``gmail.send``.
        args: The step's arguments.
        task_id: The task the step belongs to.
        step: The step's number.
        key: The idempotency key; by default the one run_step derives for this step.
        before_state: What the snapshot recorded with the intent.
        outcome: The recorded outcome (set for ``compensate`` only).
    """
    return StepContext(task_id=task_id, step=step, action=action, args=args,
                       key=key if key is not None else key_for(task_id, step, action, args),
                       started_at=datetime.now(UTC), before_state=before_state,
                       outcome=outcome)


def persist(store: JournalStore, specs: Registry, steps: list[dict[str, Any]],
            task_id: str = "t") -> str:
    """Validates a plan of ``steps`` against ``specs``, stores it and returns its task id."""
    plan = load_plan({"task_id": task_id, "steps": steps}, specs)
    store.persist_plan(plan)
    return plan.task_id



def wait_unlocked(db_url: str, timeout: float = 10.0, *, leases: bool = True) -> None:
    """Waits until a killed attempt is presumed dead, as a worker's retry would find it.

    That is, no open intent's attempt lease is fresh, on the database's clock and on this process's
    own (tidemark.sightings: this process has seen each open intent unchanged for its lease's whole
    length, so a take-over by this process that follows need not wait). Without ``leases`` there is
    nothing to wait for (an attempt holds no session state: ownership is the lease, StepSession).

    A SIGKILLed attempt's lease lapses once the action's deadline_s + horizon_s (written before
    the call) or the last renewal's LEASE_S have passed, whichever is later: about a second for
    ``ledger.record``, two for ``fs.rename``. A resume started at once would get StepBusy (a
    real worker retries it later).
    """
    if not leases:
        return
    deadline = time.monotonic() + timeout
    with psycopg.connect(db_url, autocommit=True) as conn:
        while True:
            rows = conn.execute(
                "SELECT idem_key, owner, xmin::text,"
                "       coalesce(lease_s, extract(epoch FROM coalesce(lease_until, started_at"
                "         + make_interval(secs => %(lease)s)) - started_at))::float8,"
                "       clock_timestamp() < coalesce(lease_until,"
                "         started_at + make_interval(secs => %(lease)s))"
                " FROM tidemark.journal WHERE outcome IS NULL", {"lease": LEASE_S}).fetchall()
            fresh = [key for key, owner, version, length, db_fresh in rows
                     if SIGHTINGS.left(key, (owner, version), length or 0.0) > 0 or db_fresh]
            if not fresh:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"attempt leases still fresh after {timeout}s")
            time.sleep(0.01)


def cut_sessions(db_url: str) -> int:
    """Terminates every other session of the database, and returns how many.

    The sessions are pooled connections and lease keepers. This is what a Postgres restart, a
    failover or a network cut does to a worker.

    Each termination is waited for (up to 5 s): when this returns the sessions are gone, as
    after a restart. Without the wait a pooled connection could still look idle and alive to
    the pool's check for a moment after the call, and the next statement on it fail."""
    with psycopg.connect(db_url, autocommit=True) as admin:
        row = admin.execute(
            "SELECT count(pg_terminate_backend(pid, 5000)) FILTER (WHERE true)"
            " FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            "   AND backend_type = 'client backend'").fetchone()
    return int(row[0]) if row else 0


T = TypeVar("T")


class Attempts(Generic[T]):
    """Runs ``run(item)`` for every item at once, each in a thread of its own.

    The threads are attempts racing or waiting side by side in one process. They start on
    construction. What each returned or raised is kept by item: ``results`` and ``errors``."""

    def __init__(self, run: Callable[[T], Any], items: Iterable[T]) -> None:
        self.results: dict[T, Any] = {}
        self.errors: dict[T, BaseException] = {}
        self._lock = threading.Lock()
        # Daemon threads: an attempt a failed test left waiting never keeps pytest alive.
        self._threads = [threading.Thread(target=self._one, args=(run, item), daemon=True)
                         for item in items]
        for t in self._threads:
            t.start()

    def _one(self, run: Callable[[T], Any], item: T) -> None:
        try:
            result = run(item)
        except BaseException as e:  # kept for the test's assertions
            with self._lock:
                self.errors[item] = e
            return
        with self._lock:
            self.results[item] = result

    def join(self, timeout: float = 30.0) -> dict[T, BaseException]:
        """Waits for every attempt, ``timeout`` seconds in all; returns the errors.

        An attempt still running then fails the test: its outcome would otherwise go unchecked."""
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        running = sum(t.is_alive() for t in self._threads)
        if running:
            raise AssertionError(f"{running} of {len(self._threads)} attempts still running "
                                 f"after {timeout}s")
        return self.errors


RUN_ONE = str(Path(__file__).parent / "run_one.py")


def run_one(db_url: str, task_id: str, step: int, **env: str) -> subprocess.Popen[str]:
    """Starts tests/helpers/run_one.py on one step in a process of its own.

    ``env`` is added, e.g. TIDEMARK_CRASH_AT to make it SIGKILL itself at a crash point."""
    return subprocess.Popen([sys.executable, RUN_ONE, db_url, task_id, str(step)],
                            env={**os.environ, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def crash_at(db_url: str, task_id: str, step: int, point: str) -> None:
    """Runs ``step`` in a process that SIGKILLs itself at crash point ``point``.

    It fails unless the process was in fact killed there (a point never reached proves nothing).
    Then it waits until its lock and lease are gone, as a later worker would find them."""
    proc = run_one(db_url, task_id, step, TIDEMARK_CRASH_AT=f"{point}:{step}")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, (
        f"step {step} was not killed at {point}: exit {proc.returncode}, {out!r} {err[-1000:]!r}")
    wait_unlocked(db_url)
