"""The `tidemark` command: a thin shell over tools.commands.

The configuration is read once (``tidemark.settings.load_settings``) and passed down as
``args.settings``. Errors print one line and exit non-zero (``--traceback`` shows the full
trace).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import getpass
import json
import os
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import psycopg

from tidemark.database import database_url
from tidemark.errors import PartlyUnwound, TaskUnwound, TidemarkError, UnknownTask
from tidemark.process_exit import exit_now
from tidemark.settings import Settings, load_settings
from tidemark.words import Decision, Verdict
from tools import commands
from tools.inbox import add_inbox_command

EXIT_ERROR = 1
EXIT_USAGE = 2
# `--wait` of resume, unwind, approve and reject: the run ended, but not in the command's
# success state (SUCCESS below); one line on stderr names the state it ended in.
EXIT_NOT_DONE = 3
# What each waiting command set out to reach. A reject succeeds when the run it told ends
# stopped with nothing irreversible done.
SUCCESS = {"resume": "completed", "unwind": "unwound", "approve": "completed",
           "reject": "stopped"}
# The commands that are a laptop stack or a test harness: they may use the embedded Postgres
# when DATABASE_URL is unset. Every other command needs DATABASE_URL or --embedded-db.
EMBEDDED_COMMANDS = ("dev", "demo", "chaos")


class UsageError(Exception):
    """A command line that names nothing to act on, or two things at once."""


def _db(a: argparse.Namespace) -> str:
    """The journal's URL under the command's settings."""
    return database_url(a.settings)


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True, default=str))


def _cmd_db_migrate(a: argparse.Namespace) -> int:
    applied = commands.db_migrate(_db(a))
    if a.json:
        _print_json({"applied": applied})
    else:
        print("applied: " + ", ".join(applied) if applied else "schema is up to date")
    return 0


def _cmd_plan_check(a: argparse.Namespace) -> int:
    plan = commands.plan_check(a.file, sort=a.sort, fs_roots=a.settings.fs_roots)
    summary = commands.plan_summary(plan)
    if a.sort:
        _print_json(summary["plan"])  # the reordered plan, ready to save
    elif a.json:
        _print_json(summary)
    else:
        first = summary["first_irreversible"]
        print(f"ok: task {plan.task_id}, {len(plan.steps)} steps, plan {plan.plan_hash[:12]}"
              + (f", irreversible from step {first}" if first else ", all reversible"))
    return 0


def _cmd_status(a: argparse.Namespace) -> int:
    if a.series is not None:
        return _series_status(a)
    if a.task is None:
        print("tidemark: status needs a task or --series S", file=sys.stderr)
        return EXIT_USAGE
    try:
        report = commands.status(_db(a), a.task)
    except UnknownTask:
        blocked = commands.blocked_status(_db(a), a.task)  # or UnknownTask again
        if a.json:
            _print_json(blocked)
        else:
            print(f"task {a.task}  (blocked)  {blocked['line']}")
        return 0
    if a.json:
        _print_json(report.as_json())
    else:
        print(report.text())
    return 0


def _cmd_journal(a: argparse.Namespace) -> int:
    data = commands.journal(_db(a), a.task)
    if a.json:
        _print_json(data)
        return 0
    print(f"{'step':>5} {'phase':<5} {'action':<22} {'status':<8} {'by':<9} "
          f"{'intent':<20} {'key'}")
    for r in data["rows"]:
        phase = r["phase"] + (f"#{r['attempt']}" if r.get("attempt", 1) > 1 else "")
        print(f"{r['step']:>5} {phase:<5} {r['action']:<22} {r['status'] or 'IN DOUBT':<8} "
              f"{r['resolved_by'] or '-':<9} {r['started_at'][:19]:<20} {r['idem_key']}")
    for e in data["events"]:
        step = f"step {e['step']} " if e["step"] else ""
        print(f"{e['at'][:19]}  {e['kind']:<12} {step}{json.dumps(e['detail'], sort_keys=True)}"
              f"  ({e['actor']})")
    return 0


def _cmd_resolve(a: argparse.Namespace) -> int:
    if not a.yes:
        print(f"tidemark: recording that step {a.step} of {a.task} is {a.as_} is your decision; "
              "pass --yes to record it", file=sys.stderr)
        return EXIT_USAGE
    _print_json(commands.resolve(_db(a), a.task, a.step, a.as_, a.note, a.by))
    return 0


def _scope(a: argparse.Namespace, verb: str) -> str:
    """The control scope named on the command line: a task id, or ``*`` for ``--all``."""
    if a.all and a.task is not None:
        raise UsageError(f"{verb}: give a task id or --all, not both")
    if a.all:
        return commands.ALL_TASKS
    if a.task is None:
        raise UsageError(f"{verb}: give a task id, or --all for every task")
    return str(a.task)


def _cmd_stop(a: argparse.Namespace) -> int:
    if _series_scope(a):
        commands.stop(_db(a), "series:" + a.series, a.reason, a.by, force_unknown=True)
        print(f"series {a.series} is stopped; no run of it starts until "
              f"`tidemark release --series {a.series}`")
        return 0
    scope = _scope(a, "stop")
    commands.stop(_db(a), scope, a.reason, a.by, force_unknown=a.force_unknown)
    if scope == commands.ALL_TASKS:
        print("every task is stopped; nothing will act until `tidemark release --all`")
    else:
        print(f"task {scope} is stopped; nothing will act on it until `tidemark release {scope}`")
    return 0


def _cmd_release(a: argparse.Namespace) -> int:
    if a.for_unwind:
        if a.task is None or a.all or a.series:
            raise UsageError("release --for-unwind: give one task id")
        commands.release_for_unwind(_db(a), a.task, a.reason, a.by)
        print(f"task {a.task}'s kill is lifted for unwinding; it stays stopped. "
              f"`tidemark unwind {a.task} --yes` puts its reversible steps back")
        return 0
    if _series_scope(a):
        commands.release(_db(a), "series:" + a.series, a.reason, a.by,
                         force_unknown=True)
        print(f"series {a.series} is released")
        return 0
    scope = _scope(a, "release")
    commands.release(_db(a), scope, a.reason, a.by, force_unknown=a.force_unknown)
    if scope == commands.ALL_TASKS:
        print("the stop of every task is released (a task stopped by its own id stays "
              "stopped until released by name)")
    else:
        print(f"task {scope} is released; starting it again resumes from the journal")
    return 0


def _cmd_resume(a: argparse.Namespace) -> int:
    from tools.starter import check_no_unwind, resume_task

    url = _db(a)
    report = commands.status(url, a.task)
    if report.progress.unwound is not None:
        raise TaskUnwound(a.task)  # before releasing anything: an unwound task stays put
    if report.progress.undo_rows:
        raise PartlyUnwound(a.task)  # so does one with any compensation
    every = commands.global_stop(url)
    if every is not None:
        # Releasing the task alone would start a run that meets the global stop at once.
        raise commands.GloballyStopped(
            f"every task is stopped (by {every['set_by']}: {every['reason'] or 'no reason'}); "
            f"nothing was released or started. `tidemark release --all` first, then resume")
    if report.progress.stop is not None:
        commands.check_not_killed(report.progress.stop, a.task)  # a kill is released by name
    # Nor while an unwind of it is under way: releasing the unwind's stop would run the task
    # forward while compensations of it may still run.
    check_no_unwind(a.settings, a.task, "resume")
    if report.progress.stop is not None:
        commands.release(url, a.task, a.reason or "resume", a.by)
    result = asyncio.run(resume_task(a.settings, a.task, wait=a.wait,
                                     task_queue=a.task_queue))
    if result is None:
        print(f"started tidemark-{a.task} on the stored plan (from step "
              f"{report.progress.next_step}); follow it in the Web UI or with "
              f"`tidemark status {a.task}`")
        return 0
    _print_json(dataclasses.asdict(result))
    return _ended("resume", f"tidemark-{a.task}", result.state, result.error)


def _ended(command: str, workflow_id: str, state: str, error: dict[str, Any] | None) -> int:
    """The exit code of a waiting command whose run ended in ``state``: 0 for the command's
    success state; otherwise one line on stderr naming the end state, and EXIT_NOT_DONE, so
    that a script (or a person's `&&`) never takes a run that needs a person for done."""
    want = SUCCESS[command]
    if state == want:
        return 0
    err = error or {}
    why = f" ({err.get('type')}: {err.get('message')})" if err.get("type") else ""
    print(f"tidemark: {workflow_id} ended {state}, not {want}{why}".replace("\n", " "),
          file=sys.stderr)
    return EXIT_NOT_DONE


def _cmd_decide(a: argparse.Namespace) -> int:
    from tools.starter import decision_taken, signal_approval

    decision = Decision.APPROVE if a.command == Decision.APPROVE else Decision.REJECT

    def show(lines: list[str]) -> None:
        # What the person decides on, in full, before the decision is recorded.
        if not a.json:
            print(f"task {a.task}: the irreversible steps you {decision}:")
            for line in lines:
                print(f"  {line}")
            sys.stdout.flush()

    out = commands.decide_approval(_db(a), a.task, decision, a.by, a.reason, show=show)
    try:
        woke: bool | None = asyncio.run(signal_approval(a.settings, a.task,
                                                        {"decision": decision, "by": out["by"]}))
    except TidemarkError as e:  # journaled all the same: the run reads it at the boundary
        print(f"tidemark: could not wake the run ({e}); the decision is journaled and counts "
              "when the run next reaches the boundary", file=sys.stderr)
        woke = None
    stands = (asyncio.run(decision_taken(a.settings, a.task, until_end=True))
              if a.wait and woke else None)
    code = 0 if stands is None else _decision_code(decision, a.task, stands)
    if a.json:
        _print_json({**out, "signalled": woke, **({"stands": stands} if a.wait else {})})
        return code
    label = f" ({a.by})" if a.by and a.by != out["by"] else ""
    print(f"{decision} of task {a.task} by {out['by']}{label} is journaled")
    if decision == Decision.REJECT:
        print(f"the task is stopped; nothing from its first irreversible step on will run. "
              f"`tidemark unwind {a.task}` puts the reversible steps back")
    if woke is not None:
        print(f"the waiting run of tidemark-{a.task} was told" if woke else
              f"no run of tidemark-{a.task} is open; the decision counts when it is next "
              "started")
    if stands is not None:
        print(_where_it_stands(a.task, stands))
    return code


def _decision_code(decision: str, task: str, stands: dict[str, Any]) -> int:
    """The exit code of `approve/reject --wait` once the run that took the decision ended."""
    if stands["open"]:  # not reached by decision_taken(until_end=True); never reported as done
        return _ended(decision, f"tidemark-{task}", "running", None)
    return _ended(decision, f"tidemark-{task}", stands["state"], stands["error"])


def _where_it_stands(task: str, stands: dict[str, Any]) -> str:
    """One line after `approve/reject --wait`: what the run did with the decision."""
    if stands["open"]:
        return (f"tidemark-{task} took the decision: {stands['state']} "
                f"(`tidemark status {task}` follows its steps)")
    err = stands["error"] or {}
    why = f" ({err.get('type')}: {err.get('message')})" if err.get("type") else ""
    return f"tidemark-{task} took the decision and ended {stands['status']}: {stands['state']}{why}"


def _cmd_unwind(a: argparse.Namespace) -> int:
    from tools.starter import check_no_unwind, unwind_task

    url = _db(a)
    plan = commands.unwind_preview(url, a.task)
    if not a.yes:
        _print_json(plan)
        print(f"tidemark: unwind compensates {len(plan['undo_steps'])} step(s) as listed; "
              "pass --yes to do it", file=sys.stderr)
        return EXIT_USAGE
    commands.check_unwind_allowed(url, a.task)  # a kill in force: nothing changes
    check_no_unwind(a.settings, a.task, "unwind")  # one under way: nothing changes either
    commands.stop(url, a.task, a.reason or "unwind", a.by)
    result = asyncio.run(unwind_task(a.settings, a.task, wait=a.wait,
                                     task_queue=a.task_queue))
    if result is None:
        print(f"started tidemark-unwind-{a.task}")
        return 0
    _print_json(dataclasses.asdict(result))
    return _ended("unwind", f"tidemark-unwind-{a.task}", result.state, result.error)


def _cmd_dev(a: argparse.Namespace) -> int:
    from tidemark.approval import ENV_APPROVERS
    from tidemark.database import redacted
    from tidemark.metrics import METRICS_ENV, dev_address
    from tools.devstack import DevStack

    stack = DevStack(port=a.port, ui_port=a.ui_port, staging_port=a.staging_port,
                     with_worker=not a.no_worker, settings=a.settings,
                     worker_env={METRICS_ENV: dev_address(a.settings.env),
                                 # Who may approve on a laptop stack: the user running it,
                                 # unless configured.
                                 ENV_APPROVERS: a.settings.env.get(ENV_APPROVERS)
                                 or commands.os_user()})
    # SIGTERM during start-up unwinds like Ctrl-C, so start() stops what it has started: the
    # children run in sessions of their own and would outlive a plain SIGTERM of this process.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with stack:
        interrupted = _interrupt_event()
        staging = stack.staging.url if stack.staging else "-"
        metrics = f"http://{stack.worker_env[METRICS_ENV]}/metrics" if stack.worker else "-"
        print(f"Temporal gRPC  {stack.address}   (export TEMPORAL_CONFIG_FILE="
              f"{stack.temporal_config_file})\n"
              f"Web UI         {stack.ui_url}\n"
              f"Postgres       {redacted(stack.db_url)}"
              f"{'' if a.settings.database_url else '   (export TIDEMARK_EMBEDDED_DB=1)'}\n"
              f"staging        {staging}\n"
              f"worker         {'pid ' + str(stack.worker.pid) if stack.worker else 'not started'}"
              f" (log: {stack.home / 'worker.log'})\n"
              f"metrics        {metrics}\n"
              f"fs.rename in    {stack.fs_roots}   (TIDEMARK_FS_ROOTS)\n"
              "Ctrl-C stops everything started here.", flush=True)
        interrupted.wait()
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
    from tools.demo import run_demo

    # With --json the narration goes to stderr and stdout holds only the JSON document.
    out = sys.stderr if a.json else sys.stdout
    outcome = run_demo(kill_at=a.kill_at, third_party=a.third_party, keep=a.keep,
                       say=lambda line: print(line, file=out, flush=True), settings=a.settings)
    if a.json:
        _print_json(outcome.as_json())
    print("demo: every check held" if outcome.ok else "demo: a check FAILED", file=out,
          flush=True)
    return 0 if outcome.ok else EXIT_ERROR


def _cmd_chaos(a: argparse.Namespace) -> int:
    from tools.chaos import progress_bar, run_chaos

    with open(a.plan, encoding="utf-8") as f:
        doc = json.load(f)
    seed = a.seed if a.seed is not None else int.from_bytes(os.urandom(4), "big")
    if a.staging_url:
        report = run_chaos(doc, a.runs, seed, db_url=_db(a), staging_url=a.staging_url,
                           extra=a.action, progress=progress_bar, worst_case=a.worst_case)
    else:
        from staging.core import StagingServer
        from staging.targets import build_staging

        with StagingServer(build_staging(worst_case=a.worst_case)) as server:
            report = run_chaos(doc, a.runs, seed, db_url=_db(a), staging_url=server.url,
                               extra=a.action, progress=progress_bar, worst_case=a.worst_case)
    if a.json:
        print(json.dumps(report.as_json(), sort_keys=True))
    else:
        print(report.table())
    return 0 if report.ok else EXIT_ERROR


def _cmd_providers(a: argparse.Namespace) -> int:
    from tools import providers

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
        from tools.testing import staging_post

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
        _print_json([{k: v for k, v in r.items() if k != "exchanges"} for r in results])
    else:
        for r in results:
            detail = r.get("error") or r.get("needs") or r.get("failed") or r.get("measured")
            print(f"{r['status']:<8} {r['id']:<22} {json.dumps(detail, default=str)}")
    return 0 if all(r["status"] in ("held", "skipped") for r in results) else EXIT_ERROR


def _interrupt_event() -> threading.Event:
    """An event that SIGINT and SIGTERM set from now on. Installed before the addresses are
    printed: a Ctrl-C that follows them at once must take the clean way out (exit 0), not raise
    KeyboardInterrupt wherever the main thread happens to be."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def add_temporal_arguments(parser: argparse.ArgumentParser) -> None:
    """--address and --namespace: they replace the configured ones (the temporal.toml profile
    of TEMPORAL_PROFILE, TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE); TLS and API key stay."""
    parser.add_argument("--address", help="Temporal frontend host:port (default: the "
                        "configured profile or TEMPORAL_ADDRESS, else localhost:7233)")
    parser.add_argument("--namespace", help="Temporal namespace (default: the configured "
                        "profile or TEMPORAL_NAMESPACE, else default)")


def command_settings(a: argparse.Namespace, env: Mapping[str, str] | None = None) -> Settings:
    """The settings of this command line: the environment's, the embedded database allowed for
    the commands that are a dev stack or a harness (or with --embedded-db), and the Temporal
    flags applied."""
    settings = load_settings(env, embedded_db=a.embedded_db or a.command in EMBEDDED_COMMANDS)
    return settings.with_temporal(address=getattr(a, "address", None),
                                  namespace=getattr(a, "namespace", None))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tidemark",
        description="Crash-safe, idempotent execution of agent plans. The journal lives in "
                    "DATABASE_URL; `tidemark dev`, `demo` and `chaos` use an embedded "
                    "Postgres when it is unset, other commands only with --embedded-db.")
    p.add_argument("--traceback", action="store_true", help="show the full trace on errors")
    p.add_argument("--embedded-db", action="store_true",
                   help="without DATABASE_URL, use the embedded Postgres in $TIDEMARK_HOME "
                        "(as TIDEMARK_EMBEDDED_DB=1 does)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    db = sub.add_parser("db", help="journal database").add_subparsers(dest="db_command",
                                                                        required=True)
    mig = db.add_parser("migrate", help="apply pending schema migrations")
    mig.add_argument("--json", action="store_true")
    mig.set_defaults(func=_cmd_db_migrate)

    plan = sub.add_parser("plan", help="plan files").add_subparsers(dest="plan_command",
                                                                     required=True)
    check = plan.add_parser("check", help="validate a plan file (actions, args, ordering)")
    check.add_argument("file")
    check.add_argument("--sort", action="store_true",
                       help="print the plan stably reordered: reversible steps first")
    check.add_argument("--json", action="store_true")
    check.set_defaults(func=_cmd_plan_check)

    st = sub.add_parser("status", help="the interruption report of a task")
    st.add_argument("task", nargs="?")
    st.add_argument("--series", help="list the runs of a series with their states")
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=_cmd_status)

    jr = sub.add_parser("journal", help="every journal row and event of a task (audit trail)")
    jr.add_argument("task")
    jr.add_argument("--json", action="store_true")
    jr.set_defaults(func=_cmd_journal)

    user = getpass.getuser()
    rs = sub.add_parser("resolve", help="record a person's decision on the step in doubt")
    rs.add_argument("task")
    rs.add_argument("--step", type=int, required=True)
    rs.add_argument("--as", dest="as_", choices=[str(v) for v in Verdict], required=True,
                    help="done: it happened; absent: it did not (a resumed run executes it "
                         "if its probe still cannot tell); never: it did not happen and must "
                         "not happen (stopped tasks only: the step is closed as failed, "
                         "nothing executes it, an unwind can proceed)")
    rs.add_argument("--note", default="", help="what you looked at")
    rs.add_argument("--by", default=user)
    rs.add_argument("--yes", action="store_true")
    rs.set_defaults(func=_cmd_resolve)

    for name, func, what in (("stop", _cmd_stop, "set the durable stop state of a task"),
                             ("release", _cmd_release, "allow a stopped task to run again")):
        c = sub.add_parser(name, help=what)
        c.add_argument("task", nargs="?", help="a task id that has a plan (or a stop)")
        c.add_argument("--series", help="every run of this series instead of one task")
        c.add_argument("--all", action="store_true",
                       help="every task (the global stop; '*' quoted means the same)")
        c.add_argument("--force-unknown", action="store_true",
                       help="accept a task id that has no plan yet")
        c.add_argument("--reason", default="", help="recorded in the journal")
        c.add_argument("--by", default=user, help=f"who decides (default: {user})")
        if name == "release":
            c.add_argument("--for-unwind", action="store_true",
                           help="turn a task's kill into a stop, so that an unwind may act")
        c.set_defaults(func=func)

    user_args = argparse.ArgumentParser(add_help=False)
    user_args.add_argument("task")
    user_args.add_argument("--reason", default="", help="recorded in the journal")
    user_args.add_argument("--by", default=user, help=f"who decides (default: {user})")
    add_temporal_arguments(user_args)
    user_args.add_argument("--task-queue", help="default: TIDEMARK_TASK_QUEUE, else tidemark")
    user_args.add_argument("--wait", action="store_true",
                           help="wait until the run has ended and say how (approve, reject: "
                                "the run that took the decision). Exit 0 only when it ended "
                                "as the command meant (resume, approve: completed; unwind: "
                                "unwound; reject: stopped), else 3 with one line naming the "
                                "end state; 1 when refused")
    res = sub.add_parser("resume", parents=[user_args],
                         help="release a stopped task and start it again on its stored plan")
    res.set_defaults(func=_cmd_resume)
    unw = sub.add_parser("unwind", parents=[user_args],
                         help="stop a task and compensate its reversible steps, last first")
    unw.add_argument("--yes", action="store_true", help="really do it (without: show the plan)")
    unw.set_defaults(func=_cmd_unwind)

    for name, what in (("approve", "let a waiting task run its irreversible steps"),
                       ("reject", "refuse a waiting task's irreversible steps; it stays "
                                  "stopped, ready for unwind")):
        c = sub.add_parser(name, parents=[user_args], help=what)
        c.add_argument("--json", action="store_true")
        c.set_defaults(func=_cmd_decide)

    dev = sub.add_parser("dev", help="run the embedded stack in the foreground: Temporal dev "
                                     "server + Web UI, Postgres, staging servers, a worker")
    dev.add_argument("--port", type=int, default=7233, help="Temporal gRPC port")
    dev.add_argument("--ui-port", type=int, default=8233, help="Temporal Web UI port")
    dev.add_argument("--staging-port", type=int, default=8900, help="staging servers port")
    dev.add_argument("--no-worker", action="store_true", help="start no worker")
    dev.set_defaults(func=_cmd_dev)

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
    ch.add_argument("--staging-url", help="use these staging servers (default: start them here)")
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
    add_series_commands(sub, user)
    add_inbox_command(sub)
    return p


# -- series, kill, schedules ------------------------------------------------------------------

def _series_scope(a: argparse.Namespace) -> bool:
    """Whether the command names a series (``--series S``) rather than a task or --all."""
    if a.series is not None and (a.task is not None or getattr(a, "all", False)):
        raise UsageError("give a task id, --series S or --all: one of them")
    return a.series is not None


def _series_status(a: argparse.Namespace) -> int:
    from tidemark import series

    with commands.open_store(_db(a)) as store:
        commands.check_series_known(store, a.series)
        data = series.listing(store, a.series)
    if a.json:
        _print_json(data)
        return 0
    stop = data["stopped"]
    print(f"series {a.series}" + (f"  ({stop['state']} by {stop['set_by']}: {stop['reason']})"
                                  if stop else ""))
    for r in data["runs"]:
        print(f"  {r['position']:>4}  {r['task_id']:<40} {r['state']:<14} "
              f"{r['confirmed']}/{r['steps']}  admitted {r['admitted_at'][:19]}")
    for b in data["blocked"]:
        print(f"  blocked  {b['task_id']:<40} at {b['at'][:19]} by {b['blockers'] or 'stop'}")
    return 0


async def _temporal(a: argparse.Namespace) -> Any:
    from tools.starter import connect

    return await connect(a.settings)


def _cmd_kill(a: argparse.Namespace) -> int:
    from tools.kill import kill, stopped_workflows

    if sum((a.task is not None, a.series is not None, a.all)) != 1:
        raise UsageError("kill: give one of a task id, --series S or --all")
    if a.all and not a.yes:
        print("tidemark: kill --all stops every task and schedule; pass --yes", file=sys.stderr)
        return EXIT_USAGE
    if a.grace < 0:
        raise UsageError("kill: --grace must be 0 or more seconds")

    async def go() -> list[dict[str, Any]]:
        from tools.starter import TemporalUnavailable

        client, unreachable = None, ""
        try:
            client = await _temporal(a)
        except TemporalUnavailable as e:  # the stop state and the grants need no Temporal
            unreachable = str(e)
        with commands.open_store(_db(a)) as store:
            return await kill(client, store, task=a.task, series=a.series, everything=a.all,
                              reason=a.reason, by=a.by, force_unknown=a.force_unknown,
                              grace_s=a.grace, unreachable=unreachable)

    layers = asyncio.run(go())
    if a.json:
        _print_json(layers)
    else:
        for layer in layers:
            mark = "ok  " if layer["done"] else "FAIL"
            print(f"{mark} layer {layer['layer']}: {layer['what']}: "
                  f"{json.dumps(layer['detail'], default=str)}")
        stopped = stopped_workflows(layers)
        print("stopped: " + ", ".join(stopped) if stopped else
              "stopped: no workflow was running; the stop state holds every later start")
    return 0 if all(layer["done"] for layer in layers) else EXIT_ERROR


def _cmd_schedule(a: argparse.Namespace) -> int:
    from tools import schedules

    async def go() -> Any:
        client = await _temporal(a)
        if a.schedule_command == "create":
            try:
                args = json.loads(a.args)
            except json.JSONDecodeError as e:
                raise commands.DecisionError(f"--args is not JSON: {e.msg}") from None
            if not isinstance(args, dict):
                raise commands.DecisionError("--args must be a JSON object")
            commands.series_policy(a.series, a.approval, _approvers(a))  # before anything
            created = await schedules.create(client, a.series, a.cron, a.planner, args,
                                             a.task_queue, by=a.by)
            return {"created": created, **commands.declare_series(
                _db(a), a.series, a.by, a.approval, _approvers(a))}
        if a.schedule_command == "list":
            return await schedules.list_all(client)
        if a.schedule_command == "pause":
            if not await schedules.pause(client, a.series, f"{a.by}: {a.reason}"):
                raise schedules.ScheduleError(f"series {a.series} has no schedule")
        elif a.schedule_command == "unpause":
            await schedules.unpause(client, a.series, f"{a.by}: {a.reason}")
        elif a.schedule_command == "delete":
            await schedules.delete(client, a.series)
        return {a.schedule_command: a.series}

    _print_json(asyncio.run(go()))
    return 0


def _approvers(a: argparse.Namespace) -> list[str] | None:
    from tidemark.approval import split_names

    return None if a.approvers is None else split_names(a.approvers)


def _cmd_series(a: argparse.Namespace) -> int:
    _print_json(commands.declare_series(_db(a), a.series, a.by, a.approval, _approvers(a)))
    return 0


def _policy_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--approval", help="which irreversible steps of its runs wait for a "
                        "person: all, none, payments, amount>CUR:FIGURE (comma-separated; "
                        "default: the worker's TIDEMARK_APPROVAL)")
    parser.add_argument("--approvers", help="operating-system users who may approve its runs, "
                        "comma-separated (default: the worker's TIDEMARK_APPROVERS)")


def add_series_commands(sub: Any, user: str) -> None:
    se = sub.add_parser("series", help="declare a series, so that plans may name it")
    sesub = se.add_subparsers(dest="series_command", required=True)
    de = sesub.add_parser("declare", help="declare series S (again: replace its policy)")
    de.add_argument("series")
    de.add_argument("--by", default=user, help=f"who declares (default: {user})")
    _policy_arguments(de)
    de.set_defaults(func=_cmd_series)

    temporal = argparse.ArgumentParser(add_help=False)
    add_temporal_arguments(temporal)
    temporal.add_argument("--by", default=user, help=f"who decides (default: {user})")
    temporal.add_argument("--reason", default="", help="recorded with the decision")

    k = sub.add_parser("kill", parents=[temporal],
                       help="out of band, in layers: stop state killed, pause schedules, "
                            "revoke grants, terminate the workflow")
    k.add_argument("task", nargs="?")
    k.add_argument("--series")
    k.add_argument("--all", action="store_true", help="every task and schedule (needs --yes)")
    k.add_argument("--yes", action="store_true")
    k.add_argument("--force-unknown", action="store_true",
                   help="accept a task id that has no plan yet")
    k.add_argument("--grace", type=float, default=10.0, metavar="SECONDS",
                   help="how long to let the attempt under way finish before terminating "
                        "(default 10)")
    k.add_argument("--json", action="store_true")
    k.set_defaults(func=_cmd_kill)

    sc = sub.add_parser("schedule", help="Temporal Schedules that start runs of a series")
    ssub = sc.add_subparsers(dest="schedule_command", required=True)
    cr = ssub.add_parser("create", parents=[temporal], help="a schedule whose runs call a planner")
    cr.add_argument("series")
    cr.add_argument("--cron", required=True, help="e.g. '0 3 * * *' (UTC)")
    cr.add_argument("--planner", required=True, help="MODULE:FUNCTION, importable by the worker")
    cr.add_argument("--args", default="{}", help="JSON object handed to the planner")
    cr.add_argument("--task-queue", help="default: TIDEMARK_TASK_QUEUE, else tidemark")
    _policy_arguments(cr)
    cr.set_defaults(func=_cmd_schedule)
    ssub.add_parser("list", parents=[temporal]).set_defaults(func=_cmd_schedule)
    for name in ("pause", "unpause", "delete"):
        c = ssub.add_parser(name, parents=[temporal])
        c.add_argument("series")
        c.set_defaults(func=_cmd_schedule)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.settings = command_settings(args)
        if getattr(args, "task_queue", "") is None:
            args.task_queue = args.settings.task_queue
        return int(args.func(args))
    except UsageError as e:
        parser.print_usage(sys.stderr)
        print(f"tidemark: {e}", file=sys.stderr)
        return EXIT_USAGE
    except TidemarkError as e:
        if args.traceback:
            raise
        print(f"tidemark: {type(e).__name__}: {e}{_unknown_hint(args, e)}", file=sys.stderr)
        return EXIT_ERROR
    except psycopg.errors.UndefinedTable:
        if args.traceback:
            raise
        print("tidemark: the journal database has no Tidemark schema yet: `tidemark db "
              "migrate` creates it (a worker does on start)", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


def _unknown_hint(a: argparse.Namespace, e: TidemarkError) -> str:
    """For a task no plan is stored for whose start its series blocked: what blocked it (a
    person at 03:14 must not take the run for a typo)."""
    if not isinstance(e, UnknownTask):
        return ""
    try:
        return "; " + commands.blocked_status(_db(a), e.task_id)["line"]
    except (TidemarkError, psycopg.Error):
        return ""


def run() -> None:
    """The ``tidemark`` command: main(), then the exit of tidemark.process_exit."""
    try:
        code = main()
    except SystemExit as e:  # argparse's --help and usage errors
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int | None):
            print(e.code, file=sys.stderr)
    exit_now(code)


if __name__ == "__main__":
    run()
