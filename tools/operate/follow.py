"""Follows a task's run from what Temporal holds, one line per change.

It prints one line per step or batch confirmed and one per state change, and when the run waits
for a person, who may decide and the command to run (tidemark.needs). It reads the run's
``TidemarkState`` search attribute and ``describe()``, which the server answers alone, and the
workflow's ``status`` query, which a worker answers: no worker-side logging is needed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio.client import (
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowQueryRejectedError,
)
from temporalio.service import RPCError

from tidemark.needs import NEXT, Act, Need, command, need_of, sentence
from tidemark.payloads import RunResult
from workflows.outcome import run_result

# Often enough that a person sees a run wait for them within a second or two; each poll is one
# describe and, while the run is open, one query: a modest load on the frontend.
POLL_S = 0.5
# A query waits for a worker to answer it; with none polling, the line of the state alone is
# said, and the next poll asks again.
QUERY_WAIT = timedelta(seconds=2)


@dataclass
class _Seen:
    """What was said last: the state, the need and how many steps were confirmed."""

    state: str | None = None
    need: str | None = None
    confirmed: int = 0


def asks(task_id: str, need: Need, who: str = "") -> str:
    """What a run that waits for ``need`` asks of a person: who decides, and the command."""
    acts = NEXT[need]
    first = f"`{command(acts[0], task_id)}`"
    others = " or ".join(f"`{command(a, task_id)}`" for a in acts[1:] if a != Act.STATUS)
    by = f" by {who}" if who else ""
    return (f"waits for {need}{by}: {first}" + (f" (or {others})" if others else ""))


def ended_line(result: RunResult) -> str:
    """The last line of a followed run: how it ended, in the sentence of tidemark.needs."""
    said = sentence(result.task_id, result.state, result.error,
                    f"{result.confirmed}/{result.steps} steps confirmed")
    return f"tidemark-{result.task_id}: ended {result.state}: {said}"


async def _status(handle: WorkflowHandle[Any, Any]) -> dict[str, Any]:
    """The workflow's ``status`` query, or {} while no worker answers it."""
    try:
        return dict(await handle.query("status", rpc_timeout=QUERY_WAIT))
    except (RPCError, TimeoutError, WorkflowQueryFailedError, WorkflowQueryRejectedError):
        return {}  # no worker yet, or the run ended between the describe and the query


async def follow(handle: WorkflowHandle[Any, Any], task_id: str, say: Callable[[str], None],
                 poll_s: float = POLL_S, confirmed_before: int = 0) -> RunResult:
    """Says how the run of ``handle`` goes until it ends; returns its RunResult.

    ``confirmed_before``: the steps confirmed before this run (a resumed task's), not said
    again."""
    seen = _Seen(confirmed=confirmed_before)
    wid = handle.id
    while True:
        desc = await handle.describe()
        if desc.status != WorkflowExecutionStatus.RUNNING:
            result = await run_result(handle)
            say(ended_line(result))
            return result
        attrs = {k.name: v for k, v in desc.typed_search_attributes}
        st = await _status(handle)
        steps, confirmed = int(st.get("steps") or 0), int(st.get("confirmed") or 0)
        if steps and confirmed > seen.confirmed:
            done = (f"step {confirmed}/{steps}" if confirmed == seen.confirmed + 1 else
                    f"steps {seen.confirmed + 1}-{confirmed}/{steps}")
            say(f"{wid}: {done} confirmed")
            seen.confirmed = confirmed
        state = str(attrs.get("TidemarkState") or st.get("state") or "pending")
        need = Need.NOTHING if state == "pending" else need_of(state)
        if (state, need) != (seen.state, seen.need):
            if state == "pending":
                line = f"{wid}: started; waits for a worker on its task queue to take it"
            elif need == Need.NOTHING:
                line = f"{wid}: {state}"
            else:
                who = str(st.get("approvers") or "") if need == Need.APPROVAL else ""
                line = f"{wid}: {state}; {asks(task_id, need, who)}"
            say(line)
            seen.state, seen.need = state, need
        await asyncio.sleep(poll_s)
