"""``tidemark fleet PLAN --tasks N --workers W --wait-s S --kills K``: many tasks, killed workers.

Many tasks, many steps in flight, over several real worker processes that are SIGKILLed and
restarted while the tasks run. They are judged from the staging servers' logs, with the peak of
Postgres server connections.

The plan's steps are drive.rename steps whose ``file_id`` holds ``{n}``: each of the N tasks
gets the plan with ``{n}`` replaced by its number (so each task renames a file of its own, seeded
on the staging server), and every write of a step waits ``--wait-s`` seconds on the staging
server before it is applied (the staging ``delay`` fault, armed for every write: a slow
provider). W worker processes (``python -m worker``, each with TIDEMARK_MAX_CONCURRENT_STEPS
and TIDEMARK_DB_POOL_MAX as given) poll one task queue of their own; all N runs are started at
once. K times, at a random moment while a write is in flight at the target, a random live worker
is SIGKILLed and another started in its place.

Judged from the outside, as ``tidemark chaos`` judges (tools/chaos/judge.py):

* **duplicates**: a step's key applied more than once at the target (the effect log);
* **false done**: a step the journal records ``done`` whose key the target never applied;
* **completed**: every run ended ``completed``; the others are listed with their state and
  error (or as still running when ``--timeout-s`` passed).

Measured meanwhile: every ``SAMPLE_EVERY_S`` the number of server connections to the journal's
database (``pg_stat_activity``, the sampler's own left out): its peak, against the bound
``workers x (pool + 2) + HARNESS_CONNECTIONS`` (each worker's pool plus its lease keeper and
one spare). From the journal afterwards: the most steps whose intent was open at one moment,
and the most tasks with a step open, at their peaks and at the connection peak. Throughput is
steps completed per second of wall time, from the first start to the last run's end. What the
steps in flight cost the workers is read at the same samples from each worker's /proc/<pid>:
resident memory (VmRSS, and the kernel's own peak VmHWM), threads and CPU time, once all poll
(before any run starts) and at their peaks (docs/scaling.md, *What one worker holds*).

The heavier check beside ``tidemark chaos``: 1,000 tasks on four workers is a command to run
by hand (docs/benchmarks.md), a small fleet is tests/test_fleet.py.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client, WorkflowHandle

from activities.catalog import spec_registry
from tidemark.approval import unattended
from tidemark.errors import TidemarkError
from tidemark.keys import key_for
from tidemark.limits import cut
from tidemark.plan import load_plan
from tidemark.store import JournalStore
from tidemark.words import Phase, StepStatus
from tools.chaos.world import staging_http
from tools.cli.fleet import DEFAULT_POOL, DEFAULT_STEPS_PER_WORKER
from workflows.shared import start_attributes

# The actions a fleet plan may use, and the (target, op) of the write that waits.
WAIT_OPS = {"drive.rename": ("drive", "files.update")}
PLACEHOLDER = "{n}"
# The workers' client timeouts for the targets the fleet's steps never write to: only their
# start reads them (each checks whose account its tokens reach), and a machine loaded by the
# fleet itself must not fail that check. Drive's stays the staging one: it bounds a step's
# deadline, hence the lease a killed attempt leaves.
IDLE_CLIENTS = {"TIDEMARK_GMAIL_TIMEOUT_S": "30", "TIDEMARK_GRAPH_TIMEOUT_S": "30",
                "TIDEMARK_STRIPE_TIMEOUT_S": "30"}
# Connections a worker may hold beyond its pool: its lease keeper's, and one spare.
PER_WORKER_EXTRA = 2
# The harness's own connections to the journal's database while the fleet runs (none but the
# sampler, which leaves itself out; one for slack, e.g. a worker that is being replaced).
HARNESS_CONNECTIONS = 1
SAMPLE_EVERY_S = 0.1
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
FOREVER = 10**9  # the delay fault's count: every write waits
START_TIMEOUT_S = 120.0  # for a worker to poll (its start imports every SDK and checks every token)
# The end states of a run that waits for a person (tidemark.words.TaskState).
PERSON_STATES = frozenset({"needs_decision", "stopped", "precondition_failed",
                           "verification_failed", "awaiting_approval"})


class FleetError(TidemarkError):
    """The fleet could not run as asked.

    For example, a plan it cannot spread, or a worker that would not start."""


@dataclass(frozen=True)
class FleetConfig:
    tasks: int = 1000
    workers: int = 4
    wait_s: float = 2.0
    kills: int = 4
    seed: int = 0
    steps_per_worker: int = DEFAULT_STEPS_PER_WORKER
    pool: int = DEFAULT_POOL
    timeout_s: float = 1800.0
    # The share of the staging Drive's requests, reads and writes, answered as throttled
    # (403 userRateLimitExceeded, as Drive documents), once the workers poll.
    throttle: float = 0.0

    def problem(self) -> str:
        """What is wrong with these values, in one line ('' when nothing)."""
        if self.tasks < 1:
            return f"--tasks must be 1 or more, got {self.tasks}"
        if self.workers < 1:
            return f"--workers must be 1 or more, got {self.workers}"
        limit = drive_timeout_s()
        if not 0 <= self.wait_s < limit:
            return (f"--wait-s must be at least 0 and below the Drive client's timeout "
                    f"(TIDEMARK_DRIVE_TIMEOUT_S, {limit:g} s here), got {self.wait_s:g}")
        if self.kills < 0:
            return f"--kills must be 0 or more, got {self.kills}"
        if self.steps_per_worker < 1:
            return f"--steps-per-worker must be 1 or more, got {self.steps_per_worker}"
        if self.pool < 2:
            return f"--pool must be 2 or more, got {self.pool}"
        if self.timeout_s <= 0:
            return f"--timeout-s must be more than 0, got {self.timeout_s}"
        if not 0 <= self.throttle < 1:
            return f"--throttle must be at least 0 and below 1, got {self.throttle:g}"
        return ""

    @property
    def connection_bound(self) -> int:
        return self.workers * (self.pool + PER_WORKER_EXTRA) + HARNESS_CONNECTIONS


def throttled_share(share: float) -> str:
    return f"{share:.0%} of the Drive's requests" if share else "nothing"


def mib(kib: int) -> float:
    return round(kib / 1024, 1)


def drive_timeout_s() -> float:
    """The workers' Drive client timeout: a write that waits longer would never be answered."""
    from tools.stack.devstack import STAGING_CLIENTS

    name = "TIDEMARK_DRIVE_TIMEOUT_S"
    try:
        return float(os.environ.get(name) or STAGING_CLIENTS[name])
    except ValueError:
        return float(STAGING_CLIENTS[name])


@dataclass
class Kill:
    at_s: float  # since the runs were started
    pid: int
    writes_in_flight: int  # at the target, when it died
    replaced_by: int


@dataclass
class FleetReport:
    config: FleetConfig
    completed: int = 0
    not_completed: list[dict[str, Any]] = field(default_factory=list)
    duplicates: int = 0
    false_done: list[str] = field(default_factory=list)  # "task step"
    missing: int = 0  # a completed run's step the target never applied
    absorbed: int = 0  # writes the target answered from an idempotency key
    kills: list[Kill] = field(default_factory=list)
    db_connections_peak: int = 0
    db_connections_samples: int = 0
    inflight_steps_peak: int = 0
    inflight_tasks_peak: int = 0
    inflight_steps_at_connection_peak: int = 0
    # What the steps in flight cost the workers (/proc/<pid>/status, sampled with the
    # connections): each worker's resident memory and threads once it polls, before any run
    # starts, and their peaks over the run (the largest worker's), and every pid sampled.
    worker_rss_start_kib: int = 0
    worker_rss_peak_kib: int = 0
    worker_threads_start: int = 0
    worker_threads_peak: int = 0
    worker_growth_kib: int = 0  # the first workers' peak minus start, summed
    worker_thread_growth: int = 0
    worker_cpu_s: float = 0.0  # every worker's CPU time while the runs ran, summed
    workers_sampled: list[int] = field(default_factory=list)
    worker_pids: list[int] = field(default_factory=list)  # every worker started
    wall_s: float = 0.0
    steps_done: int = 0
    log_dir: str = ""

    @property
    def stopped_for_a_person(self) -> list[dict[str, Any]]:
        """The runs that ended waiting for a person (PERSON_STATES)."""
        return [n for n in self.not_completed if n["state"] in PERSON_STATES]

    @property
    def ok(self) -> bool:
        return (not self.not_completed and not self.false_done and self.duplicates == 0
                and self.missing == 0)

    def per_step(self, growth: float) -> float:
        """``growth`` per step in flight at the peak.

        ``growth`` is the first workers' peak minus their start, summed. Exact for one worker;
        with several, or kills, an upper bound (their peaks need not coincide)."""
        return round(growth / self.inflight_steps_peak, 1) if self.inflight_steps_peak else 0.0

    def as_json(self) -> dict[str, Any]:
        c = self.config
        return {
            "tasks": c.tasks, "workers": c.workers, "wait_s": c.wait_s, "seed": c.seed,
            "throttle": c.throttle,
            "stopped_for_a_person": len(self.stopped_for_a_person),
            "steps_per_worker": c.steps_per_worker, "pool": c.pool,
            "kills": [asdict(k) for k in self.kills], "completed": self.completed,
            "not_completed": self.not_completed, "duplicates": self.duplicates,
            "false_done": self.false_done, "missing": self.missing, "absorbed": self.absorbed,
            "db_connections_peak": self.db_connections_peak,
            "db_connections_bound": c.connection_bound,
            "db_connections_samples": self.db_connections_samples,
            "inflight_steps_peak": self.inflight_steps_peak,
            "inflight_tasks_peak": self.inflight_tasks_peak,
            "inflight_steps_at_connection_peak": self.inflight_steps_at_connection_peak,
            "worker_rss_start_mib": mib(self.worker_rss_start_kib),
            "worker_rss_peak_mib": mib(self.worker_rss_peak_kib),
            "worker_rss_per_step_kib": self.per_step(self.worker_growth_kib),
            "worker_threads_start": self.worker_threads_start,
            "worker_threads_peak": self.worker_threads_peak,
            "worker_threads_per_step": self.per_step(self.worker_thread_growth),
            "workers_sampled": len(self.workers_sampled),
            "worker_cpu_s": round(self.worker_cpu_s, 1),
            "worker_cpu_ms_per_step": (round(1000 * self.worker_cpu_s / self.steps_done, 1)
                                       if self.steps_done else 0.0),
            "wall_s": round(self.wall_s, 2), "steps_done": self.steps_done,
            "steps_per_s": round(self.steps_done / self.wall_s, 2) if self.wall_s else 0.0,
            "log_dir": self.log_dir, "ok": self.ok}

    def table(self) -> str:
        j = self.as_json()
        lines = [f"fleet: {j['tasks']} tasks on {j['workers']} workers ({j['steps_per_worker']} "
                 f"steps at once, pool {j['pool']} each), writes waiting {j['wait_s']} s, "
                 f"{len(self.kills)} kill(s), seed {j['seed']}",
                 f"throttled       {throttled_share(j['throttle'])}",
                 f"completed       {self.completed}/{j['tasks']}",
                 f"for a person    {j['stopped_for_a_person']}",
                 f"duplicates      {self.duplicates}",
                 f"false done      {len(self.false_done)}",
                 f"missing         {self.missing}",
                 f"absorbed        {self.absorbed}",
                 f"connections     peak {self.db_connections_peak} (bound "
                 f"{j['db_connections_bound']}; {self.db_connections_samples} samples)",
                 f"in flight       {self.inflight_steps_peak} steps, {self.inflight_tasks_peak} "
                 f"tasks at most; {self.inflight_steps_at_connection_peak} steps at the "
                 "connection peak",
                 f"worker memory   {j['worker_rss_start_mib']} MiB polling, "
                 f"{j['worker_rss_peak_mib']} MiB at most; {j['worker_rss_per_step_kib']} KiB "
                 "per step in flight",
                 f"worker threads  {self.worker_threads_start} polling, "
                 f"{self.worker_threads_peak} at most; {j['worker_threads_per_step']} per step "
                 "in flight",
                 f"worker CPU      {j['worker_cpu_s']} s, {j['worker_cpu_ms_per_step']} ms per "
                 "step done",
                 f"wall            {j['wall_s']} s, {j['steps_per_s']} steps/s"]
        lines += [f"not completed   {n['task']}: {n['state']} {n['why']}"
                  for n in self.not_completed[:20]]
        if len(self.not_completed) > 20:
            lines.append(f"                ... and {len(self.not_completed) - 20} more")
        lines += [f"false done      {x}" for x in self.false_done[:20]]
        lines.append(f"worker logs     {self.log_dir}")
        lines.append("fleet: every check held" if self.ok else "fleet: a check FAILED")
        return "\n".join(lines)


# -- the plan, spread over the tasks ------------------------------------------------------------

def task_docs(plan_doc: dict[str, Any], tasks: int, base: str) -> list[dict[str, Any]]:
    """The plan once per task: task id ``{base}-{n}``, ``{n}`` in string arguments replaced.

    Raises:
        FleetError: a step's action has no staging write to wait on, or its file is not one
            of its own per task.
    """
    steps = plan_doc.get("steps")
    if not isinstance(steps, list) or not steps:
        raise FleetError("fleet: the plan has no steps")
    for i, s in enumerate(steps, 1):
        action = s.get("action") if isinstance(s, dict) else None
        if action not in WAIT_OPS:
            raise FleetError(f"fleet: step {i} is {action!r}; a fleet plan's steps are "
                             f"{', '.join(WAIT_OPS)} (their writes wait on the staging server)")
        if PLACEHOLDER not in str(s.get("args", {}).get("file_id", "")):
            raise FleetError(f"fleet: step {i}'s file_id must hold {PLACEHOLDER}, so that each "
                             "task renames a file of its own")
    width = len(str(tasks))
    return [{**plan_doc, "task_id": f"{base}-{n:0{width}d}",
             "steps": [_filled(s, f"{n:0{width}d}") for s in steps]}
            for n in range(1, tasks + 1)]


def _filled(value: Any, n: str) -> Any:
    if isinstance(value, str):
        return value.replace(PLACEHOLDER, n)
    if isinstance(value, dict):
        return {k: _filled(v, n) for k, v in value.items()}
    if isinstance(value, list):
        return [_filled(v, n) for v in value]
    return value


def seed_targets(staging_url: str, docs: Sequence[dict[str, Any]], wait_s: float) -> None:
    """A reset staging server with every task's files.

    Every write of a fleet action waits ``wait_s`` before it is applied."""
    staging_http(staging_url, "/_staging/reset", {})
    for doc in docs:
        for s in doc["steps"]:
            fid = s["args"]["file_id"]
            staging_http(staging_url, "/_staging/drive/files", {"id": fid, "name": f"{fid}.orig"})
    for target, op in sorted(set(WAIT_OPS.values())):
        staging_http(staging_url, "/_staging/faults", {"target": target, "op": op,
                                                       "kind": "delay", "seconds": wait_s,
                                                       "times": FOREVER})


# -- the workers ---------------------------------------------------------------------------------

class Workers:
    """The fleet's worker processes: started, SIGKILLed and replaced, stopped."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = env
        self.log_dir = log_dir
        self.live: dict[int, subprocess.Popen[bytes]] = {}
        self.dead: list[subprocess.Popen[bytes]] = []
        self.started: list[int] = []  # every pid, in order

    def pids(self) -> list[int]:
        """The live workers' pids (read from the sampler's thread: a copy)."""
        return list(self.live)

    def start(self) -> int:
        n = len(self.live) + len(self.dead) + 1
        with open(self.log_dir / f"worker-{n}.log", "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "worker"], env=self.env,
                                    stdout=log, stderr=subprocess.STDOUT)
        self.live[proc.pid] = proc
        self.started.append(proc.pid)
        return proc.pid

    def kill(self, pid: int) -> None:
        proc = self.live.pop(pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        self.dead.append(proc)

    def exited(self) -> list[str]:
        """Workers that ended without being killed here: what their logs end with."""
        out = []
        for pid, proc in self.live.items():
            if proc.poll() is not None:
                out.append(f"worker {pid} exited with {proc.returncode}")
        return out

    def stop(self) -> None:
        stop_processes(list(self.live.values()))
        self.live.clear()


def stop_processes(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to all, then each gets 30 s to end before a SIGKILL."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def worker_env(cfg: FleetConfig, *, temporal_address: str, db_url: str, staging_url: str,
               task_queue: str, log_dir: Path) -> dict[str, str]:
    """The workers' environment: this one's TIDEMARK_* settings, the staging clients', the fleet's.

    The caller's Temporal profile (a cloud namespace, an API key) is replaced by an empty one:
    the fleet's workers go to the fleet's server only."""
    from tools.stack.devstack import STAGING_CLIENTS

    profile = log_dir / "temporal.toml"
    profile.write_text("")
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")}
    return {**STAGING_CLIENTS, **IDLE_CLIENTS, **inherited,
            "TEMPORAL_CONFIG_FILE": str(profile), "TEMPORAL_ADDRESS": temporal_address,
            "DATABASE_URL": db_url, "TIDEMARK_STAGING_URL": staging_url,
            "TIDEMARK_TASK_QUEUE": task_queue, "TIDEMARK_APPROVAL": "none",
            "TIDEMARK_LOG_LEVEL": "WARNING",
            "TIDEMARK_MAX_CONCURRENT_STEPS": str(cfg.steps_per_worker),
            "TIDEMARK_DB_POOL_MAX": str(cfg.pool)}


@contextmanager
def staging_process() -> Iterator[str]:
    """The staging servers in a process of their own (`tidemark staging`): their URL."""
    from tools.stack.devstack import free_port, wait_for_port

    port = free_port()
    log_dir = Path(tempfile.mkdtemp(prefix="tidemark-fleet-staging-"))
    with open(log_dir / "staging.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "tools.cli.main", "staging", "--port",
                                 str(port)], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port, proc, "staging servers", log_dir / "staging.log")
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_processes([proc])


async def pollers(client: Client, queue: str) -> set[int]:
    """The pids of the workers polling ``queue`` for activities."""
    resp = await client.workflow_service.describe_task_queue(DescribeTaskQueueRequest(
        namespace=client.namespace, task_queue=TaskQueue(name=queue),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY))
    heads = (p.identity.split("@", 1)[0] for p in resp.pollers)
    return {int(h) for h in heads if h.isdigit()}


async def all_polling(client: Client, queue: str, workers: Workers) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not set(workers.live) <= await pollers(client, queue):
        if workers.exited() or time.monotonic() > deadline:
            raise FleetError(f"fleet: the workers did not all start polling ("
                             f"{'; '.join(workers.exited()) or 'timed out'}); their logs are "
                             f"in {workers.log_dir}")
        await asyncio.sleep(0.1)


# -- what is measured meanwhile ------------------------------------------------------------------

@dataclass(frozen=True)
class ProcessSample:
    """One look at a process in /proc: what a step in flight costs its worker."""

    rss_kib: int  # VmRSS: resident now
    hwm_kib: int  # VmHWM: the most it was resident (the kernel's own peak, between samples too)
    threads: int
    cpu_s: float  # user + system time so far (/proc/<pid>/stat)


def process_sample(pid: int) -> ProcessSample | None:
    """``pid``'s memory, threads and CPU time, read from /proc.

    Memory and threads come from /proc/<pid>/status, CPU time from /proc/<pid>/stat. None when
    it is gone (or on a system without /proc)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    # stat's second field, the command, is in parentheses and may hold spaces: count after it.
    # utime and stime are the 14th and 15th fields, in clock ticks.
    after = stat.rsplit(")", 1)[-1].split()
    try:
        return ProcessSample(rss_kib=int(fields["VmRSS"].split()[0]),
                             hwm_kib=int(fields["VmHWM"].split()[0]),
                             threads=int(fields["Threads"]),
                             cpu_s=(int(after[11]) + int(after[12])) / CLOCK_TICKS)
    except (KeyError, ValueError, IndexError):
        return None  # a zombie has no Vm* lines


@dataclass
class WorkerUse:
    """Each worker's peaks over the run, by pid."""

    rss_peak_kib: dict[int, int] = field(default_factory=dict)
    threads_peak: dict[int, int] = field(default_factory=dict)
    cpu_s: dict[int, float] = field(default_factory=dict)  # the last seen

    def add(self, pid: int, s: ProcessSample) -> None:
        self.rss_peak_kib[pid] = max(self.rss_peak_kib.get(pid, 0), s.hwm_kib, s.rss_kib)
        self.threads_peak[pid] = max(self.threads_peak.get(pid, 0), s.threads)
        self.cpu_s[pid] = s.cpu_s


class ConnectionSampler:
    """Counts the server connections to the journal's database every SAMPLE_EVERY_S.

    It runs in a thread of its own, and at the same moments reads each live worker's memory and
    threads (``worker_pids``). The statement reads Postgres's view of its backends, not the
    journal: it is the harness's, not the store's."""

    def __init__(self, db_url: str, worker_pids: Callable[[], list[int]] = list) -> None:
        self.db_url = db_url
        self.worker_pids = worker_pids
        self.samples: list[tuple[float, int]] = []
        self.workers = WorkerUse()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="fleet-sampler")

    def _run(self) -> None:
        with psycopg.connect(self.db_url, autocommit=True) as conn:
            while not self._stop.is_set():
                row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                                   "current_database() AND pid <> pg_backend_pid()").fetchone()
                self.samples.append((time.time(), int(row[0]) if row else 0))
                for pid in self.worker_pids():
                    if (sample := process_sample(pid)) is not None:
                        self.workers.add(pid, sample)
                self._stop.wait(SAMPLE_EVERY_S)

    def __enter__(self) -> ConnectionSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def peak(self) -> tuple[int, float]:
        """The most connections seen, and when (first time)."""
        if not self.samples:
            return 0, 0.0
        at, n = max(self.samples, key=lambda s: (s[1], -s[0]))
        return n, at


def overlap_peak(spans: Sequence[tuple[float, float]]) -> int:
    """The most of ``spans`` (start, end) open at one moment."""
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    peak = now = 0
    for _, d in events:
        now += d
        peak = max(peak, now)
    return peak


def open_at(spans: Sequence[tuple[float, float]], t: float) -> int:
    return sum(1 for a, b in spans if a <= t <= b)


async def deliver_kills(cfg: FleetConfig, workers: Workers, staging_url: str, started: float,
                        finished: asyncio.Event, rng: random.Random) -> list[Kill]:
    """``cfg.kills`` SIGKILLs, each replacing the killed worker at once.

    Each comes at a random moment (within one wait) after the last, once a write is in flight at
    the target."""
    kills: list[Kill] = []
    for _ in range(cfg.kills):
        await asyncio.sleep(rng.uniform(0.2, 1.0) * max(cfg.wait_s, 0.5))
        in_flight = 0
        while not finished.is_set() and not (in_flight := await _writes_in_flight(staging_url)):
            await asyncio.sleep(0.05)
        if finished.is_set():
            break
        victim = rng.choice(sorted(workers.live))
        workers.kill(victim)
        kills.append(Kill(round(time.monotonic() - started, 2), victim, in_flight,
                          workers.start()))
    return kills


async def _writes_in_flight(staging_url: str) -> int:
    requests = await asyncio.to_thread(staging_http, staging_url, "/_staging/requests")
    return sum(1 for q in requests if q.get("status") is None)


# -- the run --------------------------------------------------------------------------------------

async def run_fleet(plan_doc: dict[str, Any], cfg: FleetConfig, *, client: Client, db_url: str,
                    staging_url: str, say: Callable[[str], None] = lambda _: None
                    ) -> FleetReport:
    """The whole experiment; see the module docstring."""
    if cfg.problem():
        raise FleetError(f"fleet: {cfg.problem()}")
    base = f"{plan_doc.get('task_id') or 'fleet'}-{uuid.uuid4().hex[:6]}"
    docs = task_docs(plan_doc, cfg.tasks, base)
    registry = spec_registry()  # validates; the workers bind the actions
    plans = [load_plan(d, registry) for d in docs]  # refuses a bad plan before anything runs
    with JournalStore(db_url, max_size=2) as store:
        store.migrate()
        unattended(store, "tidemark fleet")  # a scratch journal: its runs pay unattended
    seed_targets(staging_url, docs, cfg.wait_s)
    log_dir = Path(tempfile.mkdtemp(prefix="tidemark-fleet-"))
    queue = f"fleet-{uuid.uuid4().hex[:8]}"
    workers = Workers(worker_env(cfg, temporal_address=client.service_client.config.target_host,
                                 db_url=db_url, staging_url=staging_url, task_queue=queue,
                                 log_dir=log_dir), log_dir)
    report = FleetReport(cfg, log_dir=str(log_dir))
    rng = random.Random(cfg.seed)
    try:
        for _ in range(cfg.workers):
            workers.start()
        await all_polling(client, queue, workers)
        if cfg.throttle:  # once the workers made their identity check's scratch file
            for name, value in (("throttle_status", 403), ("throttle_rate", cfg.throttle)):
                # 403 userRateLimitExceeded: Drive's throttled answer at its worst
                staging_http(staging_url, "/_staging/switches", {
                    "target": "drive", "name": name, "value": value})
        say(f"{cfg.workers} workers polling {queue}; starting {cfg.tasks} runs")
        at_start = {pid: s for pid in workers.pids() if (s := process_sample(pid)) is not None}
        with ConnectionSampler(db_url, workers.pids) as sampler:
            started = time.monotonic()
            handles = await asyncio.gather(*(client.start_workflow(
                "RunPlan", d, id=f"tidemark-{d['task_id']}", task_queue=queue,
                search_attributes=start_attributes(d["task_id"])) for d in docs))
            finished = asyncio.Event()
            killer = asyncio.create_task(deliver_kills(cfg, workers, staging_url, started,
                                                       finished, rng))
            results = await _results(handles, cfg.timeout_s - (time.monotonic() - started))
            report.wall_s = time.monotonic() - started
            finished.set()
            report.kills = await killer
        peak, peak_at = sampler.peak()
        report.db_connections_peak, report.db_connections_samples = peak, len(sampler.samples)
        _worker_use(report, at_start, sampler.workers)
    finally:
        report.worker_pids = list(workers.started)
        workers.stop()
    say(f"runs ended after {report.wall_s:.1f} s; judging")
    _judge(report, plans, results, staging_url, db_url, peak_at)
    return report


def _worker_use(report: FleetReport, at_start: dict[int, ProcessSample], use: WorkerUse
                ) -> None:
    """The workers' memory and threads: polling (before any run started) and at their peaks."""
    report.workers_sampled = sorted(use.rss_peak_kib)
    if at_start:
        report.worker_rss_start_kib = max(s.rss_kib for s in at_start.values())
        report.worker_threads_start = max(s.threads for s in at_start.values())
    report.worker_rss_peak_kib = max(use.rss_peak_kib.values(), default=0)
    report.worker_threads_peak = max(use.threads_peak.values(), default=0)
    report.worker_growth_kib = sum(max(use.rss_peak_kib.get(pid, 0) - s.rss_kib, 0)
                                   for pid, s in at_start.items())
    report.worker_cpu_s = sum(cpu - (at_start[pid].cpu_s if pid in at_start else 0.0)
                              for pid, cpu in use.cpu_s.items())
    report.worker_thread_growth = sum(max(use.threads_peak.get(pid, 0) - s.threads, 0)
                                      for pid, s in at_start.items())


# The most run results awaited at once (_results): far below a namespace's limit of long polls.
RESULT_WAITS = 200


async def _results(handles: Sequence[WorkflowHandle[Any, Any]], timeout: float
                   ) -> dict[str, tuple[str, str]]:
    """Each run's (state, why), by task id.

    A run still going after ``timeout`` is terminated and reported as such. At most
    RESULT_WAITS results are awaited at once: each is a long poll of the server, and a
    namespace takes a bounded number of them (the dev server refuses past 1,200 with
    ResourceExhausted, "namespace concurrent poller limit exceeded"), the workers' own polls
    for tasks among them."""
    from workflows.outcome import run_result

    gate = asyncio.Semaphore(RESULT_WAITS)

    async def one(h: WorkflowHandle[Any, Any]) -> tuple[str, str]:
        async with gate:
            try:
                r = await run_result(h)
            except Exception as e:
                return "error", f"{type(e).__name__}: {e}"
        return r.state, str(r.error.get("message") or r.error or "")

    tasks = {h.id.removeprefix("tidemark-"): asyncio.ensure_future(one(h)) for h in handles}
    await asyncio.wait(tasks.values(), timeout=max(timeout, 1.0))
    out: dict[str, tuple[str, str]] = {}
    for (task, fut), h in zip(tasks.items(), handles, strict=True):
        if fut.done():
            out[task] = fut.result()
        else:
            fut.cancel()
            where = await _pending(h)
            out[task] = ("running", "still running when --timeout-s passed; terminated"
                         + (f"; {where}" if where else ""))
            await h.terminate(reason="tidemark fleet: timed out")
    return out


async def _pending(h: WorkflowHandle[Any, Any]) -> str:
    """Where a run still going stands: each activity it waits on, its attempt and last failure.

    So a run that outlived the timeout says why (a kill's lease waited out, a target that kept
    throttling, an activity no worker took), in the report itself."""
    try:
        desc = await h.describe()
    except Exception as e:  # the report must not fail on a run it only describes
        return f"not described: {type(e).__name__}"
    said = []
    for a in desc.raw_description.pending_activities:
        line = f"{a.activity_type.name} attempt {a.attempt}"
        if a.HasField("last_failure"):
            line += f", last failed: {cut(a.last_failure.message, 160)}"
        said.append(line)
    return "; ".join(said) or "waiting on no activity"


def _judge(report: FleetReport, plans: Sequence[Any], results: dict[str, tuple[str, str]],
           staging_url: str, db_url: str, peak_at: float) -> None:
    """Completed runs, duplicates, false done and misses, and the in-flight peaks.

    The counts come from the target's logs and the journal; the in-flight peaks from the
    journal's intents."""
    effects = staging_http(staging_url, "/_staging/effects")
    requests = staging_http(staging_url, "/_staging/requests")
    waited = set(WAIT_OPS.values())
    applied = Counter(e["key"] for e in effects if (e["target"], e["op"]) in waited and e["key"])
    report.duplicates = sum(n - 1 for n in applied.values() if n > 1)
    report.absorbed = sum(1 for q in requests if q.get("replayed"))
    steps: list[tuple[float, float]] = []
    tasks: list[tuple[float, float]] = []
    with JournalStore(db_url, max_size=2) as store:
        for plan in plans:
            state, why = results[plan.task_id]
            if state == "completed":
                report.completed += 1
            else:
                report.not_completed.append({"task": plan.task_id, "state": state, "why": why})
            rows = {r.step: r for r in store.rows(plan.task_id) if r.phase == Phase.DO}
            spans = []
            for s in plan.steps:
                key = key_for(plan.task_id, s.number, s.action, s.args)
                row = rows.get(s.number)
                done = row is not None and row.status == StepStatus.DONE
                report.steps_done += done
                if done and not applied[key]:
                    report.false_done.append(f"{plan.task_id} step {s.number}")
                elif state == "completed" and not applied[key]:
                    report.missing += 1
                if row is not None and row.finished_at is not None:
                    spans.append((row.started_at.timestamp(), row.finished_at.timestamp()))
            steps += spans
            if spans:
                tasks.append((min(a for a, _ in spans), max(b for _, b in spans)))
    report.inflight_steps_peak = overlap_peak(steps)
    report.inflight_tasks_peak = overlap_peak(tasks)
    report.inflight_steps_at_connection_peak = open_at(steps, peak_at)
