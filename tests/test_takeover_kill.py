"""A worker SIGKILLed while its take-over's probe is at the target: the step ends once.

The lease its take-over wrote keeps every later attempt out until it has passed, and the step then
ends exactly once at the target, settled by whoever may settle it.

Attempt A wrote the intent and failed ambiguously (its request dropped after or refused before
Drive committed it); its lease, held for Drive's horizon, passes. Attempt B, a worker process of
its own, takes the step over and probes the file; the probe's GET is held at the staging Drive
(a ``delay`` fault on ``files.get``), and B is killed there. The staging request log keeps
writes only; a read that reached the server shows in its token log (``calls_of``) and in the
armed fault it took, which is gone from ``/_staging/faults`` once the delay has begun. Attempt C
then finds B's lease fresh (StepBusy, no probe) until it passes, and settles the step: once.
"""

from __future__ import annotations

import signal
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from activities.catalog import spec_registry
from activities.drive import DriveRename, drive_client
from helpers.staging_fixtures import CLIENT_TIMEOUT_S, arm, get
from helpers.steps import persist, run_one, wait_unlocked
from helpers.wait import assert_eventually
from staging.core import StagingServer
from staging.drive import DEFAULT_READ_TOKEN, DEFAULT_WRITE_TOKEN, DriveTarget
from tidemark.actions import Registry
from tidemark.errors import StepBusy, TargetUnavailable
from tidemark.run_step import StepResult, run_step
from tidemark.store import LEASE_S, JournalStore

HORIZON_S = 0.5  # A's lease after its ambiguous failure: short, so the test waits little
PROBE_HELD_S = 4.0  # far longer than it takes to see the probe arrive and kill B


def registry(server: StagingServer) -> Registry:
    return Registry([DriveRename(
        writer=drive_client(server.url, DEFAULT_WRITE_TOKEN, timeout=CLIENT_TIMEOUT_S),
        reader=drive_client(server.url, DEFAULT_READ_TOKEN, timeout=CLIENT_TIMEOUT_S),
        timeout=CLIENT_TIMEOUT_S, horizon_s=HORIZON_S)])


def owner_and_lease(db_url: str, key: str) -> tuple[Any, datetime]:
    """(the open intent's owner token, its lease_until)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute("SELECT owner, lease_until FROM tidemark.journal"
                           " WHERE idem_key = %s AND outcome IS NULL", (key,)).fetchone()
    assert row is not None, "the intent is no longer open"
    return row[0], row[1]


def db_now(db_url: str) -> datetime:
    """The database's clock, on which leases are written."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    return row[0]


def probe_held(server: StagingServer) -> bool:
    """Whether B's probe has reached Drive and is held there: the armed delay was taken."""
    return not [f for f in get(server, "/_staging/faults") if f["op"] == "files.get"]


def settle(store: JournalStore, reg: Registry, task: str) -> StepResult | None:
    try:
        return run_step(store, reg, task, 1)
    except StepBusy:
        return None


@pytest.mark.parametrize(("a_fault", "settled_by"), [
    ("drop_after_commit", "probe"),  # A's rename landed: C's probe finds it, nothing is sent
    ("fail_before_commit", "execute"),  # it did not: C's probe says absent, C renames once
])
def test_a_worker_killed_in_its_take_overs_probe_keeps_the_step_out_of_reach_until_its_lease(
        store: JournalStore, db_url: str, server: StagingServer, drive: DriveTarget,
        a_fault: str, settled_by: str) -> None:
    f = drive.seed("scan.pdf")
    reg = registry(server)
    task = persist(store, spec_registry(DriveRename),
                   [{"action": "drive.rename", "args": {"file_id": f.id, "name": "Q3.pdf"}}],
                   f"takeover-kill-{a_fault}")

    arm(server, "drive", "files.update", a_fault)
    with pytest.raises(TargetUnavailable):
        run_step(store, reg, task, 1)  # attempt A: in doubt, its lease held for the horizon
    row = store.step_row(task, 1)
    assert row is not None and row.outcome is None
    key = row.idem_key
    a_owner, _ = owner_and_lease(db_url, key)
    wait_unlocked(db_url)  # A's lease has passed: B may take the step over

    arm(server, "drive", "files.get", "delay", seconds=PROBE_HELD_S)
    b_started, calls_before = db_now(db_url), len(server.staging.calls_of("drive"))
    b = run_one(db_url, task, 1, TIDEMARK_DRIVE_URL=server.url,
                TIDEMARK_DRIVE_WRITE_TOKEN=DEFAULT_WRITE_TOKEN,
                TIDEMARK_DRIVE_READ_TOKEN=DEFAULT_READ_TOKEN,
                TIDEMARK_DRIVE_HORIZON_S=str(HORIZON_S))
    try:
        assert_eventually(lambda: probe_held(server) or b.poll() is not None, timeout=30)
        assert b.poll() is None, f"B ended before its probe was held: {b.communicate()}"
    finally:
        b.kill()  # SIGKILL in the middle of its probe
        b.wait(timeout=30)
    assert b.returncode == -signal.SIGKILL
    with pytest.raises(StepBusy, match="may still be acting"):  # C, at once
        run_step(store, reg, task, 1)
    assert any(c.method == "GET" and c.path.endswith(f.id)
               for c in server.staging.calls_of("drive")[calls_before:])  # B's probe, held
    b_owner, b_lease = owner_and_lease(db_url, key)
    assert b_owner != a_owner  # B had taken the intent over before it probed,
    assert b_lease >= b_started + timedelta(seconds=LEASE_S)  # for LEASE_S from then
    assert [e for e in store.events(task) if e["kind"] == "probe"] == []  # nobody probed

    result = assert_eventually(lambda: settle(store, reg, task), timeout=LEASE_S + 15)
    assert (result.status, result.resolved_by) == ("done", settled_by)
    assert result.outcome["name"] == "Q3.pdf" and result.outcome["tidemark_key"] == key
    [c_probe] = [e for e in store.events(task) if e["kind"] == "probe"]
    assert c_probe["at"] >= b_lease  # C probed only once B's lease had passed
    applied = server.staging.effects_of("drive", "files.update")
    assert [e.key for e in applied] == [key]  # the rename landed exactly once
    assert drive.files[f.id].name == "Q3.pdf"
