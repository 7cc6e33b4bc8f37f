"""The Temporal Schedules of series, one per series.

Its id is ``tidemark-series-<S>``, and its action starts ``ScheduledRun`` for the series
(workflows/scheduled_run.py). They show on the Web UI's Schedules page; ``tidemark schedule
create|list|pause|unpause|delete`` drives them, and ``tidemark kill`` pauses them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleCalendarSpec,
    ScheduleHandle,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleRange,
    ScheduleSpec,
    ScheduleState,
)
from temporalio.service import RPCError, RPCStatusCode

from tidemark.errors import TidemarkError
from tidemark.needs import series_metadata
from tidemark.payloads import TASK_QUEUE
from tidemark.plan import TASK_ID_RE

PREFIX = "tidemark-series-"
# The memo key that keeps a schedule's cron expression as it was given: Temporal compiles a
# cron expression into a calendar and describes the schedule by that calendar only.
MEMO_CRON = "cron"


class ScheduleError(TidemarkError):
    """A schedule command that cannot be done as asked."""


def schedule_id(series: str) -> str:
    if not TASK_ID_RE.fullmatch(series):
        raise ScheduleError(f"series {series!r}: must be 1-128 characters of letters, digits "
                            "and . _ : -, starting with a letter or digit")
    return PREFIX + series


async def create(client: Client, series: str, cron: str, planner: str, args: dict[str, Any],
                 task_queue: str = TASK_QUEUE, *, by: str = "") -> str:
    """Creates the series' schedule.

    Each firing starts ScheduledRun ``tidemark-sched-<S>`` (Temporal appends the time).
    Overlapping firings are skipped: runs of a series never overlap, and a run that is still
    going blocks the next anyway."""
    module, sep, function = planner.partition(":")
    if not (module and sep and function):
        raise ScheduleError(f"--planner must be MODULE:FUNCTION, got {planner!r}")
    sid = schedule_id(series)
    summary, details = series_metadata(series)
    action = ScheduleActionStartWorkflow(
        "ScheduledRun", {"series": series, "planner": planner, "args": args},
        id=f"tidemark-sched-{series}", task_queue=task_queue,
        static_summary=summary, static_details=details)
    try:
        await client.create_schedule(sid, Schedule(
            action=action, spec=ScheduleSpec(cron_expressions=[cron]),
            policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
            state=ScheduleState(note=f"created by {by}" if by else "")),
            memo={MEMO_CRON: cron})
    except ScheduleAlreadyRunningError:  # the SDK's word for ALREADY_EXISTS on create
        raise ScheduleError(f"series {series} already has a schedule ({sid}); nothing was "
                            f"changed (`tidemark schedule delete {series}` first to replace "
                            "it)") from None
    except RPCError as e:
        if e.status == RPCStatusCode.ALREADY_EXISTS:
            raise ScheduleError(f"series {series} already has a schedule ({sid})") from None
        if e.status == RPCStatusCode.INVALID_ARGUMENT:
            raise ScheduleError(f"schedule {sid}: {e.message}") from None
        raise
    return sid


def handle(client: Client, series: str) -> ScheduleHandle:
    return client.get_schedule_handle(schedule_id(series))


async def describe(client: Client, series: str) -> dict[str, Any] | None:
    """The schedule of a series as a dict, or None without a schedule.

    The keys are ``{series, id, paused, note, planner, args, next}`` and what the schedule fires
    on (``cron``, ``calendars``, ``intervals``: those it has)."""
    try:
        d = await handle(client, series).describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    action = d.schedule.action
    arg = action.args[0] if isinstance(action, ScheduleActionStartWorkflow) and action.args \
        else {}
    if not isinstance(arg, dict):  # a raw payload: decode it as the worker would
        arg = json.loads(getattr(arg, "data", b"{}") or b"{}")
    return {"series": series, "id": d.id, "paused": d.schedule.state.paused,
            "note": d.schedule.state.note, "planner": arg.get("planner"),
            "args": arg.get("args"), **fires_on(d.schedule.spec, (await d.memo()).get(MEMO_CRON)),
            "next": [t.isoformat() for t in d.info.next_action_times[:3]]}


def fires_on(spec: ScheduleSpec, given_cron: Any = None) -> dict[str, Any]:
    """What a schedule fires on, in the form it was given.

    That is the cron expression kept in its memo (``tidemark schedule create``). For a schedule
    made elsewhere (the Web UI, `temporal schedule create`): its cron expressions, calendars (as
    cron fields) and intervals (in seconds), each only when it has some."""
    if isinstance(given_cron, str) and given_cron:
        return {"cron": [given_cron]}
    out: dict[str, Any] = {}
    if spec.cron_expressions:
        out["cron"] = list(spec.cron_expressions)
    if spec.calendars:
        out["calendars"] = [{"calendar": calendar_text(c),
                             **({"comment": c.comment} if c.comment else {})}
                            for c in spec.calendars]
    if spec.intervals:
        out["intervals"] = [{"every_s": int(i.every.total_seconds()),
                             "offset_s": int(i.offset.total_seconds()) if i.offset else 0}
                            for i in spec.intervals]
    return out


# A calendar's fields in cron order, each with the bounds that make it "*".
_CALENDAR_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day_of_month", 1, 31),
                    ("month", 1, 12), ("day_of_week", 0, 6))


def calendar_text(c: ScheduleCalendarSpec) -> str:
    """A calendar as cron fields (``30 4 * * *``).

    The fields are led by its seconds unless they are 0, and followed by its years when it names
    some."""
    fields = [_ranges_text(getattr(c, name), lo, hi) for name, lo, hi in _CALENDAR_FIELDS]
    second = _ranges_text(c.second, 0, 59)
    text = " ".join(fields if second == "0" else [second, *fields])
    return text + (f" year {_ranges_text(c.year, None, None)}" if c.year else "")


def _ranges_text(ranges: Sequence[ScheduleRange], lo: int | None, hi: int | None) -> str:
    parts = []
    for r in ranges or ():
        end = max(r.end, r.start)  # an end before the start means the start alone
        text = ("*" if (r.start, end) == (lo, hi) else
                str(r.start) if end == r.start else f"{r.start}-{end}")
        parts.append(text + (f"/{r.step}" if r.step > 1 else ""))
    return ",".join(parts) or "*"


async def list_all(client: Client) -> list[dict[str, Any]]:
    out = []
    async for entry in await client.list_schedules():
        if entry.id.startswith(PREFIX):
            found = await describe(client, entry.id[len(PREFIX):])
            if found is not None:
                out.append(found)
    return sorted(out, key=lambda s: s["series"])


async def pause(client: Client, series: str, note: str) -> bool:
    """Pauses the series' schedule; False when the series has none."""
    try:
        await handle(client, series).pause(note=note or "paused")
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return False
        raise
    return True


async def unpause(client: Client, series: str, note: str) -> None:
    await _must(client, series, "unpause", note or "unpaused")


async def delete(client: Client, series: str) -> None:
    await _must(client, series, "delete", None)


async def trigger(client: Client, series: str) -> None:
    await _must(client, series, "trigger", None)


async def _must(client: Client, series: str, what: str, note: str | None) -> None:
    h = handle(client, series)
    try:
        if what == "unpause":
            await h.unpause(note=note)
        elif what == "delete":
            await h.delete()
        else:
            await h.trigger()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise ScheduleError(f"series {series} has no schedule") from None
        raise
