"""What a step's hand-over to the worker's step threads costs, beside an inline step.

The inline step runs in the calling thread; both are measured side by side in one process.

The activity path's ``run_step`` is a coroutine on the worker's event loop; the journal is
synchronous psycopg, so the attempt's blocking parts run on a step thread
(tidemark.step_threads) and the loop awaits them. Three variants of one no-op step, on the same
Postgres (embedded unless DATABASE_URL is set), interleaved in rounds:

* ``inline``: ``run_step`` called on the loop's own thread (what ``journal_p50_ms`` measures);
* ``thread``: ``run_step_async`` with a synchronous action: the whole attempt on one step
  thread, one hand-over there and back;
* ``awaited``: ``run_step_async`` with an action that ``awaits`` its call (as every provider's
  does): the attempt up to the call on a step thread, the call on the loop, the settling on a
  step thread again, two hand-overs.

``--pace-ms`` sleeps that long on the loop before each step, as a worker waits for Temporal
between the steps of a run. Prints p50 per variant and the differences to ``inline``.

    python bench/step_handover.py [--steps 300] [--rounds 4] [--pace-ms 0]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from journal_overhead import Noop, bench_store

from tidemark.actions import Registry, StepContext
from tidemark.plan import load_plan
from tidemark.run_step import run_step, run_step_async
from tidemark.step_threads import StepThreads
from tidemark.store import JournalStore


class AwaitedNoop(Noop):
    """The no-op step, its call awaited on the event loop."""

    name: ClassVar[str] = "bench.awaited_noop"
    awaits: ClassVar[bool] = True

    async def execute_async(self, ctx: StepContext) -> dict[str, Any]:
        return {"i": ctx.args["i"]}


REGISTRY = Registry([Noop(), AwaitedNoop()])
VARIANTS = {"inline": Noop.name, "thread": Noop.name, "awaited": AwaitedNoop.name}


def new_task(store: JournalStore, action: str, n: int) -> str:
    task = f"handover-{uuid.uuid4().hex[:8]}"
    store.persist_plan(load_plan({"task_id": task, "steps": [
        {"action": action, "args": {"i": i}} for i in range(n)]}, REGISTRY))
    return task


async def measure(store: JournalStore, n: int, rounds: int, pace_s: float
                  ) -> dict[str, list[float]]:
    threads = StepThreads(ThreadPoolExecutor(16, thread_name_prefix="step-part"))
    out: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in range(rounds):
        order = list(VARIANTS) if r % 2 == 0 else list(reversed(VARIANTS))
        for variant in order:
            task = new_task(store, VARIANTS[variant], n)
            for step in range(1, n + 1):
                if pace_s:
                    await asyncio.sleep(pace_s)
                t0 = time.perf_counter()
                if variant == "inline":
                    run_step(store, REGISTRY, task, step)
                else:
                    await run_step_async(store, REGISTRY, task, step, threads)
                out[variant].append((time.perf_counter() - t0) * 1000)
    threads.executor.shutdown()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--pace-ms", type=float, default=0.0)
    a = ap.parse_args()
    with bench_store() as (store, _):
        samples = asyncio.run(measure(store, a.steps, a.rounds, a.pace_ms / 1000))
    p50 = {v: statistics.median(s) for v, s in samples.items()}
    print(f"{a.rounds} rounds of {a.steps} steps, paced {a.pace_ms:g} ms; p50 per step:")
    for v, ms in p50.items():
        print(f"  {v:<8} {ms:6.3f} ms" + (f"   +{ms - p50['inline']:.3f} ms over inline"
                                          if v != "inline" else ""))


if __name__ == "__main__":
    main()
