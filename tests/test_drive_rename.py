"""drive.rename through the real Drive client against the staging server.

Directly, and through run_step with a real journal."""

from __future__ import annotations

from typing import Any

import pytest

from activities.catalog import spec_registry
from activities.drive import DriveRename, drive_client
from helpers.staging_fixtures import CLIENT_TIMEOUT_S, post
from helpers.steps import persist as persist_plan
from helpers.steps import step_context
from helpers.wait import assert_eventually
from staging.core import Fault, Staging, StagingServer
from staging.drive import DEFAULT_READ_TOKEN, DEFAULT_WRITE_TOKEN, DriveTarget
from tidemark.actions import GateRefused, ProbeStatus, Registry, StepContext
from tidemark.errors import (
    NeedsDecision,
    PlanError,
    PreconditionFailed,
    Refused,
    StepBusy,
    StepFailed,
    TargetUnavailable,
    Unauthorized,
)
from tidemark.run_step import run_step
from tidemark.store import JournalStore

# Healthy calls get the suite's client timeout; only a call meant to time out gets this one,
# and the delay faults that victimise it exceed it many times over.
SHORT_TIMEOUT = 0.5


@pytest.fixture
def drive(drive: DriveTarget) -> DriveTarget:
    """The Drive target with one file, ``f1`` named ``report.pdf``."""
    drive.seed("report.pdf", file_id="f1")
    return drive


def make_action(server: StagingServer, timeout: float = CLIENT_TIMEOUT_S,
                horizon_s: float = 0.0) -> DriveRename:
    """The action on staging, with no horizon unless the test gives one.

    Its writes land within their request unless a test arms a delay fault."""
    return DriveRename(writer=drive_client(server.url, DEFAULT_WRITE_TOKEN, timeout=timeout),
                       reader=drive_client(server.url, DEFAULT_READ_TOKEN, timeout=timeout),
                       timeout=timeout, horizon_s=horizon_s)


@pytest.fixture
def action(server: StagingServer, staging: Staging) -> DriveRename:
    return make_action(server)


def context(name: str = "2026-Q3 report.pdf", file_id: str = "f1",
            before: dict[str, Any] | None = None,
            outcome: dict[str, Any] | None = None) -> StepContext:
    return step_context("drive.rename", {"file_id": file_id, "name": name},
                        before_state=before, outcome=outcome)


def intent(action: DriveRename, name: str = "2026-Q3 report.pdf") -> StepContext:
    """What run_step does before executing: gates, snapshot, then the context of the intent."""
    ctx = context(name)
    action.preconditions(ctx)
    return context(name, before=action.snapshot(ctx))


# -- the action on its own ------------------------------------------------------------------

def test_happy_path_renames_stamps_and_probes_done(action: DriveRename, drive: DriveTarget,
                                                   staging: Staging) -> None:
    ctx = intent(action)
    assert ctx.before_state == {"file_id": "f1", "name": "report.pdf", "app_properties": {}}
    assert action.probe(ctx).status is ProbeStatus.ABSENT
    outcome = action.execute(ctx)
    assert outcome == {"file_id": "f1", "name": "2026-Q3 report.pdf", "tidemark_key": ctx.key}
    assert drive.files["f1"].name == "2026-Q3 report.pdf"
    probed = action.probe(ctx)
    assert probed.status is ProbeStatus.DONE
    assert probed.observed["name"] == "2026-Q3 report.pdf"
    assert probed.observed["tidemark_key"] == ctx.key
    [effect] = staging.effects_of("drive", "files.update")
    assert effect.key == ctx.key


def test_any_nonempty_name_is_valid_including_slashes() -> None:
    assert DriveRename.validate_args({"file_id": "f1", "name": "a/b: c?"}, "args") == {
        "file_id": "f1", "name": "a/b: c?"}
    with pytest.raises(PlanError, match="empty"):
        DriveRename.validate_args({"file_id": "f1", "name": "  "}, "args")
    assert DriveRename.describe({"file_id": "f1", "name": "x.pdf"}) == "f1 -> x.pdf"


def test_gates_refuse_a_missing_or_trashed_file(action: DriveRename, drive: DriveTarget) -> None:
    with pytest.raises(GateRefused, match="does not exist"):
        action.preconditions(context(file_id="nope"))
    drive.seed("old.txt", file_id="f2", trashed=True)
    with pytest.raises(GateRefused, match="trash"):
        action.preconditions(context(file_id="f2"))


def test_the_target_name_without_our_stamp_is_not_success(server: StagingServer,
                                                          action: DriveRename,
                                                          drive: DriveTarget) -> None:
    ctx = intent(action)
    post(server, "/_staging/drive/files/f1/third_party_rename", {"name": "2026-Q3 report.pdf"})
    probed = action.probe(ctx)
    assert probed.status is ProbeStatus.UNKNOWN
    assert "not by us" in probed.reason


def test_third_party_rename_after_intent_is_unknown_with_what_was_seen(
        server: StagingServer, action: DriveRename, drive: DriveTarget) -> None:
    ctx = intent(action)
    post(server, "/_staging/drive/files/f1/third_party_rename", {"name": "theirs.pdf"})
    probed = action.probe(ctx)
    assert probed.status is ProbeStatus.UNKNOWN
    assert "renamed to 'theirs.pdf' by someone else" in probed.reason
    assert probed.observed["name"] == "theirs.pdf"


def test_third_party_rename_after_ours_is_unknown_not_done(server: StagingServer,
                                                           action: DriveRename,
                                                           drive: DriveTarget) -> None:
    ctx = intent(action)
    action.execute(ctx)
    post(server, "/_staging/drive/files/f1/third_party_rename", {"name": "theirs.pdf"})
    probed = action.probe(ctx)
    assert probed.status is ProbeStatus.UNKNOWN
    assert "'theirs.pdf'" in probed.reason and "someone else" in probed.reason


def test_a_late_answer_times_out_and_the_probe_sees_the_late_commit(server: StagingServer,
                                                                    drive: DriveTarget,
                                                                    staging: Staging) -> None:
    action = make_action(server, timeout=SHORT_TIMEOUT)
    ctx = intent(action)
    # Far beyond the timeout, so that "not committed yet" holds on a loaded machine too.
    staging.arm(Fault("drive", "files.update", "delay", seconds=SHORT_TIMEOUT * 6))
    with pytest.raises(TargetUnavailable, match="no answer in time"):
        action.execute(ctx)
    assert action.probe(ctx).status is ProbeStatus.ABSENT  # not committed yet
    assert_eventually(lambda: action.probe(ctx).status is ProbeStatus.DONE)
    assert len(staging.effects_of("drive", "files.update")) == 1


def test_a_commit_later_than_the_client_is_waited_out_not_renamed_again(
        server: StagingServer, store: JournalStore, drive: DriveTarget,
        staging: Staging) -> None:
    """A commit later than the client is waited out, not renamed again.

    Drive has no idempotency key. After an ambiguous failure the step does not trust *absent*
    until the horizon has passed, so a rename Drive applies after our client gave up is found by
    the probe instead of being made a second time."""
    delay = SHORT_TIMEOUT * 6
    action = make_action(server, timeout=SHORT_TIMEOUT, horizon_s=delay + 1.0)
    task = persist(store)
    staging.arm(Fault("drive", "files.update", "delay", seconds=delay))
    with pytest.raises(TargetUnavailable):
        run_step(store, Registry([action]), task, 1)
    with pytest.raises(StepBusy):  # the late commit may still land: no probe, no rename
        run_step(store, Registry([action]), task, 1)
    assert len(staging.effects_of("drive", "files.update")) == 0  # it has not landed yet

    def settled() -> bool:
        try:
            return run_step(store, Registry([action]), task, 1).resolved_by == "probe"
        except StepBusy:
            return False

    assert_eventually(settled, timeout=delay + 10)
    assert len(staging.effects_of("drive", "files.update")) == 1
    assert drive.files["f1"].app_properties.get("tidemark_key") is not None


def test_a_503_is_target_unavailable_and_changes_nothing(action: DriveRename,
                                                         drive: DriveTarget,
                                                         staging: Staging) -> None:
    ctx = intent(action)
    staging.arm(Fault("drive", "files.update", "fail_before_commit"))
    with pytest.raises(TargetUnavailable, match="503"):
        action.execute(ctx)
    assert action.probe(ctx).status is ProbeStatus.ABSENT


def test_a_failing_read_makes_the_probe_unknown(action: DriveRename, drive: DriveTarget,
                                                staging: Staging) -> None:
    ctx = intent(action)
    staging.arm(Fault("drive", "files.get", "fail_before_commit"))
    probed = action.probe(ctx)
    assert probed.status is ProbeStatus.UNKNOWN and "could not read" in probed.reason


def test_revoked_write_token_is_unauthorized_and_changes_nothing(server: StagingServer,
                                                                 action: DriveRename,
                                                                 drive: DriveTarget) -> None:
    ctx = intent(action)
    post(server, f"/_staging/tokens/{DEFAULT_WRITE_TOKEN}/revoke", {})
    with pytest.raises(Unauthorized, match="401"):
        action.execute(ctx)
    assert drive.files["f1"].name == "report.pdf"


def test_revoked_read_token_stops_the_probe_and_the_gates(server: StagingServer,
                                                          action: DriveRename,
                                                          drive: DriveTarget) -> None:
    ctx = intent(action)
    post(server, f"/_staging/tokens/{DEFAULT_READ_TOKEN}/revoke", {})
    with pytest.raises(Unauthorized):
        action.probe(ctx)
    with pytest.raises(Unauthorized):
        action.preconditions(ctx)


def test_a_read_only_client_cannot_execute(server: StagingServer, drive: DriveTarget) -> None:
    reader = drive_client(server.url, DEFAULT_READ_TOKEN, timeout=CLIENT_TIMEOUT_S)
    misconfigured = DriveRename(writer=reader, reader=reader)
    with pytest.raises(Unauthorized, match="403"):
        misconfigured.execute(context(before={"name": "report.pdf"}))
    assert drive.files["f1"].name == "report.pdf"


# -- compensation ---------------------------------------------------------------------------

def test_compensate_restores_the_name_and_removes_our_stamp(action: DriveRename,
                                                            drive: DriveTarget) -> None:
    ctx = intent(action)
    outcome = action.execute(ctx)
    undo = context(before=ctx.before_state, outcome=outcome)
    assert action.compensate(undo) == {"file_id": "f1", "name": "report.pdf",
                                       "tidemark_key": None}
    assert drive.files["f1"].name == "report.pdf"
    assert "tidemark_key" not in drive.files["f1"].app_properties
    # A second attempt of the same compensation finds it done and writes nothing.
    versions = drive.files["f1"].version
    assert action.compensate(undo)["name"] == "report.pdf"
    assert drive.files["f1"].version == versions


def test_compensate_puts_back_an_earlier_stamp(action: DriveRename, drive: DriveTarget) -> None:
    drive.files["f1"].app_properties = {"tidemark_key": "earlier", "other": "x"}
    ctx = intent(action)
    action.execute(ctx)
    action.compensate(context(before=ctx.before_state))
    assert drive.files["f1"].app_properties == {"tidemark_key": "earlier", "other": "x"}


def test_compensate_refuses_to_overwrite_someone_elses_rename(server: StagingServer,
                                                              action: DriveRename,
                                                              drive: DriveTarget) -> None:
    ctx = intent(action)
    action.execute(ctx)
    post(server, "/_staging/drive/files/f1/third_party_rename", {"name": "theirs.pdf"})
    with pytest.raises(Refused, match="someone else changed it"):
        action.compensate(context(before=ctx.before_state))
    assert drive.files["f1"].name == "theirs.pdf"


def test_compensate_never_renames_back_a_file_someone_trashed(action: DriveRename,
                                                              drive: DriveTarget) -> None:
    """An unwind never renames back a file somebody trashed.

    Someone put our renamed file in the trash: it still has our name and stamp, but putting
    its old name back would undo a person's change nobody explained. Refused; it stays as is."""
    ctx = intent(action)
    action.execute(ctx)
    drive.files["f1"].trashed = True
    with pytest.raises(Refused, match="in the trash"):
        action.compensate(context(before=ctx.before_state))
    assert (drive.files["f1"].name, drive.files["f1"].trashed) == ("2026-Q3 report.pdf", True)


# -- through run_step -------------------------------------------------------------------------

def persist(store: JournalStore, task_id: str = "t", name: str = "2026-Q3 report.pdf") -> str:
    return persist_plan(store, spec_registry(DriveRename), [
        {"action": "drive.rename", "args": {"file_id": "f1", "name": name}}], task_id)


def test_run_step_happy_path(store: JournalStore, action: DriveRename, drive: DriveTarget,
                             staging: Staging) -> None:
    task = persist(store)
    result = run_step(store, Registry([action]), task, 1)
    assert (result.status, result.resolved_by) == ("done", "execute")
    assert result.outcome["tidemark_key"] == result.key
    row = store.step_row(task, 1)
    assert row is not None and row.before_state == {"file_id": "f1", "name": "report.pdf",
                                                    "app_properties": {}}
    assert run_step(store, Registry([action]), task, 1).skipped
    assert [e.key for e in staging.effects_of("drive")] == [result.key]


def test_run_step_resolves_a_dropped_answer_by_probe(store: JournalStore, action: DriveRename,
                                                     drive: DriveTarget,
                                                     staging: Staging) -> None:
    task = persist(store)
    staging.arm(Fault("drive", "files.update", "drop_after_commit"))
    with pytest.raises(TargetUnavailable):
        run_step(store, Registry([action]), task, 1)
    row = store.step_row(task, 1)
    assert row is not None and row.in_doubt
    resumed = run_step(store, Registry([action]), task, 1)
    assert (resumed.status, resumed.resolved_by) == ("done", "probe")
    assert resumed.outcome["name"] == "2026-Q3 report.pdf"
    assert len(staging.effects_of("drive", "files.update")) == 1


def test_run_step_executes_after_a_write_that_never_landed(store: JournalStore,
                                                           action: DriveRename,
                                                           drive: DriveTarget,
                                                           staging: Staging) -> None:
    task = persist(store)
    staging.arm(Fault("drive", "files.update", "fail_before_commit"))
    with pytest.raises(TargetUnavailable):
        run_step(store, Registry([action]), task, 1)
    resumed = run_step(store, Registry([action]), task, 1)
    assert (resumed.status, resumed.resolved_by) == ("done", "execute")
    assert len(staging.effects_of("drive", "files.update")) == 1


def test_run_step_stops_for_a_person_when_someone_else_renamed(server: StagingServer,
                                                               store: JournalStore,
                                                               action: DriveRename,
                                                               drive: DriveTarget,
                                                               staging: Staging) -> None:
    task = persist(store)
    staging.arm(Fault("drive", "files.update", "fail_before_commit"))
    with pytest.raises(TargetUnavailable):
        run_step(store, Registry([action]), task, 1)
    post(server, "/_staging/drive/files/f1/third_party_rename", {"name": "theirs.pdf"})
    with pytest.raises(NeedsDecision, match=r"theirs\.pdf"):
        run_step(store, Registry([action]), task, 1)
    assert drive.files["f1"].name == "theirs.pdf"
    assert staging.effects_of("drive", "files.update") == []


def test_run_step_refuses_a_trashed_file_before_any_intent(store: JournalStore,
                                                           action: DriveRename,
                                                           drive: DriveTarget) -> None:
    drive.files["f1"].trashed = True
    task = persist(store)
    with pytest.raises(PreconditionFailed, match="trash"):
        run_step(store, Registry([action]), task, 1)
    assert store.step_row(task, 1) is None


def test_run_step_with_a_revoked_token_stops_with_unauthorized(server: StagingServer,
                                                               store: JournalStore,
                                                               action: DriveRename,
                                                               drive: DriveTarget) -> None:
    task = persist(store)
    post(server, f"/_staging/tokens/{DEFAULT_WRITE_TOKEN}/revoke", {})
    with pytest.raises(Unauthorized) as info:
        run_step(store, Registry([action]), task, 1)
    assert not info.value.retryable
    row = store.step_row(task, 1)
    assert row is not None and row.in_doubt
    assert drive.files["f1"].name == "report.pdf"


# -- the stamp decides, not the name alone ----------------------------------------------------

def other_writer_renames_back(server: StagingServer, name: str, key: str) -> None:
    """Another writer of the same app renames f1 under its own key.

    The writer is another task or another Tidemark, through the real client."""
    other = drive_client(server.url, DEFAULT_WRITE_TOKEN, timeout=CLIENT_TIMEOUT_S)
    other.files().update(fileId="f1", body={"name": name, "appProperties": {"tidemark_key": key}},
                         fields="id").execute(num_retries=0)


def test_the_old_name_under_another_key_is_unknown_not_absent(server: StagingServer,
                                                              action: DriveRename,
                                                              drive: DriveTarget) -> None:
    ctx = intent(action)
    action.execute(ctx)
    other_writer_renames_back(server, "report.pdf", "someone-elses-key")
    probed = action.probe(ctx)
    assert probed.status is ProbeStatus.UNKNOWN
    assert probed.observed == {"file_id": "f1", "name": "report.pdf",
                               "tidemark_key": "someone-elses-key", "trashed": False}


def test_the_old_name_without_the_old_stamp_is_unknown(action: DriveRename,
                                                       drive: DriveTarget) -> None:
    drive.files["f1"].app_properties = {"tidemark_key": "earlier"}
    ctx = intent(action)
    drive.files["f1"].app_properties = {}  # someone removed the earlier stamp since
    assert action.probe(ctx).status is ProbeStatus.UNKNOWN
    drive.files["f1"].app_properties = {"tidemark_key": "earlier"}  # as before_state has it
    assert action.probe(ctx).status is ProbeStatus.ABSENT


def test_run_step_does_not_overwrite_a_rename_back_under_another_key(
        server: StagingServer, store: JournalStore, action: DriveRename, drive: DriveTarget,
        staging: Staging) -> None:
    task = persist(store)
    staging.arm(Fault("drive", "files.update", "drop_after_commit"))
    with pytest.raises(TargetUnavailable):
        run_step(store, Registry([action]), task, 1)  # applied; the answer was lost
    other_writer_renames_back(server, "report.pdf", "someone-elses-key")
    with pytest.raises(NeedsDecision, match="someone-elses-key"):
        run_step(store, Registry([action]), task, 1)
    assert drive.files["f1"].name == "report.pdf"
    assert drive.files["f1"].app_properties == {"tidemark_key": "someone-elses-key"}
    assert len(staging.effects_of("drive", "files.update")) == 2  # ours, theirs; no third


# -- a 403 about one file is a refusal of the step, not a revoked credential -------------------

def test_a_file_shared_read_only_refuses_the_step_and_the_task_fails_there(
        store: JournalStore, action: DriveRename, drive: DriveTarget,
        staging: Staging) -> None:
    drive.seed("theirs.pdf", file_id="f1", owner="carol", shared={"default": "reader"})
    task = persist(store)
    with pytest.raises(StepFailed, match="insufficientFilePermissions"):
        run_step(store, Registry([action]), task, 1)
    row = store.step_row(task, 1)
    assert row is not None and row.status == "failed" and row.resolved_by == "execute"
    assert drive.files["f1"].name == "theirs.pdf"
    assert staging.effects_of("drive", "files.update") == []


def test_a_drive_file_token_never_granted_the_file_is_refused(server: StagingServer,
                                                             drive: DriveTarget) -> None:
    post(server, "/_staging/tokens", {"token": "narrow", "target": "drive", "client": "narrow-app",
                                      "scopes": ["https://www.googleapis.com/auth/drive.file"]})
    narrow = DriveRename(
        writer=drive_client(server.url, "narrow", timeout=CLIENT_TIMEOUT_S),
        reader=drive_client(server.url, DEFAULT_READ_TOKEN, timeout=CLIENT_TIMEOUT_S))
    with pytest.raises(Refused, match="appNotAuthorizedToFile"):
        narrow.execute(context(before={"name": "report.pdf"}))
    assert drive.files["f1"].name == "report.pdf"


def test_a_scope_the_token_lacks_still_stops_the_task_as_unauthorized(
        server: StagingServer, drive: DriveTarget) -> None:
    # insufficientPermissions is about the credential (its scopes), not about one file.
    reader = drive_client(server.url, DEFAULT_READ_TOKEN, timeout=CLIENT_TIMEOUT_S)
    with pytest.raises(Unauthorized, match="insufficientPermissions"):
        DriveRename(writer=reader, reader=reader).execute(context(before={"name": "x"}))
