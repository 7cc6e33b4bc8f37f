"""The Temporal Schedules of series: one per series, id ``tidemark-series-<S>``, whose action
starts ``ScheduledRun`` for the series (workflows/scheduled_run.py). They show on the Web UI's
Schedules page; ``tidemark schedule create|list|pause|unpause|delete`` drives them, and
``tidemark kill`` pauses them."""

from __future__ import annotations

import json
from typing import Any

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleHandle,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleState,
)
from temporalio.service import RPCError, RPCStatusCode

from tidemark.errors import TidemarkError
from tidemark.payloads import TASK_QUEUE
from tidemark.plan import TASK_ID_RE

PREFIX = "tidemark-series-"


class ScheduleError(TidemarkError):
    """A schedule command that cannot be done as asked."""


def schedule_id(series: str) -> str:
    if not TASK_ID_RE.fullmatch(series):
        raise ScheduleError(f"series {series!r}: must be 1-128 characters of letters, digits "
                            "and . _ : -, starting with a letter or digit")
    return PREFIX + series


async def create(client: Client, series: str, cron: str, planner: str, args: dict[str, Any],
                 task_queue: str = TASK_QUEUE, *, by: str = "") -> str:
    """Creates the series' schedule; each firing starts ScheduledRun ``tidemark-sched-<S>``
    (Temporal appends the time). Overlapping firings are skipped: runs of a series never
    overlap, and a run that is still going blocks the next anyway."""
    module, sep, function = planner.partition(":")
    if not (module and sep and function):
        raise ScheduleError(f"--planner must be MODULE:FUNCTION, got {planner!r}")
    sid = schedule_id(series)
    action = ScheduleActionStartWorkflow(
        "ScheduledRun", {"series": series, "planner": planner, "args": args},
        id=f"tidemark-sched-{series}", task_queue=task_queue)
    try:
        await client.create_schedule(sid, Schedule(
            action=action, spec=ScheduleSpec(cron_expressions=[cron]),
            policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
            state=ScheduleState(note=f"created by {by}" if by else "")))
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
    """``{series, id, paused, note, planner, args, cron, next}``, or None without a schedule."""
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
            "args": arg.get("args"), "cron": list(d.schedule.spec.cron_expressions),
            "next": [t.isoformat() for t in d.info.next_action_times[:3]]}


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
