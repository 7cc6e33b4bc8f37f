"""Recovery after a killed worker: time until another worker does the step.

The worker process is SIGKILLed in the middle of a step's call.

    python bench/recovery.py [--reps N]      (or as part ``recovery`` of bench/run_all.py)

Two real worker processes (bench/bench_worker.py) poll one task queue of a real dev server, on
a real Postgres. Each repetition starts a task of two no-op steps whose first step's
call is held (``hold_while``, as a slow provider call); once the call runs, the worker that runs
it (the pending activity's worker identity, ``pid@host``) is SIGKILLed at a random moment
between 0.2 s and 1.8 s into the call (so the kill falls anywhere in the heartbeat period),
the hold is lifted, and the clock runs until the journal records the step's outcome
(``finished_at``, Postgres's clock on this machine). The other worker must have done it: the
activity's completing attempt names its identity in the history. ``..._next_step`` is the same
to the following step's outcome (one more workflow task, which first waits out the
dead worker's sticky queue).

Two actions, alternating: ``bench.short_step``, whose deadline (2 s, fs.rename's) is within the
attempt lease's floor (LEASE_S): its dead attempt's lease lapses at most LEASE_S after the kill,
and the worker and retry settings bound the recovery (``recovery_s_after_kill``);
``bench.step``, whose 5 s deadline keeps the dead attempt's lease until 5 s after its intent
was written, and which a twin must wait out (``recovery_s_after_kill_deadline_5s``).

What a recovery waits for, in order: the heartbeat timeout (Temporal's only sign that the
worker died), the retry policy's first interval, and the dead attempt's lease if it is still
fresh (a retry meets StepBusy and waits for the next interval); see docs/operate.md,
"Heartbeats and retries".
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
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
from result_stdout import others_to_stderr
from temporalio.api.enums.v1 import EventType, PendingActivityState
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from tidemark.activity_names import ActivityName
from tidemark.approval import unattended
from tidemark.payloads import RunResult
from tidemark.store import JournalStore
from workflows.outcome import run_result

BENCH = Path(__file__).resolve().parent
# A kill lands this long into the held call, uniformly: across a whole heartbeat period.
KILL_AFTER_S = (0.2, 1.8)
# Live steps run at once to count the retries of steps whose heartbeats merely stalled, and
# how long each one's call lasts.
LIVE_TASKS = 16
LIVE_HOLD_S = 4.0
# The action of the killed step, and the result's key for it.
ACTIONS = {"bench.short_step": "recovery_s_after_kill",
           "bench.step": "recovery_s_after_kill_deadline_5s"}


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _start_worker(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, str(BENCH / "bench_worker.py")], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def _pollers(client: Client, queue: str) -> set[int]:
    """The pids of the workers polling ``queue`` for activities."""
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
    resp = await client.workflow_service.describe_task_queue(DescribeTaskQueueRequest(
        namespace=client.namespace, task_queue=TaskQueue(name=queue),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY))
    return {int(p.identity.split("@", 1)[0]) for p in resp.pollers
            if p.identity.split("@", 1)[0].isdigit()}


async def _until(what: str, check: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = await check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.02)


async def _holder(handle: WorkflowHandle[Any, Any]) -> int | None:
    """The pid of the worker running the workflow's step, once its call runs."""
    desc = await handle.describe()
    for a in desc.raw_description.pending_activities:
        if (a.activity_type.name == ActivityName.RUN_STEP and a.last_worker_identity
                and a.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED):
            head = a.last_worker_identity.split("@", 1)[0]
            return int(head) if head.isdigit() else None
    return None


async def _completed_by(handle: WorkflowHandle[Any, Any]) -> list[tuple[int, str]]:
    """(attempt, worker identity) of the attempt of each run_step that completed, in order."""
    steps: set[int] = set()
    out: list[tuple[int, str]] = []
    async for e in handle.fetch_history_events():
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled = e.activity_task_scheduled_event_attributes.activity_type.name
            if scheduled == ActivityName.RUN_STEP:
                steps.add(e.event_id)
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            a = e.activity_task_started_event_attributes
            if a.scheduled_event_id in steps:
                out.append((a.attempt, a.identity))
    return out


async def _finished_at(store: JournalStore, task: str, step: int) -> float:
    async def done() -> float | None:
        row = store.step_row(task, step)
        return row.finished_at.timestamp() if row and row.finished_at else None
    return float(await _until(f"step {step} of {task} done", done))


async def _one(client: Client, store: JournalStore, queue: str, env: dict[str, str],
               procs: dict[int, subprocess.Popen[bytes]], work: Path,
               action: str) -> dict[str, Any]:
    task = f"recovery-{uuid.uuid4().hex[:8]}"
    hold = work / task
    hold.touch()
    handle: WorkflowHandle[Any, RunResult] = await client.start_workflow(
        "RunPlan", bench_plan(task, 2, holds={1: str(hold)}, action=action), id=f"tidemark-{task}",
        task_queue=queue, result_type=RunResult)
    pid = await _until("step 1 running", lambda: _holder(handle))
    await asyncio.sleep(random.uniform(*KILL_AFTER_S))
    os.kill(pid, signal.SIGKILL)
    killed_at = time.time()
    hold.unlink()
    procs.pop(pid).wait()
    first = await _finished_at(store, task, 1)
    second = await _finished_at(store, task, 2)
    result = await run_result(handle)
    assert result.state == "completed" and result.executed + result.resolved_by_probe == 2, result
    (attempt, by), _ = await _completed_by(handle)
    assert attempt > 1 and not by.startswith(f"{pid}@"), (pid, attempt, by)
    # The next repetition needs two workers again.
    fresh = _start_worker(env)
    procs[fresh.pid] = fresh
    return {"step_s": first - killed_at, "next_step_s": second - killed_at,
            "attempt": attempt}


async def measure_recovery(client: Client, db_url: str, reps: int) -> dict[str, Any]:
    """The recovery times of short-deadline and 5 s-deadline steps.

    ``recovery_s_after_kill``: the median of ``reps`` kills of a short-deadline step (and the
    max, the samples); the same for a 5 s-deadline step."""
    queue = f"recovery-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "TEMPORAL_ADDRESS": client.service_client.config.target_host,
           "DATABASE_URL": db_url, "TIDEMARK_TASK_QUEUE": queue,
           "TIDEMARK_LOG_LEVEL": "CRITICAL", "TIDEMARK_APPROVAL": "none"}
    work = Path(tempfile.mkdtemp(prefix="tidemark-recovery-"))
    procs = {p.pid: p for p in (_start_worker(env), _start_worker(env))}
    samples: dict[str, list[dict[str, Any]]] = {a: [] for a in ACTIONS}
    try:
        with JournalStore(db_url) as store:
            store.migrate()
            unattended(store, "bench")  # a scratch journal: unattended
            for r in range(reps):
                for action in ACTIONS:
                    await _until("two workers polling", lambda: _two(client, queue, procs))
                    s = await _one(client, store, queue, env, procs, work, action)
                    samples[action].append(s)
                    _log(f"recovery {r + 1}/{reps}, {action}: killed mid-call, done by the "
                         f"other worker {s['step_s']:.2f} s later (attempt {s['attempt']}), "
                         f"the next step {s['next_step_s']:.2f} s")
            await _until("two workers polling", lambda: _two(client, queue, procs))
            spurious = await _live_retries(client, queue, work)
    finally:
        for p in procs.values():
            p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
    out: dict[str, Any] = {}
    out.update(spurious)
    for action, key in ACTIONS.items():
        step = [s["step_s"] for s in samples[action]]
        nxt = [s["next_step_s"] for s in samples[action]]
        out.update({key: round(statistics.median(step), 2), f"{key}_max": round(max(step), 2),
                    f"{key}_samples": [round(x, 2) for x in step],
                    f"{key}_attempts": [s["attempt"] for s in samples[action]],
                    f"{key}_next_step": round(statistics.median(nxt), 2),
                    f"{key}_next_step_max": round(max(nxt), 2)})
    return out


async def _live_retries(client: Client, queue: str, work: Path) -> dict[str, Any]:
    """What the short heartbeat timeout costs live steps on this machine as loaded.

    LIVE_TASKS tasks run at once, each a step whose call lasts LIVE_HOLD_S (two heartbeat
    timeouts), no kill. Every attempt beyond the first is one Temporal started because a live
    step's heartbeats stalled (it meets StepBusy; nothing is done twice)."""
    handles = []
    for _ in range(LIVE_TASKS):
        task = f"live-{uuid.uuid4().hex[:8]}"
        (work / task).touch()
        handles.append(await client.start_workflow(
            "RunPlan", bench_plan(task, 1, holds={1: str(work / task)}), id=f"tidemark-{task}",
            task_queue=queue, result_type=RunResult))
    await asyncio.sleep(LIVE_HOLD_S)
    for f in work.glob("live-*"):
        f.unlink()
    attempts = []
    for h in handles:
        res = await run_result(h)
        assert res.state == "completed", res
        attempts += [a for a, _ in await _completed_by(h)]
    extra = sum(a - 1 for a in attempts)
    _log(f"{LIVE_TASKS} live steps of {LIVE_HOLD_S:g} s, two workers: {extra} extra attempts")
    return {"recovery_live_steps": LIVE_TASKS, "recovery_live_step_s": LIVE_HOLD_S,
            "recovery_live_extra_attempts": extra}


async def _two(client: Client, queue: str, procs: dict[int, subprocess.Popen[bytes]]) -> bool:
    return set(procs) <= await _pollers(client, queue)


async def _main(reps: int) -> dict[str, Any]:
    from run_all import new_database, postgres

    from tools.stack.devstack import dev_server_args, temporal_binary
    from workflows.shared import SEARCH_ATTRIBUTES
    with postgres() as (admin_url, _):
        db_url = new_database(admin_url, f"recovery_{uuid.uuid4().hex[:8]}")
        env = await WorkflowEnvironment.start_local(
            dev_server_existing_path=temporal_binary(), search_attributes=SEARCH_ATTRIBUTES,
            dev_server_log_level="error", dev_server_extra_args=dev_server_args())
        try:
            return await measure_recovery(env.client, db_url, reps)
        finally:
            await env.shutdown()


if __name__ == "__main__":
    import argparse
    import json
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    reps = ap.parse_args().reps
    with others_to_stderr():
        result = asyncio.run(_main(reps))
    print(json.dumps(result, indent=1))
