"""The attempt lease covers the call and the target's in-flight horizon.

Against a real Postgres, it covers the action's call and the target's in-flight horizon whether
or not renewals succeed, so a twin never probes or acts while the first attempt may still be
acting or its request may still land."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

from activities.catalog import spec_registry
from helpers.ledger import LedgerRecord, ledger_lines, ledger_step
from helpers.steps import Attempts, cut_sessions, persist
from helpers.wait import assert_eventually
from tidemark.actions import Registry, StepContext
from tidemark.errors import Refused, StepBusy, StepFailed, TargetUnavailable
from tidemark.run_step import StepResult, run_step
from tidemark.store import LEASE_RENEW_S, LEASE_S, POOL_MAX, JournalStore

SPECS = spec_registry(LedgerRecord)


class Eager(LedgerRecord):
    """The same action, without the test's hold: a twin that would act at once."""

    def execute(self, ctx: StepContext) -> dict[str, Any]:
        return super().execute(replace(ctx, args={**ctx.args, "hold_while": None}))


def probes(store: JournalStore, task: str) -> list[dict[str, Any]]:
    return [e for e in store.events(task) if e["kind"] == "probe"]


def settle(store: JournalStore, registry: Registry, task: str) -> StepResult | None:
    try:
        return run_step(store, registry, task, 1)
    except StepBusy:
        return None


def test_locks_lost_at_full_load_leave_no_twin_acting(store: JournalStore, db_url: str,
                                                      tmp_path: Path) -> None:
    """Locks lost at full load leave no twin acting.

    Twice POOL_MAX steps are in flight on one store. None holds a pooled connection while its
    call waits (with a connection per call, half of them would wait for the pool and fail). Every
    session of the database is then killed while the actions still run. Renewals come from the
    lease keeper's own connection, made anew, so every twin finds the lease fresh and stays away;
    the first attempts then record their outcomes on new connections."""
    hold = tmp_path / "hold"
    hold.write_text("")
    tasks = [persist(store, SPECS, [ledger_step(tmp_path, f"e{i}", hold_while=str(hold))],
                     f"full-{i}") for i in range(2 * POOL_MAX)]
    attempts = Attempts(lambda task: run_step(store, Registry([LedgerRecord()]), task, 1),
                        tasks)
    admin = psycopg.connect(db_url, autocommit=True)
    try:
        assert_eventually(lambda: admin.execute(
            "SELECT count(*) FROM tidemark.journal WHERE outcome IS NULL").fetchone()[0]
            == 2 * POOL_MAX)
        # Past the lease written before the call (LedgerRecord.deadline_s) and past LEASE_S:
        # from here on only renewals keep the leases fresh.
        time.sleep(max(LedgerRecord.deadline_s, LEASE_S) + 0.5)
        assert cut_sessions(db_url) >= 1
        with JournalStore(db_url) as twin:
            for task in tasks:
                with pytest.raises(StepBusy, match="may still be acting"):
                    run_step(twin, Registry([Eager()]), task, 1)
            assert all(probes(twin, task) == [] for task in tasks)
            assert ledger_lines(tmp_path / "ledger") == []
            hold.unlink()  # the first attempts finish their actions and record them
            attempts.join(timeout=30)
            for task in tasks:
                result = assert_eventually(lambda t=task: settle(twin, Registry([Eager()]), t))
                assert (result.status, result.resolved_by) == ("done", "execute")
    finally:
        admin.close()
    assert attempts.errors == {}  # no first attempt lost anything with its sessions
    lines = ledger_lines(tmp_path / "ledger")
    assert sorted(line.split(" ", 1)[1] for line in lines) == sorted(
        f"e{i}" for i in range(2 * POOL_MAX))  # one effect per task, none twice


class LateCommit(LedgerRecord):
    """A provider slower than our client, which applies the request a second later.

    The request times out on our side, and the provider applies it a second later."""

    horizon_s = 1.5
    applies_after_s = 1.0

    def __init__(self) -> None:
        super().__init__()
        self.late: list[threading.Timer] = []

    def execute(self, ctx: StepContext) -> dict[str, Any]:
        apply = super().execute
        timer = threading.Timer(self.applies_after_s, apply, args=(ctx,))
        timer.start()
        self.late.append(timer)
        raise TargetUnavailable("the provider did not answer within the client timeout")


def test_a_provider_slower_than_the_client_is_waited_out_not_sent_again(
        store: JournalStore, tmp_path: Path) -> None:
    task = persist(store, SPECS, [ledger_step(tmp_path)])
    slow = LateCommit()
    with pytest.raises(TargetUnavailable):
        run_step(store, Registry([slow]), task, 1)
    failed_at = time.monotonic()
    fast = Registry([LedgerRecord()])
    # Until the horizon has passed, absent is no answer: the step waits, it neither probes nor
    # acts.
    with pytest.raises(StepBusy):
        run_step(store, fast, task, 1)
    assert probes(store, task) == []
    result = assert_eventually(lambda: settle(store, fast, task), timeout=10)
    assert time.monotonic() - failed_at >= LateCommit.horizon_s - 0.2
    assert (result.status, result.resolved_by) == ("done", "probe")  # the late commit found
    for timer in slow.late:
        timer.join()
    assert len(ledger_lines(tmp_path / "ledger")) == 1


def test_a_definite_refusal_still_closes_the_row_at_once(store: JournalStore,
                                                        tmp_path: Path) -> None:
    class RefusedSlowly(LedgerRecord):
        horizon_s = 30.0

        def execute(self, ctx: StepContext) -> dict[str, Any]:
            raise Refused("400: bad recipient")

    task = persist(store, SPECS, [ledger_step(tmp_path)])
    with pytest.raises(StepFailed):
        run_step(store, Registry([RefusedSlowly()]), task, 1)
    again = run_step(store, Registry([LedgerRecord()]), task, 1)  # no horizon to wait out
    assert (again.status, again.skipped) == ("failed", True)


def test_the_lease_is_written_with_the_intent_and_renewals_never_shorten_it(
        store: JournalStore, tmp_path: Path) -> None:
    seen: list[float] = []

    class Watched(LedgerRecord):
        deadline_s = 40.0
        horizon_s = 20.0

        def execute(self, ctx: StepContext) -> dict[str, Any]:
            with psycopg.connect(store.conninfo, autocommit=True) as conn:
                for _ in range(2):  # at the call's start, and after a few renewals
                    seen.append(conn.execute(
                        "SELECT extract(epoch FROM lease_until - clock_timestamp())::float8"
                        " FROM tidemark.journal WHERE idem_key = %s", (ctx.key,)).fetchone()[0])
                    time.sleep(3 * LEASE_RENEW_S)
            return super().execute(ctx)

    task = persist(store, SPECS, [ledger_step(tmp_path)])
    run_step(store, Registry([Watched()]), task, 1)
    assert seen[0] is not None and 55 < seen[0] <= 60  # deadline + horizon, before the call
    assert 50 < seen[1] < seen[0]  # renewals (to LEASE_S + horizon) did not cut it short
