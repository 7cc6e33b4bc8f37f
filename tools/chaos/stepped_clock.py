"""An embedded Postgres of its own whose wall clock can be stepped.

The clock steps as NTP stepping a server's clock (or a person setting it) does, for `tidemark
chaos --time-faults` and the tests. Debian's libfaketime (``apt-get install faketime``) is
preloaded into the server's processes, reading the offset from a file on every call, so a write
to that file moves ``clock_timestamp()`` at once. Only the wall clock moves: the server's
monotonic clock (its timeouts and waits) is left alone, as a real clock step leaves it."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg

from tidemark.database import EmbeddedPostgres
from tidemark.errors import ConfigError

# Where Debian's libfaketime package puts the library (apt-get install faketime).
LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
_ENVIRON = threading.Lock()  # os.environ is changed while the server starts


@dataclass
class SteppedClock:
    url: str
    offset_file: Path
    offset_s: float = 0.0

    def step(self, seconds: float) -> None:
        """Moves the server's wall clock by ``seconds`` (forward when positive), at once."""
        self.offset_s += seconds
        tmp = self.offset_file.with_suffix(".new")
        tmp.write_text(f"{self.offset_s:+.3f}\n")
        tmp.chmod(0o644)
        tmp.replace(self.offset_file)  # read whole or not at all


def stop_postmaster(data: Path, sig: signal.Signals = signal.SIGINT) -> None:
    """Ends the postmaster of ``data`` and waits until it is gone.

    By default it stops as a restart does (SIGINT, a fast shutdown); SIGQUIT is an immediate
    shutdown, as a crash (no checkpoint)."""
    pid = int((data / "postmaster.pid").read_text().split()[0])
    os.kill(pid, sig)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)
    raise TimeoutError(f"postmaster {pid} still runs 30 s after {sig.name}")


@contextmanager
def stepped_postgres() -> Iterator[SteppedClock]:
    """A fresh embedded Postgres whose clock ``SteppedClock.step`` moves; removed afterwards."""
    if not LIBFAKETIME.exists():
        raise ConfigError(f"{LIBFAKETIME} is missing: a database clock step needs Debian's "
                          "libfaketime (apt-get install faketime)")
    base = Path(tempfile.mkdtemp(prefix="tm-clock-"))
    base.chmod(0o755)  # the server runs as the system user pgserver when we are root
    clock = SteppedClock("", base / "offset")
    clock.step(0)
    server = EmbeddedPostgres(base / "data", delete=True)
    try:
        stop_postmaster(base / "data")
        faked = {"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME_TIMESTAMP_FILE": str(clock.offset_file),
                 "FAKETIME_NO_CACHE": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
        with _ENVIRON:
            saved = {k: os.environ.get(k) for k in faked}
            os.environ.update(faked)
            try:
                server._server.ensure_postgres_running()
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
        clock.url = server.url()
        with psycopg.connect(clock.url, connect_timeout=10):
            pass
        yield clock
    finally:
        server.close()
        shutil.rmtree(base, ignore_errors=True)
