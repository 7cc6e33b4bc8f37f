"""A task's life on a real Temporal dev server.

Unwound is terminal, refused compensations are counted apart, Temporal's Reset repeats no effect,
and a wrong workflow id or an input that is not an object ends the run readably."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from helpers.ledger import ledger_lines
from helpers.wait import assert_eventually
from tidemark.errors import UnknownTask
from tidemark.faults import CRASH_ENV
from tidemark.payloads import RunResult, UnwindResult
from tidemark.report import build_report
from tidemark.store import JournalStore
from tools.cli.main import main
from tools.operate import commands
from tools.stack.devstack import temporal_binary
from workflows.outcome import run_result, unwind_result

RESULT_TIMEOUT = 60


async def run_plan(client: Client, doc: Any, task_queue: str, task_id: str,
                   workflow_id: str | None = None, timeout: float = RESULT_TIMEOUT) -> RunResult:
    handle = await client.start_workflow("RunPlan", doc, id=workflow_id or f"tidemark-{task_id}",
                                         task_queue=task_queue, result_type=RunResult)
    return await asyncio.wait_for(run_result(handle), timeout)


async def unwind(client: Client, task_id: str, task_queue: str) -> UnwindResult:
    handle = await client.start_workflow("UnwindPlan", {"task_id": task_id},
                                         id=f"tidemark-unwind-{task_id}",
                                         task_queue=task_queue, result_type=UnwindResult)
    return await asyncio.wait_for(unwind_result(handle), RESULT_TIMEOUT)


def renames(tmp_path: Path, n: int) -> list[dict[str, Any]]:
    for i in range(n):
        (tmp_path / f"d{i}.txt").write_text(str(i))
    return [{"action": "fs.rename", "args": {"path": str(tmp_path / f"d{i}.txt"),
                                             "name": f"f{i}.txt"}} for i in range(n)]


def ledger(tmp_path: Path, entry: str, **extra: Any) -> dict[str, Any]:
    return {"action": "ledger.record",
            "args": {"ledger": str(tmp_path / "ledger"), "entry": entry, **extra}}


def files(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".txt")


def entries(tmp_path: Path) -> list[str]:
    return [line.split(" ", 1)[1] for line in ledger_lines(tmp_path / "ledger")]


# -- 3. unwound is terminal -----------------------------------------------------------------

async def test_an_unwound_task_never_runs_forward_again(
        temporal_env: WorkflowEnvironment, store: JournalStore, db_url: str, tmp_path: Path,
        workers, task_queue: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    workers.start()
    client = temporal_env.client
    gate = tmp_path / "gate"
    gate.write_text("")
    doc = {"task_id": "unw-1", "steps": [*renames(tmp_path, 1),
                                         ledger(tmp_path, "check", gate_file=str(gate)),
                                         ledger(tmp_path, "final mail")]}
    first = await run_plan(client, doc, task_queue, "unw-1")
    assert (first.state, first.confirmed) == ("precondition_failed", 1)
    commands.stop(db_url, "unw-1", "wrong names", "ops")
    undone = await unwind(client, "unw-1", task_queue)
    assert (undone.state, undone.undone) == ("unwound", [1])
    assert files(tmp_path) == ["d0.txt"]
    gate.unlink()  # the world would now let it run on

    commands.release(db_url, "unw-1", "resume", "ops")  # what `tidemark resume` did first
    stored = await run_plan(client, {"task_id": "unw-1"}, task_queue, "unw-1")
    assert stored.state == "unwound" and stored.error["type"] == "TaskUnwound"
    again = await run_plan(client, doc, task_queue, "unw-1")  # the agent submits it again
    assert again.state == "unwound"
    assert entries(tmp_path) == [] and files(tmp_path) == ["d0.txt"]
    assert build_report(store, "unw-1").state == "unwound"
    desc = await client.get_workflow_handle("tidemark-unw-1").describe()
    assert {k.name: v for k, v in desc.typed_search_attributes}["TidemarkState"] == "unwound"

    monkeypatch.setenv("DATABASE_URL", db_url)
    capsys.readouterr()
    assert main(["resume", "unw-1", "--address", "127.0.0.1:1"]) == 1  # refused, not started
    assert "TaskUnwound" in capsys.readouterr().err
    assert store.stop_state("unw-1") is None and entries(tmp_path) == []


async def test_a_completed_then_unwound_task_reports_unwound(
        temporal_env: WorkflowEnvironment, store: JournalStore, db_url: str, tmp_path: Path,
        workers, task_queue: str) -> None:
    workers.start()
    client = temporal_env.client
    doc = {"task_id": "unw-2", "steps": renames(tmp_path, 2)}
    assert (await run_plan(client, doc, task_queue, "unw-2")).state == "completed"
    commands.stop(db_url, "unw-2", "undo all", "ops")
    result = await unwind(client, "unw-2", task_queue)
    assert (result.state, result.undone) == ("unwound", [2, 1])
    report = build_report(store, "unw-2")
    assert report.state == "unwound" and report.as_json()["unwound"] is not None
    assert (await run_plan(client, doc, task_queue, "unw-2")).state == "unwound"


# -- 4. refused compensations are counted apart and tried again -----------------------------

async def test_an_unwind_counts_refused_steps_apart_and_a_later_one_retries_them(
        temporal_env: WorkflowEnvironment, store: JournalStore, db_url: str, tmp_path: Path,
        workers, task_queue: str) -> None:
    workers.start()
    client = temporal_env.client
    doc = {"task_id": "unw-3", "steps": renames(tmp_path, 3)}
    assert (await run_plan(client, doc, task_queue, "unw-3")).state == "completed"
    (tmp_path / "f1.txt").rename(tmp_path / "theirs.txt")  # someone else took step 2's file
    commands.stop(db_url, "unw-3", "undo", "ops")
    first = await unwind(client, "unw-3", task_queue)
    assert first.state == "failed" and first.error["type"] == "CompensationRefused"
    assert (first.undone, first.refused, first.already_undone) == ([3, 1], [2], [])
    assert "cannot restore" in first.reasons["2"]
    # Not unwound (step 2 is not), and never to be run forward again.
    assert build_report(store, "unw-3").state == "partly_unwound"

    (tmp_path / "theirs.txt").rename(tmp_path / "f1.txt")  # a person clears the way
    second = await unwind(client, "unw-3", task_queue)
    assert (second.state, second.undone, second.refused) == ("unwound", [2], [])
    assert files(tmp_path) == ["d0.txt", "d1.txt", "d2.txt"]


# -- 6. Temporal's Reset repeats no effect --------------------------------------------------

def reset_to_first_workflow_task(workers, workflow_id: str) -> None:
    done = subprocess.run(
        [temporal_binary(), "workflow", "reset", "--workflow-id", workflow_id,
         "--type", "FirstWorkflowTask", "--reason", "test"],
        env={**os.environ, "TEMPORAL_ADDRESS": workers.env["TEMPORAL_ADDRESS"]},
        capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


async def latest_result(client: Client, workflow_id: str, old_run: str | None) -> RunResult:
    handle = client.get_workflow_handle(workflow_id, result_type=RunResult)
    desc = await handle.describe()
    assert desc.run_id != old_run  # the reset made a new run
    return await asyncio.wait_for(run_result(handle), RESULT_TIMEOUT)


async def test_reset_of_a_finished_run_repeats_nothing(
        temporal_env: WorkflowEnvironment, tmp_path: Path, workers, task_queue: str) -> None:
    workers.start()
    client = temporal_env.client
    doc = {"task_id": "reset-1", "steps": [ledger(tmp_path, f"e{i}") for i in range(1, 4)]}
    handle = await client.start_workflow("RunPlan", doc, id="tidemark-reset-1",
                                         task_queue=task_queue, result_type=RunResult)
    assert (await run_result(handle)).state == "completed"
    reset_to_first_workflow_task(workers, "tidemark-reset-1")
    after = await latest_result(client, "tidemark-reset-1", handle.result_run_id)
    assert (after.state, after.executed, after.confirmed) == ("completed", 0, 3)
    assert entries(tmp_path) == ["e1", "e2", "e3"]


async def test_reset_of_a_run_with_a_step_in_doubt_repeats_nothing(
        temporal_env: WorkflowEnvironment, store: JournalStore, tmp_path: Path, workers,
        task_queue: str) -> None:
    client = temporal_env.client
    doomed = workers.start(**{CRASH_ENV: "after_execute:2"})  # dies with step 2 in doubt
    doc = {"task_id": "reset-2", "steps": [ledger(tmp_path, f"e{i}") for i in range(1, 5)]}
    handle = await client.start_workflow("RunPlan", doc, id="tidemark-reset-2",
                                         task_queue=task_queue, result_type=RunResult)
    assert doomed.wait(timeout=60) == -signal.SIGKILL
    doubt = store.progress("reset-2").in_doubt
    assert doubt is not None and doubt.step == 2
    reset_to_first_workflow_task(workers, "tidemark-reset-2")  # while it is half-finished
    workers.start()
    after = await latest_result(client, "tidemark-reset-2", handle.result_run_id)
    assert (after.state, after.confirmed) == ("completed", 4)
    assert entries(tmp_path) == ["e1", "e2", "e3", "e4"]  # step 2 once: settled by its probe
    row2 = store.step_row("reset-2", 2)
    assert row2 is not None and row2.resolved_by == "probe"


async def test_reset_of_a_halted_run_repeats_nothing(
        temporal_env: WorkflowEnvironment, store: JournalStore, db_url: str, tmp_path: Path,
        workers, task_queue: str) -> None:
    workers.start()
    client = temporal_env.client
    doc = {"task_id": "reset-3",
           "steps": [ledger(tmp_path, f"e{i}", hold_s=0.2) for i in range(1, 9)]}
    handle = await client.start_workflow("RunPlan", doc, id="tidemark-reset-3",
                                         task_queue=task_queue, result_type=RunResult)
    assert_eventually(lambda: len(entries(tmp_path)) >= 2, timeout=30)
    await handle.signal("halt", "window")
    assert (await run_result(handle)).state == "halted"
    done = entries(tmp_path)
    reset_to_first_workflow_task(workers, "tidemark-reset-3")
    after = await latest_result(client, "tidemark-reset-3", handle.result_run_id)
    assert after.state in ("stopped", "halted") and after.executed == 0
    assert entries(tmp_path) == done
    commands.release(db_url, "reset-3", "window over", "ops")
    resumed = await run_plan(client, {"task_id": "reset-3"}, task_queue, "reset-3")
    assert (resumed.state, resumed.confirmed) == ("completed", 8)
    assert entries(tmp_path) == [f"e{i}" for i in range(1, 9)]


# -- 7. the workflow id names the task -------------------------------------------------------

async def test_a_workflow_id_that_does_not_match_the_task_is_refused_before_persisting(
        temporal_env: WorkflowEnvironment, store: JournalStore, tmp_path: Path, workers,
        task_queue: str) -> None:
    workers.start()
    client = temporal_env.client
    doc = {"task_id": "wid-1", "steps": [ledger(tmp_path, "e1")]}
    result = await run_plan(client, doc, task_queue, "wid-1", workflow_id="tidemark-other")
    assert result.state == "failed" and result.error["type"] == "PlanError"
    assert "tidemark-wid-1" in result.error["message"]
    with pytest.raises(UnknownTask):
        store.progress("wid-1")  # nothing persisted
    assert (await run_plan(client, doc, task_queue, "wid-1")).state == "completed"
    stored = await run_plan(client, {"task_id": "wid-1"}, task_queue, "wid-1",
                            workflow_id="my-run")
    assert (stored.state, stored.error["type"]) == ("failed", "PlanError")
    assert entries(tmp_path) == ["e1"]


# -- 9. an input that is not an object --------------------------------------------------------

@pytest.mark.parametrize("bad", ["x", [1, 2], 7])
async def test_an_input_that_is_not_an_object_ends_failed_and_visible(
        temporal_env: WorkflowEnvironment, workers, task_queue: str, bad: Any) -> None:
    workers.start()
    client = temporal_env.client
    wid = f"tidemark-notobj-{type(bad).__name__}"
    result = await run_plan(client, bad, task_queue, "", workflow_id=wid, timeout=20)
    assert (result.state, result.error["type"]) == ("failed", "PlanError")
    assert "must be a plan object" in result.error["message"]
    desc = await client.get_workflow_handle(wid).describe()
    assert {k.name: v for k, v in desc.typed_search_attributes}["TidemarkState"] == "failed"
