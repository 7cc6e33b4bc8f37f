"""Unwind as a person runs it at 03:14, through the `tidemark` command.

It uses real worker processes, real Postgres, the Temporal dev server and the staging Drive.
Compensations act under a grant scoped to the undo of the task, on any worker and at any later
time; a kill stops an unwind and an unwind after a kill needs the kill released for it; a task
with any compensation never runs forward; a trashed file fails the verification gate; an unwind
never replaces a file that took the original name, and waits out the lease of an attempt that may
still be acting."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from activities.catalog import spec_registry
from activities.drive import drive_client
from helpers.runs import start, wait_state
from helpers.staging_fixtures import arm, effects, post
from staging.core import StagingServer
from tidemark import staging_tokens
from tidemark.plan import load_plan
from tidemark.store import JournalStore
from tools.cli.main import main
from tools.operate import commands
from workflows.outcome import run_result

MAIL = {"to": ["ap@supplier.example"], "subject": "Q3 invoices filed", "body": "All filed."}
APPROVAL = {"required": True}


@pytest.fixture
def staged(workers, server: StagingServer, store: JournalStore,  # type: ignore[no-untyped-def]
           monkeypatch: pytest.MonkeyPatch):
    """Worker processes on the staging servers, and the CLI on the same journal."""
    workers.env["TIDEMARK_STAGING_URL"] = server.url
    monkeypatch.setenv("DATABASE_URL", store.conninfo)
    return workers


def cli(temporal_env: WorkflowEnvironment, task_queue: str, *args: str) -> int:
    """`tidemark ARGS` against the test's Temporal, task queue and journal."""
    address = temporal_env.client.service_client.config.target_host
    extra = [] if args[0] in ("stop", "release") else ["--address", address]
    if args[0] in ("unwind", "resume"):
        extra += ["--task-queue", task_queue]
    return main([*args, *extra])


async def acli(temporal_env: WorkflowEnvironment, task_queue: str, *args: str) -> int:
    return await asyncio.to_thread(cli, temporal_env, task_queue, *args)


def drive_doc(task_id: str, files: list[Any], *, mail: bool = True) -> dict[str, Any]:
    steps: list[dict[str, Any]] = [
        {"action": "drive.rename", "args": {"file_id": f.id, "name": f"invoice {i}.pdf"}}
        for i, f in enumerate(files, start=1)]
    doc: dict[str, Any] = {"task_id": task_id, "steps": steps}
    if mail:
        doc["steps"].append({"action": "gmail.send", "args": MAIL})
        doc["approval"] = APPROVAL
    return doc


async def rejected_drive_task(temporal_env: WorkflowEnvironment, task_queue: str, drive: Any,
                              task_id: str, n: int = 3) -> list[Any]:
    """A task that renamed ``n`` Drive files and waits for approval, then is rejected."""
    files = [drive.seed(f"scan-{i}.pdf") for i in range(1, n + 1)]
    handle = await start(temporal_env.client, drive_doc(task_id, files), task_queue)
    await wait_state(handle, "awaiting_approval")
    assert await acli(temporal_env, task_queue, "reject", task_id, "--by", "ana") == 0
    assert (await run_result(handle)).state == "stopped"
    return files


def restart_workers(staged) -> None:  # type: ignore[no-untyped-def]
    """Another replica: the workers that ran the task (and held its grants) are gone."""
    staged.stop_all()
    staged.procs.clear()
    staged.start()


def undo_rows(store: JournalStore, task_id: str) -> list[Any]:
    return [r for r in store.rows(task_id) if r.phase == "undo"]


def grant_events(store: JournalStore, task_id: str) -> list[dict[str, Any]]:
    return [e["detail"] for e in store.events(task_id) if e["kind"] == "grant"]


def names(drive: Any, files: list[Any]) -> list[str]:
    return [drive.files[f.id].name for f in files]


# -- item 1: the undo grant --------------------------------------------------------------------

async def test_unwind_after_reject_restores_drive_files_on_a_worker_that_holds_no_grant(
        temporal_env: WorkflowEnvironment, store: JournalStore, server: StagingServer,
        drive: Any, staged, task_queue: str) -> None:
    staged.start()
    files = await rejected_drive_task(temporal_env, task_queue, drive, "uw-grant")
    restart_workers(staged)
    assert await acli(temporal_env, task_queue, "unwind", "uw-grant", "--yes", "--wait") == 0
    assert names(drive, files) == ["scan-1.pdf", "scan-2.pdf", "scan-3.pdf"]
    assert commands.status(store.conninfo, "uw-grant").state == "unwound"
    undo = [g for g in store.grants("uw-grant") if g["purpose"] == "undo"]
    assert undo and all(g["revoked"] is not None for g in undo)  # revoked when it ended
    events = grant_events(store, "uw-grant")
    assert any(e.get("issued") and e.get("purpose") == "undo" for e in events)
    assert any(e.get("revoked") for e in events)


async def test_an_unwind_after_a_kill_needs_the_kill_released_for_it(
        temporal_env: WorkflowEnvironment, store: JournalStore, server: StagingServer,
        drive: Any, staged, task_queue: str, capsys: pytest.CaptureFixture[str]) -> None:
    staged.start()
    files = await rejected_drive_task(temporal_env, task_queue, drive, "uw-kill")
    assert await acli(temporal_env, task_queue, "kill", "uw-kill", "--reason", "incident") == 0
    capsys.readouterr()
    restart_workers(staged)
    # While the kill is in force, an unwind is refused: one line, non-zero, nothing changed.
    assert await acli(temporal_env, task_queue, "unwind", "uw-kill", "--yes", "--wait") == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tidemark release uw-kill --for-unwind" in err[0], err
    assert store.stop_state("uw-kill")["state"] == "killed"
    assert undo_rows(store, "uw-kill") == []
    assert names(drive, files) == ["invoice 1.pdf", "invoice 2.pdf", "invoice 3.pdf"]
    # A release for unwinding keeps the task stopped (nothing runs it forward) and lets the
    # unwind act.
    assert await acli(temporal_env, task_queue, "release", "uw-kill", "--for-unwind") == 0
    lifted = store.stop_state("uw-kill")  # killed still: lifted for the unwind alone
    assert (lifted["state"], lifted["for_unwind"]) == ("killed", True)
    assert [e["detail"] for e in store.events("uw-kill") if e["kind"] == "release"] == [
        {"reason": "released for unwind", "for_unwind": True}]
    assert await acli(temporal_env, task_queue, "unwind", "uw-kill", "--yes", "--wait") == 0
    assert names(drive, files) == ["scan-1.pdf", "scan-2.pdf", "scan-3.pdf"]
    assert commands.status(store.conninfo, "uw-kill").state == "unwound"


async def test_a_kill_during_a_long_unwind_lets_no_compensation_start_after_it(
        temporal_env: WorkflowEnvironment, store: JournalStore, server: StagingServer,
        drive: Any, staged, task_queue: str) -> None:
    staged.start()
    files = await rejected_drive_task(temporal_env, task_queue, drive, "uw-long", n=40)
    # Every restore takes a moment at the provider, so the kill lands in the middle.
    arm(server, "drive", "files.update", "delay", seconds=0.15, times=1000)
    assert await acli(temporal_env, task_queue, "unwind", "uw-long", "--yes") == 0
    for _ in range(600):
        if len([r for r in undo_rows(store, "uw-long") if r.status == "done"]) >= 3:
            break
        await asyncio.sleep(0.05)
    assert await acli(temporal_env, task_queue, "kill", "uw-long", "--reason", "stop it") == 0
    killed_at = max(e["at"] for e in store.events("uw-long") if e["kind"] == "kill")
    handle = temporal_env.client.get_workflow_handle("tidemark-unwind-uw-long")
    for _ in range(300):  # the unwind ends (refused, or terminated by the kill)
        if (await handle.describe()).status.name != "RUNNING":
            break
        await asyncio.sleep(0.1)
    description = await handle.describe()
    if description.status.name != "TERMINATED":  # not ended by the kill: it ended itself
        assert (await handle.result())["state"] == "killed"
    await asyncio.sleep(2.0)  # a worker thread still inside a step has had time to act
    rows = undo_rows(store, "uw-long")
    assert 3 <= len(rows) < 40
    late = [r.step for r in rows if r.started_at > killed_at]
    assert late == [], f"compensations started after the kill: {late}"
    restored = sum(n.startswith("scan-") for n in names(drive, files))
    assert restored == len([r for r in rows if r.status == "done"])


def test_release_for_unwind_refuses_bad_input_and_a_stop_never_lifts_a_kill(
        store: JournalStore, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("DATABASE_URL", store.conninfo)
    doc = {"task_id": "uw-bad", "steps": [
        {"action": "drive.rename", "args": {"file_id": "f1", "name": "invoice 1.pdf"}}]}
    store.persist_plan(load_plan(doc, spec_registry()))

    def refused(*args: str, code: int = 1) -> str:
        before = (store.stop_state("uw-bad"), len(store.events("uw-bad")))
        assert main(list(args)) == code
        err = capsys.readouterr().err.strip().splitlines()
        assert (store.stop_state("uw-bad"), len(store.events("uw-bad"))) == before
        return err[-1]

    assert "is not killed" in refused("release", "uw-bad", "--for-unwind")  # not stopped
    store.set_control("uw-bad", "stopped", "ops", "ana")
    assert "is not killed" in refused("release", "uw-bad", "--for-unwind")
    assert "no task 'uw-typo' is known" in refused("release", "uw-typo", "--for-unwind")
    assert "give one task id" in refused("release", "--all", "--for-unwind", code=2)
    store.set_killed("*", "incident", "ben")  # a kill of every task is released as such
    assert "under the kill of '*'" in refused("release", "uw-bad", "--for-unwind")
    store.set_control("*", "released", "over", "ben")
    store.set_killed("uw-bad", "incident", "ben")
    assert main(["stop", "uw-bad", "--reason", "again"]) == 0  # a stop is no release
    assert store.stop_state("uw-bad")["state"] == "killed"


# -- item 5: a task with any compensation never runs forward -----------------------------------

async def test_resume_after_a_partial_unwind_is_refused_and_status_says_partly_unwound(
        temporal_env: WorkflowEnvironment, store: JournalStore, server: StagingServer,
        drive: Any, staged, task_queue: str, capsys: pytest.CaptureFixture[str]) -> None:
    staged.start()
    files = [drive.seed(f"scan-{i}.pdf") for i in range(1, 4)]
    handle = await start(temporal_env.client, drive_doc("uw-part", files, mail=False),
                         task_queue)
    assert (await run_result(handle)).state == "completed"
    post(server, f"/_staging/drive/files/{files[0].id}/third_party_rename",
         {"name": "invoice 1 - supplier.pdf"})
    # partly unwound: --wait exits 3, the unwind did not end unwound
    assert await acli(temporal_env, task_queue, "unwind", "uw-part", "--yes", "--wait") == 3
    assert names(drive, files) == ["invoice 1 - supplier.pdf", "scan-2.pdf", "scan-3.pdf"]
    capsys.readouterr()
    updates = len(effects(server, "drive", "files.update"))
    assert await acli(temporal_env, task_queue, "resume", "uw-part", "--wait") == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "partly unwound" in err[0], err
    report = commands.status(store.conninfo, "uw-part")
    assert report.state == "partly_unwound"
    assert report.progress.stop is not None  # nothing was released
    # A run started by other means refuses too, and nothing acts.
    again = await run_result(await start(temporal_env.client, {"task_id": "uw-part"},
                                         task_queue))
    assert again.state == "partly_unwound"
    assert len(effects(server, "drive", "files.update")) == updates
    assert names(drive, files) == ["invoice 1 - supplier.pdf", "scan-2.pdf", "scan-3.pdf"]


# -- item 6: a trashed or unshared file is unknown to the probe and the gate -------------------

@pytest.mark.parametrize("change", ["trashed", "unshared"])
async def test_the_gate_stops_on_a_renamed_file_that_was_trashed_or_unshared(
        temporal_env: WorkflowEnvironment, store: JournalStore, server: StagingServer,
        drive: Any, staged, task_queue: str, change: str) -> None:
    staged.start()
    # Ours to trash; or owned by a colleague who shared it with us as an editor, and unshares.
    share = {} if change == "trashed" else {"owner": "colleague",
                                            "shared": {"default": "writer"}}
    files = [drive.seed(f"scan-{i}.pdf", **share) for i in range(1, 4)]
    handle = await start(temporal_env.client, drive_doc("uw-trash", files), task_queue)
    await wait_state(handle, "awaiting_approval")
    if change == "trashed":  # the Drive UI's "Move to trash": files.update with trashed
        owner = drive_client(server.url, staging_tokens.DRIVE_WRITE)
        owner.files().update(fileId=files[1].id, body={"trashed": True}).execute()
        assert drive.files[files[1].id].name == "invoice 2.pdf"  # our name and stamp stay
    else:
        post(server, f"/_staging/drive/files/{files[1].id}/share",
             {"account": "default", "role": None})
    assert await acli(temporal_env, task_queue, "approve", "uw-trash", "--by", "ana") == 0
    result = await run_result(handle)
    assert result.state == "verification_failed"
    [failure] = result.error["failures"]
    assert failure["step"] == 2, failure
    assert effects(server, "gmail", "drafts.send") == []


# -- item 12: no data loss, and no compensation while a twin may act ---------------------------

async def test_an_unwind_never_replaces_a_file_that_took_the_original_name(
        temporal_env: WorkflowEnvironment, store: JournalStore, server: StagingServer,
        staged, task_queue: str, tmp_path: Path) -> None:
    from helpers.fs_roots import FS_ROOTS
    docs = Path(FS_ROOTS.split(os.pathsep)[0]) / f"uw-noreplace-{time.time_ns()}"
    docs.mkdir(parents=True)
    for i in (1, 2):
        (docs / f"scan-{i}.pdf").write_text(f"ours {i}")
    staged.start()
    doc = {"task_id": "uw-noreplace", "steps": [
        {"action": "fs.rename", "args": {"path": str(docs / f"scan-{i}.pdf"),
                                         "name": f"invoice {i}.pdf"}} for i in (1, 2)]}
    assert (await run_result(await start(temporal_env.client, doc, task_queue))).state == \
        "completed"
    (docs / "scan-1.pdf").write_text("somebody's new scan")  # took step 1's original name
    assert await acli(temporal_env, task_queue, "unwind", "uw-noreplace", "--yes",
                      "--wait") == 3  # refused: the unwind ended failed, not unwound
    assert (docs / "scan-1.pdf").read_text() == "somebody's new scan"
    assert (docs / "invoice 1.pdf").read_text() == "ours 1"  # left for a person
    assert (docs / "scan-2.pdf").read_text() == "ours 2"
    [refused] = [r for r in undo_rows(store, "uw-noreplace") if r.status == "failed"]
    assert refused.step == 1
    assert commands.status(store.conninfo, "uw-noreplace").state == "partly_unwound"


async def test_an_unwind_waits_out_the_lease_of_an_attempt_that_may_still_be_acting(
        temporal_env: WorkflowEnvironment, store: JournalStore, server: StagingServer,
        drive: Any, staged, task_queue: str) -> None:
    # Each rename is held 4 s at the provider (under the client's 5 s timeout), then applied;
    # step 2's worker dies while its request is in flight, and the Drive applies it after. The
    # 4 s run from the request's arrival, which a loaded machine delays past the intent's
    # commit: a horizon of 3 s covers that, as it covers a slow commit at the real Drive.
    staged.env["TIDEMARK_DRIVE_HORIZON_S"] = "3"
    first = staged.start()
    files = [drive.seed(f"scan-{i}.pdf") for i in range(1, 3)]
    arm(server, "drive", "files.update", "delay", seconds=4, times=2)
    handle = await start(temporal_env.client, drive_doc("uw-twin", files, mail=False),
                         task_queue)
    # Kill the worker once step 2's rename has reached the provider: its intent row alone may
    # commit before the request leaves, and a request never sent is rightly found not applied.
    for _ in range(600):
        if any(q.path.endswith(files[1].id) for q in server.staging.requests_of("drive")):
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail("step 2's rename never reached the staging Drive")
    first.kill()  # SIGKILL: its request is in flight, its lease stays
    first.wait()
    assert await acli(temporal_env, task_queue, "stop", "uw-twin") == 0
    await handle.terminate("replaced by an unwind")
    [do2] = [r for r in store.rows("uw-twin") if r.step == 2 and r.phase == "do"]
    assert do2.outcome is None and do2.lease_until is not None
    staged.start()
    assert await acli(temporal_env, task_queue, "unwind", "uw-twin", "--yes", "--wait") == 0
    [undo2] = [r for r in undo_rows(store, "uw-twin") if r.step == 2]
    assert undo2.started_at >= do2.lease_until  # nothing acted on step 2 before it lapsed
    [do2] = [r for r in store.rows("uw-twin") if r.step == 2 and r.phase == "do"]
    assert (do2.status, do2.resolved_by) == ("done", "probe")  # the late rename was found
    assert names(drive, files) == ["scan-1.pdf", "scan-2.pdf"]
    assert commands.status(store.conninfo, "uw-twin").state == "unwound"
