"""The `tidemark` command: a thin shell over tidemark.commands.

Errors print one line and exit non-zero (``--traceback`` shows the full trace).
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from collections.abc import Sequence
from typing import Any

from tidemark import commands
from tidemark.database import database_url
from tidemark.errors import TidemarkError

EXIT_ERROR = 1
EXIT_USAGE = 2


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True, default=str))


def _cmd_db_migrate(a: argparse.Namespace) -> int:
    applied = commands.db_migrate(database_url())
    if a.json:
        _print_json({"applied": applied})
    else:
        print("applied: " + ", ".join(applied) if applied else "schema is up to date")
    return 0


def _cmd_plan_check(a: argparse.Namespace) -> int:
    plan = commands.plan_check(a.file, sort=a.sort)
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
    report = commands.status(database_url(), a.task)
    if a.json:
        _print_json(report.as_json())
    else:
        print(report.text())
    return 0


def _cmd_stop(a: argparse.Namespace) -> int:
    commands.stop(database_url(), a.task, a.reason, a.by)
    print(f"task {a.task} is stopped; nothing will act on it until `tidemark release {a.task}`")
    return 0


def _cmd_release(a: argparse.Namespace) -> int:
    commands.release(database_url(), a.task, a.reason, a.by)
    print(f"task {a.task} is released; starting it again resumes from the journal")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tidemark",
        description="Crash-safe, idempotent execution of agent plans. The journal lives in "
                    "DATABASE_URL, or in an embedded Postgres when it is unset.")
    p.add_argument("--traceback", action="store_true", help="show the full trace on errors")
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
    st.add_argument("task")
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=_cmd_status)

    user = getpass.getuser()
    for name, func, what in (("stop", _cmd_stop, "set the durable stop state of a task"),
                             ("release", _cmd_release, "allow a stopped task to run again")):
        c = sub.add_parser(name, help=what)
        c.add_argument("task", help="a task id, or * for every task")
        c.add_argument("--reason", default="", help="recorded in the journal")
        c.add_argument("--by", default=user, help=f"who decides (default: {user})")
        c.set_defaults(func=func)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except TidemarkError as e:
        if args.traceback:
            raise
        print(f"tidemark: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
