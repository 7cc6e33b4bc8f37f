"""`tidemark kill` through the real CLI, worker processes, Temporal dev server and Postgres.

It refuses what names nothing, matches a series exactly, stops a running unwind, leaves the step
under way settled, and leaves every killed workflow Terminated with `TidemarkState = killed`;
`status` names the kill; an approval after a kill or under a stop changes nothing;
`approve --wait` waits for the run to take the decision; an unwind closes a run that awaits
approval; a failed unwind ends Failed."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from activities.catalog import spec_registry
from helpers.ledger import LedgerRecord, ledger_lines
from helpers.runs import start
from helpers.wait import assert_eventually
from tidemark import series
from tidemark.errors import Unauthorized
from tidemark.grants import GrantBroker, LocalMinter
from tidemark.plan import load_plan
from tidemark.series import SeriesBlocked
from tidemark.store import JournalStore
from tools.operate import schedules
from tools.operate.kill import KillError, target_of
from workflows.outcome import run_result

SPECS = spec_registry(LedgerRecord)


def ledger_steps(ledger: Path, prefix: str, n: int, **extra: Any) -> list[dict[str, Any]]:
    return [{"action": "ledger.record", "args": {"ledger": str(ledger), "entry": f"{prefix}{i}",
                                                 **extra}} for i in range(1, n + 1)]


def renames(docs: Path, n: int) -> list[dict[str, Any]]:
    docs.mkdir()
    for i in range(n):
        (docs / f"d{i}.txt").write_text(str(i))
    return [{"action": "fs.rename", "args": {"path": str(docs / f"d{i}.txt"),
                                             "name": f"f{i}.txt"}} for i in range(n)]


async def tidemark_state(handle: WorkflowHandle[Any, Any]) -> tuple[str, str | None]:
    """(Temporal status, TidemarkState) as the Web UI's list shows them."""
    desc = await handle.describe()
    attrs = dict((k.name, v) for k, v in desc.typed_search_attributes)
    return (desc.status.name if desc.status else "?"), attrs.get("TidemarkState")


async def wait_for_state(handle: WorkflowHandle[Any, Any], state: str,
                         timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while (await tidemark_state(handle))[1] != state:
        assert time.monotonic() < deadline, await tidemark_state(handle)
        await asyncio.sleep(0.1)


def approval_plan(tmp_path: Path, task_id: str) -> dict[str, Any]:
    return {"task_id": task_id, "steps": renames(tmp_path / "docs", 2)
            + ledger_steps(tmp_path / "ledger", "mail", 1),
            "approval": {"required": True}}


# -- bad input: one line, a non-zero exit, nothing written, no layer run ---------------------

async def test_kill_takes_neither_every_task_nor_a_series_scope_as_a_task_id(
        store: JournalStore) -> None:
    """Kill takes neither every task nor a series scope as a task id.

    `*` and `series:S` are scopes, not task ids. A kill given either as its task (by a caller
    that passed no command line, whose id check would refuse `*` first) is refused before
    anything is written, naming --series and --all."""
    for scope in ("*", "series:nightly"):
        with pytest.raises(KillError, match="is not a task id; use --series S or --all"):
            await target_of(None, store, task=scope, series=None, everything=False,
                            force_unknown=True)
        assert store.stop_state(scope) is None


async def test_kill_refuses_an_unknown_or_invalid_id_an_unknown_series_and_two_targets(
        cli: Any, store: JournalStore, tmp_path: Path) -> None:
    store.persist_plan(load_plan({"task_id": "sync-7", "steps": ledger_steps(
        tmp_path / "ledger", "e", 1)}, SPECS))
    code, out, err = await cli("kill", "sync-l")  # a typo of sync-7
    assert code == 1 and out == ""
    assert err.startswith("tidemark: UnknownStopTarget: no task 'sync-l' is known")
    assert "--force-unknown" in err and err.count("\n") == 1
    assert store.stop_state("sync-l") is None and store.events("sync-l") == []
    code, _, err = await cli("stop", "sync-l")  # nothing was written that would admit it
    assert code == 1 and "no task 'sync-l'" in err

    code, out, err = await cli("kill", "no such/id!", "--force-unknown")
    assert (code, out) == (1, "") and "not a valid task id" in err and err.count("\n") == 1
    code, out, err = await cli("kill", "series:sync")
    assert (code, out) == (1, "") and "not a task id" in err
    code, out, err = await cli("kill", "--series", "nightly")  # declared nowhere
    assert (code, out) == (1, "") and err.startswith("tidemark: UnknownSeries: no series "
                                                     "'nightly' is known")
    assert store.stop_state("series:nightly") is None
    code, out, err = await cli("kill", "sync-7", "--series", "nightly")
    assert (code, out) == (2, "") and "give one of a task id, --series S or --all" in err
    code, out, err = await cli("kill", "sync-7", "--grace", "-1")
    assert (code, out) == (2, "") and "--grace must be 0 or more seconds" in err
    assert store.stop_state("sync-7") is None
    assert [e["kind"] for e in store.events("sync-7")] == ["plan"]

    # An id whose plan has not arrived yet is killed on purpose with --force-unknown.
    code, out, _ = await cli("kill", "sync-8", "--force-unknown", "--by", "ops")
    assert code == 0 and "stopped: no workflow was running" in out
    assert store.stop_state("sync-8")["state"] == "killed"


# -- a killed run is Terminated and says killed; status names the kill -------------------------

@pytest.mark.parametrize("execution", ["activity", "fast"])
async def test_kill_of_a_running_plan_ends_terminated_killed_and_status_names_the_kill(
        cli: Any, temporal_env: WorkflowEnvironment, store: JournalStore, tmp_path: Path,
        workers, task_queue: str, execution: str) -> None:
    client = temporal_env.client
    workers.start()
    series, task = f"quick-{execution}", f"quick-{execution}-1"
    store.declare_series(series, "ops", "ops")
    await schedules.create(client, series, "0 3 * * *", "helpers.planners:nightly", {},
                           task_queue)
    ledger = tmp_path / "ledger"
    # Quick steps: between layer 1 (the stop state) and layer 4 the next step meets the stop.
    hold = {"hold_s": 0.01} if execution == "fast" else {}
    doc = {"task_id": task, "series": series, "execution": execution,
           "steps": ledger_steps(ledger, "q", 400, **hold)}
    handle = await start(client, doc, task_queue)
    assert_eventually(lambda: len(ledger_lines(ledger)) >= 3, timeout=30)
    code, out, _ = await cli("kill", task, "--reason", "wrong folder", "--by", "ops")
    assert code == 0, out
    assert await tidemark_state(handle) == ("TERMINATED", "killed")
    assert f"stopped: tidemark-{task}" in out
    progress = store.progress(task)
    assert progress.in_doubt is None  # the step under way was let finish
    time.sleep(0.5)
    assert len(ledger_lines(ledger)) == progress.confirmed < 400

    code, out, _ = await cli("status", task)
    assert code == 0 and f"task {task}  (killed)" in out
    assert "stop state     killed by ops at 20" in out and ": wrong folder" in out
    code, out, _ = await cli("status", task, "--json")
    report = json.loads(out)
    assert report["state"] == "killed" and report["stop"]["set_by"] == "ops"
    await schedules.delete(client, series)


async def test_kill_during_a_slow_step_lets_it_finish_so_it_is_not_left_in_doubt(
        cli: Any, temporal_env: WorkflowEnvironment, store: JournalStore, tmp_path: Path,
        workers, task_queue: str) -> None:
    workers.start()
    ledger = tmp_path / "ledger"
    doc = {"task_id": "slow-1", "steps": ledger_steps(ledger, "s", 4, hold_s=2.0)}
    handle = await start(temporal_env.client, doc, task_queue)
    # Step 1's intent is written and its action is holding: the step is under way.
    assert_eventually(lambda: store.task_known("slow-1")
                      and store.progress("slow-1").in_doubt is not None, timeout=30)
    code, out, _ = await cli("kill", "slow-1", "--by", "ops", "--json")
    layers = json.loads(out)["committed"]["layers"]
    assert code == 0 and all(x["done"] for x in layers)
    progress = store.progress("slow-1")
    assert progress.in_doubt is None and progress.confirmed == 1
    assert await tidemark_state(handle) == ("TERMINATED", "killed")
    said = layers[3]["detail"]["tidemark-slow-1"]
    assert said.startswith("terminated (killed; the attempt under way ended first: run_step"), said
    time.sleep(2.5)  # nothing after it starts
    assert [line.split(" ", 1)[1] for line in ledger_lines(ledger)] == ["s1"]


async def test_kill_with_grace_0_terminates_without_waiting_for_the_step_yet_says_killed(
        cli: Any, temporal_env: WorkflowEnvironment, store: JournalStore, tmp_path: Path,
        workers, task_queue: str) -> None:
    """Kill with ``--grace 0`` terminates without waiting for the step, yet says killed.

    ``--grace 0`` waits for no attempt under way, but a terminated run can no longer change
    its search attributes: the kill lets the run take its signal (the list then says
    ``killed``) before it terminates it, also when the worker is slow to take it."""
    worker = workers.start()
    ledger = tmp_path / "ledger"
    doc = {"task_id": "slow-0", "steps": ledger_steps(ledger, "s", 4, hold_s=3.0)}
    handle = await start(temporal_env.client, doc, task_queue)
    assert_eventually(lambda: store.task_known("slow-0")
                      and store.progress("slow-0").in_doubt is not None, timeout=30)
    # The worker pauses for a second (a stalled host) just as the kill starts.
    worker.send_signal(signal.SIGSTOP)
    resume = threading.Timer(1.0, worker.send_signal, (signal.SIGCONT,))
    resume.start()
    started = time.monotonic()
    try:
        code, out, _ = await cli("kill", "slow-0", "--by", "ops", "--grace", "0", "--json")
    finally:
        resume.join()
        worker.send_signal(signal.SIGCONT)
    took = time.monotonic() - started
    layers = json.loads(out)["committed"]["layers"]
    assert code == 0 and all(x["done"] for x in layers), layers
    assert await tidemark_state(handle) == ("TERMINATED", "killed")
    said = layers[3]["detail"]["tidemark-slow-0"]
    # Terminated with step 1's attempt still holding: it was not waited for.
    assert said == ("terminated (killed; the attempt under way was not waited for (--grace 0): "
                    "run_step (attempt 1))"), said
    assert took < 3.0, took  # step 1 holds 3 s: it was not waited for
    result = await run_result(handle)
    assert (result.state, result.error["message"]) == ("killed", "killed by ops: killed")


# -- a series is matched exactly, never by a prefix ---------------------------------------------

async def test_kill_series_k_leaves_the_running_scheduled_run_of_series_k_b_alone(
        cli: Any, temporal_env: WorkflowEnvironment, store: JournalStore, tmp_path: Path,
        workers, task_queue: str) -> None:
    client = temporal_env.client
    workers.start()
    args = {"calls": str(tmp_path / "calls"), "ledger": str(tmp_path / "ledger-kb"), "n": 3,
            "hold_s": 1.0}
    store.declare_series("k-b", "ops", "ops")
    await schedules.create(client, "k-b", "0 3 * * *", "helpers.planners:nightly", args,
                           task_queue)
    store.declare_series("k", "ops", "ops")
    await schedules.create(client, "k", "0 3 * * *", "helpers.planners:nightly",
                           {**args, "ledger": str(tmp_path / "ledger-k"), "n": 30},
                           task_queue)
    await schedules.trigger(client, "k-b")
    await schedules.trigger(client, "k")
    runs = await _scheduled(client, 2, "tidemark-sched-k-")
    kb = next(wid for wid in runs if wid.startswith("tidemark-sched-k-b-"))
    k = next(wid for wid in runs if wid != kb)
    assert_eventually(lambda: ledger_lines(tmp_path / "ledger-kb")
                      and ledger_lines(tmp_path / "ledger-k"), timeout=30)

    code, out, _ = await cli("kill", "--series", "k", "--by", "ops", "--json")
    layers = json.loads(out)["committed"]["layers"]
    assert code == 0 and layers[1]["detail"] == {"k": "paused"}
    killed = layers[3]["detail"]
    assert kb not in killed and not any(w.startswith("tidemark-sched-k-b-") for w in killed)
    assert killed[k].startswith("terminated (killed; ")
    # Its RunPlan, found from the journal (task id sched-k-<stamp>).
    [child] = [w for w in killed if w != k and w.startswith("tidemark-sched-k-2")]
    for wid in (k, child):
        assert await tidemark_state(client.get_workflow_handle(wid)) == ("TERMINATED", "killed")
    # Series k-b runs on to the end, untouched; its schedule is not paused.
    result = await run_result(client.get_workflow_handle(kb))
    assert (result.state, result.confirmed) == ("completed", 3)
    assert (await schedules.describe(client, "k-b"))["paused"] is False
    assert store.stop_state(result.task_id) is None
    for s in ("k", "k-b"):
        await schedules.delete(client, s)


async def _scheduled(client: Client, n: int, prefix: str = "tidemark-sched-") -> list[str]:
    deadline = time.monotonic() + 30
    while True:
        ids = [wf.id async for wf in client.list_workflows('WorkflowType="ScheduledRun" AND '
                                                           'ExecutionStatus="Running"')
               if wf.id.startswith(prefix)]
        if len(ids) >= n:
            return ids
        assert time.monotonic() < deadline, ids
        await asyncio.sleep(0.2)


# -- kill while an unwind runs -------------------------------------------------------------------

async def test_kill_stops_an_unwind_under_way_and_says_so(
        cli: Any, temporal_env: WorkflowEnvironment, store: JournalStore, tmp_path: Path,
        workers, task_queue: str) -> None:
    client = temporal_env.client
    workers.start()
    doc = {"task_id": "unw-k", "steps": renames(tmp_path / "docs", 60)}
    assert (await run_result(await start(client, doc, task_queue))).state == "completed"
    # A person runs the unwind and waits for it, in another terminal.
    waiting = subprocess.Popen(
        [sys.executable, "-m", "tools.cli.main", "unwind", "unw-k", "--yes", "--wait",
         "--task-queue", task_queue], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env={**os.environ, "DATABASE_URL": store.conninfo,
                        "TEMPORAL_ADDRESS": workers.env["TEMPORAL_ADDRESS"]})
    assert_eventually(lambda: store.task_known("unw-k")
                      and store.progress("unw-k").undo_rows >= 3, timeout=30)

    code, out, _ = await cli("kill", "unw-k", "--by", "ops", "--reason", "wrong undo")
    assert code == 0, out
    at_kill = store.progress("unw-k").undo_rows
    time.sleep(1.5)
    assert store.progress("unw-k").undo_rows == at_kill < 60  # no compensation after the kill
    unwind = client.get_workflow_handle("tidemark-unwind-unw-k")
    assert await tidemark_state(unwind) == ("TERMINATED", "killed")
    assert "stopped: tidemark-unwind-unw-k" in out
    assert store.stop_state("unw-k")["state"] == "killed"
    # The waiting unwind command says it was killed, with the kill's reason, in one line and
    # its exit code (3: it did not end unwound); no trace.
    out, err = await asyncio.to_thread(waiting.communicate, timeout=30)
    assert waiting.returncode == 3 and err.count("\n") == 1, err
    assert err.startswith("tidemark: tidemark-unwind-unw-k ended killed, not unwound"), err
    said = json.loads(out)
    assert (said["state"], said["error"]["message"]) == ("killed", "killed by ops: wrong undo")


# -- kill then approve, stop then approve, approve --wait ---------------------------------------

async def test_an_approval_after_a_kill_changes_nothing_and_says_why(
        cli: Any, temporal_env: WorkflowEnvironment, store: JournalStore, tmp_path: Path,
        workers, task_queue: str) -> None:
    workers.start()
    handle = await start(temporal_env.client, approval_plan(tmp_path, "appr-k"), task_queue)
    await wait_for_state(handle, "awaiting_approval")
    code, out, _ = await cli("kill", "appr-k", "--by", "ops", "--reason", "incident")
    assert code == 0
    assert await tidemark_state(handle) == ("TERMINATED", "killed")
    assert "stopped: tidemark-appr-k" in out

    for verb in ("approve", "reject"):
        code, out, err = await cli(verb, "appr-k", "--by", "ana", "--wait")
        assert (code, out) == (1, ""), (verb, out)
        assert err.startswith("tidemark: DecisionRefused: task appr-k is killed by ops at ")
        assert f" {verb} now changes nothing" in err and err.count("\n") == 1
    assert [e for e in store.events("appr-k") if e["kind"] == "approval"] == []
    assert store.stop_state("appr-k")["state"] == "killed"  # a reject did not turn it into a stop
    assert ledger_lines(tmp_path / "ledger") == []


async def test_an_approval_under_a_stop_is_refused_then_approve_wait_follows_the_run(
        cli: Any, temporal_env: WorkflowEnvironment, store: JournalStore, tmp_path: Path,
        workers, task_queue: str) -> None:
    workers.start()
    handle = await start(temporal_env.client, approval_plan(tmp_path, "appr-s"), task_queue)
    await wait_for_state(handle, "awaiting_approval")
    assert (await cli("stop", "appr-s", "--by", "ops", "--reason", "audit"))[0] == 0
    code, out, err = await cli("approve", "appr-s", "--by", "ana")
    assert (code, out) == (1, "") and "is stopped by ops at " in err
    assert "`tidemark release appr-s`" in err and err.count("\n") == 1
    assert store.current_decision("appr-s") is None and ledger_lines(tmp_path / "ledger") == []

    assert (await cli("release", "appr-s"))[0] == 0
    code, out, _ = await cli("approve", "appr-s", "--by", "ana", "--wait")
    assert code == 0
    last = out.strip().splitlines()[-1]
    # It waited until the run took the decision: going on, or already completed.
    assert last in ("tidemark-appr-s took the decision: running (`tidemark status appr-s` "
                    "follows its steps)",
                    "tidemark-appr-s took the decision and ended completed: completed"), last
    result = await run_result(handle)
    assert (result.state, result.confirmed) == ("completed", 3)
    assert len(ledger_lines(tmp_path / "ledger")) == 1


async def test_reject_wait_prints_that_the_run_ended_stopped(
        cli: Any, temporal_env: WorkflowEnvironment, store: JournalStore, tmp_path: Path,
        workers, task_queue: str) -> None:
    workers.start()
    handle = await start(temporal_env.client, approval_plan(tmp_path, "appr-r"), task_queue)
    await wait_for_state(handle, "awaiting_approval")
    code, out, _ = await cli("reject", "appr-r", "--by", "ana", "--wait")
    assert code == 0
    assert out.strip().splitlines()[-1].startswith(
        "tidemark-appr-r took the decision and ended failed: stopped (Rejected: "
        f"{pwd.getpwuid(os.geteuid()).pw_name} rejected")
    assert (await tidemark_state(handle)) == ("FAILED", "stopped")


async def test_an_unwind_of_a_task_awaiting_approval_closes_the_waiting_run(
        cli: Any, temporal_env: WorkflowEnvironment, store: JournalStore, tmp_path: Path,
        workers, task_queue: str) -> None:
    """An unwind of a task awaiting approval closes the waiting run.

    The run that waits for a person at the boundary does not stay open behind an unwind. It ends
    ``stopped`` (Failed in the list, ``TidemarkState = stopped``), and nothing of the task runs
    forward afterwards."""
    workers.start()
    handle = await start(temporal_env.client, approval_plan(tmp_path, "appr-u"), task_queue)
    await wait_for_state(handle, "awaiting_approval")
    code, out, _ = await cli("unwind", "appr-u", "--yes", "--wait", "--by", "ops",
                             "--task-queue", task_queue)
    assert code == 0 and json.loads(out)["state"] == "unwound", out
    assert sorted(p.name for p in (tmp_path / "docs").iterdir()) == ["d0.txt", "d1.txt"]

    result = await asyncio.wait_for(run_result(handle), timeout=30)
    assert (result.state, result.error["type"], result.error["step"]) == (
        "stopped", "Unwinding", 3), result
    assert "tidemark-unwind-appr-u" in result.error["message"]
    assert await tidemark_state(handle) == ("FAILED", "stopped")

    # Nothing runs it forward: an approval is refused, a resume ends at once, the mail is
    # never sent.
    code, out, err = await cli("approve", "appr-u", "--by", pwd.getpwuid(os.geteuid()).pw_name)
    assert (code, out) == (1, "") and err.count("\n") == 1, err
    assert "task appr-u was unwound; there is nothing to decide" in err, err
    code, out, err = await cli("resume", "appr-u", "--wait", "--task-queue", task_queue)
    assert (code, out) == (1, "") and err.startswith("tidemark: TaskUnwound: "), err
    assert ledger_lines(tmp_path / "ledger") == []
    assert [e for e in store.events("appr-u") if e["kind"] == "approval"] == []


# -- an unwind that fails ends Failed ---------------------------------------------------------

async def test_an_unwind_with_a_refused_compensation_ends_failed(
        cli: Any, temporal_env: WorkflowEnvironment, store: JournalStore, tmp_path: Path,
        workers, task_queue: str) -> None:
    client = temporal_env.client
    workers.start()
    docs = tmp_path / "docs"
    doc = {"task_id": "unw-f", "steps": renames(docs, 3)}
    assert (await run_result(await start(client, doc, task_queue))).state == "completed"
    (docs / "f1.txt").rename(docs / "theirs.txt")  # somebody else took step 2's file
    code, out, err = await cli("unwind", "unw-f", "--yes", "--wait", "--task-queue", task_queue)
    assert code == 3 and "tidemark-unwind-unw-f ended failed, not unwound" in err
    result = json.loads(out)
    assert (result["state"], result["refused"], result["undone"]) == ("failed", [2], [3, 1])
    handle = client.get_workflow_handle("tidemark-unwind-unw-f")
    assert await tidemark_state(handle) == ("FAILED", "failed")
    assert await _eventually_listed(client)  # on the list of runs that need a person


async def _eventually_listed(client: Client) -> bool:
    deadline = time.monotonic() + 10  # the list is Temporal's visibility store: it lags a little
    while time.monotonic() < deadline:
        if [wf.id async for wf in client.list_workflows(
                'ExecutionStatus="Failed" AND WorkflowId="tidemark-unwind-unw-f"')]:
            return True
        await asyncio.sleep(0.2)
    return False


async def test_kill_of_a_scheduled_task_takes_its_scheduled_run_with_it(
        cli: Any, temporal_env: WorkflowEnvironment, store: JournalStore, tmp_path: Path,
        workers, task_queue: str) -> None:
    client = temporal_env.client
    workers.start()
    store.declare_series("solo", "ops", "ops")
    await schedules.create(client, "solo", "0 3 * * *", "helpers.planners:nightly",
                           {"calls": str(tmp_path / "calls"), "ledger": str(tmp_path / "ledger"),
                            "n": 20, "hold_s": 0.5}, task_queue)
    await schedules.trigger(client, "solo")
    [parent] = await _scheduled(client, 1, "tidemark-sched-solo-")
    assert_eventually(lambda: ledger_lines(tmp_path / "ledger"), timeout=30)
    [run] = store.series_runs("solo")
    code, out, _ = await cli("kill", run["task_id"], "--by", "ops")
    assert code == 0, out
    # Not Failed on its terminated child: killed with it, and saying so.
    for wid in (parent, f"tidemark-{run['task_id']}"):
        assert await tidemark_state(client.get_workflow_handle(wid)) == ("TERMINATED", "killed")
    assert f"stopped: tidemark-{run['task_id']}, {parent}\n" in out
    await schedules.delete(client, "solo")


async def test_kill_without_temporal_still_sets_the_stop_state_and_revokes_the_grants(
        cli: Any, store: JournalStore, tmp_path: Path) -> None:
    store.persist_plan(load_plan({"task_id": "dark-1", "steps": ledger_steps(
        tmp_path / "ledger", "e", 1)}, SPECS))
    code, out, err = await cli("kill", "dark-1", "--by", "ops", "--address", "127.0.0.1:1",
                               "--json")
    layers = json.loads(out)["committed"]["layers"]
    assert code == 1 and err == ""
    assert [(x["layer"], x["done"]) for x in layers] == [(1, True), (2, True), (3, True),
                                                         (4, False)]
    assert layers[3]["detail"].startswith("KillError: Temporal is unreachable (cannot reach "
                                          "Temporal at 127.0.0.1:1")
    assert store.stop_state("dark-1")["state"] == "killed"


async def test_a_kill_of_a_series_whose_schedule_cannot_be_paused_still_kills_and_revokes(
        cli: Any, store: JournalStore, tmp_path: Path) -> None:
    """A kill of a series whose schedule cannot be paused still kills and revokes.

    Layer 2 fails (Temporal is unreachable, so the schedule cannot be paused). The kill says so
    and layers 3 and 4 still run; the stop is on the series itself, so its next run is refused
    too, not only the runs it had."""
    store.declare_series("dark", "ops", "ops")
    plan = load_plan({"task_id": "dark-s1", "series": "dark",
                      "steps": ledger_steps(tmp_path / "ledger", "d", 1)}, SPECS)
    series.admit(store, plan.task_id, "dark")
    store.persist_plan(plan)
    GrantBroker(store).token("dark-s1", "ledger", "write", "base-token", LocalMinter("local"))
    code, out, err = await cli("kill", "--series", "dark", "--by", "ops", "--address",
                               "127.0.0.1:1", "--json")
    layers = json.loads(out)["committed"]["layers"]
    assert code == 1 and err == ""
    assert [(x["layer"], x["done"]) for x in layers] == [(1, True), (2, False), (3, True),
                                                         (4, False)], layers
    assert layers[1]["detail"].startswith("KillError: Temporal is unreachable")
    assert [(g["task_id"], g["at_provider"]) for g in layers[2]["detail"]] == [
        ("dark-s1", "nothing to revoke (local grant)")]
    assert store.revoke_grants("dark-s1", "test") == []  # none left unrevoked
    stop = store.stop_state("series:dark")
    assert stop is not None and stop["state"] == "killed"
    with pytest.raises(SeriesBlocked) as blocked:
        series.check(store, "dark", "dark-s2")
    assert blocked.value.details()["stopped"] is True


@pytest.mark.parametrize("state", ["stopped", "killed"])
def test_no_grant_is_issued_to_a_stopped_task_on_a_worker_that_holds_none(
        store: JournalStore, tmp_path: Path, state: str) -> None:
    """No grant is issued to a stopped task on a worker that holds none.

    A worker that never held a grant for the task (a fresh worker, a restarted one) asks for one
    after the stop. It is refused, and no grant is recorded."""
    store.persist_plan(load_plan({"task_id": "fresh-1", "steps": ledger_steps(
        tmp_path / "ledger", "f", 1)}, SPECS))
    if state == "killed":
        store.set_killed("fresh-1", "drill", "ops")
    else:
        store.set_control("fresh-1", "stopped", "audit", "ops")
    with pytest.raises(Unauthorized, match="the task is stopped; no grant is issued"):
        GrantBroker(store).token("fresh-1", "ledger", "write", "base-token",
                                 LocalMinter("local"))
    assert store.revoke_grants("fresh-1", "test") == []  # none was recorded
    store.set_control("fresh-1", "released", "checked", "ops")  # a person released it
    assert GrantBroker(store).token("fresh-1", "ledger", "write", "base-token",
                                   LocalMinter("local")) == "base-token"
