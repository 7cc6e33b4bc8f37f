"""Series, scheduled runs with a planner, `tidemark kill` in layers, and their end states.

The Web UI tells the end states apart. On a real Temporal dev server, real worker processes, real
Postgres and the staging servers."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from googleapiclient.errors import HttpError
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment

from activities.drive import drive_client
from activities.granted import acting_for
from activities.wiring import worker_registry
from helpers.ledger import LedgerRecord, ledger_lines
from helpers.planners import calls
from helpers.runs import start
from helpers.staging_fixtures import arm
from helpers.wait import assert_eventually
from staging.core import StagingServer
from staging.drive import DriveTarget
from tidemark import series
from tidemark.actions import StepContext
from tidemark.errors import Unauthorized, UnknownTask
from tidemark.grants import GrantBroker, revoke_task_grants
from tidemark.payloads import RunResult
from tidemark.plan import load_plan
from tidemark.run_step import run_step
from tidemark.store import JournalStore
from tools.operate import commands, schedules
from tools.operate.kill import kill
from tools.stack.devstack import temporal_binary
from workflows.outcome import run_result


def ledger_steps(ledger: Path, prefix: str, n: int, **extra: Any) -> list[dict[str, Any]]:
    return [{"action": "ledger.record", "args": {"ledger": str(ledger), "entry": f"{prefix}{i}",
                                                 **extra}} for i in range(1, n + 1)]


def entries(ledger: Path) -> list[str]:
    return [line.split(" ", 1)[1] for line in ledger_lines(ledger)]


def temporal_cli(address: str, *args: str) -> str:
    done = subprocess.run([temporal_binary(), *args, "--address", address],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


async def triggered_run(client: Client, address: str, series_name: str,
                        seen: set[str]) -> RunResult:
    """Triggers the series' schedule as an operator would, and returns that run's result.

    Not that of a run an earlier test of the session started for a series of the same name."""
    known = seen | {wf.id async for wf in client.list_workflows('WorkflowType="ScheduledRun"')}
    temporal_cli(address, "schedule", "trigger", "--schedule-id",
                 schedules.schedule_id(series_name))
    deadline = time.monotonic() + 30
    while True:
        ids = [wf.id async for wf in client.list_workflows('WorkflowType="ScheduledRun"')
               if wf.id.startswith(f"tidemark-sched-{series_name}-") and wf.id not in known]
        if ids:
            break
        assert time.monotonic() < deadline, "the trigger started no ScheduledRun"
        await asyncio.sleep(0.2)
    seen.add(ids[0])
    return await asyncio.wait_for(run_result(client.get_workflow_handle(ids[0])), timeout=60)


async def test_a_killed_run_blocks_the_next_until_a_person_settles_and_releases_it(
        temporal_env: WorkflowEnvironment, store: JournalStore, tmp_path: Path, workers,
        task_queue: str) -> None:
    client = temporal_env.client
    address = workers.env["TEMPORAL_ADDRESS"]
    ledger, calls_file = tmp_path / "ledger", tmp_path / "planner-calls"
    workers.start()
    store.declare_series("nightly", "ops", "ops")  # what `tidemark schedule create` does too
    await schedules.create(client, "nightly", "0 3 * * *", "helpers.planners:nightly",
                           {"calls": str(calls_file), "ledger": str(ledger), "n": 3},
                           task_queue, by="ops")
    # Run 122 of the nightly series, killed mid-run at 02:10.
    doc = {"task_id": "nightly-122", "series": "nightly",
           "steps": ledger_steps(ledger, "r122-", 8, hold_s=0.3)}
    h122 = await start(client, doc, task_queue)
    assert_eventually(lambda: len(entries(ledger)) >= 2, timeout=30)
    layers = await kill(client, store, task="nightly-122", reason="wrong supplier folder",
                        by="ops")
    assert [(x["layer"], x["done"]) for x in layers] == [(1, True), (2, True), (3, True),
                                                         (4, True)], layers
    assert layers[1]["detail"] == {"nightly": "paused"}
    # The kill signal comes before layer 1: the run does not end itself on meeting the stop
    # state `killed`; it says killed and is terminated once its step under way has ended.
    assert layers[3]["detail"]["tidemark-nightly-122"].startswith("terminated (killed; ")
    desc = await h122.describe()
    assert desc.status == WorkflowExecutionStatus.TERMINATED
    assert dict((k.name, v) for k, v in desc.typed_search_attributes)["TidemarkState"] == \
        "killed"
    assert (await schedules.describe(client, "nightly"))["paused"] is True
    stop = store.stop_state("nightly-122")
    assert stop is not None and (stop["state"], stop["set_by"], stop["reason"]) == (
        "killed", "ops", "wrong supplier folder")
    time.sleep(0.6)  # the attempt under way when the workflow was terminated may still land
    after_kill = entries(ledger)
    assert 2 <= len(after_kill) < 8

    # Run 123, triggered on the paused schedule: calls no planner, acts on nothing, blocked.
    seen: set[str] = set()
    r123 = await triggered_run(client, address, "nightly", seen)
    assert r123.state == "blocked" and r123.error["type"] == "SeriesBlocked"
    assert "nightly-122 (killed)" in r123.error["message"]
    assert calls(calls_file) == [] and entries(ledger) == after_kill
    with pytest.raises(UnknownTask):
        commands.status(store.conninfo, r123.task_id)  # no plan was even persisted

    # A person settles 122 (release, resume to completion) and unpauses; run 124 runs.
    commands.release(store.conninfo, "nightly-122", "folder checked", "ops")
    r122 = await run_result(await start(client, {"task_id": "nightly-122"}, task_queue))
    assert (r122.state, r122.confirmed) == ("completed", 8)
    await schedules.unpause(client, "nightly", "ops: 122 settled")
    r124 = await triggered_run(client, address, "nightly", seen)
    assert (r124.state, r124.confirmed, r124.executed) == ("completed", 3, 3)
    assert len(calls(calls_file)) == 1
    assert len(entries(ledger)) == 8 + 3

    listed = series.listing(store, "nightly")
    assert [(r["task_id"], r["state"]) for r in listed["runs"]] == [
        ("nightly-122", "completed"), (r124.task_id, "completed")]
    assert [b["task_id"] for b in listed["blocked"]] == [r123.task_id]
    await schedules.delete(client, "nightly")


async def test_a_stopped_series_or_an_unsettled_earlier_run_blocks_a_direct_start(
        temporal_env: WorkflowEnvironment, store: JournalStore, tmp_path: Path, workers,
        task_queue: str) -> None:
    client = temporal_env.client
    ledger, gate = tmp_path / "ledger", tmp_path / "gate"
    workers.start()
    gate.write_text("closed")
    store.declare_series("sync", "ops", "ops")
    first = {"task_id": "s-1", "series": "sync",
             "steps": ledger_steps(ledger, "a", 2, gate_file=str(gate))}
    r1 = await run_result(await start(client, first, task_queue))
    assert r1.state == "precondition_failed"
    second = {"task_id": "s-2", "series": "sync", "steps": ledger_steps(ledger, "b", 2)}
    r2 = await run_result(await start(client, second, task_queue))
    assert (r2.state, r2.error["type"]) == ("blocked", "SeriesBlocked")
    # its gate refused it: the block names it as status does
    assert "s-1 (precondition_failed)" in r2.error["message"] and entries(ledger) == []

    gate.unlink()
    assert (await run_result(await start(client, {"task_id": "s-1"}, task_queue))).state == \
        "completed"
    commands.stop(store.conninfo, "series:sync", "audit", "ops")
    r2 = await run_result(await start(client, second, task_queue, "s-2"))
    assert r2.state == "blocked" and "release --series sync" in r2.error["message"]
    commands.release(store.conninfo, "series:sync", "audit done", "ops")
    r2 = await run_result(await start(client, second, task_queue, "s-2"))
    assert (r2.state, r2.executed) == ("completed", 2)
    assert entries(ledger) == ["a1", "a2", "b1", "b2"]


async def test_kill_during_a_slow_drive_call_revokes_the_grant_and_nothing_after_it_acts(
        temporal_env: WorkflowEnvironment, store: JournalStore, server: StagingServer,
        drive: DriveTarget) -> None:
    client = temporal_env.client
    files = [drive.seed(f"scan-{i}.pdf") for i in (1, 2, 3)]
    await schedules.create(client, "drive-sync", "0 3 * * *", "helpers.planners:nightly", {},
                           "tq-drive-sync")
    doc = {"task_id": "drive-kill", "series": "drive-sync", "steps": [
        {"action": "drive.rename", "args": {"file_id": f.id, "name": f"n{i}.pdf"}}
        for i, f in enumerate(files, start=1)]}
    # A wedged worker: its workflow's task queue has no live poller, while its step thread
    # (the worker's own code path: run_step under the task's grants) keeps going.
    registry = worker_registry({"TIDEMARK_STAGING_URL": server.url})
    plan = load_plan(doc, registry)
    series.admit(store, plan.task_id, "drive-sync")
    store.persist_plan(plan)
    handle = await client.start_workflow("RunPlan", {"task_id": "drive-kill"},
                                         id="tidemark-drive-kill", task_queue="tq-wedged")
    # Step 1's first Drive call (its gate's files.get) hangs for 3 s at the provider.
    arm(server, "drive", "files.get", "delay", seconds=3.0)
    raised: list[Exception] = []

    def wedged() -> None:
        with acting_for(GrantBroker(store), "drive-kill"):
            for step in (1, 2, 3):
                try:
                    run_step(store, registry, "drive-kill", step)
                except Exception as e:  # a wedged loop just goes on to the next step
                    raised.append(e)

    thread = threading.Thread(target=wedged)
    thread.start()
    assert_eventually(lambda: not server.staging.faults, timeout=10)  # the call is under way
    killed_at = time.time()
    layers = await kill(client, store, task="drive-kill", reason="runaway", by="ops")
    assert all(x["done"] for x in layers), layers
    assert layers[3]["detail"] == {  # no worker polls the wedged run's task queue
        "tidemark-drive-kill": "terminated (no worker took the kill signal; its TidemarkState "
                               "still says what it said before)",
        "tidemark-unwind-drive-kill": "no such workflow"}
    assert (await handle.describe()).status == WorkflowExecutionStatus.TERMINATED
    assert (await schedules.describe(client, "drive-sync"))["paused"] is True
    await asyncio.to_thread(thread.join, 20)

    # The slow call returned; the step's next call (the snapshot's files.get) was refused.
    assert [type(e).__name__ for e in raised] == ["Unauthorized", "TaskStopped",
                                                  "TaskStopped"], raised
    assert "revoked" in str(raised[0]) and "by ops" in str(raised[0])
    refused = [e for e in store.events("drive-kill") if e["kind"] == "grant"
               and "refused" in e["detail"]]
    assert len(refused) == 1 and refused[0]["at"].timestamp() > killed_at
    # Nothing was renamed (the worker's start created its identity check's scratch file).
    assert [e for e in _effects(server, "drive") if e["op"] != "files.create"] == []
    assert [drive.files[f.id].name for f in files] == ["scan-1.pdf", "scan-2.pdf",
                                                       "scan-3.pdf"]
    assert store.rows("drive-kill") == []  # no intent: nothing after the kill started

    grants = store.grants("drive-kill")
    assert [(g["target"], g["scope"], g["revoked_by"]) for g in grants] == [
        ("drive", "read", "ops")]
    assert all(g["revoked"].timestamp() >= killed_at - 1 for g in grants)
    minted = [t for t in server.staging.tokens.values() if t.token.startswith("grant-")]
    assert len(minted) == 1 and minted[0].revoked
    with pytest.raises(HttpError) as e:  # the provider refuses the task's token itself
        drive_client(server.url, minted[0].token).files().get(
            fileId=files[1].id).execute(num_retries=0)
    assert e.value.status_code == 401
    await schedules.delete(client, "drive-sync")


async def test_workflow_list_tells_runs_that_need_a_person_from_finished_ones(
        temporal_env: WorkflowEnvironment, store: JournalStore, tmp_path: Path, workers,
        task_queue: str) -> None:
    client = temporal_env.client
    ledger, gate = tmp_path / "ledger", tmp_path / "gate"
    gate.write_text("closed")
    workers.start()
    done = await run_result(await start(client, {"task_id": "ui-done", "steps": ledger_steps(
        ledger, "d", 1)}, task_queue))
    gated = await run_result(await start(client, {"task_id": "ui-gated", "steps": ledger_steps(
        ledger, "g", 1, gate_file=str(gate))}, task_queue))
    commands.stop(store.conninfo, "ui-stopped", "", "ops", force_unknown=True)
    stopped_doc = {"task_id": "ui-stopped", "steps": ledger_steps(ledger, "s", 1)}
    stopped = await run_result(await start(client, stopped_doc, task_queue))
    assert (done.state, gated.state, stopped.state) == ("completed", "precondition_failed",
                                                          "stopped")
    out = temporal_cli(workers.env["TEMPORAL_ADDRESS"], "workflow", "list", "--query",
                       'WorkflowId STARTS_WITH "tidemark-ui-"', "--output", "json")
    by_id = {w["execution"]["workflowId"]: w["status"] for w in _json_lines(out)}
    assert by_id == {"tidemark-ui-done": "WORKFLOW_EXECUTION_STATUS_COMPLETED",
                     "tidemark-ui-gated": "WORKFLOW_EXECUTION_STATUS_FAILED",
                     "tidemark-ui-stopped": "WORKFLOW_EXECUTION_STATUS_FAILED"}
    failed = await client.get_workflow_handle("tidemark-ui-gated").describe()
    assert failed.typed_search_attributes is not None


def _json_lines(out: str) -> list[dict[str, Any]]:
    text = out.strip()
    if text.startswith("["):
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _effects(server: StagingServer, target: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{server.url}/_staging/effects?target={target}",
                                timeout=5) as r:
        return json.loads(r.read())


def test_the_supplier_sync_planner_lists_the_drive_inbox_and_plans_renames_then_a_mail(
        server: StagingServer, drive: DriveTarget, monkeypatch: pytest.MonkeyPatch) -> None:
    from examples.supplier_sync_planner import plan as supplier_plan

    monkeypatch.setenv("TIDEMARK_STAGING_URL", server.url)
    for k in ("TIDEMARK_DRIVE_URL", "TIDEMARK_DRIVE_WRITE_TOKEN", "TIDEMARK_DRIVE_READ_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    inbox = [drive.seed(f"scan-{i:03d}.pdf") for i in range(1, 131)]  # two pages and more
    drive.seed("scan-999.pdf", trashed=True)
    drive.seed("notes scan-1.txt")
    drive.seed("theirs-scan-5.pdf", owner="carol")  # not visible to our account
    when = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
    doc = supplier_plan({"prefix": "scan-", "to": ["ap@supplier.example"]}, when)
    checked = load_plan({**doc, "task_id": "supplier-sync-x", "series": "supplier-sync"},
                        worker_registry({"TIDEMARK_STAGING_URL": server.url}))
    renames = [s for s in checked.steps if s.action == "drive.rename"]
    assert sorted(s.args["file_id"] for s in renames) == sorted(f.id for f in inbox)
    assert renames[0].args["name"] == "2026-11-30 supplier 001.pdf"
    assert [s.action for s in checked.steps[len(renames):]] == ["gmail.send"]
    assert "130 files" in checked.steps[-1].args["body"]


async def test_cli_series_stop_release_status_schedule_and_kill(
        temporal_env: WorkflowEnvironment, store: JournalStore, db_url: str,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from tools.cli.main import main

    monkeypatch.setenv("DATABASE_URL", db_url)
    address = temporal_env.client.service_client.config.target_host
    monkeypatch.setenv("TEMPORAL_ADDRESS", address)
    registry = worker_registry({})
    registry.register(LedgerRecord())
    plan = load_plan({"task_id": "cli-1", "series": "cli",
                      "steps": ledger_steps(Path("/nonexistent/ledger"), "c", 1)}, registry)
    series.admit(store, plan.task_id, "cli")
    store.persist_plan(plan)

    def cli(*args: str) -> tuple[int, str]:
        code = main(list(args))
        return code, capsys.readouterr().out

    assert (await asyncio.to_thread(cli, "stop", "--series", "cli", "--reason", "audit"))[0] == 0
    code, out = await asyncio.to_thread(cli, "status", "--series", "cli", "--json")
    data = json.loads(out)
    assert data["stopped"]["state"] == "stopped" and data["runs"][0]["task_id"] == "cli-1"
    assert data["runs"][0]["state"] == "partial"
    assert (await asyncio.to_thread(cli, "release", "--series", "cli"))[0] == 0
    assert json.loads((await asyncio.to_thread(cli, "status", "--series", "cli", "--json"))[1]
                      )["stopped"] is None
    assert (await asyncio.to_thread(main, ["stop", "cli-1", "--series", "cli"])) == 2  # usage

    code, out = await asyncio.to_thread(
        cli, "schedule", "create", "cli", "--cron", "0 3 * * *", "--planner",
        "helpers.planners:nightly", "--args", '{"n": 1}')
    assert code == 0 and "tidemark-series-cli" in out
    listed = json.loads((await asyncio.to_thread(cli, "schedule", "list", "--json"))[1])
    assert [(s["series"], s["paused"], s["planner"], s["args"]) for s in listed] == [
        ("cli", False, "helpers.planners:nightly", {"n": 1})]
    assert (await asyncio.to_thread(main, ["kill", "--all"])) == 2  # needs --yes
    code, out = await asyncio.to_thread(cli, "kill", "--series", "cli", "--reason", "drill",
                                        "--by", "ops", "--json")
    layers = json.loads(out)["committed"]["layers"]
    assert code == 0 and [x["layer"] for x in layers] == [1, 2, 3, 4]
    assert layers[1]["detail"] == {"cli": "paused"}
    assert store.stop_state("cli-1")["state"] == "killed"
    assert (await asyncio.to_thread(cli, "schedule", "delete", "cli"))[0] == 0


def test_stripe_and_gmail_calls_present_per_task_grants_that_a_kill_revokes(
        store: JournalStore, server: StagingServer) -> None:
    registry = worker_registry({"TIDEMARK_STAGING_URL": server.url})
    doc = {"task_id": "pay-1", "steps": [
        {"action": "gmail.send", "args": {"to": ["ap@supplier.example"], "subject": "s",
                                          "body": "b"}},
        {"action": "graph.send_mail", "args": {"to": ["ap@supplier.example"], "subject": "s",
                                               "body": "b"}},
        {"action": "stripe.payment_intent", "args": {"amount": 1200, "currency": "usd"}},
        {"action": "stripe.payment_intent", "args": {"amount": 1300, "currency": "usd"}}]}
    store.persist_plan(load_plan(doc, registry))
    broker = GrantBroker(store)
    with acting_for(broker, "pay-1"):
        for step in (1, 2, 3):
            run_step(store, registry, "pay-1", step)
    grants = store.grants("pay-1")
    assert sorted((g["target"], g["scope"]) for g in grants) == [
        ("gmail", "read"), ("gmail", "write"), ("graph", "read"), ("graph", "write"),
        ("stripe", "read"), ("stripe", "write")]  # each one issued once; every step reads
    #                                              through its grants (Stripe: its clock)
    minted = {t.token: t for t in server.staging.tokens.values() if "grant-" in t.token}
    assert len(minted) == len(grants)
    assert sum(t.startswith("sk_test_grant-") for t in minted) == 1  # the mode is kept

    store.set_killed("pay-1", "drill", "ops")  # what `tidemark kill` does first
    revoke_task_grants(store, "pay-1", "ops")
    assert all(t.revoked for t in minted.values())
    with acting_for(broker, "pay-1"), pytest.raises(Unauthorized, match="revoked"):
        registry.bound("stripe.payment_intent").execute(StepContext(
            task_id="pay-1", step=4, action="stripe.payment_intent",
            args={"amount": 1300, "currency": "usd"}, key="1" * 32))  # a wedged worker's call
    assert len(_effects(server, "stripe")) == 1  # it created nothing

    # Released by a person, the task gets fresh grants and goes on.
    commands.release(store.conninfo, "pay-1", "settled", "ops")
    with acting_for(broker, "pay-1"):
        assert run_step(store, registry, "pay-1", 4).status == "done"
    assert len(store.grants("pay-1")) == 8 and len(_effects(server, "stripe")) == 2


async def test_a_scheduled_supplier_sync_plans_from_the_drive_inbox_and_runs_it(
        temporal_env: WorkflowEnvironment, store: JournalStore, server: StagingServer,
        drive: DriveTarget, workers, task_queue: str) -> None:
    client = temporal_env.client
    inbox = [drive.seed(f"scan-{i:03d}.pdf") for i in (1, 2, 3)]
    other = drive.seed("contract.pdf")
    root = str(Path(__file__).resolve().parent.parent)  # the worker imports examples.*
    workers.start(TIDEMARK_STAGING_URL=server.url, PYTHONPATH=root)
    store.declare_series("supplier-sync", "ops", "ops")
    await schedules.create(client, "supplier-sync", "0 3 * * *",
                           "examples.supplier_sync_planner:plan",
                           {"prefix": "scan-", "to": ["ap@supplier.example"]}, task_queue)
    result = await triggered_run(client, workers.env["TEMPORAL_ADDRESS"], "supplier-sync", set())
    assert (result.state, result.confirmed, result.executed) == ("completed", 4, 4)
    assert result.task_id.startswith("sched-supplier-sync-2")
    names = sorted(drive.files[f.id].name for f in inbox)
    assert all(n.endswith((" supplier 001.pdf", " supplier 002.pdf", " supplier 003.pdf"))
               for n in names) and drive.files[other.id].name == "contract.pdf"
    assert len([e for e in _effects(server, "gmail") if e["op"] == "drafts.send"]) == 1
    assert [r["task_id"] for r in series.listing(store, "supplier-sync")["runs"]] == [
        result.task_id]
    assert {g["target"] for g in store.grants(result.task_id)} == {"drive", "gmail"}
    await schedules.delete(client, "supplier-sync")


async def test_kill_all_stops_everything_pauses_every_schedule_and_revokes_every_grant(
        temporal_env: WorkflowEnvironment, store: JournalStore, server: StagingServer,
        drive: DriveTarget) -> None:
    client = temporal_env.client
    registry = worker_registry({"TIDEMARK_STAGING_URL": server.url})
    f = drive.seed("scan-1.pdf")
    for task in ("all-1", "all-2"):
        store.persist_plan(load_plan({"task_id": task, "steps": [
            {"action": "drive.rename", "args": {"file_id": f.id, "name": f"{task}.pdf"}}]},
            registry))
        with acting_for(GrantBroker(store), task):
            registry.bound("drive.rename").snapshot(StepContext(
                task_id=task, step=1, action="drive.rename",
                args={"file_id": f.id, "name": "x.pdf"}, key="2" * 32))
    await schedules.create(client, "all-a", "0 3 * * *", "helpers.planners:nightly", {}, "tq-x")
    await schedules.create(client, "all-b", "0 4 * * *", "helpers.planners:nightly", {}, "tq-x")
    wedged = await client.start_workflow("RunPlan", {"task_id": "all-1"}, id="tidemark-all-1",
                                         task_queue="tq-nobody")
    layers = await kill(client, store, everything=True, reason="incident", by="ops")
    assert all(x["done"] for x in layers), layers
    assert layers[0]["detail"]["scope"] == "*"
    assert {"all-a": "paused", "all-b": "paused"}.items() <= layers[1]["detail"].items()
    assert sorted(g["task_id"] for g in layers[2]["detail"]) == ["all-1", "all-2"]
    assert layers[3]["detail"]["tidemark-all-1"].startswith("terminated (no worker took")
    assert (await wedged.describe()).status == WorkflowExecutionStatus.TERMINATED
    assert store.stop_state("all-2")["state"] == "killed"
    assert all(t.revoked for t in server.staging.tokens.values() if "grant-" in t.token)
    for s in ("all-a", "all-b"):
        assert (await schedules.describe(client, s))["paused"] is True
        await schedules.delete(client, s)
