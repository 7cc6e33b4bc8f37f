"""The pool's check before it hands out a connection (StoreBase._check).

The check is tidemark.store.base StoreBase._check. A connection the server ended is never handed
out, and a connection in steady use is handed out without a round trip. What goes over the wire
is read from libpq's own protocol trace."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
from psycopg import pq

from tidemark.store import JournalStore
from tidemark.store.base import QUIET_S


def checkout_trace(store: JournalStore, trace: Path, quiet_s: float) -> tuple[str, bool]:
    """What the second of two checkouts, ``quiet_s`` apart, sent before the first statement.

    Returns (what it sent before the caller's first statement; whether it handed out the same
    connection)."""
    with store._conn() as first:
        first.execute("SELECT 1")
    f = trace.open("w")
    first.pgconn.trace(f.fileno())
    first.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
    try:
        time.sleep(quiet_s)
        with store._conn() as again:
            same = again is first
    finally:
        first.pgconn.untrace()
        f.close()
    sent = "".join(line for line in trace.read_text().splitlines(keepends=True)
                   if line.startswith("F"))
    return sent, same


def test_a_connection_in_steady_use_is_handed_out_without_a_round_trip(
        store: JournalStore, tmp_path: Path) -> None:
    sent, same = checkout_trace(store, tmp_path / "trace", quiet_s=0.0)
    assert same
    assert sent == "", f"the checkout sent {sent!r}"


def test_a_connection_quiet_for_a_while_is_checked_with_a_round_trip(
        store: JournalStore, tmp_path: Path) -> None:
    # A server host that died without closing its sockets answers only after a reboot: a
    # connection quiet that long is asked before it is handed out.
    sent, same = checkout_trace(store, tmp_path / "trace", quiet_s=QUIET_S + 0.1)
    assert same
    assert "Query" in sent, f"the checkout sent {sent!r}"


def test_a_session_the_server_ended_is_never_handed_out_even_just_after_use(
        store: JournalStore, db_url: str) -> None:
    with store._conn() as first:
        pid = first.info.backend_pid
    with psycopg.connect(db_url, autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,)).fetchone()
    with store._conn() as conn:  # within QUIET_S of the last checkout
        assert conn is not first
        assert conn.execute("SELECT 1 AS one").fetchone() == {"one": 1}
