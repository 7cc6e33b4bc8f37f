"""Temporal Cloud's billable actions, counted over histories (bench/temporal_actions.py).

bench/run_all.py reports ``temporal_actions_per_step`` and ``_per_task`` from this count."""

from __future__ import annotations

import json
from pathlib import Path

from temporalio.api.common.v1 import Payload, SearchAttributes, WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import (
    ActivityTaskStartedEventAttributes,
    HistoryEvent,
    MarkerRecordedEventAttributes,
    UpsertWorkflowSearchAttributesEventAttributes,
    WorkflowExecutionSignaledEventAttributes,
    WorkflowExecutionStartedEventAttributes,
)
from temporalio.client import WorkflowHistory

from bench.temporal_actions import billable_actions

HISTORIES = Path(__file__).resolve().parent / "histories"
T = EventType


def upsert(*names: str) -> HistoryEvent:
    return HistoryEvent(
        event_type=T.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES,
        upsert_workflow_search_attributes_event_attributes=(
            UpsertWorkflowSearchAttributesEventAttributes(search_attributes=SearchAttributes(
                indexed_fields={n: Payload(data=b'"x"') for n in names}))))


def marker(task: int) -> HistoryEvent:
    return HistoryEvent(event_type=T.EVENT_TYPE_MARKER_RECORDED,
                        marker_recorded_event_attributes=MarkerRecordedEventAttributes(
                            marker_name="core_local_activity",
                            workflow_task_completed_event_id=task))


def test_each_kind_counts_as_temporal_cloud_bills_it() -> None:
    events = [
        HistoryEvent(event_type=T.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED),
        HistoryEvent(event_type=T.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED),  # started: counted there
        HistoryEvent(event_type=T.EVENT_TYPE_ACTIVITY_TASK_STARTED,
                     activity_task_started_event_attributes=ActivityTaskStartedEventAttributes(
                         attempt=3)),  # two retries: three attempts started
        HistoryEvent(event_type=T.EVENT_TYPE_ACTIVITY_TASK_COMPLETED),
        marker(4), marker(4), marker(9),  # local activities: one per workflow task
        upsert("TidemarkState", "TidemarkNeeds"),  # one command, two attributes: one
        upsert("TemporalChangeVersion"),  # exempt
        HistoryEvent(event_type=T.EVENT_TYPE_TIMER_STARTED),
        HistoryEvent(event_type=T.EVENT_TYPE_TIMER_FIRED),
        HistoryEvent(event_type=T.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED),  # from a client
        HistoryEvent(event_type=T.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED,  # counted where sent
                     workflow_execution_signaled_event_attributes=(
                         WorkflowExecutionSignaledEventAttributes(
                             external_workflow_execution=WorkflowExecution(workflow_id="w")))),
        HistoryEvent(event_type=T.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED),
        HistoryEvent(event_type=T.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED),
        HistoryEvent(event_type=T.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED),
        HistoryEvent(event_type=T.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED),
        HistoryEvent(event_type=T.EVENT_TYPE_WORKFLOW_TASK_COMPLETED),
        HistoryEvent(event_type=T.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED),
    ]
    assert billable_actions(events) == {
        "workflow_started": 1, "activity": 3, "markers": 2, "search_attributes": 1,
        "timer": 1, "signal": 2, "child_workflow": 2, "update": 1}


def test_a_childs_own_start_is_its_parents_to_count() -> None:
    child = HistoryEvent(
        event_type=T.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED,
        workflow_execution_started_event_attributes=WorkflowExecutionStartedEventAttributes(
            parent_workflow_execution=WorkflowExecution(workflow_id="parent")))
    assert billable_actions([child]) == {}


def test_a_recorded_run_counts_its_start_activities_upserts_and_signals() -> None:
    ids = json.loads((HISTORIES / "workflow_ids.json").read_text())
    h = WorkflowHistory.from_json(ids["run_halted.json"],
                                  (HISTORIES / "run_halted.json").read_text())
    started = [e for e in h.events if e.event_type == T.EVENT_TYPE_ACTIVITY_TASK_STARTED]
    assert started and all(e.activity_task_started_event_attributes.attempt == 1
                           for e in started)
    # Two signals: the worklist release the run sends at its start, and the halt it receives.
    assert billable_actions(h.events) == {
        "workflow_started": 1, "activity": len(started), "search_attributes": 2, "signal": 2,
        "child_workflow": 2}
