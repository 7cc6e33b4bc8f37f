"""Many workers, many steps in flight: `tidemark fleet` (tools/fleet.py) as a benchmark.

    python bench/fleet.py [--tasks N] [--workers W] [--wait-s S] [--kills K]
                          [--steps-per-worker M] [--pool P]
                                          (or as part ``fleet`` of bench/run_all.py)

N runs of examples/fleet-rename.json (one drive.rename whose write waits S seconds on the
staging server) over W real worker processes (each M steps at once, default 256, and a
journal pool of P connections, default 8),
K of them SIGKILLed and replaced while the steps wait, on a database of its own (so the
connections counted are the fleet's alone). The default here is 200 tasks, a few minutes on a
loaded 2-core machine; the issue's 1,000 is ``--tasks 1000`` (docs/benchmarks.md).

Keys: ``inflight_tasks`` and ``inflight_workers`` (what ran), ``inflight_duplicates`` and
``inflight_false_done`` (from the staging server's effect log: both must be 0),
``inflight_completed``, ``db_connections_peak`` (pg_stat_activity, sampled every 100 ms) with
``db_connections_bound`` (workers x (pool + 2) + 1), ``inflight_steps_peak`` and
``inflight_tasks_peak`` (steps whose intent was open at one moment), ``inflight_wall_s`` and
``inflight_steps_per_s``. What the steps in flight cost the workers, from /proc/<pid>, sampled
with the connections: ``worker_rss_start_mib`` and ``worker_threads_start`` (the largest worker
once polling, before any run started), ``worker_rss_peak_mib`` and ``worker_threads_peak``
(the largest worker's peaks), ``worker_rss_per_step_kib`` and ``worker_threads_per_step`` (the
growth per step in flight at the peak: exact for one worker, an upper bound for several), and
``worker_cpu_ms_per_step`` (the workers' CPU time per step done).
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from result_stdout import others_to_stderr
from temporalio.client import Client

from tools.fleet import FleetConfig, run_fleet, staging_process

PLAN = Path(__file__).resolve().parent.parent / "examples" / "fleet-rename.json"
WORKER_KEYS = ("worker_rss_start_mib", "worker_rss_peak_mib", "worker_rss_per_step_kib",
               "worker_threads_start", "worker_threads_peak", "worker_threads_per_step",
               "worker_cpu_ms_per_step")
DEFAULTS = FleetConfig(tasks=200, workers=4, wait_s=2.0, kills=2, seed=22, timeout_s=1200.0)


def _log(msg: str) -> None:
    print(f"[fleet] {msg}", file=sys.stderr, flush=True)


async def measure_fleet(client: Client, db_url: str,
                        cfg: FleetConfig = DEFAULTS) -> dict[str, Any]:
    """The fleet's keys, from one run on ``db_url`` (a database of its own)."""
    with staging_process() as staging_url:  # as `tidemark fleet` runs them
        r = await run_fleet(json.loads(PLAN.read_text()), cfg, client=client, db_url=db_url,
                            staging_url=staging_url, say=_log)
    j = r.as_json()
    _log(r.table())
    return {"inflight_tasks": cfg.tasks, "inflight_workers": cfg.workers,
            "inflight_wait_s": cfg.wait_s, "inflight_kills": len(r.kills),
            "inflight_completed": r.completed, "inflight_duplicates": r.duplicates,
            "inflight_false_done": len(r.false_done), "inflight_missing": r.missing,
            "inflight_steps_peak": r.inflight_steps_peak,
            "inflight_tasks_peak": r.inflight_tasks_peak,
            "inflight_steps_at_connection_peak": r.inflight_steps_at_connection_peak,
            "inflight_steps_per_worker": cfg.steps_per_worker, "inflight_pool": cfg.pool,
            "db_connections_peak": r.db_connections_peak,
            "db_connections_bound": cfg.connection_bound,
            "inflight_wall_s": j["wall_s"], "inflight_steps_per_s": j["steps_per_s"],
            **{k: j[k] for k in WORKER_KEYS}}


WAITING_DEFAULTS = FleetConfig(tasks=1000, workers=1, wait_s=240.0, kills=0, seed=44,
                               steps_per_worker=1000, timeout_s=1800.0)


async def measure_waiting(client: Client, db_url: str,
                          cfg: FleetConfig = WAITING_DEFAULTS) -> dict[str, Any]:
    """One worker holding ``cfg.tasks`` steps whose writes wait ``cfg.wait_s`` s: its memory.

    Part ``waiting`` of bench/run_all.py: the fleet's run with one worker, no kills, and as many
    steps at once as tasks. ``worker_rss_per_step_kib`` is exact there (one worker); the keys
    are those of measure_fleet, ``waiting_`` before each. The Drive client's timeout is raised
    above the wait for the run (a write that waits longer than it would never be answered)."""
    import os

    name = "TIDEMARK_DRIVE_TIMEOUT_S"
    was = os.environ.get(name)
    os.environ[name] = str(max(float(was or 0), cfg.wait_s + 30))
    try:
        got = await measure_fleet(client, db_url, cfg)
    finally:
        if was is None:
            del os.environ[name]
        else:
            os.environ[name] = was
    return {f"waiting_{k.removeprefix('inflight_')}": v for k, v in got.items()}


async def _main(cfg: FleetConfig) -> dict[str, Any]:
    from run_all import new_database, postgres
    from temporalio.testing import WorkflowEnvironment

    from tools.stack.devstack import dev_server_args, temporal_binary
    from workflows.shared import SEARCH_ATTRIBUTES
    with postgres() as (admin_url, _):
        db_url = new_database(admin_url, f"fleet_{uuid.uuid4().hex[:8]}")
        env = await WorkflowEnvironment.start_local(
            dev_server_existing_path=temporal_binary(), search_attributes=SEARCH_ATTRIBUTES,
            dev_server_log_level="error", dev_server_extra_args=dev_server_args())
        try:
            return await measure_fleet(env.client, db_url, cfg)
        finally:
            await env.shutdown()


if __name__ == "__main__":
    import argparse
    import dataclasses
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=DEFAULTS.tasks)
    ap.add_argument("--workers", type=int, default=DEFAULTS.workers)
    ap.add_argument("--wait-s", type=float, default=DEFAULTS.wait_s)
    ap.add_argument("--kills", type=int, default=DEFAULTS.kills)
    ap.add_argument("--steps-per-worker", type=int, default=DEFAULTS.steps_per_worker)
    ap.add_argument("--pool", type=int, default=DEFAULTS.pool)
    a = ap.parse_args()
    config = dataclasses.replace(DEFAULTS, tasks=a.tasks, workers=a.workers, wait_s=a.wait_s,
                                 kills=a.kills, steps_per_worker=a.steps_per_worker,
                                 pool=a.pool)
    if config.problem():
        ap.error(config.problem())
    with others_to_stderr():
        result = asyncio.run(_main(config))
    print(json.dumps(result, indent=1))
