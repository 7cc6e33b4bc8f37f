"""How a run ends in Temporal, so that the Web UI's workflow list tells who needs a person.

A run that finished (``completed``) completes. A run that ended in any other named state —
halted, stopped, killed, blocked, needs_decision, precondition_failed, failed — ends the
workflow **Failed**, with a non-retryable ``ApplicationError`` whose type names the state
(``TidemarkNeedsDecision``, ``TidemarkHalted``, ``TidemarkBlocked`` …) and whose details carry
the ``RunResult``. The ``TidemarkState`` search attribute says the same. So
``temporal workflow list --query 'ExecutionStatus="Failed"'`` (red in the Web UI) is the list of
runs waiting for a person, ``ExecutionStatus="Completed"`` the finished ones.

``run_result(handle)`` gives the ``RunResult`` either way, ``unwind_result(handle)`` an
UnwindResult. A terminated run carries no result: both then say ``killed`` (terminated by
``tidemark kill``, whose reason begins "killed by") or ``terminated``, with the reason.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError, ChildWorkflowError, TerminatedError

from tidemark.needs import sentence
from tidemark.payloads import COMPLETED, KILLED, RunResult, UnwindResult

TYPE_PREFIX = "Tidemark"


def failure_type(state: str) -> str:
    """``needs_decision`` -> ``TidemarkNeedsDecision``."""
    return TYPE_PREFIX + "".join(w.title() for w in state.split("_"))


def ended(result: RunResult) -> RunResult:
    """Returns a completed result; raises the typed failure for every other state.

    Workflow code: call it as the run's last statement."""
    if result.state == COMPLETED:
        return result
    raise ApplicationError(failure_message(result), dataclasses.asdict(result),
                           type=failure_type(result.state), non_retryable=True)


def failure_message(result: RunResult) -> str:
    """The message of a run's failure.

    First comes the one plain sentence a person reads (what happened, what to do next;
    tidemark.needs.sentence). Below it come the state, the error's type and its own message as
    the code raised it. The Web UI shows the message above the stack trace; the RunResult is in
    the failure's details."""
    err = result.error or {}
    confirmed = f"{result.confirmed}/{result.steps} steps confirmed"
    technical = (f"{result.state}: {err.get('type', '')} {err.get('message', '')}".strip()
                 + f" ({confirmed})")
    return f"{sentence(result.task_id, result.state, err, confirmed)}\n\n{technical}"


def result_of(e: BaseException) -> RunResult | None:
    """The RunResult a failed run carries; None when the failure is not ours.

    It comes from the client's WorkflowFailureError or a parent's ChildWorkflowError."""
    cause: BaseException | None = e
    while isinstance(cause, (WorkflowFailureError, ChildWorkflowError)):
        cause = cause.cause
    if (isinstance(cause, ApplicationError) and (cause.type or "").startswith(TYPE_PREFIX)
            and cause.details and isinstance(cause.details[0], dict)):
        return RunResult(**_known(cause.details[0]))
    return None


def _known(d: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(RunResult)}
    return {k: v for k, v in d.items() if k in names}


async def run_result(handle: WorkflowHandle[Any, Any]) -> RunResult:
    """The RunResult of a RunPlan (or ScheduledRun), completed or failed.

    It is returned whether the run completed or ended Failed in a named state. Any other failure
    is raised."""
    try:
        result = await handle.result()
    except WorkflowFailureError as e:
        found = result_of(e)
        if found is None and isinstance(e.cause, TerminatedError):
            state, error = _terminated(e.cause)
            return RunResult(task_id=handle.id.removeprefix("tidemark-"), state=state, steps=0,
                             confirmed=0, error=error)
        if found is None:
            raise
        return found
    if isinstance(result, RunResult):
        return result
    return RunResult(**_known(result))


async def unwind_result(handle: WorkflowHandle[Any, Any]) -> UnwindResult:
    """The UnwindResult of an UnwindPlan, whatever state it ended in.

    It is returned whether the unwind ended ``unwound`` (Completed) or in any other state
    (Failed, the result in the typed error's details). Any other failure is raised."""
    try:
        result = await handle.result()
    except WorkflowFailureError as e:
        cause: BaseException | None = e.cause
        if (isinstance(cause, ApplicationError) and (cause.type or "").startswith(TYPE_PREFIX)
                and cause.details and isinstance(cause.details[0], dict)):
            return _unwind_result(cause.details[0])
        if isinstance(cause, TerminatedError):
            state, error = _terminated(cause)
            return UnwindResult(task_id=handle.id.removeprefix("tidemark-unwind-"), state=state,
                                error=error)
        raise
    if isinstance(result, UnwindResult):
        return result
    return _unwind_result(result)


def _unwind_result(d: dict[str, Any]) -> UnwindResult:
    names = {f.name for f in dataclasses.fields(UnwindResult)}
    return UnwindResult(**{k: v for k, v in d.items() if k in names})


def _terminated(cause: TerminatedError) -> tuple[str, dict[str, Any]]:
    """The state and error of a terminated run.

    ``tidemark kill`` terminates with a reason that begins "killed by"; anything else
    (``temporal workflow terminate``) is terminated."""
    reason = cause.message or ""
    state = KILLED if reason.startswith("killed by ") else "terminated"
    return state, {"type": "Terminated", "message": reason}
