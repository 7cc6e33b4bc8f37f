"""``tidemark kill``: stop a task (a series, everything) out of band, in layers, each reported.

1. the durable stop state ``killed`` on the task, ``series:<S>`` or ``*``: every later step and
   every start refuses until a person runs ``tidemark release`` (recorded with who and why);
2. every Temporal Schedule of the series is paused, so nothing restarts it;
3. the task's credential grants are revoked, in the table and at the provider, so the next
   outbound call fails with Unauthorized, even from a wedged worker whose workflow is gone;
4. the workflow is terminated (and, for a series or everything, its scheduled runs).

A layer that fails is reported and the next layers still run.
"""

from __future__ import annotations

from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from tidemark.errors import TidemarkError
from tidemark.grants import revoke_task_grants
from tidemark.store import JournalStore
from workflows import schedules


class KillError(TidemarkError):
    """A kill asked for in a way that cannot be done."""


async def kill(client: Client, store: JournalStore, *, task: str | None = None,
               series: str | None = None, everything: bool = False, reason: str,
               by: str) -> list[dict[str, Any]]:
    """Runs the four layers and returns one report per layer: ``{layer, what, done,
    detail}``."""
    if sum(x is not None for x in (task, series, everything or None)) != 1:
        raise KillError("kill exactly one of: a task, --series S, --all")
    reason = reason or "killed"
    if task is not None:
        scope, tasks = task, [task]
        named = store.series_of(task)
        series_list = [named] if named else []
    elif series is not None:
        scope = "series:" + series
        tasks = [r["task_id"] for r in store.series_runs(series)]
        series_list = [series]
    else:
        scope, tasks = "*", []
        series_list = [s["series"] for s in await schedules.list_all(client)]
    layers: list[dict[str, Any]] = []

    async def layer(n: int, what: str, fn: Any) -> None:
        try:
            detail = await fn()
            layers.append({"layer": n, "what": what, "done": True, "detail": detail})
        except Exception as e:  # report it; the next layers still run
            layers.append({"layer": n, "what": what, "done": False,
                           "detail": f"{type(e).__name__}: {e}"})

    async def stop_state() -> Any:
        store.set_killed(scope, reason, by)
        return {"scope": scope, "state": "killed", "by": by, "reason": reason}

    async def pause() -> Any:
        note = f"killed by {by}: {reason}"
        return {s: ("paused" if await schedules.pause(client, s, note) else "no schedule")
                for s in series_list}

    async def grants() -> Any:
        revoked: list[dict[str, Any]] = []
        for t in (tasks if not everything else [None]):
            revoked += revoke_task_grants(store, t, by)
        return [{"task_id": g["task_id"], "target": g["target"], "scope": g["scope"],
                 "revoked": str(g["revoked"]), "revoked_by": g["revoked_by"],
                 "at_provider": g["at_provider"]} for g in revoked]

    async def terminate() -> Any:
        ids = [f"tidemark-{t}" for t in tasks]
        query = 'ExecutionStatus="Running"'
        async for wf in client.list_workflows(query):
            scheduled = any(wf.id.startswith(f"tidemark-sched-{s}-") for s in series_list)
            if scheduled or (everything and wf.id.startswith("tidemark-")):
                ids.append(wf.id)
        out: dict[str, str] = {}
        for wid in dict.fromkeys(ids):
            out[wid] = await _terminate(client, wid, f"killed by {by}: {reason}")
        return out

    await layer(1, "durable stop state killed", stop_state)
    await layer(2, "pause the schedules of the series", pause)
    await layer(3, "revoke credential grants", grants)
    await layer(4, "terminate the workflow", terminate)
    return layers


async def _terminate(client: Client, workflow_id: str, reason: str) -> str:
    h = client.get_workflow_handle(workflow_id)
    try:
        desc = await h.describe()
        if desc.status != WorkflowExecutionStatus.RUNNING:
            return f"not running ({desc.status.name.lower() if desc.status else '?'})"
        await h.terminate(reason=reason)
    except RPCError as e:
        if e.status != RPCStatusCode.NOT_FOUND:
            raise
        try:  # it ended between the two calls, or never existed
            desc = await h.describe()
        except RPCError:
            return "no such workflow"
        return f"not running ({desc.status.name.lower() if desc.status else '?'}): {e.message}"
    return "terminated"
