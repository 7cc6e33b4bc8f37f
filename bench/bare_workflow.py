"""The floor a step is measured against: a workflow of no-op activities and nothing else.

``python bench/bare_workflow.py`` runs a worker process of it alone, on TEMPORAL_ADDRESS and the
task queue TIDEMARK_TASK_QUEUE, until SIGTERM: the bare workflow's worker, beside the real one
(bench/bench_worker.py), so that the CPU of each is its process's (bench/step_costs.py).
"""

from __future__ import annotations

import asyncio
import os
import signal
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import Worker


@activity.defn(name="bench_noop")
async def bench_noop(i: int) -> int:
    return i


@workflow.defn(name="BareActivities", sandboxed=False)
class BareActivities:
    @workflow.run
    async def run(self, args: list[Any]) -> int:
        n, local = args
        for i in range(n):
            if local:
                await workflow.execute_local_activity(
                    "bench_noop", i, start_to_close_timeout=timedelta(seconds=10))
            else:
                await workflow.execute_activity(
                    "bench_noop", i, start_to_close_timeout=timedelta(seconds=10))
        return n


async def serve(address: str, queue: str) -> None:
    client = await Client.connect(address)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with Worker(client, task_queue=queue, workflows=[BareActivities],
                      activities=[bench_noop]):
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(serve(os.environ["TEMPORAL_ADDRESS"], os.environ["TIDEMARK_TASK_QUEUE"]))
