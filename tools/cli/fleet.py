"""The `tidemark fleet` command: its flags, and the servers it runs on.

tools/fleet.py is the harness. The servers are a Temporal dev server and staging servers. Kept
apart so that building the command line imports no driver or SDK."""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any

from tools.cli.common import EXIT_ERROR, UsageError, journal_url

if TYPE_CHECKING:
    from tools.fleet import FleetConfig, FleetReport

DEFAULT_STEPS_PER_WORKER = 256  # TIDEMARK_MAX_CONCURRENT_STEPS of each worker
DEFAULT_POOL = 8  # TIDEMARK_DB_POOL_MAX of each worker


def add_fleet_command(sub: Any) -> None:
    fl = sub.add_parser("fleet", help="many tasks whose writes wait on the staging servers, over "
                                      "several worker processes SIGKILLed while they run: "
                                      "duplicates, false done, peak Postgres connections")
    fl.add_argument("plan", help="a plan file (JSON) of drive.rename steps whose file_id holds "
                                 "{n} (examples/fleet-rename.json)")
    fl.add_argument("--tasks", type=int, default=1000, help="runs of the plan (default 1000)")
    fl.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    fl.add_argument("--wait-s", type=float, default=2.0,
                    help="seconds every write waits at the target (default 2)")
    fl.add_argument("--kills", type=int, default=4, help="worker SIGKILLs (default 4)")
    fl.add_argument("--seed", type=int, help="the same seed gives the same victims and moments")
    fl.add_argument("--steps-per-worker", type=int, default=DEFAULT_STEPS_PER_WORKER,
                    help="each worker's TIDEMARK_MAX_CONCURRENT_STEPS (default "
                         f"{DEFAULT_STEPS_PER_WORKER})")
    fl.add_argument("--pool", type=int, default=DEFAULT_POOL,
                    help=f"each worker's TIDEMARK_DB_POOL_MAX (default {DEFAULT_POOL})")
    fl.add_argument("--throttle", type=float, default=0.0,
                    help="share (0 to below 1) of the staging Drive's requests answered as "
                         "throttled, as Drive documents (default 0)")
    fl.add_argument("--timeout-s", type=float, default=1800.0,
                    help="runs still going after this long are terminated and reported")
    fl.add_argument("--json", action="store_true", help="print the report as one JSON object")
    fl.set_defaults(func=_cmd_fleet)


def _cmd_fleet(a: Any) -> int:
    import asyncio  # with the harness: not loaded by `--help`

    from tools.fleet import FleetConfig, task_docs

    cfg = FleetConfig(tasks=a.tasks, workers=a.workers, wait_s=a.wait_s, kills=a.kills,
                      seed=a.seed if a.seed is not None else int.from_bytes(os.urandom(4), "big"),
                      steps_per_worker=a.steps_per_worker, pool=a.pool, timeout_s=a.timeout_s,
                      throttle=a.throttle)
    if cfg.problem():
        raise UsageError(cfg.problem())
    try:
        with open(a.plan, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise UsageError(f"{a.plan}: {e}") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{a.plan}: a plan is a JSON object with a \"steps\" list")
    task_docs(doc, 1, "check")  # a plan the fleet cannot spread is refused before any start
    # The dev server prints its banner to the inherited stdout: while it runs, stdout is
    # stderr, so that stdout holds the report alone (--json).
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        report = asyncio.run(_fleet_stack(doc, cfg, journal_url(a)))
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
    if a.json:
        print(json.dumps(report.as_json(), sort_keys=True))
    else:
        print(report.table())
    return 0 if report.ok else EXIT_ERROR


async def _fleet_stack(doc: dict[str, Any], cfg: FleetConfig, db_url: str) -> FleetReport:
    """A Temporal dev server and staging servers of the fleet's own around ``run_fleet``.

    The staging servers run in a process of their own (`tidemark staging`), as a provider would.
    In this one they would share the interpreter with the harness, whose bookkeeping of a
    thousand runs could hold up their answers past the workers' client timeouts."""
    from temporalio.testing import WorkflowEnvironment

    from tidemark.codec import data_converter
    from tidemark.settings import load_settings
    from tools.fleet import run_fleet, staging_process
    from tools.stack.devstack import dev_server_args, temporal_binary
    from workflows.shared import SEARCH_ATTRIBUTES

    # The workers inherit this environment's TIDEMARK_* settings, the payload keys among them:
    # the harness's client reads their results with the same converter.
    converter = data_converter(load_settings(lazy_temporal=True).codec_keys())
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(), search_attributes=SEARCH_ATTRIBUTES,
        dev_server_log_level="error", dev_server_extra_args=dev_server_args(),
        data_converter=converter)
    try:
        with staging_process() as staging_url:
            return await run_fleet(doc, cfg, client=env.client, db_url=db_url,
                                   staging_url=staging_url,
                                   say=lambda line: print(line, file=sys.stderr, flush=True))
    finally:
        await env.shutdown()
