"""`tidemark inbox`: every task that waits for a person, one entry per task, oldest first.

Read from the journal: a task is the journal's, and a task's newest run writes there what it
waits for (an approval asked, a stop or kill, a row in doubt, a refused step, a compensation, a
failed verification gate, a refused start of a series). Which of those facts means the task
waits, and why, is the reading `tidemark status` prints (tidemark.report.Report); an attempt
still under its lease is a run acting now, and a task whose every step is done or that was
unwound is settled: neither appears. Temporal is asked one thing the journal cannot tell: which
tasks have an unwind under way (a person's `tidemark unwind T --yes` sets a plain stop first;
while it runs, the task is being settled, not waiting).

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
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from tidemark.boundary import what_it_will_do
from tidemark.database import database_url
from tidemark.errors import TidemarkError
from tidemark.needs import sentence, worklist_query
from tidemark.settings import Settings
from tidemark.words import ControlState, Decision, TaskState
from tools.commands import open_store

# The report and the store (psycopg) are loaded by the commands that read the journal, when
# they read it: `tidemark --help` registers this command without them.
if TYPE_CHECKING:
    from tidemark.report import Report
    from tidemark.store import JournalStore

DEFAULT_UI = "http://localhost:8233"
# The unwinds under way (tools.starter.unwind_task names them tidemark-unwind-<task>).
UNWINDS_OPEN = 'WorkflowType = "UnwindPlan" AND ExecutionStatus = "Running"'
UNWIND_PREFIX = "tidemark-unwind-"
# How long the inbox waits for Temporal before it answers from the journal alone.
TEMPORAL_WAIT_S = 5.0


@dataclass(frozen=True)
class Entry:
    """One task that waits for a person (the ``--json`` object, keys as named here)."""

    task_id: str
    why: str  # in_doubt, awaiting_approval, verification_failed, halted, stopped, killed,
    #           failed, blocked, partly_unwound, unwind_unfinished
    since: datetime
    detail: str  # one line: what happened, in the journal's words
    command: str  # the one command that decides it
    at_stake: list[str] = field(default_factory=list)  # the irreversible steps not yet done

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "since": self.since.astimezone(UTC).isoformat()}


def _when(value: Any) -> datetime:
    """A timestamp from the journal: a datetime, or the ISO text a jsonb column holds."""
    return value if isinstance(value, datetime) else datetime.fromisoformat(str(value))


def _release(task_id: str, scope: str | None) -> str:
    """The release of the stop that holds the task: its own, its series' or everything's."""
    if scope == "*":
        return "tidemark release --all"
    if scope and scope.startswith("series:"):
        return f"tidemark release --series {scope.removeprefix('series:')}"
    return f"tidemark release {task_id}"


def halt_by() -> str:
    """Who stopped a task when the run took the halt signal (the stop's set_by): a halt is told
    apart from a person's `tidemark stop` by it. The payloads (seventeen dataclasses, some
    10 ms of a command's start) are loaded only when a stop is read."""
    from tidemark.payloads import HaltInput

    return HaltInput(task_id="", reason="").by


def _report(store: JournalStore, task_id: str) -> Report:
    from tidemark.report import build_report  # see TYPE_CHECKING above

    return build_report(store, task_id)


def _stake(store: JournalStore, task_id: str) -> list[str]:
    return [what_it_will_do(s["step"], s["action"], s["args"])
            for s in store.irreversible_pending(task_id)]


def _stopped(t: str, report: Report, stop: dict[str, Any], stake: list[str]) -> Entry:
    since, scope = _when(stop["set_at"]), stop.get("scope")
    said = f"by {stop['set_by']}: {stop['reason']}"
    if stop.get("state") == ControlState.KILLED:
        return Entry(t, "killed", since, said, _release(t, scope), stake)
    if scope not in (None, t):
        return Entry(t, "stopped", since, f"{said} (scope {scope})", _release(t, scope), stake)
    if stop["set_by"] == halt_by():
        return Entry(t, "halted", since, f"halted: {stop['reason']}", f"tidemark resume {t}",
                     stake)
    if (report.approval or {}).get("decision") == Decision.REJECT:
        return Entry(t, "stopped", since, said, f"tidemark unwind {t} --yes", stake)
    return Entry(t, "stopped", since, said, f"tidemark resume {t}", stake)


def _unwind_unfinished(t: str, event: dict[str, Any], stake: list[str]) -> Entry:
    """A stopped task whose unwind ended before it was unwound (an unwind_unfinished event
    since the stop): it waits for its unwind, also when every step is done."""
    d = event["detail"]
    err = d.get("error") or {}
    why = err.get("type") or d.get("state")
    refused = f", step(s) {', '.join(map(str, d['refused']))} refused" if d.get("refused") \
        else ""
    return Entry(t, "unwind_unfinished", _when(event["at"]),
                 f"its unwind {event['actor']} ended {d.get('state')} ({why}) with "
                 f"{len(d.get('undone') or [])} step(s) put back{refused}",
                 f"tidemark unwind {t} --yes", stake)


def _entry(store: JournalStore, candidate: dict[str, Any],
           report: Report | None = None) -> Entry | None:
    """The task's entry, or None when it does not wait for a person. ``report``: the task's
    interruption report when the caller has read it already."""
    t = candidate["task_id"]
    report = report or _report(store, t)
    p, state = report.progress, report.state
    unfinished = store.unwind_unfinished(t) if p.stop else None
    if state == TaskState.UNWOUND or (p.finished and not p.undo_rows and unfinished is None):
        return None  # settled: a stop or kill of a completed task holds nothing back
    last = _when(candidate["last_at"] or candidate["created_at"])
    stake = _stake(store, t)
    if p.stop and p.stop.get("state") == ControlState.KILLED:
        return _stopped(t, report, p.stop, stake)  # nothing else acts until it is released
    if state == TaskState.PARTLY_UNWOUND:
        return Entry(t, "partly_unwound", last, f"{p.undo_rows} compensation row(s) journaled, "
                     "the task is not unwound", f"tidemark unwind {t} --yes", stake)
    d = p.in_doubt
    if d is not None and d.phase == "do":
        return Entry(t, "in_doubt", d.started_at,
                     f"step {d.step} {d.action}: intent journaled, no outcome; only its probe "
                     "or a person can say whether it happened",
                     f"tidemark resolve {t} --step {d.step} --as done|absent|never --yes", stake)
    if unfinished is not None:
        return _unwind_unfinished(t, unfinished, stake)
    if p.stop:
        return _stopped(t, report, p.stop, stake)
    if state in (TaskState.NOT_STARTED, TaskState.PARTIAL):
        return None  # nothing a person must decide: a run goes on by itself
    if state == TaskState.FAILED:
        return Entry(t, "failed", last, f"{p.failed} step(s) refused by the target",
                     f"tidemark resume {t}", stake)
    if state == TaskState.VERIFICATION_FAILED:
        v = report.boundary["verification"]
        named = "; ".join(f"step {f['step']} {f['action']}: {f['reason']}"
                          for f in v["failures"])
        return Entry(t, "verification_failed", _when(v["at"]),
                     f"before step {v['boundary']}, no longer holds: {named}",
                     f"tidemark resume {t}", stake)
    if state == TaskState.AWAITING_APPROVAL:
        asked = store.approval_request(t) or {}
        who = ", ".join(asked.get("approvers") or []) or "nobody configured"
        return Entry(t, "awaiting_approval", _when(asked.get("asked_at") or last),
                     f"may decide: {who}", f"tidemark approve {t}",
                     list(asked.get("lines") or stake))
    return None


# The state whose sentence (tidemark.needs.sentence) says an entry's why.
STATE_OF_WHY = {"in_doubt": TaskState.NEEDS_DECISION, "partly_unwound": TaskState.PARTLY_UNWOUND,
                "unwind_unfinished": TaskState.PARTLY_UNWOUND}


def entry_for(store: JournalStore, task_id: str,
              report: Report | None = None) -> Entry | None:
    """The inbox entry of one task, or None when it does not wait for a person."""
    found = [c for c in store.inbox_candidates() if c["task_id"] == task_id]
    return _entry(store, found[0], report) if found else None


def first_line(store: JournalStore, report: Report) -> str:
    """The sentence `tidemark status T` opens with, in the words a run's failure opens with in
    the Web UI (tidemark.needs.sentence): what holds the task ``report`` is of, and the one
    command next."""
    task_id = report.progress.task_id
    e = entry_for(store, task_id, report)
    if e is None:
        return f"Task {task_id} needs nothing from a person ({report.state})."
    if e.why == "awaiting_approval":
        return (f"Task {task_id} waits for approval of its irreversible steps ({e.detail}); "
                f"approve with `{e.command}` or reject with `tidemark reject {task_id}`.")
    doubt = report.progress.in_doubt
    said = sentence(task_id, STATE_OF_WHY.get(e.why, e.why),
                    {"message": e.detail, "step": doubt.step if doubt else None})
    return said if f"`{e.command}" in said else f"{said} Next: `{e.command}`."


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
               and (e := _entry(store, c)) is not None]
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
