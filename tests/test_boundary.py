"""The irreversible boundary: the verification gate and a person's approval there.

On a real Temporal dev server, real worker processes, real Postgres and the staging servers: the
verification gate before the first irreversible step, and a person's approval there."""

from __future__ import annotations

import asyncio
import os
import pwd
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from activities.catalog import spec_registry
from activities.fs import FsRename
from helpers.fs_roots import FS_ROOTS
from helpers.ledger import LedgerRecord, ledger_step
from helpers.roles import WORKER_ROLE
from helpers.runs import start
from helpers.staging_fixtures import effects, post
from helpers.steps import crash_at
from staging.core import StagingServer
from tidemark.actions import Registry
from tidemark.boundary import verify_reversible
from tidemark.errors import DecisionRefused, NotAuthorized, PlanError
from tidemark.keys import key_for
from tidemark.payloads import RunResult
from tidemark.plan import load_plan
from tidemark.run_step import run_step
from tidemark.store import JournalStore
from tools.cli.main import main
from tools.operate import commands
from workflows.outcome import run_result

ME = pwd.getpwuid(os.geteuid()).pw_name  # the operating-system user who decides in these tests
MAIL = {"to": ["ap@supplier.example"], "cc": ["books@ours.example"],
        "subject": "Q3 invoices filed", "body": "All filed."}
PAY = {"amount": 4200, "currency": "eur", "description": "Q3 supplier run"}


def fs_steps(docs: Path, n: int) -> list[dict[str, Any]]:
    docs.mkdir()
    for i in range(1, n + 1):
        (docs / f"scan-{i}.pdf").write_text(str(i))
    return [{"action": "fs.rename", "args": {"path": str(docs / f"scan-{i}.pdf"),
                                             "name": f"invoice {i}.pdf"}}
            for i in range(1, n + 1)]


def irreversible_steps() -> list[dict[str, Any]]:
    return [{"action": "gmail.send", "args": MAIL},
            {"action": "stripe.payment_intent", "args": PAY}]


async def wait_state(handle: WorkflowHandle[Any, RunResult], state: str,
                     timeout: float = 60) -> dict[str, Any]:
    for _ in range(int(timeout / 0.1)):
        status = await handle.query("status")
        if status["state"] == state:
            return status
        await asyncio.sleep(0.1)
    raise AssertionError(f"never reached {state}: {status}")


def sent(server: StagingServer) -> tuple[int, int]:
    """(mails sent, payments created) on the staging servers."""
    return (len(effects(server, "gmail", "drafts.send")),
            len(effects(server, "stripe", "payment_intents.create")))


def verifications(store: JournalStore, task_id: str) -> list[dict[str, Any]]:
    """The gate's verifications (not the one at the end of a plan that completed)."""
    return [e["detail"] for e in store.events(task_id)
            if e["kind"] == "verification" and not e["detail"].get("at_end")]


def journal_of(store: JournalStore, task_id: str) -> list[tuple[Any, ...]]:
    return [(r.step, r.status, r.resolved_by, r.finished_at) for r in store.rows(task_id)]


@pytest.fixture
def staged_workers(workers, server: StagingServer):  # type: ignore[no-untyped-def]
    """Workers on the staging servers whose operator lets irreversible steps run unattended.

    Irreversible steps run unattended unless a plan asks for a person; ana, ben and the user
    running the tests may approve."""
    workers.env["TIDEMARK_STAGING_URL"] = server.url
    workers.env["TIDEMARK_APPROVAL"] = "none"
    workers.env["TIDEMARK_APPROVERS"] = f"ana,ben,{ME}"
    return workers


# -- plan validation -------------------------------------------------------------------------

def test_approval_is_validated_and_part_of_the_plan_hash(tmp_path: Path) -> None:
    reg = spec_registry()
    steps = [{"action": "gmail.send", "args": MAIL}]
    plain = load_plan({"task_id": "a", "steps": steps}, reg)
    asked = load_plan({"task_id": "a", "steps": steps, "approval": {"required": True}}, reg)
    assert asked.approval == {"required": True}
    assert asked.plan_hash != plain.plan_hash
    # Not asking is the plan without the field: same hash as before the field existed.
    off = load_plan({"task_id": "a", "steps": steps, "approval": {"required": False}}, reg)
    assert off.approval is None and off.plan_hash == plain.plan_hash
    for bad, where in (({"required": "yes"}, "approval.required"),
                       ({"required": True, "approvers": ["ana"]}, "approval.approvers"),
                       ({"required": False, "approvers": ["ana"]}, "approval.approvers"),
                       ({"required": True, "who": ["x"]}, "approval.who"),
                       ([True], "approval")):
        with pytest.raises(PlanError) as e:
            load_plan({"task_id": "a", "steps": steps, "approval": bad}, reg)
        assert e.value.field == where


# -- the verification gate -------------------------------------------------------------------

async def test_gate_passes_on_an_untouched_world_and_is_its_own_activity(
        temporal_env: WorkflowEnvironment, store: JournalStore, server: StagingServer,
        staged_workers, task_queue: str, tmp_path: Path) -> None:
    staged_workers.start()
    doc = {"task_id": "gate-ok", "steps": fs_steps(tmp_path / "docs", 3) + irreversible_steps()}
    handle = await start(temporal_env.client, doc, task_queue)
    result = await run_result(handle)
    assert (result.state, result.confirmed, result.executed) == ("completed", 5, 5)
    [v] = verifications(store, "gate-ok")
    assert (v["passed"], v["verified"], v["boundary"], v["failures"]) == (True, 3, 4, [])
    summaries = []
    async for event in handle.fetch_history_events():
        if event.user_metadata.HasField("summary"):
            summaries.append(event.user_metadata.summary.data.decode())
    boundary = [s for s in summaries if "boundary before step 4/5" in s]
    assert len(boundary) == 1 and "verify steps 1-3" in boundary[0]
    # Not a numbered step: the journal holds exactly the plan's five steps.
    assert [r.step for r in store.rows("gate-ok")] == [1, 2, 3, 4, 5]
    assert sent(server) == (1, 1)


async def test_gate_stops_on_a_local_file_renamed_by_somebody_else_and_runs_again_on_resume(
        temporal_env: WorkflowEnvironment, store: JournalStore, server: StagingServer,
        staged_workers, task_queue: str, tmp_path: Path, url_as: Callable[[str], str]) -> None:
    staged_workers.start()
    docs = tmp_path / "docs"
    doc = {"task_id": "gate-fs", "steps": fs_steps(docs, 3) + irreversible_steps(),
           "approval": {"required": True}}
    handle = await start(temporal_env.client, doc, task_queue)
    await wait_state(handle, "awaiting_approval")  # the gate passed once already
    (docs / "invoice 2.pdf").rename(docs / "invoice 2 (supplier copy).pdf")  # a third party
    before = journal_of(store, "gate-fs")
    commands.decide_approval(url_as("ana"), "gate-fs", "approve", "")
    await handle.signal("approval", {"decision": "approve", "by": "ana"})
    result = await run_result(handle)
    assert result.state == "verification_failed"
    assert [f["step"] for f in result.error["failures"]] == [2]
    assert result.error["failures"][0]["describe"] == "scan-2.pdf -> invoice 2.pdf"
    assert "scan-2.pdf is gone" in result.error["failures"][0]["reason"]  # what the probe saw
    assert "step(s) 2 no longer hold: step 2 fs.rename scan-2.pdf -> invoice 2.pdf" in (
        result.error["message"])
    assert sent(server) == (0, 0)  # nothing irreversible was attempted
    assert journal_of(store, "gate-fs") == before  # the gate re-executed and rewrote nothing
    assert sorted(p.name for p in docs.iterdir()) == [
        "invoice 1.pdf", "invoice 2 (supplier copy).pdf", "invoice 3.pdf"]
    report = commands.status(store.conninfo, "gate-fs").as_json()
    assert all(i["provably_not_attempted"] for i in report["irreversible"])
    assert report["verification"]["passed"] is False and report["state"] == (
        "verification_failed")
    attrs = {k.name: v for k, v in (await handle.describe()).typed_search_attributes}
    assert attrs["TidemarkState"] == "verification_failed"

    # Resumed as it is: the gate runs again and stops again.
    again = await run_result(await start(temporal_env.client, {"task_id": "gate-fs"}, task_queue))
    assert again.state == "verification_failed"
    assert [v["passed"] for v in verifications(store, "gate-fs")] == [True, False, False]
    # A person puts the file back; the resume passes the gate and, approved, completes.
    (docs / "invoice 2 (supplier copy).pdf").rename(docs / "invoice 2.pdf")
    done = await run_result(await start(temporal_env.client, {"task_id": "gate-fs"}, task_queue))
    assert (done.state, done.confirmed, done.executed) == ("completed", 5, 2)
    assert sent(server) == (1, 1)


async def test_gate_stops_on_a_drive_file_renamed_by_somebody_else(
        temporal_env: WorkflowEnvironment, store: JournalStore, server: StagingServer,
        drive: Any, staged_workers, task_queue: str, monkeypatch: pytest.MonkeyPatch,
        url_as: Callable[[str], str]) -> None:
    monkeypatch.setenv("DATABASE_URL", url_as(ME))
    staged_workers.start()
    files = [drive.seed(f"scan-{i}.pdf") for i in range(1, 4)]
    doc = {"task_id": "gate-drive", "approval": {"required": True},
           "steps": [{"action": "drive.rename", "args": {"file_id": f.id,
                                                         "name": f"invoice {i}.pdf"}}
                     for i, f in enumerate(files, start=1)] + irreversible_steps()}
    handle = await start(temporal_env.client, doc, task_queue)
    await wait_state(handle, "awaiting_approval")
    post(server, f"/_staging/drive/files/{files[0].id}/third_party_rename",
         {"name": "invoice 1 - supplier.pdf"})
    assert await asyncio.to_thread(main, [
        "approve", "gate-drive", "--by", "ana", "--address",
        temporal_env.client.service_client.config.target_host]) == 0
    result = await run_result(handle)
    assert result.state == "verification_failed"
    [failure] = result.error["failures"]
    assert failure["step"] == 1 and failure["observed"]["name"] == "invoice 1 - supplier.pdf"
    assert "renamed by someone else" in failure["reason"]
    assert sent(server) == (0, 0)
    assert len(effects(server, "drive", "files.update")) == 3  # no rename ran again


# -- a person's approval ---------------------------------------------------------------------

async def approval_task(temporal_env: WorkflowEnvironment, task_queue: str, tmp_path: Path,
                        task_id: str) -> WorkflowHandle[Any, RunResult]:
    doc = {"task_id": task_id, "steps": fs_steps(tmp_path / "docs", 2) + irreversible_steps(),
           "approval": {"required": True}}
    handle = await start(temporal_env.client, doc, task_queue)
    await wait_state(handle, "awaiting_approval")
    return handle


async def test_the_run_waits_and_approve_runs_the_irreversible_steps_once(
        temporal_env: WorkflowEnvironment, store: JournalStore, server: StagingServer,
        staged_workers, task_queue: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        url_as: Callable[[str], str]) -> None:
    staged_workers.start()
    handle = await approval_task(temporal_env, task_queue, tmp_path, "appr-1")
    desc = await handle.describe()
    assert dict((k.name, v) for k, v in desc.typed_search_attributes)[
        "TidemarkState"] == "awaiting_approval"
    meta = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    details = meta.current_details
    for shown in ("awaiting approval", "ap@supplier.example", "books@ours.example",
                  "'Q3 invoices filed'", "body 'All filed.'", "42.00 EUR", "step 3 gmail.send",
                  "step 4 stripe.payment_intent", f"ana, ben, {ME}",
                  "**In all:** 1 gmail.send, 1 stripe.payment_intent; in all 42.00 EUR; to "
                  "ap@supplier.example, books@ours.example"):
        assert shown in details, shown
    await asyncio.sleep(1.0)
    assert sent(server) == (0, 0) and store.progress("appr-1").last_step == 2  # it waits
    report = commands.status(store.conninfo, "appr-1")
    assert report.state == "awaiting_approval" and report.approval == {
        "approvers": sorted(["ana", "ben", ME]), "decision": None, "by": None, "at": None,
        "label": None, "holds": False}
    assert report.will_do == [
        "step 3 gmail.send: to ap@supplier.example; cc books@ours.example; subject "
        "'Q3 invoices filed'; body 'All filed.'",
        "step 4 stripe.payment_intent: amount 42.00 EUR (4200 minor units); description "
        "'Q3 supplier run'"]

    # Whoever the journal does not let decide records nothing, whatever name they give:
    # somebody with no role, an operator who is no approver, and an approver the list leaves
    # out (the superuser of this database).
    for role, refused in (("mallory", NotAuthorized), ("olga", NotAuthorized)):
        with pytest.raises(refused, match=f"role {role}"):
            commands.decide_approval(url_as(role), "appr-1", "approve", "ana")
    with pytest.raises(DecisionRefused, match="postgres may not decide on task appr-1: its "
                                              f"approvers are ana, ben, {ME}"):
        commands.decide_approval(store.conninfo, "appr-1", "approve", "ana")
    assert store.current_decision("appr-1") is None
    monkeypatch.setenv("DATABASE_URL", url_as(ME))
    address = temporal_env.client.service_client.config.target_host
    assert await asyncio.to_thread(main, ["approve", "appr-1", "--address", address,
                                          "--by", "ben"]) == 0
    result = await run_result(handle)
    assert (result.state, result.confirmed, result.executed) == ("completed", 4, 4)
    assert sent(server) == (1, 1)
    [decision] = [e for e in store.events("appr-1") if e["kind"] == "approval"]
    assert (decision["detail"]["decision"], decision["actor"], decision["detail"]["label"]) == (
        "approve", ME, "ben")
    with pytest.raises(DecisionRefused, match="attempted already"):
        commands.decide_approval(url_as("ana"), "appr-1", "reject", "")


async def test_reject_leaves_the_irreversible_steps_provably_not_attempted(
        temporal_env: WorkflowEnvironment, store: JournalStore, server: StagingServer,
        staged_workers, task_queue: str, tmp_path: Path, url_as: Callable[[str], str]) -> None:
    staged_workers.start()
    handle = await approval_task(temporal_env, task_queue, tmp_path, "appr-rej")
    commands.decide_approval(url_as("ana"), "appr-rej", "reject", "", "wrong supplier")
    await handle.signal("approval", {"decision": "reject", "by": "ana"})
    result = await run_result(handle)
    assert (result.state, result.error["type"], result.stopped_at) == ("stopped", "Rejected", 3)
    assert sent(server) == (0, 0)
    report = commands.status(store.conninfo, "appr-rej").as_json()
    assert report["last_step"] == 2 and report["stop"]["set_by"] == "ana"
    assert [i["provably_not_attempted"] for i in report["irreversible"]] == [True, True]
    assert report["approval"]["decision"] == "reject"
    assert commands.unwind_preview(store.conninfo, "appr-rej")["undo_steps"] == [2, 1]
    # Starting it again by any means acts on nothing.
    again = await run_result(await start(temporal_env.client, {"task_id": "appr-rej"}, task_queue))
    assert again.state == "stopped" and sent(server) == (0, 0)


async def test_a_halt_while_waiting_is_clean(
        temporal_env: WorkflowEnvironment, store: JournalStore, server: StagingServer,
        staged_workers, task_queue: str, tmp_path: Path) -> None:
    staged_workers.start()
    handle = await approval_task(temporal_env, task_queue, tmp_path, "appr-halt")
    await handle.signal("halt", "end of shift")
    result = await run_result(handle)
    assert (result.state, result.stopped_at) == ("halted", 3)
    progress = store.progress("appr-halt")
    assert progress.in_doubt is None and progress.last_step == 2
    assert progress.stop is not None and progress.stop["reason"] == "end of shift"
    assert sent(server) == (0, 0)


async def test_an_approval_survives_a_worker_restart_and_lives_in_the_journal(
        temporal_env: WorkflowEnvironment, store: JournalStore, server: StagingServer,
        staged_workers, task_queue: str, tmp_path: Path, url_as: Callable[[str], str]) -> None:
    first = staged_workers.start()
    handle = await approval_task(temporal_env, task_queue, tmp_path, "appr-dur")
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    # Journaled while no worker runs; the run is not woken (no signal): then it is ended from
    # outside. Only the journal remembers the approval.
    commands.decide_approval(url_as("ana"), "appr-dur", "approve", "")
    await handle.terminate("operator ended the run")
    staged_workers.start()
    resumed = await start(temporal_env.client, {"task_id": "appr-dur"}, task_queue)
    result = await run_result(resumed)
    assert (result.state, result.executed, result.confirmed) == ("completed", 2, 4)
    assert sent(server) == (1, 1)
    assert [v["passed"] for v in verifications(store, "appr-dur")] == [True, True]


async def test_an_approval_given_while_the_worker_is_dead_is_acted_on_by_the_next_worker(
        temporal_env: WorkflowEnvironment, store: JournalStore, server: StagingServer,
        staged_workers, task_queue: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        url_as: Callable[[str], str]) -> None:
    first = staged_workers.start()
    handle = await approval_task(temporal_env, task_queue, tmp_path, "appr-kill")
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    monkeypatch.setenv("DATABASE_URL", url_as(ME))
    address = temporal_env.client.service_client.config.target_host
    assert await asyncio.to_thread(
        main, ["approve", "appr-kill", "--by", "ana", "--address", address]) == 0
    await asyncio.sleep(0.5)
    assert sent(server) == (0, 0)  # nobody acts while no worker runs
    staged_workers.start()
    result = await run_result(handle)  # the same run, replayed by the new worker
    assert (result.state, result.confirmed) == ("completed", 4)
    assert sent(server) == (1, 1)
    assert [(r.step, r.resolved_by) for r in store.rows("appr-kill")] == [
        (1, "execute"), (2, "execute"), (3, "execute"), (4, "execute")]


async def test_a_decision_nobody_may_record_is_refused_by_the_journal_and_the_run_waits(
        temporal_env: WorkflowEnvironment, store: JournalStore, server: StagingServer,
        staged_workers, task_queue: str, tmp_path: Path, url_as: Callable[[str], str]) -> None:
    """A decision nobody may record is refused by the journal, and the run waits.

    Around the command, straight into the journal. A worker's credentials, somebody with no role
    and an operator who is no approver can neither record a decision nor forge the event that
    journals one. Woken all the same, the run reads no decision and waits on."""
    staged_workers.start()
    handle = await approval_task(temporal_env, task_queue, tmp_path, "appr-forged")
    plan_hash = store.load_plan("appr-forged").plan_hash
    for role in (WORKER_ROLE, "mallory", "olga"):
        with psycopg.connect(url_as(role), autocommit=True) as conn:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("INSERT INTO tidemark.decisions (task_id, epoch, decision,"
                             " plan_hash, decided_by) VALUES (%s, 0, 'approve', %s, 'ana')",
                             ("appr-forged", plan_hash))
            with pytest.raises((psycopg.errors.InsufficientPrivilege, psycopg.errors.RaiseException,
                                psycopg.Error)) as forged:
                conn.execute("INSERT INTO tidemark.events (task_id, kind, detail, actor)"
                             " VALUES ('appr-forged', 'approval', '{\"decision\": \"approve\"}',"
                             " 'ana')")
            assert forged.value.sqlstate in ("42501", "TA001"), forged.value
    assert store.current_decision("appr-forged") is None
    await handle.signal("approval", {"decision": "approve", "by": "ana"})
    await asyncio.sleep(1.0)
    status = await wait_state(handle, "awaiting_approval")
    assert status["confirmed"] == 2 and sent(server) == (0, 0)
    assert len(verifications(store, "appr-forged")) == 2  # woken, verified again, still waits
    await handle.signal("halt", "forged approval")
    assert (await run_result(handle)).state == "halted"
    assert sent(server) == (0, 0)


def test_the_gate_reprobes_done_steps_only_and_takes_a_persons_word_for_the_ones_she_settled(
        store: JournalStore, db_url: str, tmp_path: Path) -> None:
    registry = Registry([FsRename([FS_ROOTS]), LedgerRecord()])
    doc = {"task_id": "gate-unit",
           "steps": [*fs_steps(tmp_path / "docs", 3), ledger_step(tmp_path)]}
    plan = load_plan(doc, registry)
    store.persist_plan(plan)
    run_step(store, registry, "gate-unit", 1)
    # Step 2 acts, its worker dies before the outcome, and the next attempt's probe settles it.
    crash_at(db_url, "gate-unit", 2, "after_execute")
    row2 = run_step(store, registry, "gate-unit", 2)
    assert (row2.status, row2.resolved_by) == ("done", "probe")
    s3 = plan.step(3)
    with store.execution("gate-unit", 3) as s:  # an intent whose probe could not tell
        s.begin(task_id="gate-unit", step=3, key=key_for("gate-unit", 3, s3.action, s3.args),
                action=s3.action, args=s3.args, before_state={}, lease_s=0.0)
    commands.resolve(store.conninfo, "gate-unit", 3, "done", "looked at the folder", "ana")
    rows_before = store.rows("gate-unit")
    checked = verify_reversible(store, registry, "gate-unit", 4)
    assert (checked.passed, checked.verified, checked.on_word) == (True, 2, [3])
    (tmp_path / "docs" / "invoice 1.pdf").unlink()  # gone since
    checked = verify_reversible(store, registry, "gate-unit", 4)
    assert [(f["step"], f["status"]) for f in checked.failures] == [(1, "unknown")]
    # A step the probe settled is probed again like one that executed.
    (tmp_path / "docs" / "invoice 2.pdf").unlink()
    checked = verify_reversible(store, registry, "gate-unit", 4)
    assert [(f["step"], f["status"]) for f in checked.failures] == [(1, "unknown"),
                                                                    (2, "unknown")]
    assert store.rows("gate-unit") == rows_before  # the gate never writes a row
    assert [e["detail"]["passed"] for e in store.events("gate-unit")
            if e["kind"] == "verification"] == [True, False, False]
