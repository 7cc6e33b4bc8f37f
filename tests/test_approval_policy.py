"""Approval is the operator's policy, and every call a task makes goes through its grant.

A series belongs to the operator, and every call a task makes to a target goes through its grant.
All on a real Temporal dev server, real worker processes, real Postgres, the real `tidemark`
command and the staging servers."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from helpers.roles import OS_USER
from helpers.runs import start
from helpers.staging_fixtures import effects
from helpers.wait import assert_eventually
from staging.core import StagingServer
from staging.drive import DriveTarget
from tidemark.errors import UnknownTask
from tidemark.grants import revoke_task_grants
from tidemark.payloads import RunResult
from tidemark.store import JournalStore
from tools.operate import commands, schedules
from tools.stack.devstack import temporal_binary
from workflows.outcome import run_result

ME = OS_USER  # the person running the tests: their login role is an operator and an approver
MAIL = {"to": ["ap@supplier.example", "ar@supplier.example"], "cc": ["books@ours.example"],
        "subject": "Q3 invoices paid", "body": "Paid."}
YEN = {"amount": 50000, "currency": "jpy", "description": "Q3 supplier run"}


def ledger_steps(ledger: Path, n: int) -> list[dict[str, Any]]:
    return [{"action": "ledger.record", "args": {"ledger": str(ledger), "entry": f"e{i}"}}
            for i in range(1, n + 1)]


def paying_steps(where: Path, pay: dict[str, Any] = YEN) -> list[dict[str, Any]]:
    """Two renames of files under ``where`` (reversible), then a mail and a payment."""
    where.mkdir()
    for i in (1, 2):
        (where / f"scan-{i}.pdf").write_text(str(i))
    return [*({"action": "fs.rename", "args": {"path": str(where / f"scan-{i}.pdf"),
                                               "name": f"invoice {i}.pdf"}} for i in (1, 2)),
            {"action": "gmail.send", "args": MAIL},
            {"action": "stripe.payment_intent", "args": pay}]


def sent(server: StagingServer) -> tuple[int, int]:
    """(mails sent, payments created) on the staging servers."""
    return (len(effects(server, "gmail", "drafts.send")),
            len(effects(server, "stripe", "payment_intents.create")))


async def wait_state(handle: WorkflowHandle[Any, RunResult], state: str,
                     timeout: float = 60) -> None:
    status: dict[str, Any] = {}
    for _ in range(int(timeout / 0.1)):
        status = await handle.query("status")
        if status["state"] == state:
            return
        if status["state"] not in ("running", "awaiting_approval"):
            break
        await asyncio.sleep(0.1)
    desc = await handle.describe()
    raise AssertionError(f"never reached {state}: {status} ({desc.status})")


def approvals(store: JournalStore, task_id: str) -> list[dict[str, Any]]:
    return [e for e in store.events(task_id) if e["kind"] == "approval"]


@pytest.fixture
def policy_workers(workers, server: StagingServer):  # type: ignore[no-untyped-def]
    """Workers on the staging servers with no approval policy configured: the default."""
    workers.env["TIDEMARK_STAGING_URL"] = server.url
    workers.env.pop("TIDEMARK_APPROVAL", None)
    workers.env.pop("TIDEMARK_APPROVERS", None)
    return workers


# -- item 8: approval is the operator's policy ------------------------------------------------

async def test_by_default_every_irreversible_step_waits_and_only_a_listed_role_decides(
        temporal_env: WorkflowEnvironment, store: JournalStore, server: StagingServer,
        policy_workers, task_queue: str, tmp_path: Path, cli) -> None:
    """A plan that says nothing about approval does not pay or mail unattended.

    The approve command says what it approved: every recipient, the subject, the body's start and
    50,000 JPY (not 500.00), and the decision is recorded under the login role, --by beside it."""
    policy_workers.start(TIDEMARK_APPROVERS=f"ana,{ME}")
    doc = {"task_id": "pol-default", "steps": paying_steps(tmp_path / "docs")}
    handle = await start(temporal_env.client, doc, task_queue)
    await wait_state(handle, "awaiting_approval")
    await asyncio.sleep(0.5)
    assert sent(server) == (0, 0) and store.progress("pol-default").last_step == 2

    code, out, err = await cli("approve", "pol-default", "--by", "Ana on call")
    assert (code, err) == (0, "")
    assert out.startswith(f"approve of task pol-default by {ME} (Ana on call) is journaled")
    for seen in ("ap@supplier.example, ar@supplier.example", "cc books@ours.example",
                 "'Q3 invoices paid'", "body 'Paid.'", "50,000 JPY", "step 3 gmail.send",
                 "step 4 stripe.payment_intent",
                 "it covers: 1 gmail.send, 1 stripe.payment_intent; in all 50,000 JPY; to "
                 "ap@supplier.example, ar@supplier.example, books@ours.example"):
        assert seen in out, seen
    assert "500.00" not in out
    result = await run_result(handle)
    assert (result.state, result.confirmed) == ("completed", 4)
    assert sent(server) == (1, 1)
    [decision] = approvals(store, "pol-default")
    assert decision["actor"] == ME and decision["detail"]["label"] == "Ana on call"
    report = commands.status(store.conninfo, "pol-default").as_json()
    assert report["approval"]["approvers"] == sorted(["ana", ME])
    assert report["approval"]["by"] == ME


async def test_a_decision_by_a_role_not_listed_is_refused_whatever_by_says(
        temporal_env: WorkflowEnvironment, store: JournalStore, server: StagingServer,
        policy_workers, task_queue: str, tmp_path: Path, cli) -> None:
    policy_workers.start(TIDEMARK_APPROVERS="ana")
    doc = {"task_id": "pol-who", "steps": paying_steps(tmp_path / "docs")}
    handle = await start(temporal_env.client, doc, task_queue)
    await wait_state(handle, "awaiting_approval")
    for verb in ("approve", "reject"):
        code, out, err = await cli(verb, "pol-who", "--by", "ana")  # typing a name is not it
        assert code == 1 and out == ""
        assert err.count("\n") == 1
        assert f"{ME} may not decide on task pol-who: its approvers are ana" in err
    assert approvals(store, "pol-who") == [] and store.stop_state("pol-who") is None
    await asyncio.sleep(0.5)
    assert (await handle.query("status"))["state"] == "awaiting_approval"
    assert sent(server) == (0, 0)
    await handle.signal("halt", "test over")
    assert (await run_result(handle)).state == "halted"


async def test_with_no_approvers_listed_only_the_roles_an_operator_granted_decide(
        temporal_env: WorkflowEnvironment, store: JournalStore, server: StagingServer,
        policy_workers, task_queue: str, tmp_path: Path, cli, url_as,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With no approver list, only a member of tidemark_approver decides.

    No approver list is not an open door. An operator who is no approver and somebody with no
    role get one line each, and nothing is recorded; an approver then decides."""
    policy_workers.start()  # TIDEMARK_APPROVERS unset, no policy or series names any
    doc = {"task_id": "pol-nobody", "steps": paying_steps(tmp_path / "docs")}
    handle = await start(temporal_env.client, doc, task_queue)
    await wait_state(handle, "awaiting_approval")
    for role in ("olga", "mallory"):
        monkeypatch.setenv("DATABASE_URL", url_as(role))
        for verb in ("approve", "reject"):
            code, out, err = await cli(verb, "pol-nobody", "--by", "ana")
            assert code == 1 and out == ""
            assert err.count("\n") == 1 and f"to the role {role}" in err, err
    assert approvals(store, "pol-nobody") == [] and store.stop_state("pol-nobody") is None
    await asyncio.sleep(0.5)
    assert (await handle.query("status"))["state"] == "awaiting_approval"
    assert sent(server) == (0, 0)
    monkeypatch.setenv("DATABASE_URL", url_as("ben"))
    code, out, err = await cli("approve", "pol-nobody")
    assert code == 0, err
    assert (await run_result(handle)).state == "completed"
    assert sent(server) == (1, 1)
    [decision] = approvals(store, "pol-nobody")
    assert decision["actor"] == "ben"


async def test_a_plan_can_ask_for_more_approval_never_less_and_cannot_name_approvers(
        temporal_env: WorkflowEnvironment, store: JournalStore, server: StagingServer,
        policy_workers, task_queue: str, tmp_path: Path) -> None:
    policy_workers.start(TIDEMARK_APPROVAL="amount>jpy:100000", TIDEMARK_APPROVERS=ME,
                         TIDEMARK_STRIPE_MAX_AMOUNT="1000000",
                         TIDEMARK_STRIPE_MAX_TASK_AMOUNT="1000000")
    client = temporal_env.client
    # Under the limit, and a mail is not a payment: runs unattended, as the operator said.
    small = {"task_id": "pol-small", "steps": paying_steps(tmp_path / "l1")}
    assert (await run_result(await start(client, small, task_queue))).state == "completed"
    assert sent(server) == (1, 1)
    # The plan asks for more: it waits.
    more = {"task_id": "pol-more", "steps": paying_steps(tmp_path / "l2"),
            "approval": {"required": True}}
    h_more = await start(client, more, task_queue)
    await wait_state(h_more, "awaiting_approval")
    # Over the limit, the plan saying it needs nobody: it waits all the same.
    big = {"task_id": "pol-less", "approval": {"required": False},
           "steps": paying_steps(tmp_path / "l3", {"amount": 150000, "currency": "jpy"})}
    h_less = await start(client, big, task_queue)
    await wait_state(h_less, "awaiting_approval")
    # A plan naming its own approvers is refused before anything is stored.
    bot = {"task_id": "pol-bot", "steps": paying_steps(tmp_path / "l4"),
           "approval": {"required": True, "approvers": ["planner-bot"]}}
    refused = await run_result(await start(client, bot, task_queue))
    assert (refused.state, refused.error["type"]) == ("failed", "PlanError")
    assert "cannot name its own approvers" in refused.error["message"]
    with pytest.raises(UnknownTask):
        commands.status(store.conninfo, "pol-bot")
    assert sent(server) == (1, 1) and (tmp_path / "l4" / "scan-1.pdf").exists()
    for h in (h_more, h_less):
        await h.signal("halt", "test over")
        assert (await run_result(h)).state == "halted"


def test_the_policy_setting_is_parsed_and_bad_values_are_one_line() -> None:
    from tidemark.approval import parse_policy, policy_from_env
    from tidemark.errors import ConfigError
    from tidemark.settings import load_settings

    assert policy_from_env({}).text == "all"
    p = parse_policy("amount>usd:400, amount>jpy:50000", ["ben", "ana"])
    assert (dict(p.limits), p.approvers) == ({"usd": 40000, "jpy": 50000}, ("ana", "ben"))
    usd = {"amount": 40000, "currency": "usd"}
    assert p.asks([usd]) is None
    assert p.asks([{"amount": 40001, "currency": "usd"}]) is not None
    assert p.asks([{"amount": 1, "currency": "eur"}]) is not None  # no limit named: a person
    assert p.asks([{"to": ["x@y.example"], "subject": "s"}]) is None
    # Split into five payments of 400.00 USD: 2,000.00 USD in one task is over the limit.
    assert "add up to 2,000.00 USD" in str(p.asks([usd] * 5))
    assert parse_policy("payments").asks([{"amount": 1, "currency": "eur"}]) is not None
    assert parse_policy("none").asks([{"amount": 10**9, "currency": "usd"}]) is None
    assert dict(parse_policy("daily>usd:1000").daily) == {"usd": 100000}
    for bad in ("", "some", "none,all", "amount>usd:-1", "amount>jpy:1.5", "amount>usd:1.001",
                "amount>usd:1,amount>usd:2", "payments,", "daily>usd:x"):
        with pytest.raises(ConfigError) as e:
            load_settings({"TIDEMARK_APPROVAL": bad})
        assert "TIDEMARK_APPROVAL" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="TIDEMARK_APPROVERS"):
        load_settings({"TIDEMARK_APPROVERS": "ana,bad name"})


def test_a_series_policy_that_no_longer_parses_makes_every_irreversible_step_wait() -> None:
    """A series policy this version cannot read makes every irreversible step wait.

    A series declared with a policy this version no longer reads (written by another one,
    say) is read as strictly as can be: every irreversible step waits for a person, whatever
    the operator's and the worker's policies let through."""
    from tidemark.approval import parse_policy, series_policy, why_asked

    none = parse_policy("none")
    unreadable = series_policy({"series": "nightly", "approval": "amount>usd:1.001"})
    for steps in ([{"to": ["x@y.example"], "subject": "s"}],
                  [{"amount": 1, "currency": "usd"}]):
        assert why_asked([none, unreadable, none], False, steps) is not None, steps
    assert unreadable is not None and "unreadable" in unreadable.text


def test_amounts_are_shown_in_the_currencys_own_units() -> None:
    from tidemark.will_do import what_it_will_do

    assert "50,000 JPY" in what_it_will_do(4, "stripe.payment_intent",
                                           {"amount": 50000, "currency": "jpy"})
    assert "500.00" not in what_it_will_do(4, "stripe.payment_intent",
                                           {"amount": 50000, "currency": "jpy"})
    assert "42.00 EUR" in what_it_will_do(4, "stripe.payment_intent",
                                          {"amount": 4200, "currency": "eur"})
    assert "1.500 KWD" in what_it_will_do(4, "stripe.payment_intent",
                                          {"amount": 1500, "currency": "kwd"})


# -- per schedule: the series' own policy, and a planner that tries to lower it ---------------

def temporal_cli(address: str, *args: str) -> str:
    done = subprocess.run([temporal_binary(), *args, "--address", address],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


async def triggered(client: Client, address: str, series: str) -> WorkflowHandle[Any, Any]:
    """The ScheduledRun that triggering the series' schedule started.

    Not one an earlier test of the session started for a series of the same name."""
    before = {wf.id async for wf in client.list_workflows('WorkflowType="ScheduledRun"')}
    temporal_cli(address, "schedule", "trigger", "--schedule-id", schedules.schedule_id(series))
    deadline = time.monotonic() + 30
    while True:
        ids = [wf.id async for wf in client.list_workflows('WorkflowType="ScheduledRun"')
               if wf.id.startswith(f"tidemark-sched-{series}-") and wf.id not in before]
        if ids:
            return client.get_workflow_handle(ids[0])
        assert time.monotonic() < deadline, "the trigger started no ScheduledRun"
        await asyncio.sleep(0.2)


async def child_of(client: Client, series: str) -> WorkflowHandle[Any, RunResult]:
    deadline = time.monotonic() + 60
    while True:
        ids = [wf.id async for wf in client.list_workflows('WorkflowType="RunPlan"')
               if wf.id.startswith(f"tidemark-sched-{series}-")]
        if ids:
            return client.get_workflow_handle(ids[0], result_type=RunResult)
        assert time.monotonic() < deadline, "the scheduled run started no RunPlan"
        await asyncio.sleep(0.2)


async def test_a_schedules_policy_holds_whatever_its_planner_returns(
        temporal_env: WorkflowEnvironment, store: JournalStore, server: StagingServer,
        policy_workers, task_queue: str, tmp_path: Path, cli) -> None:
    """A schedule's payment policy holds, whatever the planner and the worker say.

    The worker says none; the schedule says payments need a person; the planner returns a 400 USD
    payment and `"approval": {"required": false}`: the run waits for a person."""
    client = temporal_env.client
    policy_workers.start(TIDEMARK_APPROVAL="none")
    args = json.dumps({"ledger": str(tmp_path / "ledger"), "amount": 40000, "currency": "usd",
                       "approval": {"required": False}})
    code, out, err = await cli("schedule", "create", "paying", "--cron", "0 3 * * *",
                               "--planner", "helpers.planners:paying", "--args", args,
                               "--task-queue", task_queue, "--approval", "payments",
                               "--approvers", ME)
    assert code == 0, err
    assert json.loads(out)["approval"] == "payments"
    address = temporal_env.client.service_client.config.target_host
    await triggered(client, address, "paying")
    run = await child_of(client, "paying")
    await wait_state(run, "awaiting_approval")
    await asyncio.sleep(0.5)
    assert sent(server) == (0, 0)
    task_id = run.id.removeprefix("tidemark-")
    code, out, err = await cli("approve", task_id)
    assert code == 0 and "400.00 USD" in out, err
    assert (await run_result(run)).state == "completed"
    assert sent(server) == (1, 1)
    await schedules.delete(client, "paying")


async def test_a_bad_approval_flag_is_one_line_and_declares_or_creates_nothing(
        temporal_env: WorkflowEnvironment, store: JournalStore, cli) -> None:
    for bad in (["--approval", "amount>usd:x"], ["--approval", "sometimes"],
                ["--approvers", ""], ["--approval", "none,payments"]):
        code, out, err = await cli("schedule", "create", "bad-s", "--cron", "0 3 * * *",
                                   "--planner", "helpers.planners:nightly", *bad)
        assert (code, out) == (1, "") and err.count("\n") == 1, (bad, err)
        code, out, err = await cli("series", "declare", "bad-s", *bad)
        assert (code, out) == (1, "") and err.count("\n") == 1, (bad, err)
    assert store.declared_series("bad-s") is None
    assert await schedules.describe(temporal_env.client, "bad-s") is None
    code, _, err = await cli("series", "declare", "no such series!")
    assert code == 1 and err.count("\n") == 1


# -- item 9: a series belongs to the operator -------------------------------------------------

async def test_a_plan_naming_an_undeclared_series_is_refused_before_anything_is_stored(
        temporal_env: WorkflowEnvironment, store: JournalStore, workers, task_queue: str,
        tmp_path: Path, cli) -> None:
    workers.start()
    ledger = tmp_path / "ledger"
    doc = {"task_id": "ser-1", "series": "theirs", "steps": ledger_steps(ledger, 2)}
    refused = await run_result(await start(temporal_env.client, doc, task_queue))
    assert (refused.state, refused.error["type"]) == ("failed", "PlanError")
    assert "series 'theirs' is not declared" in refused.error["message"]
    with pytest.raises(UnknownTask):
        commands.status(store.conninfo, "ser-1")
    assert store.series_runs("theirs") == [] and not ledger.exists()

    code, out, _ = await cli("series", "declare", "theirs", "--approval", "payments")
    assert code == 0 and json.loads(out) == {"series": "theirs", "approval": "payments",
                                             "approvers": None, "admits": "any",
                                             "declared_by": ME}
    # Declared again without the flag (as a later `schedule create` does): the policy stays.
    code, out, _ = await cli("series", "declare", "theirs", "--approvers", ME)
    assert code == 0 and json.loads(out) == {"series": "theirs", "approval": "payments",
                                             "approvers": [ME], "admits": "any",
                                             "declared_by": ME}
    doc["task_id"] = "ser-2"
    done = await run_result(await start(temporal_env.client, doc, task_queue))
    assert (done.state, done.confirmed) == ("completed", 2)
    assert [r["task_id"] for r in store.series_runs("theirs")] == ["ser-2"]


async def test_a_scheduled_task_id_cannot_be_taken_by_a_plan_submitted_by_hand(
        temporal_env: WorkflowEnvironment, store: JournalStore, workers, task_queue: str,
        tmp_path: Path, cli) -> None:
    client = temporal_env.client
    workers.start()
    ledger = tmp_path / "ledger"
    code, _, err = await cli("schedule", "create", "night", "--cron", "0 3 * * *",
                             "--planner", "helpers.planners:nightly", "--args",
                             json.dumps({"calls": str(tmp_path / "calls"),
                                         "ledger": str(ledger), "n": 2}),
                             "--task-queue", task_queue)
    assert code == 0, err
    # Tomorrow's run, taken today by hand (with and without naming the series).
    for doc in ({"task_id": "sched-night-20991231T030000Z", "series": "night",
                 "steps": ledger_steps(ledger, 1)},
                {"task_id": "sched-night-20991231T030000Z", "steps": ledger_steps(ledger, 1)}):
        refused = await run_result(await start(client, doc, task_queue))
        assert (refused.state, refused.error["type"]) == ("failed", "PlanError")
        assert "reserved for the runs a series' schedule starts" in refused.error["message"]
    with pytest.raises(UnknownTask):
        commands.status(store.conninfo, "sched-night-20991231T030000Z")
    assert not ledger.exists()
    # The schedule's own run takes an id of that namespace, and runs.
    address = client.service_client.config.target_host
    result = await run_result(await triggered(client, address, "night"))
    assert result.task_id.startswith("sched-night-")
    assert (result.state, result.confirmed) == ("completed", 2)
    await schedules.delete(client, "night")


async def test_a_scheduled_run_started_by_hand_calls_no_planner_and_takes_no_scheduled_id(
        temporal_env: WorkflowEnvironment, store: JournalStore, workers, task_queue: str,
        tmp_path: Path) -> None:
    from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes

    client = temporal_env.client
    workers.start()
    calls, ledger = tmp_path / "calls", tmp_path / "ledger"
    store.declare_series("night2", "ops", ME)
    arg = {"series": "night2", "planner": "helpers.planners:nightly",
           "args": {"calls": str(calls), "ledger": str(ledger), "n": 1}}
    run = await client.start_workflow("ScheduledRun", arg, id="tidemark-sched-night2-by-hand",
                                      task_queue=task_queue, result_type=RunResult)
    result = await run_result(run)
    assert (result.state, result.error["type"]) == ("failed", "PlanError")
    assert "was not started by its schedule" in result.error["message"]
    assert not calls.exists() and not ledger.exists()
    with pytest.raises(UnknownTask):
        commands.status(store.conninfo, result.task_id)
    # Temporal lets a starter write the schedule's attributes; tomorrow's time is refused all
    # the same (a schedule never fires early), so tomorrow's task id stays free.
    tomorrow = datetime.now(UTC) + timedelta(days=1)
    forged = TypedSearchAttributes([
        SearchAttributePair(SearchAttributeKey.for_keyword("TemporalScheduledById"),
                            "tidemark-series-night2"),
        SearchAttributePair(SearchAttributeKey.for_datetime("TemporalScheduledStartTime"),
                            tomorrow)])
    run = await client.start_workflow("ScheduledRun", arg, id="tidemark-sched-night2-forged",
                                      task_queue=task_queue, search_attributes=forged,
                                      result_type=RunResult)
    result = await run_result(run)
    assert (result.state, result.error["type"]) == ("failed", "PlanError")
    assert "which is still ahead" in result.error["message"]
    assert result.task_id == f"sched-night2-{tomorrow:%Y%m%dT%H%M%SZ}"
    assert not calls.exists() and not ledger.exists()
    with pytest.raises(UnknownTask):
        commands.status(store.conninfo, result.task_id)


async def test_an_undeclared_series_given_to_a_control_is_one_line_and_changes_nothing(
        temporal_env: WorkflowEnvironment, store: JournalStore, cli) -> None:
    for args in (["stop", "--series", "nightly-typo"], ["release", "--series", "nightly-typo"],
                 ["status", "--series", "nightly-typo"]):
        code, out, err = await cli(*args)
        assert (code, out) == (1, ""), args
        assert err.count("\n") == 1 and "no series 'nightly-typo' is declared" in err, err
    assert store.stop_state("series:nightly-typo") is None
    assert not store.task_known("series:nightly-typo")
    assert (await cli("series", "declare", "nightly-typo"))[0] == 0
    assert (await cli("stop", "--series", "nightly-typo"))[0] == 0
    assert store.stop_state("series:nightly-typo") is not None


# -- item 10: every call a task makes, gates and planner included, goes through its grant ----

async def test_the_verification_gate_presents_the_tasks_grant_and_a_revoked_one_is_refused(
        temporal_env: WorkflowEnvironment, store: JournalStore, server: StagingServer,
        drive: DriveTarget, policy_workers, task_queue: str) -> None:
    policy_workers.start(TIDEMARK_APPROVERS=ME)
    files = [drive.seed(f"scan-{i}.pdf") for i in (1, 2)]
    doc = {"task_id": "grant-gate", "steps": [
        *({"action": "drive.rename", "args": {"file_id": f.id, "name": f"invoice {i}.pdf"}}
          for i, f in enumerate(files, 1)),
        {"action": "gmail.send", "args": MAIL}], "approval": {"required": True}}
    handle = await start(temporal_env.client, doc, task_queue)
    await wait_state(handle, "awaiting_approval")  # the gate has probed both files

    def drive_calls() -> list[Any]:
        return [c for c in server.staging.calls_of("drive")
                if any(f.id in c.path for f in files)]

    gate_calls = drive_calls()
    assert gate_calls and all("grant-" in c.token for c in gate_calls), \
        [(c.method, c.path, c.token[:12]) for c in gate_calls]

    # The task's grants revoked while it is stopped: the gate, asked again, is refused.
    commands.stop(store.conninfo, "grant-gate", "incident", "ops")
    revoke_task_grants(store, "grant-gate", "ops")
    seen = len(server.staging.calls_of("drive"))
    await handle.signal("approval", {"decision": "approve", "by": ME})
    result = await run_result(handle)
    assert result.state == "stopped" and sent(server) == (0, 0)
    after = [c for c in server.staging.calls_of("drive")[seen:]
             if any(f.id in c.path for f in files)]
    assert not any(c.allowed for c in after), [(c.path, c.token[:12]) for c in after]


async def test_a_scheduled_planner_reads_the_targets_through_its_tasks_grant(
        temporal_env: WorkflowEnvironment, store: JournalStore, server: StagingServer,
        drive: DriveTarget, workers, task_queue: str) -> None:
    client = temporal_env.client
    for i in (1, 2):
        drive.seed(f"scan-{i:03d}.pdf")
    root = str(Path(__file__).resolve().parent.parent)  # the worker imports examples.*
    workers.start(TIDEMARK_STAGING_URL=server.url, PYTHONPATH=root)
    # The worker's start checks its Drive credentials with its own (a scratch file's stamp,
    # written, then listed back with the read token: activities/drive_identity.py); the task's
    # reads are the ones after that listing.
    def listed_back() -> bool:
        calls = server.staging.calls_of("drive")
        made = [i for i, c in enumerate(calls) if c.method == "POST"]
        return bool(made) and any(c.method == "GET" and c.path.rstrip("/").endswith("/files")
                                  for c in calls[made[0] + 1:])
    assert_eventually(listed_back)
    started = len(server.staging.calls_of("drive"))
    store.declare_series("supplier-sync", "ops", ME)
    await schedules.create(client, "supplier-sync", "0 3 * * *",
                           "examples.supplier_sync_planner:plan",
                           {"prefix": "scan-", "to": ["ap@supplier.example"]}, task_queue)
    address = client.service_client.config.target_host
    result = await run_result(await triggered(client, address, "supplier-sync"))
    assert (result.state, result.confirmed) == ("completed", 3)
    listed = [c for c in server.staging.calls_of("drive")[started:]
              if c.method == "GET" and c.path.rstrip("/").endswith("/files")]
    assert listed and all(c.allowed and "grant-" in c.token for c in listed), \
        [(c.path, c.token[:12]) for c in listed]
    assert ("drive", "read") in {(g["target"], g["scope"]) for g in store.grants(result.task_id)}
    await schedules.delete(client, "supplier-sync")


async def test_a_planner_still_reading_when_its_task_is_killed_is_refused(
        temporal_env: WorkflowEnvironment, store: JournalStore, server: StagingServer,
        drive: DriveTarget, workers, task_queue: str, tmp_path: Path) -> None:
    client = temporal_env.client
    drive.seed("scan-001.pdf")
    ready, go, ledger = tmp_path / "ready", tmp_path / "go", tmp_path / "ledger"
    workers.start(TIDEMARK_STAGING_URL=server.url)
    store.declare_series("reader", "ops", ME)
    await schedules.create(client, "reader", "0 3 * * *", "helpers.planners:reads_twice",
                           {"ready": str(ready), "go": str(go), "ledger": str(ledger)},
                           task_queue)
    run = await triggered(client, client.service_client.config.target_host, "reader")
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert time.monotonic() < deadline, "the planner never read"
        await asyncio.sleep(0.05)
    desc = await run.describe()
    task_id = dict((k.name, v) for k, v in desc.typed_search_attributes)["TidemarkTaskId"]
    read_grants = [g for g in store.grants(task_id) if g["target"] == "drive"]
    assert read_grants  # the first read presented the task's grant
    # What `tidemark kill` does to the task first: the stop state `killed`, its grants revoked.
    store.set_killed(task_id, "incident", "ops")
    revoke_task_grants(store, task_id, "ops")
    seen = len(server.staging.calls_of("drive"))
    go.write_text("go")
    result = await run_result(run)
    assert (result.state, result.error["type"]) == ("stopped", "Unauthorized"), result.error
    listed_after = [c for c in server.staging.calls_of("drive")[seen:] if c.allowed]
    assert listed_after == []  # the planner's second read never reached the Drive
    assert not ledger.exists()
    with pytest.raises(UnknownTask):
        commands.status(store.conninfo, task_id)
    await schedules.delete(client, "reader")


def test_a_plan_asks_and_the_strictest_policy_is_why_a_person_is_asked() -> None:
    """The worker says why a run waits: the plan's own ask, else the strictest policy.

    The worker's reading: the plan's own ask, else the first policy that asks (the journal's, the
    series', the worker's); a series that asks less lowers nothing."""
    from tidemark.approval import narrowed, parse_policy, why_asked

    mail = [{"to": ["x@y.example"], "subject": "s"}]
    none, payments = parse_policy("none"), parse_policy("payments")
    assert why_asked([none, none], True, mail) == (
        "the plan asks a person to approve its irreversible steps")
    assert why_asked([none, None, none], False, mail) is None
    assert why_asked([parse_policy("all"), none], False, mail) is not None  # a series' none
    assert why_asked([none, payments], False, mail) is None
    assert why_asked([none, payments], False, [{"amount": 1, "currency": "eur"}]) is not None
    assert why_asked([parse_policy("all")], True, []) is None  # nothing irreversible
    assert narrowed([None, ["ana", "ben"], ("ben", "cy")]) == ["ben"]
    assert narrowed([None, (), None]) is None
