"""The cover the lease keeper counts for a call, and its overrun watch.

Against a real Postgres: a renewal to ``secs`` covers a request that leaves before ``secs`` less the
target's horizon, counted from a moment before its statement was sent; the watch fires a margin
before the cover ends (tidemark.store.leases.LeaseKeeper)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from activities.catalog import spec_registry
from helpers.ledger import LedgerRecord, ledger_step
from helpers.steps import persist
from tidemark.keys import key_for
from tidemark.store import JournalStore
from tidemark.store.leases import LAPSE_MARGIN_S, RENEW_TIMEOUT_MS

HORIZON_S = 30.0


@pytest.fixture
def keeper_store(store: JournalStore, db_url: str
                 ) -> Iterator[tuple[JournalStore, list[float]]]:
    """A store whose lease keeper notes when its watch fires, instead of ending the process.

    On the test's (migrated) database; the watch's firing is noted in this machine's
    monotonic time."""
    fired: list[float] = []
    with JournalStore(db_url, on_lapse=lambda _: fired.append(time.monotonic())) as keeper:
        yield keeper, fired


def intent(store: JournalStore, tmp_path: Path, task: str) -> tuple[str, uuid.UUID]:
    """Step 1's intent of a new task, and the token of the attempt that owns it."""
    persist(store, spec_registry(LedgerRecord), [ledger_step(tmp_path)], task)
    with store.execution(task, 1) as s:
        key = key_for(task, 1, s.spec.action, s.spec.args)
        s.begin(task_id=task, step=1, key=key, action=s.spec.action, args=s.spec.args,
                before_state={}, lease_s=60.0)
        return key, s.attempt_token()


def test_a_renewal_covers_a_request_only_while_it_can_land_before_the_lease_ends(
        keeper_store: tuple[JournalStore, list[float]], tmp_path: Path) -> None:
    """A cover that does not reach past the horizon and the margin covers no call.

    Renewed to the target's horizon and less than the watch's margin: a request that left
    now could be applied after the lease lapsed, so the call is not covered."""
    store, _ = keeper_store
    key, owner = intent(store, tmp_path, "horizon-out")
    keeper, secs = store.leases, HORIZON_S + LAPSE_MARGIN_S / 2
    keeper.hold(key, owner, secs, horizon_s=HORIZON_S, covered_until=time.monotonic() - 1.0,
                deadline_s=60.0)
    with keeper._renewing:  # the keeper's own renewals wait: this one is the test's
        keeper._renew({key: (secs, HORIZON_S, owner)}, [])
        assert not keeper.covers(key), "the horizon was counted inside the cover"
    keeper.drop(key)


def test_a_renewal_covers_from_before_its_statement_was_sent(
        keeper_store: tuple[JournalStore, list[float]], tmp_path: Path, db_url: str) -> None:
    """The cover is counted from before the renewal's statement was sent.

    The renewal's statement waits (a lock on the row) longer than what it adds beyond the
    horizon: its lease runs from a moment after the statement was sent, so it covers nothing
    once the statement returns. Counted from the return, it would seem to cover a second more."""
    store, _ = keeper_store
    key, owner = intent(store, tmp_path, "cover-from-send")
    keeper, secs, waits_s = store.leases, HORIZON_S + 1.0, 1.2
    assert waits_s < RENEW_TIMEOUT_MS / 1000  # the renewal waits, it does not time out
    keeper.hold(key, owner, secs, horizon_s=HORIZON_S, covered_until=time.monotonic() - 1.0,
                deadline_s=60.0)
    with keeper._renewing, psycopg.connect(db_url) as locker:
        keeper._renew({}, [])  # the keeper's connection is open: the statement goes out at once
        locker.execute("SELECT 1 FROM tidemark.journal WHERE idem_key = %s FOR UPDATE", (key,))
        released = threading.Timer(waits_s, locker.rollback)
        sent = time.monotonic()
        released.start()
        keeper._renew({key: (secs, HORIZON_S, owner)}, [])
        released.join()
        assert time.monotonic() - sent >= waits_s
        assert not keeper.covers(key), "the cover was counted from the statement's return"
    keeper.drop(key)


def test_the_overrun_watch_fires_a_margin_before_the_cover_ends(
        keeper_store: tuple[JournalStore, list[float]], tmp_path: Path) -> None:
    """The watch fires a margin before the cover ends.

    A call whose cover no renewal extends (a twin owns its intent now): the watch ends it
    LAPSE_MARGIN_S before the cover ends, while a request that left could still land in it."""
    store, fired = keeper_store
    key, _ = intent(store, tmp_path, "watch-margin")
    ends = time.monotonic() + 1.0
    store.leases.hold(key, uuid.uuid4(), 60.0, horizon_s=0.0, covered_until=ends,
                      deadline_s=60.0)
    deadline = ends + 5.0
    while not fired and time.monotonic() < deadline:
        time.sleep(0.01)
    store.leases.drop(key)
    assert fired, "the watch never fired"
    assert ends - LAPSE_MARGIN_S <= fired[0] < ends, \
        f"fired {fired[0] - ends:+.3f}s from the cover's end"
