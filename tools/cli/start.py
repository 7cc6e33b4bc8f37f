"""`tidemark start PLAN.json`: validates a plan as `plan check` does, then starts its run.

The run is RunPlan as ``tidemark-<task_id>`` on the configured task queue. ``--wait`` waits for
its end and exits as the runbook says (0 completed, 3 ended otherwise); ``--follow`` says how it
goes meanwhile; ``--json`` prints the one shape of tools/operate/outcome.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from typing import Any

from tidemark.payloads import RunResult
from tools.cli.common import add_temporal_arguments, ended, print_json
from tools.operate import commands
from tools.operate.outcome import envelope, next_of_open_run, next_of_run


def add_start_command(sub: Any) -> None:
    c = sub.add_parser("start", help="validate a plan file as `plan check` does and start its run")
    c.add_argument("plan", help="the plan file (JSON)")
    add_temporal_arguments(c)
    c.add_argument("--task-queue", help="default: TIDEMARK_TASK_QUEUE, else tidemark")
    add_wait_arguments(c, "completed")
    c.add_argument("--json", action="store_true",
                   help="print the started object, or with --wait/--follow the final status "
                        "(the shape of docs/reference.md, \"--json of the commands that "
                        "change state\")")
    c.set_defaults(func=_cmd_start)


def add_wait_arguments(parser: argparse.ArgumentParser, success: str) -> None:
    """--wait and --follow of a command that starts a run."""
    parser.add_argument("--wait", action="store_true",
                        help=f"wait until the run has ended: exit 0 when it ended {success}, "
                             "else 3 with one line naming the end state")
    add_follow_argument(parser)


def add_follow_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--follow", action="store_true",
                        help="as --wait, saying meanwhile one line per step or batch confirmed "
                             "and per state change (waiting for a person: who, and the command)")


def sayer(a: argparse.Namespace) -> Callable[[str], None] | None:
    """Where --follow prints its lines: stdout, or stderr when stdout carries --json."""
    if not a.follow:
        return None
    out = sys.stderr if getattr(a, "json", False) else sys.stdout

    def say(line: str) -> None:
        print(line, file=out, flush=True)
    return say


def _cmd_start(a: argparse.Namespace) -> int:
    import asyncio  # with the Temporal client: not loaded by `--help`

    from tools.operate.inbox import run_url
    from tools.operate.starter import launch_plan

    plan = commands.plan_check(a.plan, fs_roots=a.settings.fs_roots, env=a.settings.env)
    wid = f"tidemark-{plan.task_id}"
    link = run_url(a.settings, wid)
    say = sayer(a)

    def started(run_id: str) -> None:
        if a.json:
            return
        print(f"started {wid} (task {plan.task_id}, {len(plan.steps)} steps) on task queue "
              f"{a.task_queue}\nWeb UI: {link}", flush=True)

    result: RunResult | None = asyncio.run(launch_plan(
        a.settings, plan.canonical(), plan.task_id, a.task_queue, started=started,
        wait=a.wait or a.follow, say=say))
    committed = {"workflow_id": wid, "task_queue": a.task_queue, "plan_hash": plan.plan_hash,
                 "steps": len(plan.steps), "ui": link}
    if result is None:
        if a.json:
            print_json(envelope("start", plan.task_id, committed,
                                next_of_open_run(plan.task_id)))
        return 0
    if a.json:
        print_json(envelope("start", plan.task_id, committed,
                            next_of_run(plan.task_id, result.state, result.error,
                                        f"{result.confirmed}/{result.steps} steps confirmed"),
                            dataclasses.asdict(result)))
    elif say is None:
        from tools.operate.follow import ended_line

        print(ended_line(result))
    return ended("start", wid, result.state, result.error)
