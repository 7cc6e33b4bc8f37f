"""StoreBase: the connection pool the store runs on, and the migrations.

Every part of the store runs its statements on the pool, which has a health check. JournalStore
(tidemark.store) adds one set of statements per concern."""

from __future__ import annotations

import logging
import select
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Self

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from tidemark.migrate import migrate
from tidemark.store.connection import (
    CONNECT_TIMEOUT_S,
    POOL_MAX,
    POOL_TIMEOUT_S,
    _translated,
    connect_options,
    login_role,
)
from tidemark.store.leases import LeaseKeeper, end_process

log = logging.getLogger(__name__)

# A pooled connection not handed out for this long is checked with a round trip before it is
# handed out again (StoreBase._check); one handed out more recently only if its socket says the
# server ended the session. Far shorter than any host reboot or network repair, far longer than
# the gap between two steps of a busy worker.
QUIET_S = 1.0


def _nothing_to_read(conn: psycopg.Connection[Any]) -> bool:
    """True when the idle connection's socket has no byte waiting.

    Then the server has not ended the session (it would have sent a FATAL error and closed it)."""
    if conn.closed or conn.broken:
        return False
    try:
        poller = select.poll()
        poller.register(conn.pgconn.socket, select.POLLIN)
        return not poller.poll(0)
    except (OSError, psycopg.Error):
        return False


class StoreBase:
    """The journal on one Postgres database: its pool, its lease keeper, its schema."""

    def __init__(self, conninfo: str, *, max_size: int = POOL_MAX,
                 timeout: float = POOL_TIMEOUT_S,
                 on_lapse: Callable[[list[str]], None] = end_process) -> None:
        self.conninfo = conninfo
        self.role = login_role(conninfo)  # who the journal knows this store as
        self.timeout = timeout
        self._pool: ConnectionPool[psycopg.Connection[dict[str, Any]]] = ConnectionPool(
            conninfo, min_size=1, max_size=max_size, open=False, timeout=timeout,
            check=self._check, configure=self._born,
            kwargs={"autocommit": True, "row_factory": dict_row,
                    "connect_timeout": CONNECT_TIMEOUT_S, **connect_options()})
        self.leases = LeaseKeeper(conninfo, on_lapse=on_lapse)
        self._born_at: weakref.WeakKeyDictionary[psycopg.Connection[Any], float] = (
            weakref.WeakKeyDictionary())
        # When each connection was last handed out (or made): _check skips the round trip for
        # one handed out within QUIET_S whose socket has nothing to read.
        self._handed_at: weakref.WeakKeyDictionary[psycopg.Connection[Any], float] = (
            weakref.WeakKeyDictionary())
        self._drained_at = 0.0
        self._drain_mutex = threading.Lock()

    def _born(self, conn: psycopg.Connection[Any]) -> None:
        """The pool's ``configure``: notes when each connection was made (for _check)."""
        with self._drain_mutex:
            self._born_at[conn] = self._handed_at[conn] = time.monotonic()

    def _check(self, conn: psycopg.Connection[Any]) -> None:
        """The pool's ``check``, run on every connection before it is handed out.

        A pooled connection can be dead without the pool knowing (Postgres restarted, a
        failover, a terminated session); handed out, it would fail the step attempt that got
        it, so a restart would cost one failed attempt, and its retry wait, per pooled
        connection. A dead connection is discarded and the pool hands out another (psycopg_pool
        3.2+). One dead connection also says the server went away after it was made, so every
        connection made before it is as dead: they are all dropped at once (``drain``,
        psycopg_pool 3.3+), since the pool would otherwise try them one by one, waiting after
        each failed check (1 s, then doubling) and running out of ``timeout``. Connections made
        after that drain are not drained again by a later failure of an older one.

        How a connection is found dead without a round trip on every checkout (which cost each
        step one, docs/benchmarks.md): a server that ends a session, by a restart, a shutdown,
        a failover that stops it or ``pg_terminate_backend``, sends the session a FATAL error
        and closes it, so its socket turns readable; an idle, live session has nothing to read
        (the store never LISTENs). A readable socket, or a connection not handed out for
        QUIET_S, gets the full check: ``check_connection`` sends an empty query. What no message
        announces is a server host that died or was cut off without closing its sockets: it is
        back (and answers the old connection with a reset) only after a reboot or a network
        repair, much longer than QUIET_S, so such a connection has been quiet long enough to
        get the full check as before. A quiet connection costs one ``poll`` system call.
        """
        now = time.monotonic()
        with self._drain_mutex:
            last = self._handed_at.get(conn)
            self._handed_at[conn] = now
        if last is not None and now - last < QUIET_S and _nothing_to_read(conn):
            return
        try:
            ConnectionPool.check_connection(conn)
        except psycopg.Error:
            with self._drain_mutex:
                stale = self._born_at.get(conn, 0.0) >= self._drained_at
                if stale:
                    self._drained_at = time.monotonic()
            if stale:
                log.warning("a pooled connection is dead (did Postgres restart?); "
                            "replacing every connection made before it")
                self._pool.drain()
            raise

    def open(self, *, wait: bool = True) -> Self:
        with _translated():
            self._pool.open(wait=wait, timeout=self.timeout)
        return self

    def close(self) -> None:
        self.leases.close()
        self._pool.close()

    def __enter__(self) -> Self:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _conn(self) -> Iterator[psycopg.Connection[dict[str, Any]]]:
        with _translated(self.role), self._pool.connection() as conn:
            yield conn


    def migrate(self) -> list[str]:
        with self._conn() as conn:
            return migrate(conn)
