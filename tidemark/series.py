"""Series: runs that belong together (a nightly sync), in the order they were admitted.

A plan may name its ``series``. A run of a series is admitted, and gets its place in the order,
only while nothing stops the series (``tidemark stop --series S``, a kill, ``*``) and every run
admitted before it is *settled*: completed (every step has a done outcome, none compensated)
or unwound (every reversible step it did is compensated, nothing in doubt). Any other earlier
run — in doubt, partly unwound, needing a decision, halted, stopped, killed, failed or still
under way — leaves wreckage a later run must not act on top of, so the later run ends
``blocked`` having acted on nothing. A refused run gets no place: it may run later, after the
person settled what blocked it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from tidemark.errors import PlanError, SeriesBlocked
from tidemark.series_names import SCHEDULED_PREFIX
from tidemark.store import JournalStore
from tidemark.words import HALT_ACTOR, EventKind, TaskState

SCHEDULED_WORKFLOW_PREFIX = "tidemark-sched-"
SCHEDULE_PREFIX = "tidemark-series-"  # a series' Temporal Schedule (tools/schedules)
CLOCK_SKEW = timedelta(minutes=1)  # between the Temporal server's clock and a worker's

SETTLED = (TaskState.COMPLETED, TaskState.UNWOUND)


def check_declared(store: JournalStore, series: str | None) -> None:
    """Refuses a plan that names a series nobody declared.

    Refuses a plan that names a series nobody declared (PlanError, before anything is
    stored): a series belongs to the operator, not to whoever writes a plan."""
    if series is not None and store.declared_series(series) is None:
        raise PlanError("series", f"series {series!r} is not declared; `tidemark series "
                                  f"declare {series}` or `tidemark schedule create {series} …` "
                                  "declares it")


def check_admitted_by_hand(store: JournalStore, task_id: str, series: str | None) -> None:
    """Refuses a hand-started plan in a series that takes only its schedule's runs.

    Refuses a plan started by hand that names a series declared to take its schedule's runs
    only (``--admit scheduled``, the default of ``tidemark schedule create``): a run under its
    name would hold up every later run of it until settled. The scheduled task ids are its
    schedule's alone (check_scheduled_id), so they tell its own runs."""
    if series is None or task_id.startswith(f"{SCHEDULED_PREFIX}{series}-"):
        return
    declared = store.declared_series(series)
    if declared is not None and declared.get("admits") == "scheduled":
        raise PlanError("series", f"series {series!r} takes the runs its schedule starts, not "
                                  "plans started by hand; `temporal schedule trigger` runs it "
                                  "now, or an operator declares it with --admit any")


def check_scheduled_id(task_id: str, series: str | None, parent_workflow_id: str | None) -> None:
    """Refuses a task id of the scheduled namespace unless its series' ScheduledRun asks.

    Refuses a task id of the scheduled namespace unless the plan comes from its series'
    ScheduledRun (the run's parent workflow)."""
    if not task_id.startswith(SCHEDULED_PREFIX):
        return
    own = series is not None and task_id.startswith(f"{SCHEDULED_PREFIX}{series}-") and \
        (parent_workflow_id or "").startswith(f"{SCHEDULED_WORKFLOW_PREFIX}{series}-")
    if not own:
        raise PlanError("task_id", f"task ids {SCHEDULED_PREFIX}… are reserved for the runs a "
                                   "series' schedule starts; choose another task id")


def check_started_by_schedule(series: str, scheduled_by: str | None, scheduled: datetime,
                              now: datetime) -> None:
    """Refuses a ScheduledRun that its series' Temporal Schedule did not start.

    Refuses a ScheduledRun that its series' Temporal Schedule did not start (one started by
    hand, whose planner and time are whatever its starter wrote), and one whose scheduled time
    lies ahead: a schedule fires at or after its time, so a run claiming tomorrow's time (the
    search attributes can be written by whoever starts a workflow) would take tomorrow's task
    id. Either may not take a scheduled task id."""
    if scheduled_by != SCHEDULE_PREFIX + series:
        raise PlanError("series", f"this run of series {series!r} was not started by its "
                                  f"schedule {SCHEDULE_PREFIX}{series}; `temporal schedule "
                                  "trigger` runs it now")
    if scheduled > now + CLOCK_SKEW:
        raise PlanError("series", f"this run of series {series!r} claims the scheduled time "
                                  f"{scheduled.isoformat()}, which is still ahead; a schedule "
                                  "never fires early")


def run_state(row: dict[str, Any]) -> str:
    """What a ``JournalStore.series_runs`` row says about the run."""
    stop = row.get("stop")
    if row["undone"]:
        # A compensation ran: only a whole unwind settles the run, also one whose forward
        # steps had all completed (a rename still in place is wreckage a later run meets).
        if not row["to_undo"] and not row["open"]:
            return TaskState.UNWOUND
    elif row["confirmed"] == row["step_count"] and not row["open"]:
        return TaskState.COMPLETED
    if stop is not None and not str(stop.get("scope", "")).startswith("series:"):
        if stop.get("set_by") == HALT_ACTOR and stop.get("scope") == row["task_id"] and \
                stop.get("state") == TaskState.STOPPED:
            return TaskState.HALTED  # the run's own stop from its halt signal, as status says
        return str(stop.get("state"))
    if row["open"]:
        return TaskState.IN_DOUBT
    if row["undone"]:
        return TaskState.PARTLY_UNWOUND
    if row["failed"]:
        return TaskState.FAILED
    return TaskState.PARTIAL


def said(store: JournalStore, row: dict[str, Any]) -> str:
    """run_state in the word `tidemark status` says it in.

    A run that reads as going on by its rows, but whose end is journaled with nothing running it
    since, is ``ended`` (or the state its gate or failure ended it in), as tidemark.report names
    it."""
    state = run_state(row)
    if state not in (TaskState.PARTIAL, TaskState.NOT_STARTED):
        return state
    ended = store.run_ended(row["task_id"])
    if ended is None:
        return state
    word = ended["detail"].get("ended")
    return word if word in (TaskState.PRECONDITION_FAILED, TaskState.FAILED) else TaskState.ENDED


def _states(store: JournalStore, blockers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"task_id": b["task_id"], "state": said(store, b)} for b in blockers]


def unsettled(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if run_state(r) not in SETTLED]


def admit(store: JournalStore, task_id: str, series: str) -> None:
    """Admits the run to its series or raises SeriesBlocked (logged as a ``blocked`` event)."""
    stop, blockers = store.admit_to_series(task_id, series, unsettled)
    if stop is not None or blockers:
        raise SeriesBlocked(task_id, series, stop, _states(store, blockers))


def check(store: JournalStore, series: str, task_id: str) -> None:
    """Raises SeriesBlocked unless a new run of the series could start now.

    Raises SeriesBlocked (logged as a ``blocked`` event of ``task_id``) unless a new run of
    the series could start now; nothing is admitted (RunPlan's prepare admits)."""
    rows = store.series_runs(series)
    stop = store.stop_state("series:" + series)  # the scope itself, as stop_of reads it
    blockers = unsettled(rows)
    if stop is not None or blockers:
        store.record_event(task_id, EventKind.BLOCKED, {
            "series": series, "stop": stop and {k: str(v) for k, v in stop.items()},
            "blockers": [b["task_id"] for b in blockers]})
        raise SeriesBlocked(task_id, series, stop, _states(store, blockers))


def listing(store: JournalStore, series: str) -> dict[str, Any]:
    """The runs of a series in order with their states, and its refused starts."""
    runs = [{"task_id": r["task_id"], "position": r["position"], "state": said(store, r),
             "confirmed": r["confirmed"], "steps": r["step_count"],
             "admitted_at": r["admitted_at"].isoformat()} for r in store.series_runs(series)]
    stop = store.stop_state("series:" + series)
    return {"series": series, "runs": runs,
            "stopped": stop and {k: str(v) for k, v in stop.items()},
            "blocked": [{"task_id": b["task_id"], "at": b["at"].isoformat(),
                         "blockers": b["detail"].get("blockers")}
                        for b in store.blocked_runs(series)]}
