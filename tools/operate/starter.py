"""Client-side helpers: start RunPlan for a plan, resume, unwind, wake a waiting run.

They connect through ``Settings.temporal_connect()``: the SDK's environment configuration
(``temporal.toml`` profile, TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, TEMPORAL_API_KEY, TLS), with
the command line's ``--address``/``--namespace`` applied by the caller."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from tidemark.errors import TidemarkError
from tidemark.needs import Act, command, metadata
from tidemark.payloads import AWAITING_APPROVAL, TASK_QUEUE, RunResult, UnwindResult
from tidemark.settings import Settings
from workflows.outcome import run_result, unwind_result
from workflows.shared import start_attributes


async def start_plan(client: Client, document: dict[str, Any], task_id: str,
                     task_queue: str = TASK_QUEUE) -> WorkflowHandle[Any, RunResult]:
    """Starts ``tidemark-<task_id>``, as `temporal workflow start` would.

    With the run's user metadata (``metadata``): the Web UI says what it needs and the command."""
    summary, details = metadata("RunPlan", task_id)
    return await client.start_workflow("RunPlan", document, id=f"tidemark-{task_id}",
                                       task_queue=task_queue, result_type=RunResult,
                                       static_summary=summary, static_details=details,
                                       search_attributes=start_attributes(task_id))


class TemporalUnavailable(TidemarkError):
    """The Temporal frontend could not be reached."""


class AlreadyRunning(TidemarkError):
    """A workflow with this id is running already; a task runs once at a time."""


async def connect(settings: Settings) -> Client:
    """A client on the configured Temporal.

    Raises TemporalUnavailable (one line) if it cannot be reached, ConfigError if a TLS file
    cannot be read."""
    options = settings.temporal_connect()
    try:
        return await Client.connect(**options)
    except RuntimeError as e:  # the SDK reports a failed connect as RuntimeError
        raise TemporalUnavailable(f"cannot reach Temporal at {settings.describe_temporal()}: "
                                  f"{e}") from e


async def _start(client: Client, workflow: str, task_id: str, workflow_id: str,
                 task_queue: str, result_type: type[Any]) -> WorkflowHandle[Any, Any]:
    summary, details = metadata(workflow, task_id)
    try:
        return await client.start_workflow(workflow, {"task_id": task_id}, id=workflow_id,
                                           task_queue=task_queue, result_type=result_type,
                                           static_summary=summary, static_details=details,
                                           search_attributes=start_attributes(task_id)
                                           if workflow == "RunPlan" else None)
    except WorkflowAlreadyStartedError as e:
        raise AlreadyRunning(f"{workflow_id} is running already; halt it first "
                             f"(temporal workflow signal --workflow-id {workflow_id} "
                             "--name halt)") from e


async def launch_plan(settings: Settings, document: dict[str, Any], task_id: str,
                      task_queue: str, *, started: Callable[[str], None], wait: bool,
                      say: Callable[[str], None] | None = None) -> RunResult | None:
    """Starts ``tidemark-<task_id>`` on ``document`` (`tidemark start`).

    ``started`` is told the run id once it is started. With ``wait``, returns the RunResult once
    the run ended; with ``say`` as well, tells it how the run goes meanwhile
    (tools/operate/follow.py). AlreadyRunning (one line) while a run of the task is open."""
    client = await connect(settings)
    try:
        handle = await start_plan(client, document, task_id, task_queue)
    except WorkflowAlreadyStartedError as e:
        raise AlreadyRunning(f"tidemark-{task_id} is running already: a task runs once at a "
                             f"time, nothing was started. `{command(Act.STATUS, task_id)}` "
                             "follows it") from e
    started(handle.result_run_id or "")
    return await _outcome(handle, task_id, wait, say)


async def _outcome(handle: WorkflowHandle[Any, RunResult], task_id: str, wait: bool,
                   say: Callable[[str], None] | None, confirmed: int = 0) -> RunResult | None:
    """The end of a started run: None without ``wait``, said as it goes with ``say``."""
    if not wait:
        return None
    if say is None:
        return await run_result(handle)
    from tools.operate.follow import follow

    return await follow(handle, task_id, say, confirmed_before=confirmed)


async def resume_task(settings: Settings, task_id: str, *, wait: bool,
                      task_queue: str = TASK_QUEUE,
                      say: Callable[[str], None] | None = None,
                      started: Callable[[str], None] | None = None,
                      confirmed: int = 0) -> RunResult | None:
    """Starts RunPlan on the stored plan of ``task_id`` (the caller has released it).

    ``started`` and ``say`` as for ``launch_plan``; ``confirmed``: the steps the journal has
    confirmed already, which ``say`` is not told again."""
    client = await connect(settings)
    handle = await _start(client, "RunPlan", task_id, f"tidemark-{task_id}", task_queue,
                          RunResult)
    if started is not None:
        started(handle.result_run_id or "")
    return await _outcome(handle, task_id, wait, say, confirmed)


async def unwind_task(settings: Settings, task_id: str, *, wait: bool,
                      task_queue: str = TASK_QUEUE) -> UnwindResult | None:
    """Starts UnwindPlan for a stopped task, as ``tidemark-unwind-<task_id>``."""
    client = await connect(settings)
    handle = await _start(client, "UnwindPlan", task_id, f"tidemark-unwind-{task_id}",
                          task_queue, UnwindResult)
    return await unwind_result(handle) if wait else None


async def unwind_open(settings: Settings, task_id: str) -> bool:
    """Whether an unwind of ``task_id`` (``tidemark-unwind-<task_id>``) is open.

    A resume would run the task forward under it, a second unwind would only restate its
    stop."""
    client = await connect(settings)
    try:
        desc = await client.get_workflow_handle(f"tidemark-unwind-{task_id}").describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return False
        raise
    return desc.status == WorkflowExecutionStatus.RUNNING


def check_no_unwind(settings: Settings, task_id: str, verb: str) -> None:
    """Refuses ``verb`` (AlreadyRunning, one line) while an unwind of the task is open."""
    if asyncio.run(unwind_open(settings, task_id)):
        raise AlreadyRunning(
            f"tidemark-unwind-{task_id} is running: an unwind of {task_id} is under way, "
            f"nothing was changed. Follow it with `tidemark status {task_id}`; `tidemark "
            f"kill {task_id}` ends it before its next compensation" +
            ("" if verb == "unwind" else f", then {verb}"))


async def signal_approval(settings: Settings, task_id: str,
                          decision: dict[str, Any]) -> bool:
    """Wakes ``tidemark-<task_id>`` after a decision was journaled.

    False when no run of it is open (the decision then takes effect when the task is next
    started)."""
    client = await connect(settings)
    try:
        await client.get_workflow_handle(f"tidemark-{task_id}").signal("approval", decision)
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return False
        raise
    return True


async def decision_taken(settings: Settings, task_id: str, poll_s: float = 0.2, *,
                         until_end: bool = False) -> dict[str, Any]:
    """Waits until the open run of ``tidemark-<task_id>`` has taken the decision.

    Taking it means the run no longer waits for approval: it goes on, or it ended. Says where it
    stands: ``open``, the Temporal ``status``, the ``state`` (TidemarkState, or the ended run's
    state) and, for an ended run, its ``error``. With ``until_end``, waits on until the run has
    ended, so that the answer is how it ended. Reads only what the server holds, so no worker is
    needed to answer; while no worker runs, the wait lasts until one does."""
    client = await connect(settings)
    handle = client.get_workflow_handle(f"tidemark-{task_id}")
    while True:
        desc = await handle.describe()
        state = dict((k.name, v) for k, v in desc.typed_search_attributes).get("TidemarkState")
        status = desc.status.name.lower() if desc.status else "?"
        if until_end and desc.status == WorkflowExecutionStatus.RUNNING \
                and state != AWAITING_APPROVAL:
            with contextlib.suppress(WorkflowFailureError):  # described just below
                await handle.result()  # taken: the rest of the run, however long
            continue
        if desc.status != WorkflowExecutionStatus.RUNNING:
            try:
                result = await run_result(handle)
            except WorkflowFailureError:  # terminated, or a failure that is not ours
                return {"open": False, "status": status, "state": state, "error": {}}
            return {"open": False, "status": status, "state": result.state,
                    "error": result.error}
        if state != AWAITING_APPROVAL:
            return {"open": True, "status": status, "state": state, "error": {}}
        await asyncio.sleep(poll_s)
