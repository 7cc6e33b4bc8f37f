"""A step's ownership is a fenced lease row, not a held connection (StepSession).

No connection is held while an attempt waits on its target, no session state is left behind, and
an attempt that lost its intent to a twin writes nothing more."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from helpers.ledger import LedgerRecord, ledger_lines, ledger_step
from helpers.steps import Attempts, crash_at, persist, wait_unlocked
from helpers.wait import assert_eventually
from tidemark.actions import Registry
from tidemark.errors import NeedsDecision, StepBusy
from tidemark.run_step import run_step
from tidemark.store import LEASE_S, JournalStore

REGISTRY = Registry([LedgerRecord()])
CALLS = 8
POOL = 2


def server_sessions(db_url: str, application: str) -> tuple[int, int]:
    """(sessions of ``application`` on the server, advisory locks anyone holds)."""
    with psycopg.connect(db_url, autocommit=True) as admin:
        row = admin.execute(
            "SELECT (SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            "        AND application_name = %s),"
            "       (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory')",
            (application,)).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_calls_waiting_on_their_target_hold_no_connection(
        store: JournalStore, db_url: str, tmp_path: Path) -> None:
    """Calls waiting on their target hold no connection.

    Eight steps wait in their calls at once on a store whose pool has two connections. All eight
    intents are open together, the server sees at most the pool and the lease keeper, and nobody
    holds a lock. With a connection held per call, six would wait for the pool and fail with
    StoreUnavailable."""
    hold = tmp_path / "hold"
    hold.write_text("")
    tasks = [persist(store, REGISTRY, [ledger_step(tmp_path, f"e{i}", hold_while=str(hold))],
                     f"held-{i}") for i in range(CALLS)]
    app = "ownership-small-pool"
    with JournalStore(psycopg.conninfo.make_conninfo(db_url, application_name=app),
                      max_size=POOL, timeout=2.0) as small:
        attempts = Attempts(lambda task: run_step(small, REGISTRY, task, 1), tasks)
        try:
            with psycopg.connect(db_url, autocommit=True) as admin:
                assert_eventually(lambda: admin.execute(
                    "SELECT count(*) FROM tidemark.journal WHERE outcome IS NULL").fetchone()[0]
                    == CALLS, timeout=20)
            sessions, advisory = server_sessions(db_url, app)
            assert sessions <= POOL, f"{sessions} server sessions for {CALLS} calls in flight"
            assert advisory == 0
        finally:
            hold.unlink()
            attempts.join(timeout=30)
    assert attempts.errors == {}
    assert sorted(line.split(" ", 1)[1] for line in ledger_lines(tmp_path / "ledger")) == sorted(
        f"e{i}" for i in range(CALLS))


def lapsed_intent(store: JournalStore, db_url: str, tmp_path: Path) -> str:
    """A task whose step 1 is in doubt with its attempt dead and its lease passed."""
    task = persist(store, REGISTRY, [ledger_step(tmp_path)], "lapsed")
    crash_at(db_url, task, 1, "after_intent")
    wait_unlocked(db_url)
    return task


def test_of_two_attempts_that_read_a_lapsed_intent_one_takes_it_over(
        store: JournalStore, db_url: str, tmp_path: Path) -> None:
    """Of two attempts that read a lapsed intent, one takes it over.

    Both read the intent lapsed. A takes it over (with a lease that runs out at once, as a slow
    probe's would) and stages a handle. B's read is stale: it must not take the intent over on it
    (it would act without A's staged handle), even though no lease runs."""
    task = lapsed_intent(store, db_url, tmp_path)
    with store.execution(task, 1) as a, store.execution(task, 1) as b:
        assert a.row is not None and a.seen_owner == b.seen_owner is not None
        key = a.row.idem_key
        assert a.take_over(key, 0.0, LEASE_S) is None
        a.stage(key, {"draft": "d1"}, 0.0)
        assert b.take_over(key, LEASE_S, LEASE_S) == 0.0  # refused: not the owner it read
    with store.execution(task, 1) as c:  # a fresh read sees A's handle, and may take over
        assert c.row is not None and c.row.staged == {"draft": "d1"}
        assert c.take_over(key, LEASE_S, LEASE_S) is None


def test_an_owner_that_renews_its_lease_keeps_a_twin_out_whatever_the_twin_read(
        store: JournalStore, db_url: str, tmp_path: Path) -> None:
    """An owner that renews its lease keeps a twin out, whatever the twin read.

    B reads the intent with A's lease passed. A (a process that was frozen, now awake) renews it
    before B's take-over: the take-over statement checks the lease itself."""
    task = lapsed_intent(store, db_url, tmp_path)
    with store.execution(task, 1) as a:
        assert a.row is not None
        key = a.row.idem_key
        assert a.take_over(key, 0.0, LEASE_S) is None
        with store.execution(task, 1) as b:
            assert b.lease_left is not None and b.lease_left <= 0
            a.renew_lease(key, 30.0)
            left = b.take_over(key, LEASE_S, LEASE_S)
            assert left is not None and left > 25


def test_an_attempt_that_lost_its_intent_writes_nothing_more(
        store: JournalStore, db_url: str, tmp_path: Path) -> None:
    """An attempt that lost its intent writes nothing more.

    A takes the intent over and its lease runs out (a process frozen past it); B takes it
    over in turn. Every later write of A (claim, stage, lease, outcome) is refused or changes
    nothing; B's outcome is the one recorded."""
    task = lapsed_intent(store, db_url, tmp_path)
    with store.execution(task, 1) as a:
        assert a.row is not None
        key = a.row.idem_key
        assert a.take_over(key, 0.0, LEASE_S) is None  # a lease that has already run out
        with store.execution(task, 1) as b:
            assert b.seen_owner == a.token
            assert b.take_over(key, LEASE_S, LEASE_S) is None
        with pytest.raises(StepBusy):
            a.claim(task, key, 30.0)
        with pytest.raises(StepBusy):
            a.stage(key, {"draft": "x"}, 30.0)
        a.renew_lease(key, 3600.0)
        with pytest.raises(StepBusy):
            a.complete(key=key, outcome={"by": "a"}, status="done", resolved_by="execute")
        row = store.step_row(task, 1)
        assert row is not None and row.outcome is None and row.staged is None
        assert row.lease_until is not None
        b.complete(key=key, outcome={"by": "b"}, status="done", resolved_by="probe")
    row = store.step_row(task, 1)
    assert row is not None and row.outcome == {"by": "b"}


def test_a_probe_that_cannot_decide_gives_the_lease_back(
        store: JournalStore, db_url: str, tmp_path: Path) -> None:
    """A probe that cannot decide gives the lease back.

    A take-over that ends before acting (the probe cannot tell) does not make the next
    attempt wait out its lease: nothing of it can still land."""
    blind = tmp_path / "blind"
    task = persist(store, REGISTRY, [ledger_step(tmp_path, blind_while=str(blind))], "blind")
    crash_at(db_url, task, 1, "after_intent")
    blind.write_text("")
    for _ in range(2):  # the second would be StepBusy for LEASE_S if the lease were kept
        with pytest.raises(NeedsDecision):
            run_step(store, REGISTRY, task, 1)
