"""What the journal sends to Postgres, read from libpq's own protocol trace.

A step's journal costs three round trips (the read, the intent, the outcome), four for an action
that marks its sends (drive.rename, graph.send_mail: tidemark.wire), a lease renewal one. A round
trip is the client's turn to send followed by the server's turn to answer: the trace's lines
change from F to B."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

import psycopg
import pytest
from psycopg import pq

from activities.catalog import spec_registry
from activities.drive import DriveRename, drive_client
from helpers.renames import RENAMES, two_renames
from helpers.staging_fixtures import CLIENT_TIMEOUT_S
from helpers.steps import persist
from staging.core import StagingServer
from staging.drive import DEFAULT_READ_TOKEN, DEFAULT_WRITE_TOKEN, DriveTarget
from tidemark.actions import Registry
from tidemark.errors import InvariantViolation
from tidemark.run_step import run_step
from tidemark.store import JournalStore
from tidemark.store.leases import RENEW_TIMEOUT_MS, LeaseKeeper
from tidemark.store.session import StepSession


def traced(conns: Iterable[psycopg.Connection], trace: Path,
           work: Callable[[], object]) -> list[str]:
    """The messages ``conns`` exchanged while ``work`` ran.

    Each is its direction and name (``F Sync``, ``B ReadyForQuery``)."""
    conns = list(conns)
    f = trace.open("w")
    for conn in conns:
        conn.pgconn.trace(f.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
    try:
        work()
    finally:
        for conn in conns:
            conn.pgconn.untrace()
        f.close()
    return [f"{fields[0]} {fields[2].split(' ')[0]}"
            for fields in (line.split("\t") for line in trace.read_text().splitlines())
            if fields[0] in ("F", "B")]


def round_trips(messages: list[str]) -> int:
    return sum(1 for before, after in itertools.pairwise(messages)
               if before[0] == "F" and after[0] == "B")


def test_a_step_journals_its_intent_in_one_round_trip_and_the_whole_step_in_three(
        store: JournalStore, tmp_path: Path) -> None:
    task = two_renames(store, tmp_path, "round-trips")  # step 1 done: the pool is warm
    sent = traced(store._pool._pool, tmp_path / "trace",  # the connections it may be handed
                  lambda: run_step(store, RENAMES, task, 2))
    assert sent.count("F Execute") >= 4, sent  # the trace saw the step's statements
    assert round_trips(sent) == 3, f"the step waited for Postgres {round_trips(sent)} times: {sent}"
    assert sorted(tmp_path.glob("final-*.txt")) == [tmp_path / "final-1.txt",
                                                     tmp_path / "final-2.txt"]


def test_a_step_whose_sends_are_marked_costs_one_round_trip_more(
        store: JournalStore, server: StagingServer, drive: DriveTarget, tmp_path: Path) -> None:
    """A step whose sends are marked costs one round trip more.

    drive.rename journals the mark just before its request leaves (tidemark.wire). The round
    trips are the read, the intent, the mark, the outcome."""
    f = drive.seed("scan.pdf")
    steps = [{"action": "drive.rename", "args": {"file_id": f.id, "name": n}}
             for n in ("a.pdf", "b.pdf")]
    task = persist(store, spec_registry(DriveRename), steps, "round-trips-marked")
    reg = Registry([DriveRename(
        writer=drive_client(server.url, DEFAULT_WRITE_TOKEN, timeout=CLIENT_TIMEOUT_S),
        reader=drive_client(server.url, DEFAULT_READ_TOKEN, timeout=CLIENT_TIMEOUT_S),
        timeout=CLIENT_TIMEOUT_S)])
    run_step(store, reg, task, 1)  # the pool is warm
    sent = traced(store._pool._pool, tmp_path / "trace", lambda: run_step(store, reg, task, 2))
    assert round_trips(sent) == 4, f"the step waited for Postgres {round_trips(sent)} times: {sent}"
    assert drive.files[f.id].name == "b.pdf"


def open_intent(store: JournalStore, task: str) -> tuple[str, uuid.UUID]:
    """Step 2's intent, written and left open (its attempt's key and owner token)."""
    with store.execution(task, 2) as s:
        key = "a" * 32
        s.begin(task_id=task, step=2, key=key, action="fs.rename", args=s.spec.args,
                before_state={}, lease_s=1.0)
        return key, s.attempt_token()


def lease_left(db_url: str, key: str) -> float:
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute("SELECT extract(epoch FROM lease_until - clock_timestamp())::float8"
                           " FROM tidemark.journal WHERE idem_key = %s", (key,)).fetchone()
    assert row is not None
    return float(row[0])


def test_a_lease_renewal_goes_out_in_one_round_trip(
        store: JournalStore, db_url: str, tmp_path: Path) -> None:
    key, owner = open_intent(store, two_renames(store, tmp_path, "renewal"))
    keeper = LeaseKeeper(db_url)
    try:
        keeper._renew({key: (30.0, 1.0, owner)}, [])  # opens the keeper's connection
        assert keeper._conn is not None
        sent = traced([keeper._conn], tmp_path / "trace",
                      lambda: keeper._renew({key: (60.0, 1.0, owner)}, []))
    finally:
        keeper.close()
    assert round_trips(sent) == 1, f"the renewal waited {round_trips(sent)} times: {sent}"
    assert sent.count("F Execute") == 2, sent  # the statement's timeout, the renewal
    assert 55 < lease_left(db_url, key) <= 60


def test_a_renewal_held_up_by_a_locked_row_gives_up_after_its_timeout_and_changes_nothing(
        store: JournalStore, db_url: str, tmp_path: Path) -> None:
    key, owner = open_intent(store, two_renames(store, tmp_path, "renewal-held"))
    locked, release = threading.Event(), threading.Event()

    def hold_row() -> None:
        with psycopg.connect(db_url) as conn:  # one transaction, until released
            conn.execute("SELECT 1 FROM tidemark.journal WHERE idem_key = %s FOR UPDATE",
                         (key,))
            locked.set()
            release.wait(30)

    holder = threading.Thread(target=hold_row)
    holder.start()
    keeper = LeaseKeeper(db_url)
    try:
        try:
            assert locked.wait(10)
            t0 = time.monotonic()
            keeper._renew({key: (60.0, 1.0, owner)}, [])
            took = time.monotonic() - t0
            assert keeper._conn is None  # the failed renewal's connection was closed
        finally:
            release.set()
            holder.join()
        assert RENEW_TIMEOUT_MS / 1000 - 0.1 < took < RENEW_TIMEOUT_MS / 1000 + 1.5, took
        assert lease_left(db_url, key) < 2  # still the lease the intent wrote
        keeper._renew({key: (60.0, 1.0, owner)}, [])  # the row free again: renewed
    finally:
        keeper.close()
    assert 55 < lease_left(db_url, key) <= 60


def test_an_intent_is_refused_on_a_connection_that_is_not_in_autocommit_mode(
        store: JournalStore, db_url: str, tmp_path: Path) -> None:
    # The pipeline's Sync commits the intent only when no transaction of the caller's is open:
    # on a connection in a transaction, the intent would wait for a COMMIT nobody sends.
    task = two_renames(store, tmp_path, "not-autocommit")
    with psycopg.connect(db_url) as conn, pytest.raises(InvariantViolation, match="autocommit"):
        StepSession(conn, token=uuid.uuid4()).begin(
            task_id=task, step=2, key="b" * 32, action="fs.rename", args={}, before_state={},
            lease_s=1.0)
    assert store.step_row(task, 2) is None
