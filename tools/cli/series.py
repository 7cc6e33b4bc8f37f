"""The `tidemark` commands of series.

They are `series declare`, `kill` and `schedule create|list|pause|unpause|delete`."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tidemark.needs import Act, command
from tidemark.words import SeriesAdmits
from tools.cli.common import (
    EXIT_ERROR,
    EXIT_USAGE,
    JSON_HELP,
    UsageError,
    add_temporal_arguments,
    journal_url,
    print_json,
    temporal,
)
from tools.operate import commands
from tools.operate.outcome import envelope, next_of
from tools.operate.rows import bring_rows_in_line


def _cmd_kill(a: argparse.Namespace) -> int:
    import asyncio  # with the Temporal client: not loaded by `--help` nor the journal's commands

    from tools.operate.kill import kill, stopped_workflows

    if sum((a.task is not None, a.series is not None, a.all)) != 1:
        raise UsageError("kill: give one of a task id, --series S or --all")
    if a.all and not a.yes:
        print("tidemark: kill --all stops every task and schedule; pass --yes", file=sys.stderr)
        return EXIT_USAGE
    if a.grace < 0:
        raise UsageError("kill: --grace must be 0 or more seconds")

    async def go() -> list[dict[str, Any]]:
        from tools.operate.starter import TemporalUnavailable

        client, unreachable = None, ""
        try:
            client = await temporal(a)
        except TemporalUnavailable as e:  # the stop state and the grants need no Temporal
            unreachable = str(e)
        with commands.open_store(journal_url(a)) as store:
            return await kill(client, store, task=a.task, series=a.series, everything=a.all,
                              reason=a.reason, by=a.by, force_unknown=a.force_unknown,
                              grace_s=a.grace, unreachable=unreachable)

    layers = asyncio.run(go())
    # The four layers first, whatever follows: they ran, and a person must see how each went.
    if not a.json:
        for layer in layers:
            mark = "ok  " if layer["done"] else "FAIL"
            print(f"{mark} layer {layer['layer']}: {layer['what']}: "
                  f"{json.dumps(layer['detail'], default=str)}")
        stopped = stopped_workflows(layers)
        print("stopped: " + ", ".join(stopped) if stopped else
              "stopped: no workflow was running; the stop state holds every later start")
    sys.stdout.flush()
    # The rows of the killed tasks say so (a row opened before, by a run that ended failed,
    # say, would still ask for what no longer decides anything): tools/operate/rows.py.
    scope = a.task if a.task is not None else (f"series:{a.series}" if a.series else "*")
    if layers[3]["done"]:  # Temporal answered (layer 4 says so when it did not)
        bring_rows_in_line(a.settings, journal_url(a), scope, f"tidemark kill by {a.by}")
    if a.json:
        print_json(envelope("kill", scope, {"control": "killed", "scope": scope,
                                            "reason": a.reason, "by": a.by, "layers": layers},
                            next_of(journal_url(a), scope, "killed")))
    else:
        print(f"next: nothing acts on {scope if scope != '*' else 'any task'} until a person "
              f"runs `{command(Act.RELEASE, scope=scope)}`")
    return 0 if all(layer["done"] for layer in layers) else EXIT_ERROR


def _cmd_schedule(a: argparse.Namespace) -> int:
    import asyncio

    from tools.operate import schedules

    async def go() -> Any:
        client = await temporal(a)
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
            # A series with a schedule takes its schedule's runs only, unless the operator
            # says otherwise: a plan started by hand under its name would hold up its runs.
            return {"created": created, **commands.declare_series(
                journal_url(a), a.series, a.by, a.approval, _approvers(a),
                a.admit or SeriesAdmits.SCHEDULED)}
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

    out = asyncio.run(go())
    if a.schedule_command == "list":
        return _schedule_list(a, out)
    print_json(out)
    return 0


def _schedule_list(a: argparse.Namespace, listed: list[dict[str, Any]]) -> int:
    """`schedule list`: a table for people, `--json` for programs.

    Each schedule comes with the approval policy its series declares, read from the journal
    (only when there is a schedule to show: an empty list needs no database)."""
    names = [s["series"] for s in listed]
    policies = commands.series_policies(journal_url(a), names) if names else {}
    for s in listed:
        declared = policies.get(s["series"])
        s.update(declared=declared is not None,
                 approval=declared["approval"] if declared else None,
                 approvers=declared["approvers"] if declared else None)
    if a.json:
        print_json(listed)
        return 0
    if not listed:
        print("no series has a schedule (`tidemark schedule create S ...` makes one)")
        return 0
    rows = [("series", "when", "next run", "paused", "approval", "approvers"),
            *(_schedule_row(s) for s in listed)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(f"{cell:<{w}}" for cell, w in zip(r, widths, strict=False)) + "  " + r[-1])
    return 0


def _schedule_row(s: dict[str, Any]) -> tuple[str, ...]:
    """One schedule as the table's cells.

    A series never declared runs under the worker's policy (TIDEMARK_APPROVAL,
    TIDEMARK_APPROVERS), and so does a flag it never set."""
    declared = s["declared"]
    return (s["series"], _fires_on_text(s),
            s["next"][0][:16].replace("T", " ") + " UTC" if s["next"] else "-",
            "yes" if s["paused"] else "no",
            (s["approval"] or "worker's") if declared else "not declared",
            ",".join(s["approvers"]) if s["approvers"] else ("worker's" if declared else "-"))


def _fires_on_text(s: dict[str, Any]) -> str:
    """When a schedule fires, as a person reads it.

    That is its cron as given, its calendars (in cron fields) and its intervals."""
    parts = [*s.get("cron", []),
             *(f"calendar {c['calendar']}" + (f" ({c['comment']})" if c.get("comment") else "")
               for c in s.get("calendars", [])),
             *(f"every {_span(i['every_s'])}" + (f" (+{_span(i['offset_s'])})"
                                                 if i["offset_s"] else "")
               for i in s.get("intervals", []))]
    return "; ".join(parts) or "-"


def _span(seconds: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _approvers(a: argparse.Namespace) -> list[str] | None:
    from tidemark.approval import split_names

    return None if a.approvers is None else split_names(a.approvers)


def _cmd_series(a: argparse.Namespace) -> int:
    out = commands.declare_series(journal_url(a), a.series, a.by, a.approval, _approvers(a),
                                  a.admit)
    if a.json:
        scope = f"series:{a.series}"
        out = envelope("series declare", scope, out, next_of(journal_url(a), scope))
    print_json(out)
    return 0


def _cmd_policy(a: argparse.Namespace) -> int:
    if a.policy_command == "set":
        out = commands.set_policy(journal_url(a), a.approval, _approvers(a), a.by)
    else:
        out = commands.show_policy(journal_url(a))
    if a.json:
        print_json(out)
        return 0
    who = ", ".join(out["approvers"]) if out["approvers"] else "every member of tidemark_approver"
    since = (f"set by {out['set_by']} at {out['set_at'][:19].replace('T', ' ')}"
             if not out["default"] else "the default: nobody set one")
    print(f"approval policy {out['approval']} ({since}); who may decide: {who}. A series or a "
          "plan can ask for more, never less")
    return 0


def _policy_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--approval", help="which irreversible steps of its runs wait for a "
                        "person, besides those the operator's policy names: all, none, "
                        "payments, amount>CUR:FIGURE, daily>CUR:FIGURE (comma-separated; it "
                        "adds to `tidemark policy`, never removes)")
    parser.add_argument("--approvers", help="database roles that may approve its runs, "
                        "comma-separated, each a member of tidemark_approver (default: every "
                        "approver the operator's policy allows)")
    parser.add_argument("--admit", choices=commands.ADMITS,
                        help="who may add a run: any plan that names it, or only its "
                             "schedule's runs (default: scheduled once it has a schedule, "
                             "else any)")


def add_series_commands(sub: Any, user: str) -> None:
    se = sub.add_parser("series", help="declare a series, so that plans may name it")
    sesub = se.add_subparsers(dest="series_command", required=True)
    de = sesub.add_parser("declare", help="declare series S (again: replace its policy)")
    de.add_argument("series")
    de.add_argument("--by", default=user, help=f"who declares (default: {user})")
    _policy_arguments(de)
    de.add_argument("--json", action="store_true", help=f"{JSON_HELP} (without it: the "
                    "series' declaration)")
    de.set_defaults(func=_cmd_series)

    po = sub.add_parser("policy", help="the operator's approval policy, in the journal")
    posub = po.add_subparsers(dest="policy_command", required=True)
    ps = posub.add_parser("set", help="which irreversible steps wait for a person, and who "
                                      "may decide (an operator's act)")
    ps.add_argument("approval", help="all, none, payments, amount>CUR:FIGURE, daily>CUR:FIGURE "
                                     "(comma-separated)")
    ps.add_argument("--approvers", help="database roles that may decide, comma-separated, each "
                                        "a member of tidemark_approver (default: every member)")
    ps.add_argument("--by", default=user, help=f"a label beside your role (default: {user})")
    ps.add_argument("--json", action="store_true")
    ps.set_defaults(func=_cmd_policy)
    sh = posub.add_parser("show", help="the policy the journal holds")
    sh.add_argument("--json", action="store_true")
    sh.set_defaults(func=_cmd_policy)

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
    k.add_argument("--json", action="store_true", help=JSON_HELP)
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
    ls = ssub.add_parser("list", parents=[temporal],
                         help="every series' schedule: when it fires, its next run, whether it is "
                              "paused, its approval policy")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=_cmd_schedule)
    for name in ("pause", "unpause", "delete"):
        c = ssub.add_parser(name, parents=[temporal])
        c.add_argument("series")
        c.set_defaults(func=_cmd_schedule)
