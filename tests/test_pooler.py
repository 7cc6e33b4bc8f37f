"""The journal through a transaction-mode pooler (PgBouncer, pool_mode = transaction).

Every statement or transaction may run on a different server session, so nothing the store does may
rely on session state (no session locks, no session settings, no prepared statements there).

PgBouncer comes from the operating system (Debian's package ``pgbouncer``; .ci/run installs it
where it can). Without it these tests are skipped: the reason is the machine, and
tests/test_ownership.py still shows that no connection or session lock is held."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from helpers.ledger import LedgerRecord, ledger_lines, ledger_step
from helpers.steps import Attempts, persist
from helpers.wait import assert_eventually
from tidemark.actions import Registry
from tidemark.approval import unattended
from tidemark.run_step import run_step
from tidemark.store import JournalStore
from tidemark.store.connection import POOLER_ENV
from tools.stack.devstack import free_port

PGBOUNCER = shutil.which("pgbouncer") or next(
    (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.path.exists(p)), None)
SERVER_POOL = 3  # server connections PgBouncer keeps for the database
STEPS = 12


@pytest.fixture
def pooled_url(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``db_url`` through a PgBouncer in transaction mode with SERVER_POOL server connections.

    TIDEMARK_DB_POOLER=transaction is set for the stores this test opens."""
    if PGBOUNCER is None:
        pytest.skip("PgBouncer is not installed on this machine (Debian: apt-get install "
                    "pgbouncer)")
    info = psycopg.conninfo.conninfo_to_dict(db_url)
    # Outside pytest's temporary root, which only root may enter (see conftest.py's pg).
    home = Path(tempfile.mkdtemp(prefix="tidemark-pgbouncer-"))
    port = free_port()
    user = str(info.get("user") or "postgres")
    (home / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"{info['dbname']} = host={info['host']} port={info.get('port') or 5432}"
        f" dbname={info['dbname']} user={user}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        "auth_type = any\npool_mode = transaction\n"
        f"default_pool_size = {SERVER_POOL}\nmin_pool_size = 0\nreserve_pool_size = 0\n"
        "max_client_conn = 500\nserver_reset_query =\n"
        f"logfile = {home / 'pgbouncer.log'}\npidfile = {home / 'pgbouncer.pid'}\n")
    args = [PGBOUNCER]
    if os.geteuid() == 0:  # PgBouncer refuses root; it runs as the embedded server's user
        owner = pwd.getpwuid(os.stat(str(info["host"])).st_uid).pw_name
        shutil.chown(home, owner)
        for f in home.iterdir():
            shutil.chown(f, owner)
        args += ["-u", owner]
    proc = subprocess.Popen([*args, str(home / "pgbouncer.ini")], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(
                        f"PgBouncer did not start: {proc.communicate()[0]}") from None
                time.sleep(0.05)
        monkeypatch.setenv(POOLER_ENV, "transaction")
        yield psycopg.conninfo.make_conninfo(host="127.0.0.1", port=port,
                                             dbname=info["dbname"], user=user,
                                             application_name="via-pgbouncer")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(home, ignore_errors=True)


def server_side(db_url: str) -> tuple[int, int]:
    """(server sessions of the database other than this one, advisory locks held)."""
    with psycopg.connect(db_url, autocommit=True) as admin:
        row = admin.execute(
            "SELECT (SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            "        AND pid <> pg_backend_pid() AND backend_type = 'client backend'),"
            "       (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory')").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_steps_in_flight_through_a_transaction_pooler_run_once_on_its_few_connections(
        pooled_url: str, db_url: str, tmp_path: Path) -> None:
    """Steps in flight through a transaction pooler run once on its few connections.

    Migrations, twelve steps waiting in their calls at once, their lease renewals and
    outcomes, then an unwind's list of steps (read under a row lock) and its mark: all through
    PgBouncer
    with three server connections. Each effect happens once, the server never sees more than
    the pooler's connections, and no lock outlives its transaction."""
    registry = Registry([LedgerRecord()])
    hold = tmp_path / "hold"
    hold.write_text("")
    with JournalStore(pooled_url, max_size=STEPS) as store:
        store.migrate()
        unattended(store, "tests")  # its ledger steps are irreversible
        tasks = [persist(store, registry, [ledger_step(tmp_path, f"e{i}", hold_while=str(hold))],
                         f"pooled-{i}") for i in range(STEPS)]
        attempts = Attempts(lambda task: run_step(store, registry, task, 1), tasks)
        try:
            assert_eventually(lambda: sum(store.step_row(t, 1) is not None for t in tasks)
                              == STEPS, timeout=30)
            time.sleep(1.5)  # past a lease renewal or two, all through the pooler
            sessions, _ = server_side(db_url)
            assert sessions <= SERVER_POOL, f"{sessions} server sessions behind the pooler"
        finally:
            hold.unlink()
            attempts.join(timeout=60)
        assert attempts.errors == {}
        assert all(run_step(store, registry, t, 1).skipped for t in tasks)
        store.set_control(tasks[0], "stopped", "unwind", "ops@example")
        store.undo_candidates(tasks[0])  # its row lock, in a transaction of the pooler's
        assert store.record_unwound(tasks[0], "ops@example", {}) == []
    assert server_side(db_url)[1] == 0, "a lock outlived its transaction"
    lines = ledger_lines(tmp_path / "ledger")
    assert sorted(line.split(" ", 1)[1] for line in lines) == sorted(
        f"e{i}" for i in range(STEPS))


@pytest.mark.parametrize(("value", "says"), [
    ("session", "pool_mode = transaction"),
    ("pgpool", "expected one of none, transaction"),
])
def test_a_worker_behind_a_pooler_in_the_wrong_mode_refuses_to_start_in_one_line(
        value: str, says: str, tmp_path: Path) -> None:
    """A worker behind a pooler in the wrong mode refuses to start, in one line.

    A session-mode pooler would pin a server connection to every client connection of
    every worker: the fleet's connections would not be bounded at all. Said at start, in one
    line naming the setting, before anything connects."""
    worker = Path(__file__).resolve().parent.parent / "worker.py"
    env = {**os.environ, POOLER_ENV: value, "DATABASE_URL": "postgresql://x@127.0.0.1:1/x"}
    proc = subprocess.run([sys.executable, str(worker)], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 78, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"{POOLER_ENV}=" in lines[0] and says in lines[0], lines
