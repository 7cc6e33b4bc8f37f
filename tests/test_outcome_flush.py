"""A batch commits its outcomes without waiting for the disk and flushes once before returning.

The batch is tidemark.run_step.run_steps. Shown with a crash of Postgres itself (an immediate
shutdown: SIGQUIT to the postmaster, nothing written after it), on a server of its own whose WAL
writer waits ten seconds, so that only our own flushes put anything on disk."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from helpers.ledger import ledger_registry, persisted
from tidemark.approval import unattended
from tidemark.database import EmbeddedPostgres
from tidemark.run_step import run_step, run_steps
from tidemark.store import JournalStore
from tools.chaos.stepped_clock import stop_postmaster

AFTER_RESTART = """
import json, pathlib, sys
import psycopg
from tidemark.database import EmbeddedPostgres
server = EmbeddedPostgres(pathlib.Path(sys.argv[1]), delete=False)
with psycopg.connect(server.url(), autocommit=True) as conn:
    rows = conn.execute("SELECT task_id, step, status FROM tidemark.journal"
                        " ORDER BY task_id, step").fetchall()
server.close()
print(json.dumps(rows))
"""


@pytest.fixture
def crashable() -> Iterator[tuple[str, Path]]:
    """An embedded Postgres of its own (URL, data directory) whose WAL writer is slow."""
    base = Path(tempfile.mkdtemp(prefix="tm-crash-"))  # outside pytest's root: see conftest.pg
    data = base / "data"
    server = EmbeddedPostgres(data, delete=False)
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET wal_writer_delay = '10s'")
        conn.execute("SELECT pg_reload_conf()")
    yield server.url(), data
    shutil.rmtree(base, ignore_errors=True)


def crash_and_read(data: Path) -> list[list[object]]:
    """Kills Postgres as a crash would, starts it again, and returns the journal's rows.

    Recovery replays what reached the disk, in a process of its own. The rows are (task, step,
    status)."""
    stop_postmaster(data, signal.SIGQUIT)  # immediate shutdown: no checkpoint, no WAL write
    done = subprocess.run([sys.executable, "-c", AFTER_RESTART, str(data)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [list(r) for r in json.loads(done.stdout)]


def test_a_batch_returns_only_once_its_outcomes_survive_a_crash_of_postgres(
        crashable: tuple[str, Path], tmp_path: Path) -> None:
    url, data = crashable
    with JournalStore(url) as store:
        store.migrate()
        unattended(store, "tests")  # its ledger steps are irreversible
        persisted(store, tmp_path, "flushed", 5)
        batch = run_steps(store, ledger_registry(), "flushed", 1, 5, max_steps=64, budget_s=60)
        assert [r.step for r in batch.results] == [1, 2, 3, 4, 5]
    assert crash_and_read(data) == [["flushed", n, "done"] for n in range(1, 6)]


def test_an_outcome_not_yet_flushed_is_lost_by_a_crash_of_postgres_and_its_intent_is_not(
        crashable: tuple[str, Path], tmp_path: Path) -> None:
    """A crash of Postgres loses an outcome not yet flushed, but not its intent.

    This is what the flush is for. Without it, the crash takes the outcome and leaves the step in
    doubt (its intent was flushed before it acted), as a crash of ours after the action would."""
    url, data = crashable
    with JournalStore(url) as store:
        store.migrate()
        unattended(store, "tests")  # its ledger steps are irreversible
        persisted(store, tmp_path, "unflushed", 2)
        run_step(store, ledger_registry(), "unflushed", 1)
        run_step(store, ledger_registry(), "unflushed", 2, flush_outcome=False)
    assert crash_and_read(data) == [["unflushed", 1, "done"], ["unflushed", 2, None]]


def test_a_batch_ending_on_a_later_steps_error_flushes_the_outcomes_it_reports(
        crashable: tuple[str, Path], tmp_path: Path) -> None:
    """A batch ending on a later step's error flushes the outcomes it reports.

    Step 4's snapshot cannot read its ledger (the path is a directory), so the batch ends on its
    error before step 4 commits anything: no intent, no event. Nothing but the batch's own flush
    puts step 3's outcome on disk, and the batch reports steps 1-3, so all three must be there
    when it returns."""
    url, data = crashable
    unreadable = tmp_path / "unreadable"
    unreadable.mkdir()
    with JournalStore(url) as store:
        store.migrate()
        unattended(store, "tests")  # its ledger steps are irreversible
        persisted(store, tmp_path, "flushed-err", 5, s4={"ledger": str(unreadable)})
        batch = run_steps(store, ledger_registry(), "flushed-err", 1, 5, max_steps=64,
                          budget_s=60)
        assert [r.step for r in batch.results] == [1, 2, 3]
        assert type(batch.error).__name__ == "IsADirectoryError"
        assert [e["kind"] for e in store.events("flushed-err") if e["step"] == 4] == []
    assert crash_and_read(data) == [["flushed-err", n, "done"] for n in range(1, 4)]
