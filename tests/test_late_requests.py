"""A request that leaves late never lands over a later step.

A worker frozen (SIGSTOP: a GC pause, swap, a paused VM) just before its Drive rename leaves, or a
step of the database's clock while its rename is at Drive. Whatever the twin that takes the step
over does meanwhile, the old request never lands over a later step, and the task never says done
over a file that shows an earlier step's name.

Real worker processes (tests/helpers/run_one.py) against the staging Drive through the real
Google client; the staging effect log says what Drive applied."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from activities.catalog import spec_registry
from activities.drive import DriveRename, drive_client
from helpers.freeze import wait_stopped, wake
from helpers.renames import RENAME_SPECS, RENAMES
from helpers.staging_fixtures import CLIENT_TIMEOUT_S, arm
from helpers.steps import persist, run_one, wait_unlocked
from helpers.wait import assert_eventually
from staging.core import StagingServer
from staging.drive import DEFAULT_READ_TOKEN, DEFAULT_WRITE_TOKEN, DriveTarget
from tidemark.actions import Registry
from tidemark.errors import NeedsDecision, StepBusy
from tidemark.run_step import StepResult, run_step
from tidemark.store import EXIT_LEASE_LAPSED, JournalStore
from tools.chaos.stepped_clock import stepped_postgres
from tools.operate.commands import resolve

HORIZON_S = 0.5  # Drive's horizon in these tests: short, so that a lease passes quickly
# The frozen worker's client timeout: its lease (2 x timeout + 5 s, plus the horizon) is what
# the twin waits out.
FROZEN_TIMEOUT_S = 1.0
HELD_S = 3.0  # how long the staging Drive holds the first rename (the clock-step case)
NAMES = ("2026-Q3 report.pdf", "2026-Q3 report (final).pdf")
BACK_S = 4.0  # the database's clock is set back this far: twice fs.rename's lease


def drive_env(server: StagingServer, timeout: float) -> dict[str, str]:
    return {"TIDEMARK_DRIVE_URL": server.url, "TIDEMARK_DRIVE_WRITE_TOKEN": DEFAULT_WRITE_TOKEN,
            "TIDEMARK_DRIVE_READ_TOKEN": DEFAULT_READ_TOKEN,
            "TIDEMARK_DRIVE_TIMEOUT_S": str(timeout),
            "TIDEMARK_DRIVE_HORIZON_S": str(HORIZON_S)}


def registry(server: StagingServer) -> Registry:
    return Registry([DriveRename(
        writer=drive_client(server.url, DEFAULT_WRITE_TOKEN, timeout=CLIENT_TIMEOUT_S),
        reader=drive_client(server.url, DEFAULT_READ_TOKEN, timeout=CLIENT_TIMEOUT_S),
        timeout=CLIENT_TIMEOUT_S, horizon_s=HORIZON_S)])


def two_renames(store: JournalStore, drive: DriveTarget, task: str) -> tuple[str, str]:
    """A task renaming one file twice; returns (task id, file id)."""
    f = drive.seed("scan-017.pdf")
    steps = [{"action": "drive.rename", "args": {"file_id": f.id, "name": n}} for n in NAMES]
    return persist(store, spec_registry(DriveRename), steps, task), f.id


def settle(store: JournalStore, reg: Registry, task: str, step: int) -> StepResult | None:
    """One attempt at the step, as a worker's retry makes it; None while it is busy."""
    try:
        return run_step(store, reg, task, step)
    except StepBusy:
        return None


def renames_applied(server: StagingServer) -> list[str | None]:
    return [e.key for e in server.staging.effects_of("drive", "files.update")]


def ends_as_step_2(server: StagingServer, drive: DriveTarget, file_id: str, first: StepResult,
                   second: StepResult, worker: str) -> None:
    """Both steps are done, and the file shows step 2's name once nothing is in flight.

    The first worker's rename never landed (Drive applied the twin's two renames and nothing
    else)."""
    assert (first.status, second.status) == ("done", "done")
    assert_eventually(lambda: not server.staging.in_flight(), timeout=30)
    assert drive.files[file_id].name == NAMES[1], (
        f"the task says step 2 is done, but the file shows step 1's name: the first worker's "
        f"rename landed after the twin's (the first worker: {worker})")
    assert renames_applied(server) == [first.key, second.key]


def test_a_frozen_workers_rename_never_lands_after_its_twin_took_the_task_further(
        store: JournalStore, db_url: str, server: StagingServer, drive: DriveTarget) -> None:
    task, file_id = two_renames(store, drive, "frozen-rename")
    a = run_one(db_url, task, 1, TIDEMARK_FREEZE_AT="before_send:1",
                **drive_env(server, FROZEN_TIMEOUT_S))
    reg = registry(server)
    try:
        wait_stopped(a)  # frozen just before its files.update leaves
        wait_unlocked(db_url, timeout=60)  # its lease has passed
        first = assert_eventually(lambda: settle(store, reg, task, 1), timeout=30)
        second = run_step(store, reg, task, 2)
    finally:
        code, _, err = wake(a)  # it goes on from where it froze
    ends_as_step_2(server, drive, file_id, first, second, f"exit {code}: {err[-1500:]}")


def test_a_worker_frozen_after_its_mark_makes_its_twin_ask_a_person_not_rename_again(
        store: JournalStore, db_url: str, server: StagingServer, drive: DriveTarget) -> None:
    """A worker frozen after its mark makes its twin ask a person, not rename again.

    The worker is frozen after the wire's checks, just before its request is written. Nothing but
    its own deadline watch can stop that request when the worker wakes. Its twin finds the file
    as it was and the mark with no report back: absent is no verdict, a person is asked, and
    nothing renames the file under the late request. Woken, the worker either gets its request
    out (a resume then finds step 1 done) or its watch ends it first with the request cut short
    (then the person, seeing nothing at Drive and the worker gone, says absent)."""
    task, file_id = two_renames(store, drive, "frozen-marked")
    a = run_one(db_url, task, 1, TIDEMARK_FREEZE_AT="wire_passed:1",
                **drive_env(server, FROZEN_TIMEOUT_S))
    reg = registry(server)
    try:
        wait_stopped(a)
        wait_unlocked(db_url, timeout=60)
        with pytest.raises(NeedsDecision, match="never reported back"):
            assert_eventually(lambda: settle(store, reg, task, 1), timeout=30)
        assert renames_applied(server) == []
    finally:
        code, _, err = wake(a)
    assert_eventually(lambda: not server.staging.in_flight(), timeout=30)
    if not renames_applied(server):  # its watch ended it before the request was whole
        assert code == EXIT_LEASE_LAPSED, err[-1500:]
        with pytest.raises(NeedsDecision):
            settle(store, reg, task, 1)
        resolve(db_url, task, 1, "absent", "its worker is gone; nothing reached Drive", "test")
    first = assert_eventually(lambda: settle(store, reg, task, 1), timeout=30)
    assert first.status == "done"
    second = run_step(store, reg, task, 2)
    ends_as_step_2(server, drive, file_id, first, second, "woken, its rename landed first")


def test_a_step_of_the_databases_clock_hands_no_step_over_while_its_rename_is_at_drive(
        server: StagingServer, drive: DriveTarget) -> None:
    with stepped_postgres() as pg, JournalStore(pg.url) as store:
        store.migrate()
        task, file_id = two_renames(store, drive, "clock-step")
        arm(server, "drive", "files.update", "delay", seconds=HELD_S)  # the first rename only
        a = run_one(pg.url, task, 1, **drive_env(server, CLIENT_TIMEOUT_S))
        try:
            assert_eventually(lambda: server.staging.in_flight() or a.poll() is not None,
                              timeout=30)
            assert a.poll() is None, a.communicate()
            pg.step(30)  # the database's clock jumps 30 s ahead while the rename is at Drive
            reg = registry(server)
            first = assert_eventually(lambda: settle(store, reg, task, 1), timeout=30)
            second = run_step(store, reg, task, 2)
        finally:
            _, err = a.communicate(timeout=60)
    ends_as_step_2(server, drive, file_id, first, second, err[-1500:])


def test_a_backward_step_of_the_databases_clock_keeps_a_twin_out_until_the_database_agrees(
        tmp_path: Path) -> None:
    """A backward step of the database's clock keeps a twin out until the database agrees.

    No single clock decides. The twin has seen the dead attempt's lease for its length on its own
    clock long before the database, whose clock was set back, reads it as passed; it takes the
    step over only once both do."""
    with stepped_postgres() as pg, JournalStore(pg.url) as store:
        store.migrate()
        (tmp_path / "draft.txt").write_text("draft")
        task = persist(store, RENAME_SPECS, [{"action": "fs.rename", "args": {
            "path": str(tmp_path / "draft.txt"), "name": "final.txt"}}], "clock-back")
        a = run_one(pg.url, task, 1, TIDEMARK_CRASH_AT="after_intent:1")
        a.communicate(timeout=60)
        assert a.returncode == -signal.SIGKILL
        pg.step(-BACK_S)
        row = store.step_row(task, 1)
        assert row is not None and row.lease_until is not None
        result = assert_eventually(lambda: settle(store, RENAMES, task, 1),
                                   timeout=BACK_S + 30)
        [probe] = [e for e in store.events(task) if e["kind"] == "probe"]
    assert result.status == "done"
    assert probe["at"] >= row.lease_until, "taken over while the database read the lease fresh"
