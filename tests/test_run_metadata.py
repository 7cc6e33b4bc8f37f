"""A run's user metadata in the Web UI: what it needs and the command, at start and after."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from helpers.runs import wait_state
from tidemark.needs import Act, Need, command, metadata, next_command, series_metadata
from tidemark.payloads import RunResult, UnwindResult
from tidemark.store import JournalStore
from tools.operate import commands
from tools.operate.starter import _start, start_plan
from workflows.outcome import run_result, unwind_result

SUMMARY_BYTES = 200  # what Temporal keeps of a static summary


def ledger_plan(tmp_path: Path, task_id: str, **extra: Any) -> dict[str, Any]:
    return {"task_id": task_id, **extra, "steps": [
        {"action": "ledger.record", "args": {"ledger": str(tmp_path / "ledger"), "entry": "e1"}}]}


async def shown(handle: WorkflowHandle[Any, RunResult]) -> tuple[str, str, str]:
    """The run's static summary, static details and current details, as the Web UI reads them."""
    desc = await handle.describe()
    meta = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    return (await desc.static_summary() or "", await desc.static_details() or "",
            meta.current_details)


def says_each_need(task_id: str, details: str) -> None:
    for need in (Need.APPROVAL, Need.STOPPED, Need.DECISION, Need.KILLED):
        assert f"- {need}: `{next_command(need, task_id)}`" in details, (need, details)
    assert f"`{command(Act.STATUS, task_id)}`" in details


async def test_a_run_waiting_for_approval_says_so_and_the_command(
        temporal_env: WorkflowEnvironment, tmp_path: Path, workers, task_queue: str) -> None:
    workers.start()
    handle = await start_plan(temporal_env.client, ledger_plan(
        tmp_path, "meta-appr", approval={"required": True}), "meta-appr", task_queue)
    await wait_state(handle, "awaiting_approval")
    summary, details, current = await shown(handle)
    assert summary == ("Task meta-appr: needs a person only when TidemarkNeeds says so; "
                       f"{command(Act.STATUS, 'meta-appr')}")
    assert len(summary.encode()) <= SUMMARY_BYTES
    says_each_need("meta-appr", details)
    # The first line says the state, the need and the command, before the why.
    assert current.splitlines()[0] == ("**awaiting_approval** · needs approval: "
                                       "`tidemark approve meta-appr`")
    assert next_command(Need.APPROVAL, "meta-appr") == "tidemark approve meta-appr"


async def test_a_stopped_run_says_so_and_the_release(
        temporal_env: WorkflowEnvironment, store: JournalStore, tmp_path: Path, workers,
        task_queue: str) -> None:
    commands.stop(store.conninfo, "meta-stop", "a look first", "ops", force_unknown=True)
    workers.start()
    handle = await start_plan(temporal_env.client, ledger_plan(tmp_path, "meta-stop"),
                              "meta-stop", task_queue)
    result = await run_result(handle)
    assert result.state == "stopped"
    summary, details, current = await shown(handle)
    assert summary.startswith("Task meta-stop: needs a person only when TidemarkNeeds says so")
    says_each_need("meta-stop", details)
    assert current.splitlines()[0] == ("**stopped** · 0/1 steps confirmed · needs stopped: "
                                       f"`{next_command(Need.STOPPED, 'meta-stop')}`")
    assert "release it with `tidemark release meta-stop`" in current
    # What the list shows holds no plan content: the ledger's path is not in it.
    assert str(tmp_path) not in summary + details + current.splitlines()[0]


def test_a_summary_fits_in_what_temporal_keeps_whatever_the_task_id() -> None:
    for workflow in ("RunPlan", "UnwindPlan"):
        summary, details = metadata(workflow, "t" * 128)
        assert len(summary.encode()) <= SUMMARY_BYTES and summary.endswith("...")
        assert f"`{command(Act.STATUS, 't' * 128)}`" in details
    assert len(series_metadata("s" * 128)[0].encode()) <= SUMMARY_BYTES


async def test_an_unwind_says_what_it_needs_and_the_command(
        temporal_env: WorkflowEnvironment, store: JournalStore, tmp_path: Path, workers,
        task_queue: str) -> None:
    workers.start()
    client = temporal_env.client
    run = await start_plan(client, ledger_plan(tmp_path, "meta-unw", approval={"required": True}),
                           "meta-unw", task_queue)
    await wait_state(run, "awaiting_approval")
    commands.stop(store.conninfo, "meta-unw", "put it back", "ops")
    handle = await _start(client, "UnwindPlan", "meta-unw", "tidemark-unwind-meta-unw",
                          task_queue, UnwindResult)
    assert (await unwind_result(handle)).state == "unwound"
    desc = await handle.describe()
    meta = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    assert await desc.static_summary() == ("Unwind of task meta-unw: puts its reversible steps "
                                           f"back; {command(Act.STATUS, 'meta-unw')}")
    assert f"- unwind: `{command(Act.UNWIND, 'meta-unw')}`" in (await desc.static_details() or "")
    assert meta.current_details.splitlines()[0] == (
        f"**unwound** · needs nothing · `{command(Act.STATUS, 'meta-unw')}`")


def test_the_worklist_page_gives_the_columns_its_screenshot_shows() -> None:
    """docs/who-needs-me.md's one step adds the columns dev.screenshots photographs."""
    from dev.screenshots import WORKLIST_COLUMNS

    page = (Path(__file__).resolve().parent.parent / "docs" / "who-needs-me.md").read_text()
    step = page[page.index("### The worklist's columns"):page.index("## What it looks like")]
    ours = [c for c in WORKLIST_COLUMNS if c.startswith("Tidemark")]
    assert ours == ["TidemarkNeeds", "TidemarkState", "TidemarkTaskId"]
    assert "add `TidemarkNeeds`, `TidemarkState` and `TidemarkTaskId`" in " ".join(step.split())
