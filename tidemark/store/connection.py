"""How the store reaches Postgres: its timeouts and sizes, and what a lost connection means to
the caller (StoreUnavailable, retryable)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg_pool import PoolTimeout

from tidemark.errors import StoreUnavailable

# A step waits this long for a pooled connection before its attempt fails as retryable; long
# enough to ride out a burst, short enough that a dead database surfaces within one heartbeat.
POOL_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 5  # libpq connect_timeout: a blackholed host fails fast, not after minutes
POOL_MAX = 16  # one connection per concurrent step plus a few for reports


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
