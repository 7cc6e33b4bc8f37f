"""An embedded Postgres of a test's own that the test can restart under a running store."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg

from tidemark.database import EmbeddedPostgres
from tools.chaos.stepped_clock import stop_postmaster


@dataclass
class Restartable:
    url: str
    data: Path
    server: EmbeddedPostgres

    def stop(self) -> None:
        """Ends the postmaster as a restart does, and waits until it is gone.

        A fast shutdown: every session is ended, no new one is accepted."""
        stop_postmaster(self.data)

    def start(self) -> None:
        """Starts it again on the same data directory and socket.

        pg_ctl start -w: it returns once the server accepts connections."""
        self.server._server.ensure_postgres_running()
        with psycopg.connect(self.url, connect_timeout=10):
            pass

    def restart(self, down_s: float = 0.0) -> float:
        """Stops it, waits ``down_s`` and starts it again.

        Returns the monotonic time at which it accepts connections again."""
        self.stop()
        time.sleep(down_s)
        self.start()
        return time.monotonic()


@contextmanager
def restartable_postgres() -> Iterator[Restartable]:
    """A fresh embedded Postgres, outside pytest's root (see conftest.pg), removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix="tm-restart-"))
    server = EmbeddedPostgres(base / "data", delete=True)
    try:
        yield Restartable(server.url(), base / "data", server)
    finally:
        server.close()
        shutil.rmtree(base, ignore_errors=True)
