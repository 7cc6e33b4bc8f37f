"""`tidemark inbox`: every task that waits for a person, one entry per task, oldest first.

Read from the journal (tidemark/waiting.py says what a task waits for, the same reading as
`tidemark status` and the Web UI's worklist rows). Temporal is asked one thing the journal
cannot tell: which tasks have an unwind under way (a person's `tidemark unwind T --yes` sets a
plain stop first; while it runs, the task is being settled, not waiting).

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
from datetime import UTC
from typing import TYPE_CHECKING, Any

from tidemark.database import database_url
from tidemark.errors import TidemarkError
from tidemark.needs import worklist_query
from tidemark.settings import Settings
from tidemark.waiting import Entry, entry_of
from tools.commands import open_store

# The store (psycopg) is loaded by the commands that read the journal, when they read it:
# `tidemark --help` registers this command without it.
if TYPE_CHECKING:
    from tidemark.store import JournalStore

DEFAULT_UI = "http://localhost:8233"
# The unwinds under way (tools.starter.unwind_task names them tidemark-unwind-<task>).
UNWINDS_OPEN = 'WorkflowType = "UnwindPlan" AND ExecutionStatus = "Running"'
UNWIND_PREFIX = "tidemark-unwind-"
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
                 f"stored: {why}", f"tidemark status --series {series}")


async def _open_unwinds(settings: Settings) -> set[str]:
    from tools.starter import connect  # the Temporal client: loaded by this command only

    client = await connect(settings)
    return {w.id.removeprefix(UNWIND_PREFIX) async for w in client.list_workflows(UNWINDS_OPEN)
            if w.id.startswith(UNWIND_PREFIX)}


def open_unwinds(settings: Settings) -> set[str] | None:
    """The tasks whose unwind is under way, or None (with one line on stderr) when Temporal
    does not answer in time: the inbox then answers from the journal alone."""
    import asyncio  # with the Temporal client: `--help` registers this command without it

    try:
        return asyncio.run(asyncio.wait_for(_open_unwinds(settings), TEMPORAL_WAIT_S))
    except (TidemarkError, TimeoutError, RuntimeError) as e:
        print(f"tidemark: could not ask Temporal which unwinds are under way ({type(e).__name__}: "
              f"{e}); a task being unwound is listed as stopped".replace("\n", " "),
              file=sys.stderr)
        return None


def inbox(store: JournalStore, unwinding: set[str] | None = None) -> list[Entry]:
    """Every task that waits for a person, oldest first; ``unwinding`` (tasks whose unwind is
    under way) are being settled and left out."""
    entries = [e for c in store.inbox_candidates() if c["task_id"] not in (unwinding or set())
               and (e := entry_of(store, c)) is not None]
    entries += [_blocked(b) for b in store.blocked_starts()]
    return sorted(entries, key=lambda e: (e.since, e.task_id))


def web_ui_url(base: str, namespace: str) -> str:
    """The Temporal Web UI's workflow list filtered on the runs that wait for a person (the UI
    takes a list filter in its ``query`` URL parameter): TidemarkNeeds, which each run keeps
    up to date and sets to ``nothing`` when it goes on or its task is settled (tidemark.needs;
    docs/who-needs-me.md)."""
    query = worklist_query()
    return (f"{base.rstrip('/')}/namespaces/{urllib.parse.quote(namespace, safe='')}"
            f"/workflows?query={urllib.parse.quote(query, safe='')}")


def text(entries: list[Entry], ui: str) -> str:
    if not entries:
        return "inbox empty: no task waits for a person"
    lines = [f"{len(entries)} task(s) wait for a person, oldest first:"]
    for e in entries:
        lines += ["", f"{e.task_id}  {e.why.replace('_', ' ')}  since "
                      f"{e.since.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC",
                  f"  {e.detail}"]
        lines += [f"  at stake  {s}" for s in e.at_stake]
        lines.append(f"  decide    {e.command}")
    lines += ["", f"Web UI: {ui}"]
    return "\n".join(lines)


def add_inbox_command(sub: Any) -> None:
    """Adds `tidemark inbox` to the command's subparsers."""
    c = sub.add_parser("inbox", help="every task that waits for a person, oldest first")
    c.add_argument("--json", action="store_true",
                   help="a list of objects: task_id, why, since, detail, command, at_stake")
    c.add_argument("--ui", default=DEFAULT_UI, metavar="URL",
                   help=f"the Temporal Web UI the list link points at (default {DEFAULT_UI})")
    c.add_argument("--namespace", help="Temporal namespace of the link (default: the "
                   "configured one)")
    c.set_defaults(func=run_inbox)


def run_inbox(a: argparse.Namespace) -> int:
    unwinding = open_unwinds(a.settings)
    with open_store(database_url(a.settings)) as store:
        entries = inbox(store, unwinding)
    if a.json:
        print(json.dumps([e.as_json() for e in entries], indent=2))
    else:
        print(text(entries, web_ui_url(a.ui, a.settings.temporal_namespace)))
    return 0
