"""Where a step of RunPlan's activity path spends its time, beside a bare activity's.

Both are read from the histories' event timestamps, in one run.

    python bench/path_breakdown.py [--steps 200] [--rounds 2] [--before DIR]

Starts an embedded Postgres (or uses DATABASE_URL), a dev server with the stack's dynamic
configuration and a real worker process (bench/bench_worker.py), then alternates a workflow of
bare no-op activities and RunPlan over no-op steps (``bench.step``, one activity per step).
For each step of each history it takes the intervals between consecutive events of one step's
cycle::

    ActivityTaskScheduled -> ActivityTaskStarted     dispatch (eager: the worker already has it)
    ActivityTaskStarted   -> ActivityTaskCompleted   the activity, and its result's trip back
    ActivityTaskCompleted -> WorkflowTaskScheduled
    WorkflowTaskScheduled -> WorkflowTaskStarted     the workflow task's trip to the worker
    WorkflowTaskStarted   -> WorkflowTaskCompleted   the workflow's activation in the worker
    WorkflowTaskCompleted -> next ActivityTaskScheduled

and prints the median of each, per variant, with the per-run bookkeeping (the workflow's start
to its first step, its last step to its end) spread over the steps. A plan longer than one run's
window continues as new: every run of it counts, its cycles and its bookkeeping. ``--json``
prints it as one object; the journal's own run_step time (p50, in this process) is printed
beside it, back to back and paced one step per bare step (bench/run_all.py measure_journal),
and so is the same part of each step as the activity path ran it, inside its worker: the
latency the journal reports for every attempt (tidemark_step_latency, from the read of its step
to its outcome written; bench/bench_worker.py keeps them exactly).

``--before DIR`` also runs a worker from another source tree (a checkout of an earlier commit:
``git worktree add DIR COMMIT``, or ``git archive COMMIT | tar -x -C DIR``) on a task queue of
its own, on the same server and Postgres, and alternates its RunPlan runs with this tree's:
a change's before and after, side by side in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_actions import bench_plan
from bench_worker import LATENCIES_ENV
from result_stdout import others_to_stderr
from run_all import (
    BareActivities,
    Workers,
    bench_noop,
    measure_journal,
    new_database,
    postgres,
    run_plan,
    start_env,
)
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from tidemark.activity_names import ActivityName
from tidemark.approval import unattended
from tidemark.store import JournalStore

E = EventType
# One step's cycle, in history order: each interval is named by the event it ends at.
CYCLE = (("dispatch", E.EVENT_TYPE_ACTIVITY_TASK_STARTED),
         ("activity", E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED),
         ("to_wft", E.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED),
         ("wft_wait", E.EVENT_TYPE_WORKFLOW_TASK_STARTED),
         ("wft_run", E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED),
         ("to_next", E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED))


async def events(handle: WorkflowHandle[Any, Any]) -> list[tuple[int, float, str]]:
    """(event type, ms since the epoch, activity type for a scheduled activity) of a history."""
    out = []
    async for e in handle.fetch_history_events():
        name = ""
        if e.event_type == E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            name = e.activity_task_scheduled_event_attributes.activity_type.name
        out.append((e.event_type, e.event_time.ToMicroseconds() / 1000, name))
    return out


def breakdown(evs: list[tuple[int, float, str]], activity: str) -> dict[str, Any]:
    """Per-step intervals of the cycles that begin at a scheduled ``activity``.

    Returns lists of ms per interval name, the whole cycle (scheduled -> next scheduled), and the
    bookkeeping before the first and after the last cycle."""
    starts = [i for i, (t, _, name) in enumerate(evs)
              if t == E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED and name == activity]
    parts: dict[str, list[float]] = {name: [] for name, _ in CYCLE}
    cycles: list[float] = []
    for a, b in itertools.pairwise(starts):
        at, prev = a, evs[a][1]
        for name, kind in CYCLE:
            at = next((j for j in range(at + 1, b + 1) if evs[j][0] == kind), -1)
            if at < 0:
                break
            parts[name].append(evs[at][1] - prev)
            prev = evs[at][1]
        cycles.append(evs[b][1] - evs[a][1])
    return {"parts": parts, "cycle": cycles, "before_first_ms": evs[starts[0]][1] - evs[0][1],
            "after_last_ms": evs[-1][1] - evs[starts[-1]][1], "steps": len(starts)}


async def bare_run(client: Client, n: int) -> tuple[float, dict[str, Any]]:
    async with Worker(client, task_queue="bare", workflows=[BareActivities],
                      activities=[bench_noop]):
        t0 = time.perf_counter()
        handle = await client.start_workflow("BareActivities", [n, False],
                                             id=f"bare-{uuid.uuid4().hex}", task_queue="bare")
        await handle.result()
        ms = (time.perf_counter() - t0) * 1000 / n
    return ms, breakdown(await events(handle), "bench_noop")


RAW: dict[str, list[tuple[int, float, str]]] = {}  # RunPlan's histories by task, for --raw


async def path_run(client: Client, n: int, queue: str = "bench") -> tuple[float, dict[str, Any]]:
    task = f"breakdown-{uuid.uuid4().hex[:8]}"
    t0 = time.perf_counter()
    res = await run_plan(client, bench_plan(task, n), queue)
    ms = (time.perf_counter() - t0) * 1000 / n
    assert res.state == "completed" and res.executed == n, res
    # A plan longer than a run's window continues as new: every run of it, oldest first.
    runs = [r async for r in client.list_workflows(f"WorkflowId = 'tidemark-{task}'")]
    runs.sort(key=lambda r: r.start_time)
    histories = [await events(client.get_workflow_handle(r.id, run_id=r.run_id)) for r in runs]
    RAW[task] = [e for h in histories for e in h]
    return ms, combined([breakdown(h, ActivityName.RUN_STEP) for h in histories])


def combined(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The breakdown of one plan's runs together.

    Their cycles, their steps, and each run's bookkeeping (its start to its first step, its last
    step to its end) added up."""
    return {"parts": {name: [x for r in runs for x in r["parts"][name]] for name, _ in CYCLE},
            "cycle": [x for r in runs for x in r["cycle"]],
            "before_first_ms": sum(r["before_first_ms"] for r in runs),
            "after_last_ms": sum(r["after_last_ms"] for r in runs),
            "steps": sum(r["steps"] for r in runs)}


def summary(ms: list[float], runs: list[dict[str, Any]]) -> dict[str, Any]:
    med = statistics.median
    parts = {name: med([x for r in runs for x in r["parts"][name]]) for name, _ in CYCLE}
    steps = statistics.mean(r["steps"] for r in runs)
    return {"ms_per_step": med(ms), "cycle_ms": med([x for r in runs for x in r["cycle"]]),
            "cycle_mean_ms": statistics.mean([x for r in runs for x in r["cycle"]]),
            "parts_median_ms": parts,
            "bookkeeping_ms_per_step": statistics.mean(
                (r["before_first_ms"] + r["after_last_ms"]) / steps for r in runs),
            "before_first_ms": med([r["before_first_ms"] for r in runs]),
            "after_last_ms": med([r["after_last_ms"] for r in runs])}


class TreeWorkers(Workers):
    """Worker processes of another source tree's bench/bench_worker.py.

    Each puts its own tree first on sys.path."""

    def __init__(self, env: WorkflowEnvironment, db_url: str, task_queue: str,
                 tree: Path) -> None:
        super().__init__(env, db_url, task_queue)
        self.env["PYTHONPATH"] = str(tree)
        self.tree = tree

    def start(self) -> subprocess.Popen[bytes]:
        p = subprocess.Popen([sys.executable, str(self.tree / "bench" / "bench_worker.py")],
                             env=self.env, cwd=self.tree, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        self.procs.append(p)
        return p


async def main_async(n: int, rounds: int, before: Path | None) -> dict[str, Any]:
    with postgres() as (admin_url, _):
        db_url = new_database(admin_url, f"bench_{uuid.uuid4().hex[:8]}")
        with JournalStore(db_url) as store:
            store.migrate()
            unattended(store, "bench")  # a scratch journal: unattended
        env = await start_env(flags=True)
        workers = [Workers(env, db_url, "bench")]
        # This tree's worker keeps each step's latency as the journal reports it (its part
        # of the step inside the worker); the samples are read once it has stopped.
        latencies = Path(tempfile.mkdtemp()) / "latencies"
        workers[0].env[LATENCIES_ENV] = str(latencies)
        if before is not None:
            workers.append(TreeWorkers(env, db_url, "before", before))
        out: dict[str, Any] = {"load_avg_at_start": os.getloadavg()[0]}
        variants = {"activity_path": "bench", "before": "before"}
        if before is None:
            del variants["before"]
        ms: dict[str, list[float]] = {"bare": [], **{v: [] for v in variants}}
        runs: dict[str, list[dict[str, Any]]] = {k: [] for k in ms}
        try:
            for w in workers:
                w.start()
            for queue in variants.values():
                await path_run(env.client, 10, queue)  # its worker is up, its sandbox warm
            for r in range(rounds):
                took, run = await bare_run(env.client, n)
                ms["bare"].append(took)
                runs["bare"].append(run)
                for variant, queue in (variants.items() if r % 2 == 0
                                       else reversed(variants.items())):
                    took, run = await path_run(env.client, n, queue)
                    ms[variant].append(took)
                    runs[variant].append(run)
                print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} ms/step"
                                                     for k, v in ms.items()),
                      file=sys.stderr, flush=True)
                journal = measure_journal(db_url, n, ms["bare"][-1])
                for name in ("journal", "journal_paced"):
                    out.setdefault(f"{name}_p50_ms_by_round", []).append(
                        journal[f"{name}_p50_ms"])
            for name in ("journal", "journal_paced"):
                out[f"{name}_p50_ms"] = statistics.median(out[f"{name}_p50_ms_by_round"])
            for k in ms:
                out[k] = summary(ms[k], runs[k])
        finally:
            for w in workers:
                w.stop()
            await env.shutdown()
        if latencies.exists():  # every step this tree's worker settled, warm-up included
            kept = [float(x) * 1000 for x in latencies.read_text().split()]
            out["journal_in_worker_p50_ms"] = statistics.median(kept)
            out["journal_in_worker_steps"] = len(kept)
    out["load_avg_at_end"] = os.getloadavg()[0]
    return out


def report(r: dict[str, Any]) -> None:
    cols = [k for k in ("bare", "before", "activity_path") if k in r]
    print(f"{'interval (median ms)':<28}" + "".join(f"{k:>16}" for k in cols))
    for name, _ in CYCLE:
        print(f"{name:<28}" + "".join(f"{r[k]['parts_median_ms'][name]:>16.2f}" for k in cols))
    for key in ("cycle_ms", "cycle_mean_ms", "before_first_ms", "after_last_ms",
                "bookkeeping_ms_per_step", "ms_per_step"):
        print(f"{key:<28}" + "".join(f"{r[k][key]:>16.2f}" for k in cols))
    for name, how in (("journal", "run_step in process, back to back, median of rounds"),
                      ("journal_paced", "run_step in process, paced as bare steps, median of "
                                        "rounds"),
                      ("journal_in_worker", "each attempt of the activity path in its worker, "
                                            "start to outcome")):
        if f"{name}_p50_ms" not in r:
            continue
        floor = r["bare"]["ms_per_step"] + r[f"{name}_p50_ms"]
        print(f"{name} p50 ({how}): {r[f'{name}_p50_ms']:.2f} ms; "
              + "; ".join(f"{k} / (bare + {name}): {r[k]['ms_per_step'] / floor:.2f}x"
                          for k in cols[1:] if k != "before" or name != "journal_in_worker"))
    print(f"load average {r['load_avg_at_start']:.2f} -> {r['load_avg_at_end']:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--before", type=Path, help="a source tree to run beside this one")
    ap.add_argument("--raw", type=Path, help="also write RunPlan's history events (type, ms "
                    "since the epoch, activity type) by task to this JSON file")
    a = ap.parse_args()
    with others_to_stderr():
        r = asyncio.run(main_async(a.steps, a.rounds, a.before))
    if a.raw:
        a.raw.write_text(json.dumps(RAW))
    print(json.dumps(r, indent=1, default=list) if a.json else "", end="")
    if not a.json:
        report(r)


if __name__ == "__main__":
    main()
