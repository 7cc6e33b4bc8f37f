"""Starting a RunPlan as `temporal workflow start` does, and waiting for the state it reaches."""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio.client import Client, WorkflowHandle

from tidemark.payloads import RunResult
from workflows.outcome import run_result


async def start(client: Client, doc: dict[str, Any], task_queue: str,
                task_id: str | None = None) -> WorkflowHandle[Any, RunResult]:
    """Starts RunPlan with ``doc`` as input, under the workflow id of its task.

    ``task_id`` is the task, for an input that names none or names another."""
    return await client.start_workflow("RunPlan", doc,
                                       id=f"tidemark-{task_id or doc['task_id']}",
                                       task_queue=task_queue, result_type=RunResult)


async def wait_state(handle: WorkflowHandle[Any, RunResult], state: str,
                     timeout: float = 90) -> None:
    """Waits until the run's ``status`` query says ``state``.

    Otherwise an AssertionError with the last status."""
    status: dict[str, Any] = {}
    for _ in range(int(timeout / 0.1)):
        status = await handle.query("status")
        if status["state"] == state:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"never reached {state}: {status}")


async def stuck(handle: WorkflowHandle[Any, Any]) -> list[str]:
    """What shows that a run cannot end by itself as it should.

    A failed workflow task (the server retries it for ever) or an activity that is being retried."""
    found = [f"workflow task failed: {e.workflow_task_failed_event_attributes.failure.message}"
             async for e in handle.fetch_history_events()
             if e.HasField("workflow_task_failed_event_attributes")]
    described = await handle.describe()
    found += [f"{p.activity_type.name} retried (attempt {p.attempt}): {p.last_failure.message}"
              for p in described.raw_description.pending_activities if p.attempt > 1]
    return found


async def ended_in_one_go(handle: WorkflowHandle[Any, Any], timeout: float) -> RunResult:
    """The run's result, for a run that must end in one go.

    That is, without a failed workflow task or a retried activity. Fails as soon as it shows
    either (it could then only end by the timeout)."""
    result = asyncio.ensure_future(run_result(handle))
    try:
        async with asyncio.timeout(timeout):
            while not result.done():
                seen = await stuck(handle)
                assert not seen, "; ".join(seen)
                await asyncio.wait([result], timeout=0.5)
        return result.result()
    finally:
        result.cancel()


async def signal_handled(handle: WorkflowHandle[Any, Any], name: str,
                         timeout: float = 60) -> None:
    """Waits until a workflow task that started after the run's latest ``name`` signal completed.

    By then the run's handler has seen the signal, or the worker dropped it. A workflow task that
    failed on it instead is an AssertionError at once."""
    async with asyncio.timeout(timeout):
        while True:
            signaled, done, failed = 0, [], []
            async for e in handle.fetch_history_events():
                if e.HasField("workflow_execution_signaled_event_attributes") and \
                        e.workflow_execution_signaled_event_attributes.signal_name == name:
                    signaled = e.event_id
                elif e.HasField("workflow_task_completed_event_attributes"):
                    done.append(e.workflow_task_completed_event_attributes.started_event_id)
                elif e.HasField("workflow_task_failed_event_attributes"):
                    a = e.workflow_task_failed_event_attributes
                    failed.append((a.started_event_id, a.failure.message))
            why = [message for started, message in failed if signaled and started > signaled]
            assert not why, f"a workflow task failed on the {name} signal: {why[0]}"
            if signaled and any(started > signaled for started in done):
                return
            await asyncio.sleep(0.2)
