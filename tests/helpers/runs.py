"""Starting a RunPlan as `temporal workflow start` does, and waiting for the state it reaches."""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio.client import Client, WorkflowHandle

from tidemark.payloads import RunResult


async def start(client: Client, doc: dict[str, Any],
                task_queue: str) -> WorkflowHandle[Any, RunResult]:
    """RunPlan with the plan ``doc`` as input, under the workflow id of its task."""
    return await client.start_workflow("RunPlan", doc, id=f"tidemark-{doc['task_id']}",
                                       task_queue=task_queue, result_type=RunResult)


async def wait_state(handle: WorkflowHandle[Any, RunResult], state: str,
                     timeout: float = 90) -> None:
    """Waits until the run's ``status`` query says ``state``; AssertionError with the last
    status otherwise."""
    status: dict[str, Any] = {}
    for _ in range(int(timeout / 0.1)):
        status = await handle.query("status")
        if status["state"] == state:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"never reached {state}: {status}")
