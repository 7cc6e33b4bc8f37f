"""NeedsPerson: the open worklist row of a task whose run ended waiting for a person.

The row is in the Web UI's worklist. The run ended halted, needing a decision, stopped, killed,
failed, blocked, rejected, or in a failed unwind.

A closed run's search attributes cannot change any more (Temporal writes them only from the
running workflow). Each resume of a task is a new run under the same workflow id: a run that
ended ``halted`` would keep saying so after a later run completed the task. So the worklist
counts open executions only (tidemark.needs.needs_query). A run waiting for approval is
itself open, and a run that ends needing a person starts this workflow, id
``tidemark-needs-<task>``, as an abandoned child that outlives it. It holds the task's
TidemarkTaskId, TidemarkState and TidemarkNeeds and, as its summary, the sentence of what
happened and what to do next. It waits, acting on nothing, until the task's next run starts or
its unwind begins (the ``settled`` signal), then closes with TidemarkNeeds ``nothing``. A later
end that needs a person again updates the open one (``need``) or starts it anew. A person's
command that changes what the journal says the task needs without starting a run (`tidemark
stop`, `release`, `resolve`) brings the open row in line. It does so with ``refresh``, or
``settled`` once the task needs nobody (tools/operate/rows.py).
"""

from __future__ import annotations

import contextlib
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import ActivityError, FailureError, WorkflowAlreadyStartedError

with workflow.unsafe.imports_passed_through():
    from tidemark.activity_names import ActivityName
    from tidemark.needs import Need
    from tidemark.payloads import TaskNeed
    from workflows.shared import (
        BOOKKEEPING_HEARTBEAT,
        BOOKKEEPING_RETRY,
        BOOKKEEPING_TIMEOUT,
        NEEDS,
        STATE,
        TASK_ID,
    )

# A row reads the journal once it is open (the task_need activity): a task settled in the
# moment before the row existed closes it. The check is worth a few attempts, not a row that
# waits on Postgres: if the journal cannot be read, the row stands as its run opened it.
CHECK_RETRY = RetryPolicy(initial_interval=BOOKKEEPING_RETRY.initial_interval,
                          backoff_coefficient=2.0, maximum_attempts=5)

# The Web UI shows a workflow's summary as one line; the sentence fits in this.
SUMMARY_CHARS = 400


@workflow.defn(name="NeedsPerson")
class NeedsPerson:
    def __init__(self) -> None:
        self._settled: str | None = None
        self._need: dict[str, Any] = {}

    @workflow.signal
    def settled(self, by: str = "") -> None:
        """The task's next run started, or its unwind began: nobody needs to act on this."""
        self._settled = by or "a later run"

    @workflow.signal
    def need(self, need: dict[str, Any]) -> None:
        """The task's run ended needing a person again before this one closed: it says so."""
        self._settled = None
        self._show(need)

    @workflow.signal
    def refresh(self, need: dict[str, Any]) -> None:
        """Makes the row say what the journal says the task needs now.

        A person's command changed it (tools/operate/rows.py). Unlike ``need`` it never reopens
        a row that a new run of the task has released meanwhile: that run says what the task
        needs from then on."""
        if self._settled is None:
            self._show(need)

    @workflow.query
    def status(self) -> dict[str, Any]:
        return {**self._need, "settled_by": self._settled}

    @workflow.run
    async def run(self, need: dict[str, Any]) -> str:
        self._show(need)
        await self._check(str(need.get("task_id", "")))
        await workflow.wait_condition(lambda: self._settled is not None)
        workflow.upsert_search_attributes([NEEDS.value_set(Need.NOTHING)])
        return f"settled: {self._settled}"

    async def _check(self, task_id: str) -> None:
        """Reads the journal once the row is open, and closes a row nobody needs.

        A task settled meanwhile needs nobody, and the row closes: its unwind ended ``unwound``
        in the moment between the run's reading and this row's start, or its release was sent
        before the row existed. A release sent once the row is open reaches it as a signal. One
        sent before it found the task's end journaled already, which this reads."""
        if not task_id:
            return
        with contextlib.suppress(ActivityError):  # the journal unreachable: the row stands
            now: TaskNeed = await workflow.execute_activity(
                ActivityName.TASK_NEED, task_id, result_type=TaskNeed,
                start_to_close_timeout=BOOKKEEPING_TIMEOUT,
                heartbeat_timeout=BOOKKEEPING_HEARTBEAT, retry_policy=CHECK_RETRY,
                summary="is the task settled already?")
            if now.settled and self._settled is None:
                self._settled = "the journal: its task is settled"

    def _show(self, need: dict[str, Any]) -> None:
        self._need = dict(need)
        workflow.upsert_search_attributes([STATE.value_set(str(need.get("state", ""))),
                                           NEEDS.value_set(str(need.get("need", "")))])
        workflow.set_current_details(str(need.get("sentence", "")))


# A start that meets a holder closing at that moment tries again this many times.
HOLD_ATTEMPTS = 3


def holder_id(task_id: str) -> str:
    return f"tidemark-needs-{task_id}"


async def hold(task_id: str, state: str, need: Need, sentence: str) -> None:
    """Opens (or updates) the task's worklist row. Workflow code: call it from a run's end."""
    body = {"task_id": task_id, "state": state, "need": need, "sentence": sentence,
            "by": workflow.info().workflow_id}
    for _ in range(HOLD_ATTEMPTS):
        try:
            await workflow.start_child_workflow(
                NeedsPerson.run, body, id=holder_id(task_id),
                parent_close_policy=workflow.ParentClosePolicy.ABANDON,
                search_attributes=TypedSearchAttributes([
                    SearchAttributePair(TASK_ID, task_id), SearchAttributePair(STATE, state),
                    SearchAttributePair(NEEDS, need)]),
                static_summary=sentence[:SUMMARY_CHARS])
            return
        except WorkflowAlreadyStartedError:
            try:  # the row is open: it says what this run ended needing
                await workflow.get_external_workflow_handle(holder_id(task_id)).signal(
                    NeedsPerson.need, body)
                return
            except FailureError:
                continue  # it closed meanwhile: open it anew


async def release(task_id: str, by: str) -> None:
    """Closes the task's worklist row, if one is open.

    A new run of the task started, or its unwind began. Workflow code."""
    with contextlib.suppress(FailureError):
        await workflow.get_external_workflow_handle(holder_id(task_id)).signal(
            NeedsPerson.settled, by)
