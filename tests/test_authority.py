"""Authority held by the journal: it records each decision at the irreversible boundary.

A decision at the irreversible boundary is the journal's to record, in the statement that checks it,
and the irreversible intent is refused without one.

Each test below was a way past a check that stood beside the act (the command checked, then
wrote): two people deciding at once, a person making themselves an approver, a plan borrowing
a series' policy, a payment split in five, a kill lifted through `release --for-unwind`, an
approval outliving the kill that should have voided it, a series squatted by a plan started by
hand, and an approver shown a cut list. Real Postgres, Temporal dev server, worker processes
and the real `tidemark` command; people are login roles (tests/helpers/roles.py).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.testing import WorkflowEnvironment

from helpers.ledger import LedgerRecord, ledger_lines
from helpers.roles import OS_USER, WORKER_ROLE
from helpers.runs import start, wait_state
from helpers.staging_fixtures import effects
from staging.core import StagingServer
from tidemark.errors import ApprovalRequired, DecisionRefused, NotAuthorized
from tidemark.payloads import RunResult
from tidemark.plan import load_plan
from tidemark.run_step import run_step
from tidemark.store import JournalStore
from tools.operate import commands, schedules
from workflows.outcome import run_result

MAIL = {"to": ["ap@supplier.example"], "subject": "Q3 invoices paid", "body": "Paid. " * 40}


def ledger_doc(task_id: str, ledger: Path, **extra: Any) -> dict[str, Any]:
    """A task whose one step writes a ledger line, an irreversible effect a test counts.

    The ledger is tests/helpers/ledger.py."""
    return {"task_id": task_id, "steps": [
        {"action": "ledger.record", "args": {"ledger": str(ledger), "entry": f"{task_id}-1"}}],
            **extra}


@pytest.fixture
def deciders(workers):  # type: ignore[no-untyped-def]
    """Workers whose runs ana and ben may approve (TIDEMARK_APPROVERS narrows to them)."""
    workers.env["TIDEMARK_APPROVERS"] = "ana,ben"
    return workers


# -- 1. approve and reject race: one decision wins, by compare-and-set -----------------------

async def test_a_hundred_approve_reject_pairs_sent_at_once_record_one_decision_each(
        temporal_env: WorkflowEnvironment, store: JournalStore, deciders, task_queue: str,
        tmp_path: Path, url_as: Callable[[str], str]) -> None:
    """Of 100 approve and reject pairs sent at once, each task records one decision.

    Ana approves and ben rejects each of 100 waiting tasks at the same moment: exactly one
    decision is recorded per task, the other command is refused naming it, and a task whose
    reject won writes nothing irreversible; one whose approve won writes once."""
    deciders.start()
    pairs = 100
    ids = [f"race-{i:03d}" for i in range(pairs)]
    handles = [await start(temporal_env.client,
                           ledger_doc(t, tmp_path / "ledger", approval={"required": True}),
                           task_queue) for t in ids]
    for h in handles:
        await wait_state(h, "awaiting_approval", timeout=120)

    def decide(task: str, role: str, verb: str, gate: threading.Barrier) -> Any:
        gate.wait(timeout=30)  # both commands of the pair go out together
        try:
            return commands.decide_approval(url_as(role), task, verb, role)
        except DecisionRefused as e:
            return e

    # Sixteen pairs at a time: each pair at the same instant, within Postgres's connections.
    with ThreadPoolExecutor(32) as pool:
        futures = []
        for t in ids:
            gate = threading.Barrier(2)
            futures.append((t, pool.submit(decide, t, "ana", "approve", gate),
                            pool.submit(decide, t, "ben", "reject", gate)))
        outcomes = {t: (a.result(), r.result()) for t, a, r in futures}
    winners: dict[str, str] = {}
    for task, (approved, rejected) in outcomes.items():
        committed = [o for o in (approved, rejected) if isinstance(o, dict)]
        refused = [o for o in (approved, rejected) if isinstance(o, DecisionRefused)]
        assert len(committed) == 1 and len(refused) == 1, (task, approved, rejected)
        winners[task] = committed[0]["decision"]
        assert refused[0].why in ("decided", "stopped"), refused[0]
        # The loser's one line names the decision that won.
        assert f"by {committed[0]['by']}" in str(refused[0]) or "rejected by ben" in str(
            refused[0]), refused[0]
    with psycopg.connect(store.conninfo) as conn:
        recorded = conn.execute("SELECT task_id, count(*), min(decision) FROM tidemark.decisions"
                                " GROUP BY task_id").fetchall()
    assert {t: (n, d) for t, n, d in recorded} == {t: (1, winners[t]) for t in ids}
    assert 0 < list(winners.values()).count("approve") < pairs  # both orders happened
    for h in handles:
        await h.signal("approval", {"decision": "?", "by": "?"})
    ends = {h.id.removeprefix("tidemark-"): await run_result(h) for h in handles}
    written = ledger_lines(tmp_path / "ledger")
    for task, won in winners.items():
        mine = [line for line in written if line.endswith(f" {task}-1")]
        if won == "reject":
            assert (ends[task].state, mine) == ("stopped", []), task
        else:
            assert (ends[task].state, len(mine)) == ("completed", 1), task


async def test_the_second_decision_is_one_line_naming_the_first_and_exits_non_zero(
        temporal_env: WorkflowEnvironment, store: JournalStore, tmp_path: Path, cli,
        url_as: Callable[[str], str], monkeypatch: pytest.MonkeyPatch) -> None:
    """What a command prints is what was committed.

    The first decision says it is journaled, the second names the first and records nothing."""
    registry = spec_registry_with({"ledger.record": LedgerRecord()})
    store.persist_plan(load_plan(ledger_doc("second", tmp_path / "l"), registry))
    store.ask_approval("second", "the plan asks", [], [1], ["step 1 ledger.record"])
    code, out, _ = await cli("approve", "second", "--by", "Ana")
    assert code == 0 and out.startswith(f"approve of task second by {OS_USER} (Ana) is "
                                        "journaled")
    monkeypatch.setenv("DATABASE_URL", url_as("ben"))
    code, out, err = await cli("reject", "second")
    assert (code, out) == (1, "") and err.count("\n") == 1
    assert err.startswith(f"tidemark: DecisionRefused: task second was decided already: "
                          f"approve by {OS_USER} (Ana) at "), err
    assert err.rstrip().endswith("nothing was recorded")
    decided = store.current_decision("second")
    assert decided is not None and (decided["decision"], decided["decided_by"]) == (
        "approve", OS_USER)
    assert store.stop_state("second") is None  # the refused reject stopped nothing


# -- 2. who decides, declares and releases is the journal's to know -------------------------

async def test_nobody_makes_themselves_an_approver_or_lowers_a_series_policy(
        temporal_env: WorkflowEnvironment, store: JournalStore, cli,
        url_as: Callable[[str], str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert (await cli("series", "declare", "nightly", "--approval", "payments",
                      "--approvers", "ana"))[0] == 0
    before = store.declared_series("nightly")
    for role in ("ana", "mallory", WORKER_ROLE):  # an approver, nobody, a worker's credentials
        monkeypatch.setenv("DATABASE_URL", url_as(role))
        for args in (["series", "declare", "nightly", "--approvers", role],
                     ["series", "declare", "nightly", "--approval", "none"],
                     ["policy", "set", "none"], ["policy", "set", "all", "--approvers", role]):
            code, out, err = await cli(*args)
            assert (code, out) == (1, "") and err.count("\n") == 1, (role, args, err)
            assert ("NotAuthorized" in err and f"role {role}" in err) or \
                f"{role} is not a member of it" in err, err
    assert store.declared_series("nightly") == before
    assert store.policy() is not None and store.policy()["approval"] == "none"  # the fixture's


def test_the_worker_credentials_record_no_approval_declare_no_series_and_lift_no_kill(
        store: JournalStore, tmp_path: Path, url_as: Callable[[str], str]) -> None:
    """The worker's credentials record no approval, declare no series and lift no kill.

    An agent that stole the worker's settings has a worker's login role. Postgres itself refuses
    each act, through the commands and around them."""
    registry = {"ledger.record": LedgerRecord()}
    plan = load_plan({"task_id": "stolen", "approval": {"required": True}, "steps": [
        {"action": "ledger.record", "args": {"ledger": str(tmp_path / "l"), "entry": "x"}}]},
        spec_registry_with(registry))
    store.persist_plan(plan)
    store.ask_approval("stolen", "the plan asks", [], [1], ["step 1 ledger.record"])
    store.set_killed("stolen", "incident", "ops")
    worker = url_as(WORKER_ROLE)
    with pytest.raises(NotAuthorized, match=f"role {WORKER_ROLE}"):
        commands.decide_approval(worker, "stolen", "approve", "me")
    with pytest.raises(NotAuthorized, match="tidemark_operator"):
        commands.declare_series(worker, "mine", "me", "none")
    with pytest.raises(NotAuthorized, match="tidemark_operator"):
        commands.set_policy(worker, "none", None, "me")
    with pytest.raises(NotAuthorized, match="tidemark_operator"):
        commands.release(worker, "stolen", "", "me")
    with pytest.raises(NotAuthorized, match="tidemark_operator"):
        commands.release_for_unwind(worker, "stolen", "", "me")
    with psycopg.connect(worker, autocommit=True) as conn:
        for statement, params in (
                ("INSERT INTO tidemark.decisions (task_id, epoch, decision, plan_hash,"
                 " decided_by) VALUES (%s, 0, 'approve', %s, 'ana')", ("stolen", plan.plan_hash)),
                ("UPDATE tidemark.controls SET state = 'released' WHERE scope = %s",
                 ("stolen",)),
                ("UPDATE tidemark.controls SET for_unwind = true WHERE scope = %s", ("stolen",)),
                ("INSERT INTO tidemark.events (task_id, step, kind, detail)"
                 " VALUES (%s, 1, 'decision', '{\"as\": \"absent\"}')", ("stolen",)),
                ("INSERT INTO tidemark.series (series, declared_by, os_user)"
                 " VALUES ('mine', 'me', 'me')", ()),
                ("INSERT INTO tidemark.approval_policy (approval, rules, set_by) VALUES"
                 " ('none', '{}', 'me')", ())):
            with pytest.raises(psycopg.Error) as refused:
                conn.execute(statement, params)
            assert refused.value.sqlstate in ("42501", "TA001", "TA002"), (statement, refused)
    assert store.stop_state("stolen")["state"] == "killed"
    assert store.current_decision("stolen") is None and store.declared_series("mine") is None


def spec_registry_with(actions: dict[str, Any]) -> Any:
    from tidemark.actions import Registry

    return Registry(list(actions.values()))


def test_an_activity_called_directly_cannot_act_without_a_valid_approval(
        journal: JournalStore, tmp_path: Path, url_as: Callable[[str], str]) -> None:
    """An activity called directly cannot act without a valid approval.

    Around the workflow, run_step on a journal whose policy asks a person (the default) writes no
    irreversible intent without an approval; an approval of an earlier epoch is void; with one of
    the current epoch it acts, once."""
    ledger = tmp_path / "ledger"
    registry = spec_registry_with({"ledger.record": LedgerRecord()})
    plan = load_plan(ledger_doc("direct", ledger), registry)
    journal.persist_plan(plan)
    with pytest.raises(ApprovalRequired):
        run_step(journal, registry, "direct", 1)
    assert journal.step_row("direct", 1) is None and ledger_lines(ledger) == []
    journal.ask_approval("direct", "policy all", [], [1], ["step 1"])
    commands.decide_approval(url_as("ana"), "direct", "approve", "")
    commands.stop(journal.conninfo, "direct", "a look", "ops")
    commands.release(url_as(OS_USER), "direct", "", "ops")  # a new epoch: the approval is void
    with pytest.raises(ApprovalRequired):
        run_step(journal, registry, "direct", 1)
    assert ledger_lines(ledger) == []
    commands.decide_approval(url_as("ben"), "direct", "approve", "")
    assert run_step(journal, registry, "direct", 1).status == "done"
    assert len(ledger_lines(ledger)) == 1
    # An intent whose arguments are not the plan's is refused, approval or not.
    with journal.execution("direct", 1) as s, pytest.raises(Exception):  # noqa: B017
        s.begin(task_id="direct", step=1, key="f" * 32, action="ledger.record",
                args={"ledger": str(ledger), "entry": "someone else's"}, before_state={},
                lease_s=1.0, attempt=2)


# -- 3 and 4. the strictest policy holds; amounts are summed per task ------------------------

async def test_a_plan_cannot_borrow_a_series_policy_that_asks_less(
        temporal_env: WorkflowEnvironment, store: JournalStore, deciders, task_queue: str,
        tmp_path: Path, cli) -> None:
    """A plan cannot borrow a series policy that asks less.

    The journal's policy says all; the series and the worker say none: the plan naming the series
    waits for a person, and so does a direct step."""
    assert (await cli("policy", "set", "all"))[0] == 0
    assert (await cli("series", "declare", "lenient", "--approval", "none"))[0] == 0
    deciders.start(TIDEMARK_APPROVAL="none")
    doc = ledger_doc("borrow", tmp_path / "ledger", series="lenient")
    handle = await start(temporal_env.client, doc, task_queue)
    await wait_state(handle, "awaiting_approval")
    await asyncio.sleep(0.5)
    assert ledger_lines(tmp_path / "ledger") == []
    await handle.signal("halt", "test over")
    assert (await run_result(handle)).state == "halted"


async def test_five_payments_under_a_limit_that_add_up_over_it_wait_for_a_person(
        temporal_env: WorkflowEnvironment, store: JournalStore, server: StagingServer,
        deciders, task_queue: str, tmp_path: Path, cli) -> None:
    assert (await cli("policy", "set", "amount>usd:400"))[0] == 0
    deciders.start(TIDEMARK_STAGING_URL=server.url, TIDEMARK_APPROVAL="none",
                   TIDEMARK_STRIPE_MAX_TASK_AMOUNT="1000000")
    pay = {"action": "stripe.payment_intent", "args": {"amount": 40000, "currency": "usd"}}
    one = await run_result(await start(temporal_env.client,
                                       {"task_id": "one-400", "steps": [pay]}, task_queue))
    assert one.state == "completed"  # 400.00 USD: within the limit, unattended
    handle = await start(temporal_env.client, {"task_id": "split", "steps": [pay] * 5},
                         task_queue)
    await wait_state(handle, "awaiting_approval")
    meta = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    assert "payments in USD add up to 2,000.00 USD, over amount>usd:400" in meta.current_details
    assert len(effects(server, "stripe", "payment_intents.create")) == 1
    await handle.signal("halt", "test over")


async def test_a_payment_over_the_per_step_limit_is_refused_by_plan_check_and_at_start(
        temporal_env: WorkflowEnvironment, store: JournalStore, server: StagingServer,
        deciders, task_queue: str, tmp_path: Path, cli,
        monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a.pdf").write_text("a")
    doc = {"task_id": "over", "steps": [
        {"action": "fs.rename", "args": {"path": str(tmp_path / "a.pdf"), "name": "b.pdf"}},
        {"action": "stripe.payment_intent", "args": {"amount": 60000, "currency": "usd"}}]}
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(doc))
    monkeypatch.setenv("TIDEMARK_STRIPE_MAX_AMOUNT", "50000")
    code, out, err = await cli("plan", "check", str(plan_file))
    assert (code, out) == (1, "") and err.count("\n") == 1
    assert "step 2: 600.00 USD is over the per-step limit of 500.00 USD " \
        "(TIDEMARK_STRIPE_MAX_AMOUNT=50000)" in err, err
    deciders.start(TIDEMARK_STAGING_URL=server.url, TIDEMARK_STRIPE_MAX_AMOUNT="50000",
                   TIDEMARK_FS_ROOTS=str(tmp_path))
    refused = await run_result(await start(temporal_env.client, doc, task_queue))
    assert refused.state == "precondition_failed"
    assert "per-step limit of 500.00 USD" in refused.error["message"]
    assert (tmp_path / "a.pdf").exists()  # refused before the first step: nothing renamed


# -- 5 and 6. a kill is lifted by name only; decisions do not outlive it ---------------------

async def test_a_kill_lifted_for_an_unwind_is_not_lifted_for_a_resume(
        temporal_env: WorkflowEnvironment, store: JournalStore, deciders, task_queue: str,
        tmp_path: Path, cli) -> None:
    deciders.start()
    ledger = tmp_path / "ledger"
    handle = await start(temporal_env.client,
                         ledger_doc("side", ledger, approval={"required": True}), task_queue)
    await wait_state(handle, "awaiting_approval")
    assert (await cli("kill", "side", "--reason", "wrong supplier", "--grace", "0"))[0] == 0
    code, out, _ = await cli("release", "side", "--for-unwind")
    assert code == 0 and "lifted for an unwind only" in out
    code, out, err = await cli("resume", "side", "--task-queue", task_queue)
    assert (code, out) == (1, "") and err.count("\n") == 1
    assert "lifted for an unwind only, and resume does not run it forward" in err
    code, out, _ = await cli("inbox", "--json")
    [entry] = [e for e in json.loads(out) if e["task_id"] == "side"]
    assert entry["command"] == "tidemark unwind side --yes", entry
    assert ledger_lines(ledger) == []
    assert store.stop_state("side")["state"] == "killed"


async def test_an_approval_from_before_a_kill_is_void_after_release_and_resume_asks_again(
        temporal_env: WorkflowEnvironment, store: JournalStore, deciders, task_queue: str,
        tmp_path: Path, cli, url_as: Callable[[str], str]) -> None:
    deciders.start()
    ledger = tmp_path / "ledger"
    handle = await start(temporal_env.client,
                         ledger_doc("void", ledger, approval={"required": True}), task_queue)
    await wait_state(handle, "awaiting_approval")
    # Approved while no run takes it (the worker is busy being killed): then killed.
    approved = commands.decide_approval(url_as("ana"), "void", "approve", "")
    assert approved["holds"]
    assert (await cli("kill", "void", "--grace", "0"))[0] == 0
    assert (await cli("release", "void"))[0] == 0
    code, _, err = await cli("resume", "void", "--task-queue", task_queue)
    assert code == 0, err
    resumed = temporal_env.client.get_workflow_handle("tidemark-void", result_type=RunResult)
    await wait_state(resumed, "awaiting_approval")  # asked again: the approval is void
    await asyncio.sleep(0.5)
    assert ledger_lines(ledger) == []
    report = commands.status(store.conninfo, "void")
    assert report.approval is not None and (report.approval["decision"],
                                            report.approval["holds"]) == ("approve", False)
    assert "void since (a stop, kill or release came after it)" in report.text()
    commands.decide_approval(url_as("ben"), "void", "approve", "")
    await resumed.signal("approval", {})
    assert (await run_result(resumed)).state == "completed"
    assert len(ledger_lines(ledger)) == 1


async def test_release_of_a_killed_series_says_what_it_did_to_its_schedule(
        temporal_env: WorkflowEnvironment, store: JournalStore, deciders, task_queue: str,
        tmp_path: Path, cli) -> None:
    args = json.dumps({"calls": str(tmp_path / "calls"), "ledger": str(tmp_path / "l"), "n": 1})
    assert (await cli("schedule", "create", "s-kill", "--cron", "0 3 * * *", "--planner",
                      "helpers.planners:nightly", "--args", args, "--task-queue",
                      task_queue))[0] == 0
    assert (await cli("kill", "--series", "s-kill"))[0] == 0
    client = temporal_env.client
    assert (await schedules.describe(client, "s-kill"))["paused"]
    code, out, _ = await cli("release", "--series", "s-kill")
    assert code == 0 and "schedule tidemark-series-s-kill stays paused" in out, out
    assert (await schedules.describe(client, "s-kill"))["paused"]
    code, out, _ = await cli("release", "--series", "s-kill", "--unpause-schedule")
    assert code == 0 and "schedule tidemark-series-s-kill is unpaused" in out, out
    assert not (await schedules.describe(client, "s-kill"))["paused"]
    await schedules.delete(client, "s-kill")


# -- 7. a series with a schedule takes its schedule's runs -----------------------------------

async def test_a_plan_started_by_hand_cannot_squat_a_scheduled_series(
        temporal_env: WorkflowEnvironment, store: JournalStore, deciders, task_queue: str,
        tmp_path: Path, cli) -> None:
    deciders.start()
    args = json.dumps({"calls": str(tmp_path / "calls"), "ledger": str(tmp_path / "l"), "n": 1})
    code, out, err = await cli("schedule", "create", "s-own", "--cron", "0 3 * * *",
                               "--planner", "helpers.planners:nightly", "--args", args,
                               "--task-queue", task_queue)
    assert code == 0 and json.loads(out)["admits"] == "scheduled", err
    squat = ledger_doc("squat", tmp_path / "l", series="s-own", approval={"required": True})
    handle = await start(temporal_env.client, squat, task_queue)
    # Refused at once; admitted, it would wait for approval, holding the series' place.
    for _ in range(300):
        if (await handle.query("status"))["state"] != "running":
            break
        await asyncio.sleep(0.1)
    assert (await handle.query("status"))["state"] == "failed"
    refused = await run_result(handle)
    assert (refused.state, refused.error["type"]) == ("failed", "PlanError")
    assert "takes the runs its schedule starts" in refused.error["message"]
    assert store.series_runs("s-own") == []  # no place taken: nothing blocks its runs
    await schedules.trigger(temporal_env.client, "s-own")
    for _ in range(300):
        if [r for r in store.series_runs("s-own") if r["confirmed"] == 1]:
            break
        await asyncio.sleep(0.1)
    assert [r["task_id"].startswith("sched-s-own-") for r in store.series_runs("s-own")] == [True]
    await schedules.delete(temporal_env.client, "s-own")


# -- 8. the approver sees everything that will happen ----------------------------------------

async def test_the_approver_sees_every_step_currency_and_recipient_however_long_the_plan(
        temporal_env: WorkflowEnvironment, store: JournalStore, server: StagingServer,
        deciders, task_queue: str, cli) -> None:
    mails = [{"action": "gmail.send", "args": {**MAIL, "to": [f"s{i}@supplier.example"]}}
             for i in range(80)]  # more than the details can list: the cut comes before the end
    pays = [{"action": "stripe.payment_intent", "args": {"amount": a, "currency": c}}
            for a, c in ((50000, "jpy"), (1500, "kwd"), (2250, "bhd"))]
    last = {"action": "gmail.send", "args": {**MAIL, "to": ["board@ours.example"]}}
    doc = {"task_id": "long", "steps": [*mails, *pays, last], "approval": {"required": True}}
    deciders.start(TIDEMARK_STAGING_URL=server.url)
    handle = await start(temporal_env.client, doc, task_queue)
    await wait_state(handle, "awaiting_approval")
    meta = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    details = meta.current_details
    listed, _, more = details.partition("more irreversible steps")
    assert more, "the details list them all: the plan is not long enough to test the cut"
    assert "stripe.payment_intent" not in listed.partition("will do:")[2]  # cut before them
    for seen in ("81 gmail.send, 3 stripe.payment_intent", "in all 2.250 BHD, 50,000 JPY, "
                 "1.500 KWD", "board@ours.example", "s79@supplier.example", "body 'Paid. Paid."):
        assert seen in details, seen
    code, out, _ = await cli("status", "long")
    assert code == 0 and "step 84 gmail.send: to board@ours.example" in out
    assert "step 82 stripe.payment_intent: amount 1.500 KWD" in out and "…'" in out
    await handle.signal("halt", "test over")


# -- bad input: one line, a non-zero exit, nothing changed ----------------------------------

async def test_bad_policy_approvers_and_decisions_are_one_line_and_change_nothing(
        temporal_env: WorkflowEnvironment, store: JournalStore, cli, tmp_path: Path,
        people) -> None:
    before = store.policy()
    for args, said in ((["policy", "set", "sometimes"], "unknown rule 'sometimes'"),
                       (["policy", "set", "all", "--approvers", "ghost"],
                        "approver ghost: no such database role"),
                       (["policy", "set", "all", "--approvers", "olga"],
                        "approver olga: the role is not a member of tidemark_approver"),
                       (["series", "declare", "s-bad", "--approvers", "Not A Role"],
                        "is not a database role name")):
        code, out, err = await cli(*args)
        assert (code, out) == (1, "") and err.count("\n") == 1 and said in err, (args, err)
    assert store.policy() == before and store.declared_series("s-bad") is None
    registry = spec_registry_with({"ledger.record": LedgerRecord()})
    store.persist_plan(load_plan(ledger_doc("idle", tmp_path / "l"), registry))
    code, out, err = await cli("approve", "idle")  # no run waits for a decision on it
    assert (code, out) == (1, "") and err.count("\n") == 1
    assert "task idle is not waiting for approval" in err
    assert store.current_decision("idle") is None


def test_the_journal_takes_the_strictest_policy_and_sums_amounts_per_task(
        journal: JournalStore) -> None:
    """The journal takes the strictest policy and sums amounts per task.

    The journal's own reading, with no worker asking anything. A series' policy adds to the
    operator's and never removes; amounts are summed per task; a daily limit counts the series'
    other runs begun today."""
    from activities.catalog import spec_registry

    def persist(task: str, amounts: list[int], series: str | None = None) -> None:
        doc: dict[str, Any] = {"task_id": task, "steps": [
            {"action": "stripe.payment_intent", "args": {"amount": a, "currency": "usd"}}
            for a in amounts]}
        if series:
            doc["series"] = series
            journal.admit_to_series(task, series, lambda rows: [])
        journal.persist_plan(load_plan(doc, spec_registry()))

    commands.declare_series(journal.conninfo, "lenient", "ops", "none")
    persist("lenient-run", [100], series="lenient")
    assert journal.approval_needed("lenient-run")  # no policy set: all; the series lowers nothing
    commands.set_policy(journal.conninfo, "amount>usd:400", None, "ops")
    persist("one-400", [40000])
    persist("five-400", [40000] * 5)
    assert not journal.approval_needed("one-400")
    assert journal.approval_needed("five-400")  # 2,000.00 USD in one task
    assert not journal.approval_needed("lenient-run")
    commands.declare_series(journal.conninfo, "daily", "ops", "daily>usd:500")
    persist("day-1", [30000], series="daily")
    assert not journal.approval_needed("day-1")
    with journal.execution("day-1", 1) as s:  # day-1's payment is under way today
        spec = journal.load_plan("day-1").step(1)
        s.begin(task_id="day-1", step=1, key="a" * 32, action=spec.action, args=spec.args,
                before_state={}, lease_s=0.0)
    persist("day-2", [30000], series="daily")
    assert journal.approval_needed("day-2")  # 600.00 USD of the series today


async def test_a_resume_past_the_first_irreversible_step_asks_again_before_the_next(
        temporal_env: WorkflowEnvironment, store: JournalStore, deciders, task_queue: str,
        tmp_path: Path, cli, url_as: Callable[[str], str]) -> None:
    """A resume past the first irreversible step asks again before the next one.

    The task is stopped between two irreversible steps, released and resumed. The run starts past
    the boundary, the journal refuses the next step's intent (the approval's epoch is over), and
    the run goes back to the boundary and asks again."""
    deciders.start()
    ledger = tmp_path / "ledger"
    doc = {"task_id": "two", "approval": {"required": True}, "steps": [
        {"action": "ledger.record", "args": {"ledger": str(ledger), "entry": "first",
                                             "hold_s": 2}},
        {"action": "ledger.record", "args": {"ledger": str(ledger), "entry": "second"}}]}
    handle = await start(temporal_env.client, doc, task_queue)
    await wait_state(handle, "awaiting_approval")
    commands.decide_approval(url_as("ana"), "two", "approve", "")
    await handle.signal("approval", {})
    for _ in range(100):
        if store.step_row("two", 1) is not None:
            break
        await asyncio.sleep(0.05)
    assert (await cli("stop", "two", "--reason", "a second look"))[0] == 0
    assert (await run_result(handle)).state == "stopped"
    assert [line.split()[-1] for line in ledger_lines(ledger)] == ["first"]
    code, _, err = await cli("resume", "two", "--task-queue", task_queue)
    assert code == 0, err
    resumed = temporal_env.client.get_workflow_handle("tidemark-two", result_type=RunResult)
    await wait_state(resumed, "awaiting_approval")
    assert [line.split()[-1] for line in ledger_lines(ledger)] == ["first"]
    commands.decide_approval(url_as("ben"), "two", "approve", "")
    await resumed.signal("approval", {})
    assert (await run_result(resumed)).state == "completed"
    assert [line.split()[-1] for line in ledger_lines(ledger)] == ["first", "second"]
