"""`tidemark inbox`: every task that waits for a person, one entry per task, oldest first.

Read from the journal (tidemark/needs_journal.py says what a task waits for, the same reading as
`tidemark status` and the Web UI's worklist rows). Temporal is asked two things the journal
cannot tell: which tasks have an unwind under way (a person's `tidemark unwind T --yes` sets a
plain stop first; while it runs, the task is being settled, not waiting), and whether the run
the journal reads as going on is open (a run terminated outside tidemark, from the Web UI say,
journals no end; nothing runs its task).

Each entry says why, since when, what is at stake (the irreversible steps not yet done, as
`tidemark approve` shows them: recipients, subjects, amounts in the currency's own units) and
the one command that decides it (docs/control-matrix.md). For people, the output ends with the
Temporal Web UI list of the runs that wait for a person (the TidemarkNeeds search attribute, as
a URL; docs/who-needs-me.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.parse
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from tidemark.database import database_url
from tidemark.errors import TidemarkError
from tidemark.needs import Act, command, needs_query
from tidemark.needs_journal import Entry, at_stake, entry_of
from tidemark.settings import Settings
from tidemark.web_ui import DEFAULT_UI, base_url, workflow_url
from tidemark.words import TaskState
from tools.operate.commands import open_store

# The store (psycopg) is loaded by the commands that read the journal, when they read it:
# `tidemark --help` registers this command without it.
if TYPE_CHECKING:
    from tidemark.store import JournalStore

__all__ = ["DEFAULT_UI", "inbox", "web_ui_url"]
# The unwinds under way (tools.operate.starter.unwind_task names them tidemark-unwind-<task>).
UNWINDS_OPEN = 'WorkflowType = "UnwindPlan" AND ExecutionStatus = "Running"'
UNWIND_PREFIX = "tidemark-unwind-"
RUNS_OPEN = 'WorkflowType = "RunPlan" AND ExecutionStatus = "Running"'
# The open rows of the Web UI's worklist (workflows/needs_person.py, holder_id).
ROWS_OPEN = 'WorkflowType = "NeedsPerson" AND ExecutionStatus = "Running"'
ROW_PREFIX = "tidemark-needs-"
# How long the inbox waits for Temporal before it answers from the journal alone.
TEMPORAL_WAIT_S = 5.0


def _blocked(event: dict[str, Any]) -> Entry:
    t, d = event["task_id"], event["detail"]
    series = d.get("series")
    why = (f"series {series} is {(d.get('stop') or {}).get('state', 'stopped')}"
           if d.get("stop") else
           f"earlier run(s) {', '.join(d.get('blockers') or [])} of series {series} "
           "not settled")
    return Entry(t, "blocked", event["at"], f"its start was refused before its plan was "
                 f"stored: {why}", command(Act.STATUS, t, scope=f"series:{series}"),
                 fix=f"settle the earlier runs of series {series} (or release it), then start "
                     f"{t} again")


@dataclass(frozen=True)
class Seen:
    """What Temporal says and the journal cannot."""

    unwinding: set[str]  # tasks whose unwind is under way: being settled, not waiting
    gone: dict[str, str]  # tasks the journal reads a run going on for whose run is not open:
    #                       its status in Temporal (terminated outside tidemark, say)



def _refused(event: dict[str, Any]) -> Entry:
    """A start refused before its plan was stored.

    That is a ``refused`` event of a task the journal has no plan for. The entry says what
    refused it, and that a corrected start of the task is next. Its run's worklist row says the
    same, and closes when a run of the task starts."""
    t, err = event["task_id"], event["detail"].get("error") or {}
    return Entry(t, TaskState.FAILED, event["at"],
                 f"its start ({event['actor']}) was refused before its plan was stored: "
                 f"{err.get('type')}: {' '.join(str(err.get('message') or '').split())}",
                 command(Act.PLAN_CHECK, "PLAN"),
                 fix=f"correct the plan (or the worker's configuration) as said, then start "
                     f"{t} again: nothing of the refused start was stored")


def refused_line(url: str, task_id: str) -> str | None:
    """What refused the start of a task no plan is stored for, in one line.

    None when no start of it was refused."""
    from tools.operate.commands import journal_store

    with journal_store(url) as store:
        found = store.refused_starts(task_id)
    return _refused(found[0]).detail if found else None


async def _ask(settings: Settings, going_on: list[str]) -> Seen:
    from temporalio.service import RPCError, RPCStatusCode

    from tools.operate.starter import connect  # the Temporal client: loaded by this command only

    client = await connect(settings)
    unwinding = {w.id.removeprefix(UNWIND_PREFIX) async for w in client.list_workflows(UNWINDS_OPEN)
                 if w.id.startswith(UNWIND_PREFIX)}
    running = {w.id async for w in client.list_workflows(RUNS_OPEN)}
    gone: dict[str, str] = {}
    for task_id in going_on:
        wid = f"tidemark-{task_id}"
        if wid in running:
            continue
        try:  # the list may not show a run started a moment ago: its description does
            desc = await client.get_workflow_handle(wid).describe()
            status = desc.status.name if desc.status else "UNKNOWN"
        except RPCError as e:
            if e.status != RPCStatusCode.NOT_FOUND:
                raise
            status = "NOT_FOUND"
        if status != "RUNNING":
            gone[task_id] = status
    return Seen(unwinding, gone)


def ask_temporal(settings: Settings, going_on: list[str]) -> Seen | None:
    """Which tasks have an unwind under way, and which going-on tasks have no open run.

    ``going_on`` are the tasks the journal reads a run going on for. None (with one line on
    stderr) when Temporal does not answer in time: the inbox then answers from the journal
    alone."""
    import asyncio  # with the Temporal client: `--help` registers this command without it

    from temporalio.service import RPCError

    try:
        return asyncio.run(asyncio.wait_for(_ask(settings, going_on), TEMPORAL_WAIT_S))
    except (TidemarkError, TimeoutError, RuntimeError, RPCError) as e:
        print(f"tidemark: could not ask Temporal which unwinds and runs are under way "
              f"({type(e).__name__}: {e}); a task being unwound is listed as stopped, and a "
              "run ended outside tidemark is not seen".replace("\n", " "), file=sys.stderr)
        return None


def _gone(store: JournalStore, task_id: str, status: str, began_at: datetime) -> Entry:
    """A task whose run is not open in Temporal though it journaled no end.

    It was ended outside tidemark (the Web UI's Terminate, `temporal workflow terminate`), so
    nothing runs the task."""
    return Entry(task_id, TaskState.ENDED, began_at,
                 f"its run tidemark-{task_id} is {status.lower()} in Temporal and journaled no "
                 "end (ended outside tidemark: the Web UI's Terminate, `temporal workflow "
                 "terminate`); nothing runs the task", command(Act.RESUME, task_id),
                 at_stake(store, task_id))


def inbox(store: JournalStore, seen: Seen | None = None,
          going_on: list[dict[str, Any]] | None = None) -> list[Entry]:
    """Every task that waits for a person, oldest first.

    With ``seen`` (Temporal's answer): tasks whose unwind is under way are being settled and
    left out, and a task of ``going_on`` (store.runs_going_on) whose run is not open waits for
    its resume."""
    unwinding = seen.unwinding if seen is not None else set()
    entries = {c["task_id"]: e for c in store.needs_candidates()
               if c["task_id"] not in unwinding and (e := entry_of(store, c)) is not None}
    for run in going_on or []:
        status = seen.gone.get(run["task_id"]) if seen is not None else None
        if status is not None:
            entries[run["task_id"]] = _gone(store, run["task_id"], status, run["began_at"])
    listed = [*entries.values(), *(_blocked(b) for b in store.blocked_starts()),
              *(_refused(r) for r in store.refused_starts())]
    return sorted(listed, key=lambda e: (e.since, e.task_id))


def web_ui_url(base: str, namespace: str) -> str:
    """The Temporal Web UI's workflow list, filtered on the runs that wait for a person.

    The UI takes a list filter in its ``query`` URL parameter. The filter is on TidemarkNeeds,
    which each run keeps up to date and sets to ``nothing`` when it goes on or its task is
    settled (tidemark.needs; docs/who-needs-me.md)."""
    query = needs_query()
    return (f"{base.rstrip('/')}/namespaces/{urllib.parse.quote(namespace, safe='')}"
            f"/workflows?query={urllib.parse.quote(query, safe='')}")


def run_url(settings: Settings, workflow_id: str) -> str:
    """The Web UI's page of the run ``workflow_id`` (its latest run) in the configured namespace."""
    return workflow_url(base_url(settings), settings.temporal_namespace, workflow_id)


def text(entries: list[Entry], ui: str) -> str:
    if not entries:
        return "inbox empty: no task waits for a person"
    lines = [f"{len(entries)} task(s) wait for a person, oldest first:"]
    for e in entries:
        lines += ["", f"{e.task_id}  {e.why.replace('_', ' ')}  since "
                      f"{e.since.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC",
                  f"  {e.detail}"]
        lines += [f"  at stake  {s}" for s in e.at_stake]
        if e.fix:
            lines.append(f"  first     {e.fix}")
        lines.append(f"  decide    {e.command}")
    lines += ["", f"Web UI: {ui}"]
    return "\n".join(lines)


def add_inbox_command(sub: Any) -> None:
    """Adds `tidemark inbox` to the command's subparsers."""
    c = sub.add_parser("inbox", help="every task that waits for a person, oldest first")
    c.add_argument("--json", action="store_true",
                   help="a list of objects: task_id, why, need, since, detail, command, "
                        "at_stake, fix")
    c.add_argument("--ui", metavar="URL",
                   help="the Temporal Web UI the list link points at (default: TIDEMARK_UI_URL, "
                        f"else the one `tidemark dev` recorded for the stack, else {DEFAULT_UI})")
    c.add_argument("--namespace", help="Temporal namespace of the link (default: the "
                   "configured one)")
    c.set_defaults(func=run_inbox)


def run_inbox(a: argparse.Namespace) -> int:
    with open_store(database_url(a.settings)) as store:
        going_on = store.runs_going_on()
        seen = ask_temporal(a.settings, [r["task_id"] for r in going_on])
        entries = inbox(store, seen, going_on)
    if a.json:
        print(json.dumps([e.as_json() for e in entries], indent=2))
    else:
        ui = a.ui or base_url(a.settings)
        print(text(entries, web_ui_url(ui, a.settings.temporal_namespace)))
    return 0
