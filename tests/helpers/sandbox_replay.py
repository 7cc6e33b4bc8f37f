"""The runs of our workflows that a dev server holds, replayed in Temporal's workflow sandbox.

The worker runs the workflows outside the sandbox (worker.WORKFLOW_RUNNER: it costs a step
about 3 ms). The sandbox's guard is kept here instead, before the code reaches a worker: the
suite's dev servers hold runs of every path the tests drive (completed, halted, killed, stopped
for a person, resumed in doubt, unwound, continued as new, scheduled), and replaying them in the
sandbox fails on what the sandbox refuses at run time (a clock, a file, a random number, a
thread read from workflow code) and on any command the code would not give again
(nondeterminism).

A replay in the sandbox costs 0.1-0.5 s (the sandbox imports the workflow's module for each),
so one run of each shape is replayed: the same workflow type and the same transitions between
events (an activity of a given type scheduled after another's result, a signal, a failure of a
given type, a patch marker). Runs that differ only in how many steps they took, or in their
payloads' values, take the same paths through the workflow code.

Under pytest-xdist every worker has a dev server of its own, and their runs share most shapes.
A file that the workers share (``claims``) records the shapes already replayed, so that each
shape is replayed once in the whole session, by the worker that finishes first with it.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import itertools
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowExecution, WorkflowHistory
from temporalio.worker import Replayer
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner
from temporalio.workflow import _Definition

import worker

E = EventType
# Each xdist worker waits for this at its session's end (24-59 s in a full run's --durations),
# and its dev server holds hundreds of runs by then: their histories are fetched sixteen at a
# time rather than one after another, few enough to keep the dev server's queue short.
FETCHES_AT_ONCE = 16
Shape = tuple[str, frozenset[tuple[str, str]]]


def _token(e: HistoryEvent) -> str:
    """An event as a shape sees it: its type, and the name that picks a path in the workflow."""
    name = ""
    if e.event_type == E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
        name = e.activity_task_scheduled_event_attributes.activity_type.name
    elif e.event_type == E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
        name = e.workflow_execution_signaled_event_attributes.signal_name
    elif e.event_type == E.EVENT_TYPE_ACTIVITY_TASK_FAILED:
        failure = e.activity_task_failed_event_attributes.failure
        name = (failure.cause.application_failure_info.type if failure.HasField("cause")
                else failure.application_failure_info.type)
    elif e.event_type == E.EVENT_TYPE_MARKER_RECORDED:
        name = e.marker_recorded_event_attributes.marker_name
    elif e.event_type == E.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
        payloads = e.workflow_execution_started_event_attributes.input.payloads
        name = payloads[0].data[:1].decode(errors="replace") if payloads else ""
    return f"{EventType.Name(e.event_type)}:{name}"


def shape(workflow_type: str, history: WorkflowHistory) -> Shape:
    tokens = [_token(e) for e in history.events]
    return workflow_type, frozenset(itertools.pairwise(tokens))


def shape_id(s: Shape) -> str:
    """The same for the same shape in every process (a frozenset's hash is not)."""
    text = "\n".join([s[0], *sorted(f"{a} -> {b}" for a, b in s[1])])
    return hashlib.sha256(text.encode()).hexdigest()


def claim(claims: Path | None, ids: list[str]) -> set[str]:
    """Which of ``ids`` this process replays: those no other process has claimed in ``claims``.

    ``claims`` holds one id a line, appended under an exclusive lock. Without a file, all of
    them."""
    if claims is None:
        return set(ids)
    with claims.open("a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        taken = set(f.read().split())
        mine = {i for i in ids if i not in taken}
        f.write("".join(f"{i}\n" for i in sorted(mine)))
        f.flush()
    return mine


@dataclass
class Replayed:
    """What a replay of a dev server's runs found, and where its time went."""

    found: int = 0  # runs of our workflows on the server
    shapes: int = 0  # distinct shapes among them
    replayed: int = 0  # runs replayed here: one of each shape no other process claimed
    failed: list[str] = field(default_factory=list)  # one line per replayed run that failed
    seconds: dict[str, float] = field(default_factory=dict)  # list, fetch, replay

    def summary(self) -> str:
        took = ", ".join(f"{k} {v:.1f} s" for k, v in self.seconds.items())
        return (f"{self.found} runs, {self.shapes} shapes, {self.replayed} replayed here, "
                f"{len(self.failed)} failed; {took}")


async def replay_in_sandbox(client: Client, claims: Path | None = None) -> Replayed:
    """Replays one run of each shape not in ``claims``."""
    out = Replayed()
    started = time.monotonic()
    names = [_Definition.must_from_class(w).name for w in worker.WORKFLOWS]
    listed = [r async for r in client.list_workflows(
        " OR ".join(f"WorkflowType = '{n}'" for n in names))]
    out.seconds["list"] = time.monotonic() - started
    fetching = asyncio.Semaphore(FETCHES_AT_ONCE)

    async def shaped(run: WorkflowExecution) -> tuple[str, WorkflowHistory]:
        async with fetching:
            history = await client.get_workflow_handle(run.id, run_id=run.run_id).fetch_history()
        return shape_id(shape(run.workflow_type, history)), history

    first: dict[str, WorkflowHistory] = {}
    for sid, history in await asyncio.gather(*(shaped(r) for r in listed)):
        first.setdefault(sid, history)  # gather keeps the listing's order: the same first
    out.seconds["fetch"] = time.monotonic() - started - out.seconds["list"]
    out.found, out.shapes = len(listed), len(first)
    mine = claim(claims, list(first))
    kept = [h for i, h in first.items() if i in mine]
    replaying = time.monotonic()
    out.failed = await replay(kept)
    out.replayed, out.seconds["replay"] = len(kept), time.monotonic() - replaying
    return out


async def replay(histories: list[WorkflowHistory],
                 workflows: Sequence[type] = tuple(worker.WORKFLOWS)) -> list[str]:
    """Replays ``histories`` against ``workflows`` in the sandbox: one line per failed run."""

    async def each() -> AsyncIterator[WorkflowHistory]:
        for h in histories:
            yield h

    # With the payload codec: a run the codec tests encrypted replays too, and every other
    # run, in clear, passes through it (tidemark/codec.py). Imported here: the sandbox
    # re-imports a test module that defines workflows, and cryptography's native module does
    # not load twice.
    from helpers.codec_keys import suite_converter

    replayer = Replayer(workflows=workflows, workflow_runner=SandboxedWorkflowRunner(),
                        data_converter=suite_converter())
    results = await replayer.replay_workflows(each(), raise_on_replay_failure=False)
    return [f"{run_id}: {type(e).__name__}: {e}"
            for run_id, e in results.replay_failures.items()]
