"""Temporal Cloud's billable actions, counted over a workflow's event history.

What counts, from Temporal Cloud's own list ("Temporal Cloud Actions",
https://docs.temporal.io/cloud/actions), and the history event each is read from here:

* **workflow started** (client start, continue-as-new, child start): WorkflowExecutionStarted,
  1. A child's own start is not counted in its history: the parent's
  StartChildWorkflowExecutionInitiated counts **2** (the start and the execution).
* **activity started or retried**: ActivityTaskStarted, its ``attempt`` (each attempt is one;
  the history keeps only the last attempt's started event, with its number).
* **local activities**: their markers. "Temporal Cloud counts all RecordMarkers from each
  Workflow Task as one action": MarkerRecorded events, 1 per distinct
  ``workflow_task_completed_event_id``.
* **timer started**: TimerStarted, 1.
* **search attribute upsert**: UpsertWorkflowSearchAttributes, 1 per command (several
  attributes in one command are one), 0 when it sets only ``TemporalChangeVersion``. The
  attributes given at the start are not counted.
* **signal sent** (by a client or by a workflow): a workflow's signal is counted where it is
  sent, SignalExternalWorkflowExecutionInitiated, 1 (its target may be a workflow whose history
  is not read, or none at all); a client's where it is received, WorkflowExecutionSignaled, 1
  (one that names an ``external_workflow_execution`` came from a workflow: 0 there).
* **update**: WorkflowExecutionUpdateAccepted, 1.
* **workflow execution options updated**: WorkflowExecutionOptionsUpdated, 1.
* **Nexus operation scheduled / canceled**: NexusOperationScheduled / NexusOperationCanceled, 1.

Not in a history, so not counted here (the same page lists these as left out of its own
history-based estimate): **queries**, **activity heartbeats** that reach the server (the SDK
sends at most one per 80 % of the heartbeat timeout; Tidemark's steps beat every 0.5 s against
a 2 s timeout, so a step that waits on its target for S seconds adds about S / 1.6 actions),
rejected updates, schedules (2 per scheduled start), exports, resets. Signal-with-start, one
action in all, counts 2 here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent

CHANGE_VERSION = "TemporalChangeVersion"

# Each event type that is one action by itself, and the kind it is reported as.
ONE_EACH = {
    EventType.EVENT_TYPE_TIMER_STARTED: "timer",
    EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED: "signal",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED: "update",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_OPTIONS_UPDATED: "options_updated",
    EventType.EVENT_TYPE_NEXUS_OPERATION_SCHEDULED: "nexus",
    EventType.EVENT_TYPE_NEXUS_OPERATION_CANCELED: "nexus",
}


def billable_actions(events: Iterable[HistoryEvent]) -> Counter[str]:
    """The actions one history's events bill, by kind (the module docstring lists them)."""
    out: Counter[str] = Counter()
    marker_tasks: set[int] = set()
    for e in events:
        t = e.event_type
        if t == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            attrs = e.workflow_execution_started_event_attributes
            if not attrs.HasField("parent_workflow_execution"):  # a child's: its parent's 2
                out["workflow_started"] += 1
        elif t == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED:
            out["child_workflow"] += 2
        elif t == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            out["activity"] += max(e.activity_task_started_event_attributes.attempt, 1)
        elif t == EventType.EVENT_TYPE_MARKER_RECORDED:
            marker_tasks.add(e.marker_recorded_event_attributes.workflow_task_completed_event_id)
        elif t == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
            fields = e.upsert_workflow_search_attributes_event_attributes.search_attributes
            if set(fields.indexed_fields) - {CHANGE_VERSION}:
                out["search_attributes"] += 1
        elif t == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            if not e.workflow_execution_signaled_event_attributes.HasField(
                    "external_workflow_execution"):  # from a workflow: counted where sent
                out["signal"] += 1
        elif t in ONE_EACH:
            out[ONE_EACH[t]] += 1
    if marker_tasks:
        out["markers"] += len(marker_tasks)
    return out
