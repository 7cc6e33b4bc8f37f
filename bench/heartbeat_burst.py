"""How many live activities Temporal times out for a late heartbeat in a burst.

Many start at once on one worker, with nothing of Tidemark in them.

    python bench/heartbeat_burst.py [--runs 256] [--wait-s 20] [--rounds 2] [--json]

A dev server (the stack's dynamic configuration) and one worker in this process. Each round
starts ``--runs`` workflows at once; each runs one asynchronous activity that heartbeats every
0.5 s (as run_step does, activities/steps.py) and sleeps ``--wait-s``, with a heartbeat timeout
of 2 s (STEP_HEARTBEAT) in one half of the round and 5 s in the other, alternating. An attempt
that Temporal timed out is retried; the activity counts the attempts it starts beyond the
first. Tidemark's step, the journal and the workflow's sandbox work are all absent here: what
remains is the SDK, the worker's event loop and the dev server, so this says which part of the
heartbeat timeouts seen in `tidemark fleet` with long waits (docs/scaling.md) is theirs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from run_all import log, start_env
from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.worker import Worker

BEAT_EVERY_S = 0.5
RETRIED: dict[str, int] = {}  # heartbeat timeout label -> attempts started beyond the first


@activity.defn
async def wait_beating(label: str, wait_s: float) -> None:
    if activity.info().attempt > 1:
        RETRIED[label] = RETRIED.get(label, 0) + 1
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        activity.heartbeat()
        await asyncio.sleep(min(BEAT_EVERY_S, max(0.0, end - time.monotonic())))


@workflow.defn(sandboxed=False)
class Beating:
    @workflow.run
    async def run(self, label: str, timeout_s: float, wait_s: float) -> None:
        await workflow.execute_activity(
            wait_beating, args=[label, wait_s], start_to_close_timeout=timedelta(minutes=5),
            heartbeat_timeout=timedelta(seconds=timeout_s),
            retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1)))


async def burst(client: Client, queue: str, label: str, timeout_s: float, runs: int,
                wait_s: float) -> float:
    started = time.monotonic()
    handles = await asyncio.gather(*(client.start_workflow(
        Beating.run, args=[label, timeout_s, wait_s], id=f"beat-{uuid.uuid4().hex[:10]}",
        task_queue=queue) for _ in range(runs)))
    await asyncio.gather(*(h.result() for h in handles))
    return time.monotonic() - started


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=256)
    parser.add_argument("--wait-s", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    env = await start_env(True)
    result: dict[str, list[float]] = {}
    try:
        queue = f"beat-{uuid.uuid4().hex[:8]}"
        async with Worker(env.client, task_queue=queue, workflows=[Beating],
                          activities=[wait_beating], max_concurrent_activities=args.runs):
            for r in range(args.rounds):
                for timeout_s in ((2.0, 5.0) if r % 2 == 0 else (5.0, 2.0)):
                    label = f"{timeout_s:g}s"
                    before = RETRIED.get(label, 0)
                    wall = await burst(env.client, queue, label, timeout_s, args.runs,
                                       args.wait_s)
                    retried = RETRIED.get(label, 0) - before
                    result.setdefault(f"retried_{label}", []).append(retried)
                    result.setdefault(f"wall_s_{label}", []).append(round(wall, 1))
                    log(f"round {r + 1}: heartbeat timeout {label}: {retried} of {args.runs} "
                        f"attempts timed out and retried; {wall:.1f} s")
    finally:
        await env.shutdown()
    if args.json:
        print(json.dumps({"runs": args.runs, "wait_s": args.wait_s, **result}))


if __name__ == "__main__":
    asyncio.run(main())
