"""What a step costs end to end, through Temporal and through the journal alone.

Through Temporal is RunPlan on the dev server; the journal alone is run_step in a loop. Beside
them is the seed's 15 ms yardstick. All are measured side by side.

Both variants run the same plan of no-op steps against the same Postgres (embedded unless
DATABASE_URL is set), alternating in rounds so machine noise hits them alike. Prints per-step
mean and the ratios.

    python bench/step_overhead.py [--steps 200] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from journal_overhead import SEED_MS_PER_STEP, Noop, bench_store

from tidemark.actions import Registry
from tidemark.approval import parse_policy
from tidemark.payloads import RunResult
from tidemark.plan import load_plan
from tidemark.run_step import run_step
from tidemark.store import JournalStore
from tools.stack.devstack import dev_server_args, temporal_binary
from worker import MAX_CONCURRENT_STEPS, build_worker
from workflows.shared import SEARCH_ATTRIBUTES


def plan_doc(task_id: str, n: int) -> dict:
    return {"task_id": task_id,
            "steps": [{"action": "bench.noop", "args": {"i": i}} for i in range(n)]}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()

    with bench_store() as (store, _):
        temporal_ms, journal_ms = await measure(store, a.steps, a.rounds)
    report(temporal_ms, journal_ms, a.steps, a.rounds)


async def measure(store: JournalStore, steps: int, rounds: int) -> tuple[list[float], list[float]]:
    registry = Registry([Noop()])
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(), search_attributes=SEARCH_ATTRIBUTES,
        dev_server_log_level="error", dev_server_extra_args=dev_server_args())
    temporal_ms: list[float] = []
    journal_ms: list[float] = []
    try:
        with ThreadPoolExecutor(max_workers=MAX_CONCURRENT_STEPS) as pool:
            # The benchmark's steps run unattended: the operator's policy says so.
            async with build_worker(env.client, store, registry, pool, task_queue="bench",
                                    approval=parse_policy("none")):
                for r in range(rounds):
                    task = f"bench-t-{time.time_ns()}"
                    t0 = time.perf_counter()
                    result: RunResult = await env.client.execute_workflow(
                        "RunPlan", plan_doc(task, steps), id=f"tidemark-{task}",
                        task_queue="bench", result_type=RunResult)
                    assert result.state == "completed", result
                    temporal_ms.append((time.perf_counter() - t0) * 1000 / steps)

                    task = f"bench-j-{time.time_ns()}"
                    store.persist_plan(load_plan(plan_doc(task, steps), registry))
                    t0 = time.perf_counter()
                    for step in range(1, steps + 1):
                        run_step(store, registry, task, step)
                    journal_ms.append((time.perf_counter() - t0) * 1000 / steps)
                    print(f"round {r + 1}: temporal {temporal_ms[-1]:.2f} ms/step, "
                          f"journal only {journal_ms[-1]:.2f} ms/step", flush=True)
    finally:
        await env.shutdown()
    return temporal_ms, journal_ms


def report(temporal_ms: list[float], journal_ms: list[float], steps: int, rounds: int) -> None:
    t, j = statistics.mean(temporal_ms), statistics.mean(journal_ms)
    print(f"\nsteps per run: {steps}, rounds: {rounds}")
    print(f"through Temporal (activity per step, journal inside): {t:.2f} ms/step")
    print(f"journal alone (run_step):                             {j:.2f} ms/step")
    print(f"ratio Temporal / journal alone: {t / j:.1f}x; the journal is "
          f"{100 * j / t:.0f}% of a step's cost")
    seed = SEED_MS_PER_STEP
    print(f"ratio to the seed's {seed:.0f} ms/step: Temporal {t / seed:.1f}x, "
          f"journal alone {j / seed:.2f}x")
    print(f"the 42-step morning: {42 * t / 1000:.2f} s through Temporal, "
          f"{42 * j:.0f} ms of it in the journal")


if __name__ == "__main__":
    asyncio.run(main())
