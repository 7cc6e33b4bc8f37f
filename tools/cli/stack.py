"""The `tidemark` commands that are a laptop stack or a harness.

They are `dev`, `staging`, `demo`, `chaos` and `providers verify`."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from tidemark.metrics import DEV_PORT
from tidemark.needs import Act, command
from tools.cli.common import (
    EXIT_ERROR,
    add_temporal_arguments,
    journal_url,
    print_json,
    temporal,
)


def add_stack_commands(sub: Any) -> None:
    dev = sub.add_parser("dev", help="run the embedded stack in the foreground: Temporal dev "
                                     "server + Web UI, Postgres, staging servers, a worker "
                                     "serving metrics")
    add_port_arguments(dev, {"port": 7233, "ui_port": 8233, "staging_port": 8900,
                             "codec_port": 0})
    dev.add_argument("--metrics-port", type=int,
                     help=f"the port the worker serves Prometheus metrics on, at /metrics "
                          f"(default: TIDEMARK_METRICS_ADDRESS, else {DEV_PORT}, else any free "
                          f"port)")
    dev.add_argument("--no-worker", action="store_true", help="start no worker")
    dev.set_defaults(func=_cmd_dev)

    dc = sub.add_parser("decider", help="record the approve/reject updates sent to runs "
                                        "(temporal workflow update, the Web UI) in the journal, "
                                        "as your login role")
    add_temporal_arguments(dc)
    dc.add_argument("--task-queue", help="the runs' task queue (default: TIDEMARK_TASK_QUEUE, "
                                         "else tidemark)")
    dc.set_defaults(func=_cmd_decider)

    stg = sub.add_parser("staging", help="run the staging servers alone")
    stg.add_argument("--host", default="127.0.0.1")
    stg.add_argument("--port", type=int, default=8900)
    stg.set_defaults(func=_cmd_staging)

    demo = sub.add_parser("demo", help="the 42-step morning (Drive, mail, Stripe): crash at step "
                                       "32, report, resume, gate, every effect once")
    demo.add_argument("--kill-at", type=int, default=32, help="the rename whose worker dies")
    demo.add_argument("--third-party", action="store_true",
                      help="somebody renames an already-renamed file before the resume: the "
                           "gate stops the task before any mail or payment")
    demo.add_argument("--json", action="store_true",
                      help='print {"interrupted", "final", "effects"}: the two status objects '
                           "are `tidemark status --json`")
    demo.add_argument("--keep", action="store_true", help="keep the stack up for the Web UI")
    add_port_arguments(demo, {"port": 0, "ui_port": 0, "staging_port": 0, "codec_port": 0})
    demo.add_argument("--metrics-port", type=int,
                      help="serve the workers' Prometheus metrics on this port (default: none)")
    demo.set_defaults(func=_cmd_demo)

    ch = sub.add_parser("chaos", help="kill a plan at random steps and phases on the staging "
                                      "servers, resume, compare with an uninterrupted run")
    ch.add_argument("plan", help="a plan file (JSON)")
    ch.add_argument("--runs", type=int, default=20, help="interrupted runs (default 20)")
    ch.add_argument("--seed", type=int, help="the same seed gives the same kills")
    ch.add_argument("--json", action="store_true", help='print {"runs", "duplicates", '
                    '"misses", "absorbed", "mismatches", "harness_errors", "phases", '
                    '"requests", "coverage", "seed", "failures"}')
    ch.add_argument("--worst-case", action="store_true",
                    help="every staging switch at the provider's documented worst case "
                         "(GET /_staging/switches lists them)")
    ch.add_argument("--time-faults", action="store_true",
                    help="interrupt runs in time too: a worker frozen past its lease "
                         "(SIGSTOP, then SIGCONT), a 30 s step of the database's clock; runs "
                         "on a Postgres of its own (needs Debian's libfaketime)")
    ch.add_argument("--jobs", type=int, default=3,
                    help="interrupted runs at a time, each on staging servers of its own "
                         "started here (default 3)")
    ch.add_argument("--staging-url", action="append", default=[],
                    help="use these staging servers, one run at a time on each (repeat it for "
                         "several; default: --jobs of them, started here)")
    ch.add_argument("--action", action="append", default=[], metavar="MODULE:CLASS",
                    help="an action class not installed as a plugin, bound by its from_env "
                         "(replaces an action of the same name)")
    ch.set_defaults(func=_cmd_chaos)

    pv = sub.add_parser("providers", help="check the provider assumptions the probes rely on")
    pv_sub = pv.add_subparsers(dest="providers_command", required=True)
    vf = pv_sub.add_parser("verify", help="run each assumption's check (docs/provider-"
                                          "assumptions.md); default: against staging servers "
                                          "started here")
    vf.add_argument("--live", action="store_true",
                    help="against the real providers, with the test accounts named by "
                         "TIDEMARK_LIVE_* (never in CI; Stripe test mode only)")
    vf.add_argument("--worst-case", action="store_true",
                    help="the staging servers with every switch at its documented worst case")
    vf.add_argument("--only", action="append", default=[], metavar="ID|PROVIDER",
                    help="only these assumptions (an id, or a provider: drive, gmail, ...)")
    vf.add_argument("--record", metavar="DIR",
                    help="write each result's facts and exchanges, scrubbed, as DIR/<id>.json")
    vf.add_argument("--json", action="store_true", help="print the results as JSON")
    vf.set_defaults(func=_cmd_providers)


PORTS = {"port": "Temporal gRPC port", "ui_port": "Temporal Web UI port",
         "staging_port": "staging servers port",
         "codec_port": "payload codec server port (the Web UI decodes through it)"}


def add_port_arguments(parser: argparse.ArgumentParser, defaults: dict[str, int]) -> None:
    """--port, --ui-port, --staging-port and --codec-port of a stack; 0 is any free port."""
    for name, what in PORTS.items():
        default = defaults[name]
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=default,
                            help=f"{what} (default {default or 'any free port'}; 0: any free "
                                 f"port)")


def _cmd_dev(a: argparse.Namespace) -> int:
    from tidemark.approval import ENV_APPROVAL
    from tidemark.database import redacted
    from tidemark.metrics import METRICS_ENV, dev_address
    from tidemark.store.connection import login_role
    from tools.stack.devstack import DevStack

    # On a laptop the person is the journal's operator and approver (the embedded Postgres's
    # owner): TIDEMARK_APPROVAL, if set, becomes the journal's policy, and a decider lets the
    # Web UI's approve and reject updates decide as the person.
    # An address of TIDEMARK_METRICS_ADDRESS is taken as it is (another host, say); a port is
    # checked free before anything starts, as the other ports are.
    env_metrics = a.settings.env.get(METRICS_ENV) if a.metrics_port is None else None
    metrics_port = (a.metrics_port if a.metrics_port is not None or env_metrics
                    else int(dev_address({}).rsplit(":", 1)[1]))
    stack = DevStack(port=a.port, ui_port=a.ui_port, staging_port=a.staging_port,
                     codec_port=a.codec_port,
                     metrics_port=None if env_metrics else metrics_port,
                     with_worker=not a.no_worker, settings=a.settings,
                     approval=a.settings.env.get(ENV_APPROVAL), with_decider=not a.no_worker,
                     worker_env={METRICS_ENV: env_metrics} if env_metrics else {})
    # SIGTERM (or a closed terminal's SIGHUP) during start-up unwinds like Ctrl-C, so start()
    # stops what it has started: the children run in sessions of their own and would outlive a
    # plain SIGTERM of this process.
    for sig in STOP_SIGNALS[1:]:
        signal.signal(sig, signal.default_int_handler)
    with stack:
        interrupted = _interrupt_event()
        staging = stack.staging.url if stack.staging else "-"
        decider = ("the Web UI's approve and reject updates decide as you" if stack.worker
                   else f"no decider: approve with `{command(Act.APPROVE)}`")
        metrics_at = env_metrics or stack.metrics_address
        metrics = f"http://{metrics_at}/metrics" if stack.worker else "-"
        keys = " ".join(f"{k}={v}" for k, v in stack.codec_env.items()
                        ) or "the key of TIDEMARK_CODEC_KEYS_FILE"
        codec = (f"{stack.codec.url if stack.codec else '-'}   (payloads encrypted; "
                 f"{'export ' if stack.codec_env else ''}{keys})")
        print(f"Temporal gRPC  {stack.address}   (export TEMPORAL_CONFIG_FILE="
              f"{stack.temporal_config_file})\n"
              f"Web UI         {stack.ui_url}\n"
              f"needs a person {stack.needs_url}\n"
              f"Postgres       {redacted(stack.db_url)}"
              f"{'' if a.settings.database_url else '   (export TIDEMARK_EMBEDDED_DB=1)'}\n"
              f"staging        {staging}\n"
              f"worker         {'pid ' + str(stack.worker.pid) if stack.worker else 'not started'}"
              f" (log: {stack.home / 'worker.log'}), as role {login_role(stack.worker_db_url)}\n"
              f"you            role {login_role(stack.db_url)}: operator and approver; "
              f"{decider}\n"
              f"metrics        {metrics}\n"
              f"codec server   {codec}\n"
              f"fs.rename in    {stack.fs_roots}   (TIDEMARK_FS_ROOTS)\n"
              "Ctrl-C stops everything started here.", flush=True)
        interrupted.wait()
    return 0


def _cmd_decider(a: argparse.Namespace) -> int:
    import asyncio

    from tidemark.store.connection import login_role
    from tools.operate.decider import run_decider
    from workflows.shared import decisions_queue

    url = journal_url(a)
    queue = a.task_queue or a.settings.task_queue
    interrupted = _interrupt_event()

    async def go() -> None:
        client = await temporal(a)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        threading.Thread(target=lambda: (interrupted.wait(), loop.call_soon_threadsafe(stop.set)),
                         daemon=True).start()
        print(f"deciding for the runs of task queue {queue} (on {decisions_queue(queue)}) as "
              f"the login role {login_role(url)}: the journal checks each decision as it "
              f"checks `{command(Act.APPROVE)}`. Ctrl-C stops.", flush=True)
        await run_decider(client, url, queue, stop)

    asyncio.run(go())
    return 0


def _cmd_staging(a: argparse.Namespace) -> int:
    from staging.core import StagingServer
    from staging.targets import build_staging

    with StagingServer(build_staging(), host=a.host, port=a.port) as server:
        interrupted = _interrupt_event()
        print(f"staging servers on {server.url} (Drive, Gmail, Graph, Stripe); "
              f"effects at {server.url}/_staging/effects. Ctrl-C stops.", flush=True)
        interrupted.wait()
    return 0


def _cmd_demo(a: argparse.Namespace) -> int:
    from tools.stack.demo import run_demo

    # With --json the narration goes to stderr and stdout holds only the JSON document.
    out = sys.stderr if a.json else sys.stdout
    ports = {name: getattr(a, name) for name in (*PORTS, "metrics_port")}
    outcome = run_demo(kill_at=a.kill_at, third_party=a.third_party, keep=a.keep,
                       say=lambda line: print(line, file=out, flush=True), settings=a.settings,
                       ports=ports)
    if a.json:
        print_json(outcome.as_json())
    print("demo: every check held" if outcome.ok else "demo: a check FAILED", file=out,
          flush=True)
    return 0 if outcome.ok else EXIT_ERROR


def _cmd_chaos(a: argparse.Namespace) -> int:
    from tools.chaos.run import ChaosReport, progress_bar, run_chaos

    with open(a.plan, encoding="utf-8") as f:
        doc = json.load(f)
    seed = a.seed if a.seed is not None else int.from_bytes(os.urandom(4), "big")
    if a.jobs < 1:
        print(f"tidemark chaos: --jobs must be at least 1, not {a.jobs}", file=sys.stderr)
        return EXIT_ERROR

    from contextlib import ExitStack

    with ExitStack() as stack:
        clock = None
        if a.time_faults:  # a journal of its own, whose clock it can step
            from tools.chaos.stepped_clock import stepped_postgres

            clock = stack.enter_context(stepped_postgres())

        def chaos(urls: list[str]) -> ChaosReport:
            return run_chaos(doc, a.runs, seed, db_url=clock.url if clock else journal_url(a),
                             staging_urls=urls, extra=a.action, progress=progress_bar,
                             worst_case=a.worst_case, clock=clock)

        if a.staging_url:
            report = chaos(a.staging_url)
        else:
            from staging.core import StagingServer
            from staging.targets import build_staging

            report = chaos([stack.enter_context(
                StagingServer(build_staging(worst_case=a.worst_case))).url
                for _ in range(a.jobs)])
    if a.json:
        print(json.dumps(report.as_json(), sort_keys=True))
    else:
        print(report.table())
    return 0 if report.ok else EXIT_ERROR


def _cmd_providers(a: argparse.Namespace) -> int:
    from tools.kit import providers

    providers.check_installed(staging=not a.live)
    only = a.only or None
    if a.live:
        try:
            endpoints = providers.live_endpoints()
        except providers.NoAccounts as e:
            print(e)
            return 0
        results = providers.verify(endpoints, only)
        source = "live"
    else:
        from staging.core import StagingServer
        from staging.targets import build_staging
        from tools.kit.testing import staging_post

        with StagingServer(build_staging(worst_case=a.worst_case)) as server:
            seeded = staging_post(server.url, "/_staging/drive/files",
                                  {"name": "provider-check.txt"})
            endpoints = providers.staging_endpoints(server.url, seeded["id"])
            results = providers.verify(endpoints, only)
        source = "staging (worst case)" if a.worst_case else "staging"
    if a.record:
        for path in providers.record(results, Path(a.record), endpoints, source):
            print(f"recorded {path}", file=sys.stderr)
    if a.json:
        print_json([{k: v for k, v in r.items() if k != "exchanges"} for r in results])
    else:
        for r in results:
            detail = r.get("error") or r.get("needs") or r.get("failed") or r.get("measured")
            print(f"{r['status']:<8} {r['id']:<22} {json.dumps(detail, default=str)}")
    return 0 if all(r["status"] in ("held", "skipped") for r in results) else EXIT_ERROR


# Ctrl-C, a kill, a closed terminal: each stops a stack the clean way.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _interrupt_event() -> threading.Event:
    """An event that SIGINT, SIGTERM and SIGHUP set from now on.

    It is installed before the addresses are printed: a Ctrl-C that follows them at once must
    take the clean way out (exit 0), not raise KeyboardInterrupt wherever the main thread
    happens to be."""
    stop = threading.Event()
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda *_: stop.set())
    return stop
