"""An attempt that runs past its action's declared deadline while Postgres restarts.

The lease written before the call covers the declared deadline; past it, only renewals cover
the call, and a restart of Postgres stops them. A twin that finds the lease lapsed once
Postgres is back probes, finds nothing yet (the first attempt has not written) and acts. The
first attempt must not act after that: the runner ends it before its lease can lapse."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

from helpers.ledger import LedgerRecord, ledger_lines, ledger_step
from helpers.restart import Restartable, restartable_postgres
from helpers.steps import persist
from tidemark.actions import Registry, StepContext
from tidemark.approval import unattended
from tidemark.errors import StepBusy, StoreUnavailable
from tidemark.run_step import StepResult, run_step
from tidemark.store import EXIT_LEASE_LAPSED, LEASE_S, JournalStore

pytestmark = pytest.mark.postgres  # a server of its own, started in the test's fixture

TESTS = Path(__file__).resolve().parent
HOLD_WAIT_S = 20  # how long the first attempt may take to end once the test lets go of it
ATTEMPT = """
import sys
from helpers.ledger import LedgerRecord
from tidemark.actions import Registry
from tidemark.run_step import run_step
from tidemark.store import JournalStore
store = JournalStore(sys.argv[1]).open()
print(run_step(store, Registry([LedgerRecord()]), sys.argv[2], 1), flush=True)
"""


class Eager(LedgerRecord):
    """The same action, without the test's hold: a twin that acts at once."""

    def execute(self, ctx: StepContext) -> dict[str, Any]:
        return super().execute(replace(ctx, args={**ctx.args, "hold_while": None}))


@pytest.fixture
def restartable() -> Iterator[Restartable]:
    with restartable_postgres() as pg:
        yield pg


def open_intents(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM tidemark.journal WHERE outcome IS NULL"
                           ).fetchone()
        return int(row[0]) if row else 0


def twin_settles(url: str, task: str, within_s: float) -> StepResult:
    """A twin attempt, retried as a worker would retry it, until it settles the step."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            with JournalStore(url) as twin:
                return run_step(twin, Registry([Eager()]), task, 1)
        except (StepBusy, StoreUnavailable):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def test_an_attempt_past_its_deadline_never_acts_after_a_twin_could(
        restartable: Restartable, tmp_path: Path) -> None:
    url = restartable.url
    hold = tmp_path / "hold"
    hold.write_text("")
    with JournalStore(url) as store:
        store.migrate()
        unattended(store, "tests")  # its ledger steps are irreversible
        task = persist(store, Registry([LedgerRecord]),
                       [ledger_step(tmp_path, "e", hold_while=str(hold))], "overrun")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ["PYTHONPATH"]])
           if os.environ.get("PYTHONPATH") else str(TESTS)}
    first = subprocess.Popen([sys.executable, "-c", ATTEMPT, url, task], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while open_intents(url) == 0:
            assert time.monotonic() < deadline and first.poll() is None, first.communicate()
            time.sleep(0.05)
        # Past the declared deadline and the margin of the last renewal before it: from here on
        # only renewals cover the call, and the restart stops them for longer than LEASE_S.
        time.sleep(LedgerRecord.deadline_s + LEASE_S + 0.5)
        assert first.poll() is None
        restartable.restart(down_s=LEASE_S + 1.0)
        result = twin_settles(url, task, within_s=30)
        hold.unlink()  # the first attempt, if it still runs, writes now
        try:
            first.wait(timeout=HOLD_WAIT_S)
        except subprocess.TimeoutExpired:
            first.kill()
            err = "\n".join(line for line in first.communicate()[1].splitlines()
                            if "renew" not in line and "accepting connections" not in line)
            pytest.fail(f"the first attempt still runs: {err[-3000:]}")
        out, err = first.communicate()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    lines = ledger_lines(tmp_path / "ledger")
    assert len(lines) == 1, f"{len(lines)} effects: {lines}\n{out}\n{err[-2000:]}"
    assert result.status == "done" and result.resolved_by == "execute"
    # The first attempt was ended by its deadline watch, not by the test: it passed its
    # deadline (journaled while Postgres could still be reached), then lost its renewals.
    assert first.returncode == EXIT_LEASE_LAPSED, err[-2000:]
    assert "would lapse while its call still runs" in err
    with JournalStore(url) as store:
        overran = [e for e in store.events(task) if e["kind"] == "overran"]
    assert [(e["step"], e["detail"]["deadline_s"]) for e in overran] == [
        (1, LedgerRecord.deadline_s)]

