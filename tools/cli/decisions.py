"""The `tidemark` commands by which a person decides.

They are `resolve`, `stop`, `release`, `resume`, `unwind`, `approve` and `reject`."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from tidemark.errors import PartlyUnwound, TaskUnwound, TidemarkError, UnknownTask
from tidemark.needs import Act, command
from tidemark.words import Decision, Verdict
from tools.cli.common import (
    EXIT_ERROR,
    EXIT_USAGE,
    JSON_HELP,
    UsageError,
    add_temporal_arguments,
    ended,
    journal_url,
    print_json,
)
from tools.cli.start import add_follow_argument, sayer
from tools.operate import commands
from tools.operate.outcome import envelope, next_of, next_of_open_run, next_of_run
from tools.operate.rows import bring_rows_in_line


def add_decision_commands(sub: Any, user: str) -> None:
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
    add_temporal_arguments(rs)  # where the task's worklist row is told (tools/operate/rows.py)
    rs.add_argument("--json", action="store_true", help=f"{JSON_HELP} (without it: the "
                    "decision's JSON, then the next line on stderr)")
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
        add_temporal_arguments(c)  # where the worklist rows are told (tools/operate/rows.py)
        c.add_argument("--json", action="store_true", help=JSON_HELP)
        if name == "release":
            c.add_argument("--for-unwind", action="store_true",
                           help="lift a task's kill for an unwind only: compensations may act, "
                                f"nothing runs it forward until `{command(Act.RELEASE, 'T')}`")
            c.add_argument("--unpause-schedule", action="store_true",
                           help="with --series: also resume the series' schedule, which a "
                                "kill paused (without it, the schedule stays as it is)")
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
    user_args.add_argument("--json", action="store_true", help=JSON_HELP)
    res = sub.add_parser("resume", parents=[user_args],
                         help="release a stopped task and start it again on its stored plan")
    add_follow_argument(res)
    res.set_defaults(func=_cmd_resume)
    unw = sub.add_parser("unwind", parents=[user_args],
                         help="stop a task and compensate its reversible steps, last first")
    unw.add_argument("--yes", action="store_true", help="really do it (without: show the plan)")
    unw.set_defaults(func=_cmd_unwind)

    for name, what in (("approve", "let a waiting task run its irreversible steps"),
                       ("reject", "refuse a waiting task's irreversible steps; it stays "
                                  "stopped, ready for unwind")):
        c = sub.add_parser(name, parents=[user_args], help=what)
        c.set_defaults(func=_cmd_decide)


def _cmd_resolve(a: argparse.Namespace) -> int:
    if not a.yes:
        print(f"tidemark: recording that step {a.step} of {a.task} is {a.as_} is your decision; "
              "pass --yes to record it", file=sys.stderr)
        return EXIT_USAGE
    out = commands.resolve(journal_url(a), a.task, a.step, a.as_, a.note, a.by)
    _rows(a, a.task)
    if a.json:
        print_json(envelope("resolve", a.task, out, next_of(journal_url(a), a.task)))
        return 0
    print_json(out)
    _next(a, a.task)
    return 0


def _next(a: argparse.Namespace, task_id: str) -> None:
    """The line a command that changed a task ends with: what happens next.

    It says what holds the task and the one command, as `tidemark status` opens. On stderr after
    a command's JSON."""
    try:
        line = "next: " + commands.status_with_first_line(journal_url(a), task_id)[1]
    except UnknownTask:  # an id released ahead of its plan (--force-unknown)
        line = f"next: no plan of {task_id} is stored; nothing runs it until one is started"
    print(line, file=sys.stderr if a.command == "resolve" else sys.stdout)


def _rows(a: argparse.Namespace, scope: str) -> None:
    """Brings the worklist rows of ``scope`` in line with the journal.

    Afterwards the rows say what the journal says now, and after a stop or a release the runs
    waiting at the boundary have read it (tools/operate/rows.py)."""
    bring_rows_in_line(a.settings, journal_url(a), scope, f"tidemark {a.command} by {a.by}",
                       wake=a.command in ("stop", "release"))


def _scope(a: argparse.Namespace, verb: str) -> str:
    """The control scope named on the command line: a task id, or ``*`` for ``--all``."""
    if a.all and a.task is not None:
        raise UsageError(f"{verb}: give a task id or --all, not both")
    if a.all:
        return commands.ALL_TASKS
    if a.task is None:
        raise UsageError(f"{verb}: give a task id, or --all for every task")
    return str(a.task)


def _said(a: argparse.Namespace, scope: str, control: str, line: str, *,
          stopped: str | None = None, more: dict[str, Any] | None = None,
          then_next: bool = False) -> int:
    """How a stop or release ends: its line for people, or its --json object."""
    if a.json:
        committed = {"control": control, "scope": scope, "reason": a.reason, "by": a.by,
                     **(more or {})}
        print_json(envelope(a.command, scope, committed, next_of(journal_url(a), scope,
                                                                  stopped)))
        return 0
    print(line)
    if then_next:
        _next(a, scope)
    return 0


def _cmd_stop(a: argparse.Namespace) -> int:
    if _series_scope(a):
        scope = "series:" + a.series
        commands.stop(journal_url(a), scope, a.reason, a.by, force_unknown=True)
        _rows(a, scope)
        return _said(a, scope, "stopped", f"series {a.series} is stopped; no run of it starts "
                     f"until `{command(Act.RELEASE, scope=scope)}`", stopped="stopped")
    scope = _scope(a, "stop")
    commands.stop(journal_url(a), scope, a.reason, a.by, force_unknown=a.force_unknown)
    _rows(a, scope)
    if scope == commands.ALL_TASKS:
        line = ("every task is stopped; nothing will act until "
                f"`{command(Act.RELEASE, scope=commands.ALL_TASKS)}`")
    else:
        line = (f"task {scope} is stopped; nothing will act on it until "
                f"`{command(Act.RELEASE, scope)}`")
    return _said(a, scope, "stopped", line, stopped="stopped")


def _cmd_release(a: argparse.Namespace) -> int:
    if a.for_unwind:
        if a.task is None or a.all or a.series:
            raise UsageError("release --for-unwind: give one task id")
        commands.release_for_unwind(journal_url(a), a.task, a.reason, a.by)
        _rows(a, a.task)
        return _said(a, a.task, "released_for_unwind",
                     f"task {a.task}'s kill is lifted for an unwind only; it stays killed for "
                     f"everything else. `{command(Act.UNWIND, a.task)}` puts its reversible "
                     f"steps back (`{command(Act.RELEASE, a.task)}` would lift the kill itself)")
    if _series_scope(a):
        scope = "series:" + a.series
        commands.release(journal_url(a), scope, a.reason, a.by, force_unknown=True)
        _rows(a, scope)
        schedule = _series_schedule(a)
        return _said(a, scope, "released",
                     f"series {a.series} is released; {schedule}; its runs start again when "
                     f"started or resumed (`{command(Act.STATUS, scope=scope)}` lists them)",
                     more={"schedule": schedule})
    scope = _scope(a, "release")
    commands.release(journal_url(a), scope, a.reason, a.by, force_unknown=a.force_unknown)
    _rows(a, scope)
    if scope == commands.ALL_TASKS:
        return _said(a, scope, "released", "the stop of every task is released (a task "
                     "stopped by its own id stays stopped until released by name)")
    return _said(a, scope, "released", f"task {scope} is released", then_next=True)


def _cmd_resume(a: argparse.Namespace) -> int:
    import asyncio  # with the Temporal client: not loaded by `--help` nor the journal's commands

    from tools.operate.starter import check_no_unwind, resume_task

    url = journal_url(a)
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
            "nothing was released or started. "
            f"`{command(Act.RELEASE, scope=commands.ALL_TASKS)}` first, then resume")
    if report.progress.stop is not None:
        commands.check_not_killed(report.progress.stop, a.task)  # a kill is released by name
    # Nor while an unwind of it is under way: releasing the unwind's stop would run the task
    # forward while compensations of it may still run.
    check_no_unwind(a.settings, a.task, "resume")
    if report.progress.stop is not None:
        commands.release(url, a.task, a.reason or "resume", a.by)
    released = report.progress.stop is not None
    wid = f"tidemark-{a.task}"

    def started(run_id: str) -> None:
        if not a.json and (a.follow or not a.wait):  # `--wait` alone: the result's JSON only
            print(f"started {wid} on the stored plan (from step {report.progress.next_step}); "
                  + ("following it:" if a.follow else
                     f"follow it in the Web UI or with `{command(Act.STATUS, a.task)}`"),
                  flush=True)

    result = asyncio.run(resume_task(a.settings, a.task, wait=a.wait or a.follow,
                                     task_queue=a.task_queue, say=sayer(a), started=started,
                                     confirmed=report.progress.confirmed))
    committed = {"released": released, "workflow_id": wid,
                 "from_step": report.progress.next_step, "task_queue": a.task_queue}
    if a.json:
        print_json(envelope("resume", a.task, committed, next_of_open_run(a.task)
                            if result is None else
                            next_of_run(a.task, result.state, result.error),
                            None if result is None else dataclasses.asdict(result)))
    if result is None:
        return 0
    if not a.json and not a.follow:
        print_json(dataclasses.asdict(result))
    return ended("resume", wid, result.state, result.error)


def _cmd_decide(a: argparse.Namespace) -> int:
    import asyncio

    from tools.operate.starter import decision_taken, signal_approval

    decision = Decision.APPROVE if a.command == Decision.APPROVE else Decision.REJECT
    # The journal decides, in the statement that records it; what is printed is what it
    # committed (DecisionRefused and NotAuthorized are one line on stderr, nothing recorded).
    out = commands.decide_approval(journal_url(a), a.task, decision, a.by, a.reason)
    try:
        woke: bool | None = asyncio.run(signal_approval(a.settings, a.task,
                                                        {"decision": decision, "by": out["by"]}))
    except TidemarkError as e:  # journaled all the same: the run reads it at the boundary
        print(f"tidemark: could not wake the run ({e}); the decision is journaled and counts "
              "when the run next reaches the boundary", file=sys.stderr)
        woke = None
    if woke is False:  # no run takes it: the task's row says what the journal says now
        _rows(a, a.task)
    stands = (asyncio.run(decision_taken(a.settings, a.task, until_end=True))
              if a.wait and woke and out["holds"] else None)
    code = 0 if stands is None else _decision_code(decision, a.task, stands)
    if not out["holds"]:
        code = EXIT_ERROR
    if a.json:
        after = (next_of_run(a.task, stands["state"], stands["error"])
                 if stands is not None and not stands["open"] else next_of(journal_url(a), a.task))
        print_json(envelope(decision, a.task, {**out, "signalled": woke}, after, stands))
        return code
    label = f" ({out['label']})" if out["label"] and out["label"] != out["by"] else ""
    print(f"{decision} of task {a.task} by {out['by']}{label} is journaled (epoch "
          f"{out['epoch']}); it covers: {out['glance']}")
    for line in out["irreversible"]:
        print(f"  {line}")
    if not out["holds"]:
        print(f"tidemark: a stop, kill or release of task {a.task} committed just after it, so "
              "it counts for nothing; the run asks again once the task is released",
              file=sys.stderr)
        return code
    if decision == Decision.REJECT:
        print(f"the task is stopped; nothing from its first irreversible step on will run. "
              f"`{command(Act.UNWIND, a.task)}` puts the reversible steps back")
    if woke is not None:
        print(f"the waiting run of tidemark-{a.task} was told" if woke else
              f"no run of tidemark-{a.task} is open; the decision counts when it is next "
              "started, unless the task is stopped or released first")
    if stands is not None:
        print(_where_it_stands(a.task, stands))
    return code


def _decision_code(decision: str, task: str, stands: dict[str, Any]) -> int:
    """The exit code of `approve/reject --wait` once the run that took the decision ended."""
    if stands["open"]:  # not reached by decision_taken(until_end=True); never reported as done
        return ended(decision, f"tidemark-{task}", "running", None)
    return ended(decision, f"tidemark-{task}", stands["state"], stands["error"])


def _where_it_stands(task: str, stands: dict[str, Any]) -> str:
    """One line after `approve/reject --wait`: what the run did with the decision."""
    if stands["open"]:
        return (f"tidemark-{task} took the decision: {stands['state']} "
                f"(`tidemark status {task}` follows its steps)")
    err = stands["error"] or {}
    why = f" ({err.get('type')}: {err.get('message')})" if err.get("type") else ""
    return f"tidemark-{task} took the decision and ended {stands['status']}: {stands['state']}{why}"


def _cmd_unwind(a: argparse.Namespace) -> int:
    import asyncio

    from tools.operate.starter import check_no_unwind, unwind_task

    url = journal_url(a)
    plan = commands.unwind_preview(url, a.task)
    if not a.yes:
        print_json(plan)
        print(f"tidemark: unwind compensates {len(plan['undo_steps'])} step(s) as listed; "
              "pass --yes to do it", file=sys.stderr)
        return EXIT_USAGE
    commands.check_unwind_allowed(url, a.task)  # a kill in force: nothing changes
    check_no_unwind(a.settings, a.task, "unwind")  # one under way: nothing changes either
    commands.stop(url, a.task, a.reason or "unwind", a.by)
    result = asyncio.run(unwind_task(a.settings, a.task, wait=a.wait,
                                     task_queue=a.task_queue))
    wid = f"tidemark-unwind-{a.task}"
    if a.json:
        committed = {"control": "stopped", "workflow_id": wid, "undo_steps": plan["undo_steps"],
                     "task_queue": a.task_queue}
        print_json(envelope("unwind", a.task, committed, next_of(url, a.task) if result is None
                            else next_of_run(a.task, result.state, result.error),
                            None if result is None else dataclasses.asdict(result)))
    elif result is None:
        print(f"started {wid}: it puts the reversible steps back, last first; "
              f"`tidemark status {a.task}` follows it, and the task does not run forward again")
    else:
        print_json(dataclasses.asdict(result))
    return 0 if result is None else ended("unwind", wid, result.state, result.error)


def _series_schedule(a: argparse.Namespace) -> str:
    """What a release of a series did to its Temporal Schedule, in words.

    A kill paused it, and a release resumes it only when asked (``--unpause-schedule``): the
    person who lifts a kill decides whether the next runs start on their own again."""
    import asyncio

    from tools.operate import schedules
    from tools.operate.starter import TemporalUnavailable

    async def go() -> str:
        from tools.cli.common import temporal

        client = await temporal(a)
        found = await schedules.describe(client, a.series)
        if found is None:
            return "it has no schedule"
        if not found["paused"]:
            return "its schedule runs as before"
        if a.unpause_schedule:
            await schedules.unpause(client, a.series, f"{a.by}: released {a.reason}".strip())
            return f"its schedule {schedules.schedule_id(a.series)} is unpaused"
        return (f"its schedule {schedules.schedule_id(a.series)} stays paused; `tidemark "
                f"schedule unpause {a.series}` (or release with --unpause-schedule) resumes it")

    try:
        return asyncio.run(go())
    except TemporalUnavailable as e:
        return f"its schedule could not be read ({e}); `tidemark schedule list` shows it"


def _series_scope(a: argparse.Namespace) -> bool:
    """Whether the command names a series (``--series S``) rather than a task or --all."""
    if a.series is not None and (a.task is not None or getattr(a, "all", False)):
        raise UsageError("give a task id, --series S or --all: one of them")
    return a.series is not None
