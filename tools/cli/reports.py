"""The `tidemark` commands that read.

They are `db migrate`, `plan check`, `status` (of a task or a series) and `journal`."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tidemark.errors import UnknownTask
from tools.cli.common import EXIT_USAGE, journal_url, print_json
from tools.operate import commands


def add_report_commands(sub: Any) -> None:
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


def _cmd_db_migrate(a: argparse.Namespace) -> int:
    applied = commands.db_migrate(journal_url(a))
    if a.json:
        print_json({"applied": applied})
    else:
        print("applied: " + ", ".join(applied) if applied else "schema is up to date")
    return 0


def _cmd_plan_check(a: argparse.Namespace) -> int:
    plan = commands.plan_check(a.file, sort=a.sort, fs_roots=a.settings.fs_roots,
                               env=a.settings.env)
    summary = commands.plan_summary(plan)
    outlook = commands.approval_outlook(plan, a.settings.env)
    if a.sort:
        print_json(summary["plan"])  # the reordered plan, ready to save
    elif a.json:
        print_json({**summary, "approval": outlook})
    else:
        first = summary["first_irreversible"]
        print(f"ok: task {plan.task_id}, {len(plan.steps)} steps, plan {plan.plan_hash[:12]}"
              + (f", irreversible from step {first}" if first else ", all reversible"))
        if outlook is not None:
            print(f"it will wait for a person before step {first}: {outlook} (the journal's "
                  "policy, `tidemark policy show`, and a series' may ask for more)")
    return 0


def _cmd_status(a: argparse.Namespace) -> int:
    if a.series is not None:
        return _series_status(a)
    if a.task is None:
        print("tidemark: status needs a task or --series S", file=sys.stderr)
        return EXIT_USAGE
    try:
        report, first = ((commands.status(journal_url(a), a.task), "") if a.json
                         else commands.status_with_first_line(journal_url(a), a.task))
    except UnknownTask:
        blocked = commands.blocked_status(journal_url(a), a.task)  # or UnknownTask again
        if a.json:
            print_json(blocked)
        else:
            print(f"task {a.task}  (blocked)  {blocked['line']}")
        return 0
    if a.json:
        print_json(report.as_json())
    else:
        print(first)
        print(report.text())
    return 0


def _cmd_journal(a: argparse.Namespace) -> int:
    data = commands.journal(journal_url(a), a.task)
    if a.json:
        print_json(data)
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


def _series_status(a: argparse.Namespace) -> int:
    from tidemark import series

    with commands.open_store(journal_url(a)) as store:
        commands.check_series_known(store, a.series)
        data = series.listing(store, a.series)
    if a.json:
        print_json(data)
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
