"""What the workflows share: their search attributes, the timeouts and retry policies of their
activities, and how a typed failure of an activity ends a run."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio.common import RetryPolicy, SearchAttributeKey
from temporalio.exceptions import ActivityError, ApplicationError

from tidemark.errors import END_STATES
from tidemark.needs import ATTRIBUTE as NEEDS_ATTRIBUTE
from tidemark.words import TaskState

TASK_ID = SearchAttributeKey.for_keyword("TidemarkTaskId")
STATE = SearchAttributeKey.for_keyword("TidemarkState")
# What the task needs from a person (tidemark.needs.Need): the Web UI's worklist filters on it.
NEEDS = SearchAttributeKey.for_keyword(NEEDS_ATTRIBUTE)
# Every attribute the workflows upsert: a server must have them all registered (the tests' and
# benches' dev servers, tools/devstack.py, docker/temporal-setup.sh), or the upsert fails the
# workflow task.
SEARCH_ATTRIBUTES = [TASK_ID, STATE, NEEDS]
# The patch under which a run keeps TidemarkNeeds up to date and its task's worklist row
# (workflows/needs_person.py): histories from before it upsert TidemarkTaskId and TidemarkState
# only, and start and signal no NeedsPerson (workflow.patched).
NEEDS_PATCH = "tidemark-needs"

# A step may take this long end to end (HTTP timeouts of the targets are far shorter).
STEP_START_TO_CLOSE = timedelta(minutes=5)
# A worker that stops heartbeating for this long is presumed dead and the step is retried on
# another worker: it is the larger part of the time from a worker's death to its step done
# elsewhere (docs/operate.md, Heartbeats and retries; bench/recovery.py). The step heartbeats every
# HEARTBEAT_EVERY_S (activities/steps.py); the SDK sends at most one heartbeat per 80% of this
# timeout, so the server hears from a live step every 1.6 s. A live step whose heartbeats
# stall longer (a process frozen by GC or swap, a starved machine) is retried early: harmless,
# because the twin meets the step's lock or its fresh lease (StepBusy) and waits, and the stalled
# attempt's own result is then refused by Temporal and answered from the journal. The cost of a
# short timeout is such wasted attempts, never a duplicate.
STEP_HEARTBEAT = timedelta(seconds=2)
# Bookkeeping activities (prepare, describe, halt) touch only Postgres.
BOOKKEEPING_TIMEOUT = timedelta(seconds=30)
# The boundary's gate probes every earlier reversible step in one activity (heartbeating): it
# gets the step's time plus this much per step it may verify, so that a long plan on a slow
# provider is not cut off and retried forever (a probe costs 0.2-6 ms on the staging Drive).
GATE_PER_STEP = timedelta(milliseconds=500)
# After the `kill` signal the run starts nothing more and waits this long for `tidemark kill`
# to terminate it (it does so within seconds, once the step under way has ended). Only if the
# kill command died before its last layer does the run end by itself: Failed, state killed.
KILL_WAIT = timedelta(minutes=5)

# Errors that another attempt cannot fix end the run in the state their class declares
# (tidemark/errors.py: end_state, looked up here by the error's type name in END_STATES) instead of
# looping. Everything else (StoreUnavailable, StepBusy, TargetUnavailable, a crash) is retried,
# and every retry is safe: it goes through the journal and, if the step is in doubt, its probe.
# The first interval follows a dead worker's heartbeat timeout, so it is short; a twin that then
# meets the dead attempt's fresh lease (for an action whose deadline is within LEASE_S, at most
# LEASE_S after the kill) gets StepBusy and is retried 1 s later, then 2 s: at worst 4 s from
# the kill to an attempt that may act (tests/test_recovery.py computes the bound).
STEP_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=500),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),  # a recovered database is noticed within 30 s
    non_retryable_error_types=sorted(END_STATES),
)
BOOKKEEPING_RETRY = STEP_RETRY

# A decision sent as a RunPlan update (`temporal workflow update execute --name approve`) is
# recorded by a decider: a process on the task queue of this name that holds an approver's
# login role (`tidemark decider`). A worker's role decides nothing, so the worker cannot.
DECISIONS_QUEUE_SUFFIX = "-decisions"
# How long an update waits for a decider to take its decision before it answers refused: long
# enough for a decider that polls to take it (it does within a second), short enough that a
# person at the Web UI's update form is told at once that none runs.
DECIDER_WAIT = timedelta(seconds=10)
# A decision is recorded once or refused: never retried (a refusal is the journal's answer).
DECISION_RETRY = RetryPolicy(maximum_attempts=1)
# The journal's lengths of a decision's label and note (tidemark.decisions CHECKs).
DECISION_LABEL_MAX = 200
DECISION_NOTE_MAX = 2000


def decisions_queue(task_queue: str) -> str:
    """The task queue a decider serves for the runs of ``task_queue``."""
    return task_queue + DECISIONS_QUEUE_SUFFIX


def end_state_of(e: ActivityError | ApplicationError,
                 step: int | None) -> tuple[TaskState, dict[str, Any]]:
    """The named end state and error of a typed, non-retryable failure. Any other failure (a
    bug) is re-raised, which fails the workflow task visibly in the Web UI.

    An activity's failure arrives as an ActivityError around our ApplicationError; a local
    activity's (the fast path) as the ApplicationError itself."""
    cause = e.cause if isinstance(e, ActivityError) else e
    if not isinstance(cause, ApplicationError) or cause.type not in END_STATES:
        raise e
    return END_STATES[cause.type], {"type": cause.type, "message": cause.message, "step": step}
