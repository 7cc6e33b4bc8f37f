"""What a step of RunPlan's activity path costs beyond the journal's least possible step.

That least is what any step through the journal could cost; both run side by side in one process.

    python bench/step_floor.py [--steps 300] [--rounds 4] [--json]

Four workflows of ``--steps`` no-op steps (``bench.step``), alternated in rounds on one dev
server (the stack's dynamic configuration), one Postgres, and workers in this process:

    bare      a workflow of no-op activities (the denominator of bench/run_all.py)
    floor     the same workflow, its activity running tidemark.run_step.run_step on a thread:
              the journal and nothing else, handed to a thread as a synchronous journal must be
    options   floor with the options a step's activity needs: a heartbeat timeout (a dead
              worker is noticed), the retry policy, a summary for the Web UI
    activity  options, its activity the worker's own run_step (activities/steps.py: the
              attempt on a step thread, heartbeating, acting for the task's grant)
    path      RunPlan, the activity path, as `temporal workflow start` runs it

Each difference is one layer: floor - bare is the journal as a step pays it (its statements,
and the hand-over to a thread and back); options - floor what the activity's options cost the
SDK and the server; activity - options what the worker's run_step activity adds around the
attempt; path - activity what is RunPlan's own (its prepare, its boundary, the run's
bookkeeping, its activation of each step). The journal alone, back
to back in this process (bench/run_all.py measure_journal), is printed beside them, so that
the issue's ratio (path over bare plus the journal) reads in the same run. So is run_step's own
time on its thread in the floor's steps: the same statements as a step pays them, without the
hand-over to the thread and back.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_actions import BenchStep, bench_plan
from result_stdout import others_to_stderr
from run_all import (
    BareActivities,
    bench_noop,
    measure_journal,
    new_database,
    postgres,
    run_plan,
    start_env,
)
from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import Worker

import worker
from activities.steps import StepActivities
from tidemark.actions import Registry
from tidemark.activity_names import ActivityName
from tidemark.approval import policy_from_env, unattended
from tidemark.payloads import StepInput, StepOutput
from tidemark.plan import load_plan
from tidemark.run_step import StepResult, run_step
from tidemark.store import JournalStore
from workflows.shared import STEP_HEARTBEAT, STEP_RETRY, STEP_START_TO_CLOSE

VARIANTS = ("bare", "floor", "options", "activity", "path")


@workflow.defn(name="FloorSteps", sandboxed=False)
class FloorSteps:
    """Steps ``1..n`` of a stored plan, one activity ``name`` each.

    With ``options``: a step's heartbeat timeout, retry policy and summary, as RunPlan schedules
    it."""

    @workflow.run
    async def run(self, args: list[Any]) -> int:
        task_id, n, options, name = args
        for step in range(1, n + 1):
            more: dict[str, Any] = {}
            if options:
                more = {"heartbeat_timeout": STEP_HEARTBEAT, "retry_policy": STEP_RETRY,
                        "summary": f"{step}/{n} bench.step i={step}"}
            await workflow.execute_activity(name, StepInput(task_id, step),
                                            result_type=StepOutput,
                                            start_to_close_timeout=STEP_START_TO_CLOSE, **more)
        return n


class FloorActivities:
    """``floor_step``: run_step on a thread, and nothing around it.

    That is how the activity path's attempt runs on a step thread."""

    def __init__(self, store: JournalStore, registry: Registry,
                 threads: ThreadPoolExecutor) -> None:
        self.store, self.registry, self.threads = store, registry, threads
        self.inside_ms: list[float] = []  # run_step's own time, on its thread, each step

    def timed_run_step(self, task_id: str, step: int) -> StepResult:
        t0 = time.perf_counter()
        r = run_step(self.store, self.registry, task_id, step)
        self.inside_ms.append((time.perf_counter() - t0) * 1000)
        return r

    @activity.defn(name="floor_step")
    async def floor_step(self, inp: StepInput) -> StepOutput:
        loop = asyncio.get_running_loop()
        r = await loop.run_in_executor(self.threads, self.timed_run_step, inp.task_id,
                                       inp.step)
        return StepOutput(step=r.step, status=r.status, resolved_by=r.resolved_by,
                          skipped=r.skipped)


async def timed_floor(client: Client, store: JournalStore, registry: Registry, n: int,
                      variant: str) -> float:
    task = f"floor-{uuid.uuid4().hex[:8]}"
    doc = bench_plan(task, n)
    del doc["execution"]
    store.persist_plan(load_plan(doc, registry))
    t0 = time.perf_counter()
    await client.execute_workflow(
        "FloorSteps", [task, n, variant != "floor",
                       ActivityName.RUN_STEP if variant == "activity" else "floor_step"],
        id=f"floor-{task}", task_queue="floor")
    return (time.perf_counter() - t0) * 1000 / n


async def timed_bare(client: Client, n: int) -> float:
    t0 = time.perf_counter()
    await client.execute_workflow("BareActivities", [n, False], id=f"bare-{uuid.uuid4().hex}",
                                  task_queue="bare")
    return (time.perf_counter() - t0) * 1000 / n


async def timed_path(client: Client, n: int) -> float:
    task = f"path-{uuid.uuid4().hex[:8]}"
    t0 = time.perf_counter()
    res = await run_plan(client, bench_plan(task, n), "bench")
    assert res.state == "completed" and res.executed == n, res
    return (time.perf_counter() - t0) * 1000 / n


async def main_async(n: int, rounds: int) -> dict[str, Any]:
    registry = Registry([BenchStep()])
    with postgres() as (admin_url, _):
        db_url = new_database(admin_url, f"bench_{uuid.uuid4().hex[:8]}")
        env = await start_env(flags=True)
        out: dict[str, Any] = {"load_avg_at_start": os.getloadavg()[0], "steps": n,
                               "rounds": rounds}
        ms: dict[str, list[float]] = {v: [] for v in VARIANTS}
        journal: list[float] = []
        inside: list[float] = []  # run_step's median time on its thread, in the floor's steps
        # Each variant's worker has threads of its own, as many as the real worker starts with.
        with JournalStore(db_url) as store, ThreadPoolExecutor(16) as floor_threads, \
                ThreadPoolExecutor(16) as step_parts, ThreadPoolExecutor(16) as path_threads:
            store.migrate()
            unattended(store, "bench")  # a scratch journal: unattended
            client = env.client
            floor = FloorActivities(store, registry, floor_threads)
            steps = StepActivities(store, registry, executor=step_parts)
            path = worker.build_worker(client, store, registry, path_threads, "bench",
                                       policy_from_env({"TIDEMARK_APPROVAL": "none"}))
            try:
                async with Worker(client, task_queue="bare", workflows=[BareActivities],
                                  activities=[bench_noop]), \
                        Worker(client, task_queue="floor", workflows=[FloorSteps],
                               activities=[floor.floor_step, steps.run_step]), path:
                    # warm: every worker has polled, every code path has run once
                    await timed_bare(client, 5)
                    for v in ("floor", "options", "activity"):
                        await timed_floor(client, store, registry, 5, v)
                    await timed_path(client, 5)
                    for r in range(rounds):
                        order = VARIANTS if r % 2 == 0 else tuple(reversed(VARIANTS))
                        for v in order:
                            if v == "bare":
                                ms[v].append(await timed_bare(client, n))
                            elif v == "path":
                                ms[v].append(await timed_path(client, n))
                            elif v == "floor":
                                floor.inside_ms.clear()
                                ms[v].append(await timed_floor(client, store, registry, n, v))
                                inside.append(statistics.median(floor.inside_ms))
                            else:
                                ms[v].append(await timed_floor(client, store, registry, n, v))
                        journal.append(measure_journal(db_url, n)["journal_p50_ms"])
                        print(f"round {r + 1}: " + ", ".join(
                            f"{v} {ms[v][-1]:.2f}" for v in VARIANTS)
                            + f" ms/step; journal back to back {journal[-1]:.2f} ms, in the"
                            f" floor's steps {inside[-1]:.2f} ms",
                            file=sys.stderr, flush=True)
            finally:
                await env.shutdown()
    med = statistics.median
    out.update({f"{v}_ms": med(ms[v]) for v in VARIANTS})
    out["journal_p50_ms"] = med(journal)
    out["journal_in_floor_steps_ms"] = med(inside)
    out["by_round"] = {**ms, "journal": journal, "journal_in_floor_steps": inside}
    # Within each round, then the median: the machine's drift hits a round's variants alike.
    per_round = [{v: ms[v][r] for v in VARIANTS} | {"journal": journal[r]}
                 for r in range(rounds)]
    out["path_vs_bare_plus_journal"] = med(
        [x["path"] / (x["bare"] + x["journal"]) for x in per_round])
    out["path_vs_floor"] = med([x["path"] / x["floor"] for x in per_round])
    out["path_vs_options"] = med([x["path"] / x["options"] for x in per_round])
    out["floor_vs_bare_plus_journal"] = med(
        [x["floor"] / (x["bare"] + x["journal"]) for x in per_round])
    out["layers_ms"] = {
        "journal in its step (floor - bare)": med([x["floor"] - x["bare"] for x in per_round]),
        "the activity's options (options - floor)": med(
            [x["options"] - x["floor"] for x in per_round]),
        "the run_step activity's own (activity - options)": med(
            [x["activity"] - x["options"] for x in per_round]),
        "RunPlan's own (path - activity)": med([x["path"] - x["activity"] for x in per_round])}
    out["load_avg_at_end"] = os.getloadavg()[0]
    return out


def report(r: dict[str, Any]) -> None:
    for v in VARIANTS:
        print(f"{v:<10} {r[f'{v}_ms']:8.2f} ms/step")
    print(f"journal alone, back to back: {r['journal_p50_ms']:.2f} ms; run_step on its thread"
          f" in the floor's steps: {r['journal_in_floor_steps_ms']:.2f} ms (medians)")
    for name, value in r["layers_ms"].items():
        print(f"{name:<45} {value:+7.2f} ms/step")
    print(f"path / (bare + journal) {r['path_vs_bare_plus_journal']:.2f}x; "
          f"floor / (bare + journal) {r['floor_vs_bare_plus_journal']:.2f}x; "
          f"path / floor {r['path_vs_floor']:.2f}x; path / options {r['path_vs_options']:.2f}x"
          " (medians of the rounds' ratios)")
    print(f"load average {r['load_avg_at_start']:.2f} -> {r['load_avg_at_end']:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    with others_to_stderr():
        r = asyncio.run(main_async(a.steps, a.rounds))
    if a.json:
        print(json.dumps(r, indent=1))
    else:
        report(r)


if __name__ == "__main__":
    main()
