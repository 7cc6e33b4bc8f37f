"""The attempt lease: renewed while an attempt acts, ended when it fails.

It is renewed while an attempt acts, so a twin that finds the lock free (the first attempt's
session was lost) still does not act; ended when an attempt fails, so the retry need not wait for
it."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from activities.catalog import spec_registry
from helpers.ledger import LedgerRecord, ledger_lines, ledger_step
from helpers.steps import cut_sessions, persist
from helpers.wait import assert_eventually
from tidemark.actions import Registry
from tidemark.errors import StepBusy, TargetUnavailable
from tidemark.run_step import run_step
from tidemark.store import LEASE_RENEW_S, LEASE_S, JournalStore

SPECS = spec_registry(LedgerRecord)


def short_deadline_registry() -> Registry:
    """ledger.record declaring a deadline far shorter than the test holds it.

    Only renewals can keep its lease fresh."""
    action = LedgerRecord()
    action.deadline_s = 0.2
    return Registry([action])


def test_the_lease_is_renewed_while_the_attempt_acts_past_its_first_period(
        store: JournalStore, db_url: str, tmp_path: Path) -> None:
    registry = short_deadline_registry()
    hold = tmp_path / "hold"
    hold.write_text("")
    task = persist(store, SPECS, [ledger_step(tmp_path, hold_while=str(hold))])
    first_error: list[BaseException] = []
    # The attempt's own store notes a lapsing lease instead of ending this process, so that a
    # lease that is not renewed shows as the lapse below, not as a pytest that exits.
    lapses: list[list[str]] = []
    acting = JournalStore(db_url, on_lapse=lapses.append).open()

    def first() -> None:
        try:
            run_step(acting, registry, task, 1)
        except BaseException as e:
            first_error.append(e)

    a = threading.Thread(target=first)
    a.start()
    row = assert_eventually(lambda: store.step_row(task, 1))
    time.sleep(LEASE_S + 1.0)  # well past the lease the intent started with
    # A is still acting; now every database session of its worker is lost.
    assert cut_sessions(db_url) >= 1
    time.sleep(LEASE_RENEW_S * 2)  # the keeper renews on a new connection
    renewed = store.step_row(task, 1)
    assert renewed is not None and renewed.lease_until is not None
    assert renewed.lease_until > datetime.now(UTC), "the acting attempt's lease lapsed"
    assert renewed.lease_until > row.started_at + timedelta(seconds=LEASE_S)
    with pytest.raises(StepBusy):  # the twin must not probe (absent: A has not landed) and act
        run_step(store, registry, task, 1)
    hold.unlink()
    a.join(30)
    acting.close()
    assert not a.is_alive() and first_error == []  # it held no session to lose
    assert lapses == [], "the acting attempt's lease would have lapsed under its call"
    assert len(ledger_lines(tmp_path / "ledger")) == 1
    result = run_step(store, registry, task, 1)
    assert (result.status, result.resolved_by, result.skipped) == ("done", "execute", True)
    assert len(ledger_lines(tmp_path / "ledger")) == 1


def test_an_attempt_that_failed_ends_its_lease_and_the_retry_probes_at_once(
        store: JournalStore, tmp_path: Path) -> None:
    registry = Registry([LedgerRecord()])
    down = tmp_path / "down"
    down.write_text("")
    task = persist(store, SPECS, [ledger_step(tmp_path, unavailable_while=str(down))])
    with pytest.raises(TargetUnavailable):
        run_step(store, registry, task, 1)
    row = store.step_row(task, 1)
    assert row is not None and row.in_doubt and row.lease_until is not None
    assert row.lease_until <= datetime.now(UTC)
    down.unlink()
    result = run_step(store, registry, task, 1)  # no wait: the failed attempt is over
    assert (result.status, result.resolved_by) == ("done", "execute")
    assert [e["detail"]["status"] for e in store.events(task) if e["kind"] == "probe"] == [
        "absent"]
    assert len(ledger_lines(tmp_path / "ledger")) == 1
