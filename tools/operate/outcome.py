"""The one JSON shape of every command that changes state (``--json``).

::

    {"command": "stop", "task": "T",
     "committed": {...},          # what this command wrote: the stop, the decision, the start
     "run": null | {...},         # the run it started or woke and waited for: its final status
     "next": {"state": ..., "need": ..., "command": ... | null, "line": ...}}

``task`` is the task id, or the scope (``series:S``, ``*``) a stop, release or kill named.
``next`` is what holds the task now and the one command that decides it, from tidemark.needs:
read from the journal (tidemark.needs_journal), or from the run's end when the command waited
for one. docs/reference.md describes it.
"""

from __future__ import annotations

from typing import Any

from tidemark.errors import UnknownTask
from tidemark.needs import Act, Need, command, need_of, next_command, sentence

KEYS = ("command", "task", "committed", "run", "next")


def envelope(verb: str, task: str, committed: dict[str, Any], next_: dict[str, Any],
             run: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``--json`` object of a command that changed state."""
    return {"command": verb, "task": task, "committed": committed, "run": run, "next": next_}


def _next(state: str, need: Need, act: str | None, line: str) -> dict[str, Any]:
    return {"state": state, "need": str(need), "command": act, "line": line}


def next_of_run(task_id: str, state: str, error: dict[str, Any] | None,
                confirmed: str = "") -> dict[str, Any]:
    """What comes next after a run of the task ended in ``state`` with ``error``."""
    need = need_of(state, error)
    act = None if need == Need.NOTHING else next_command(need, task_id)
    return _next(state, need, act, sentence(task_id, state, error, confirmed))


def next_of_open_run(task_id: str) -> dict[str, Any]:
    """What comes next while a run of the task goes on: nothing, unless it asks."""
    return _next("running", Need.NOTHING, command(Act.STATUS, task_id),
                 f"Task {task_id} runs; `{command(Act.STATUS, task_id)}` follows its steps.")


def next_of_scope(scope: str, stopped: str | None) -> dict[str, Any]:
    """What comes next for a series or every task (``*``), stopped (or killed) or not."""
    if stopped is None:
        return _next("released", Need.NOTHING, None,
                     f"{scope} is not stopped; its tasks run when started or resumed.")
    release = command(Act.RELEASE, scope=scope)
    return _next(stopped, Need(stopped), release,
                 f"{scope} is {stopped}; nothing of it acts until `{release}`.")


def next_of_task(url: str, task_id: str) -> dict[str, Any]:
    """What the journal says holds the task now, and the one command that decides it."""
    from tidemark.needs_journal import entry_for, first_line
    from tidemark.report import build_report
    from tools.operate.commands import journal_store

    try:
        with journal_store(url) as store:
            report = build_report(store, task_id)
            entry = entry_for(store, task_id, report)
            line = first_line(store, report)
    except UnknownTask:  # an id stopped or released ahead of its plan (--force-unknown)
        return _next("unknown", Need.NOTHING, None,
                     f"no plan of {task_id} is stored; nothing runs it until one is started")
    if entry is None:
        return _next(str(report.state), Need.NOTHING, None, line)
    return _next(str(report.state), entry.need, entry.command, line)


def next_of(url: str, scope: str, stopped: str | None = None) -> dict[str, Any]:
    """``next`` of a task id or of a scope (``series:S``, ``*``)."""
    if scope == "*" or scope.startswith("series:"):
        return next_of_scope(scope, stopped)
    return next_of_task(url, scope)
