"""How a run ends in Temporal, so that the Web UI's workflow list tells who needs a person.

A run that finished (``completed``) completes. A run that ended in any other named state —
halted, stopped, killed, blocked, needs_decision, precondition_failed, failed — ends the
workflow **Failed**, with a non-retryable ``ApplicationError`` whose type names the state
(``TidemarkNeedsDecision``, ``TidemarkHalted``, ``TidemarkBlocked`` …) and whose details carry
the ``RunResult``. The ``TidemarkState`` search attribute says the same. So
``temporal workflow list --query 'ExecutionStatus="Failed"'`` (red in the Web UI) is the list of
runs waiting for a person, ``ExecutionStatus="Completed"`` the finished ones.

``run_result(handle)`` gives the ``RunResult`` either way.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError, ChildWorkflowError

from workflows.types import COMPLETED, RunResult, UnwindResult

TYPE_PREFIX = "Tidemark"


def failure_type(state: str) -> str:
    """``needs_decision`` -> ``TidemarkNeedsDecision``."""
    return TYPE_PREFIX + "".join(w.title() for w in state.split("_"))


def ended(result: RunResult) -> RunResult:
    """Returns a completed result; raises the typed failure for every other state (workflow
    code: call it as the run's last statement)."""
    if result.state == COMPLETED:
        return result
    err = result.error or {}
    raise ApplicationError(
        f"{result.state}: {err.get('type', '')} {err.get('message', '')}".strip()
        + f" ({result.confirmed}/{result.steps} steps confirmed)",
        dataclasses.asdict(result), type=failure_type(result.state), non_retryable=True)


def result_of(e: BaseException) -> RunResult | None:
    """The RunResult a failed run carries (from the client's WorkflowFailureError or a
    parent's ChildWorkflowError), or None when the failure is not one of ours."""
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
    """The RunResult of a RunPlan (or ScheduledRun), whether it completed or ended Failed in
    a named state. Any other failure is raised."""
    try:
        result = await handle.result()
    except WorkflowFailureError as e:
        found = result_of(e)
        if found is None:
            raise
        return found
    if isinstance(result, RunResult):
        return result
    return RunResult(**_known(result))


async def unwind_result(handle: WorkflowHandle[Any, Any]) -> UnwindResult:
    """The UnwindResult of an UnwindPlan, whether it ended ``unwound`` (Completed) or in any
    other state (Failed, the result in the typed error's details). Any other failure is
    raised."""
    try:
        result = await handle.result()
    except WorkflowFailureError as e:
        cause: BaseException | None = e.cause
        if (isinstance(cause, ApplicationError) and (cause.type or "").startswith(TYPE_PREFIX)
                and cause.details and isinstance(cause.details[0], dict)):
            return _unwind_result(cause.details[0])
        raise
    if isinstance(result, UnwindResult):
        return result
    return _unwind_result(result)


def _unwind_result(d: dict[str, Any]) -> UnwindResult:
    names = {f.name for f in dataclasses.fields(UnwindResult)}
    return UnwindResult(**{k: v for k, v in d.items() if k in names})
