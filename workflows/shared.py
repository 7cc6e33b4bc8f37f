"""What the workflows share.

Their search attributes, the timeouts and retry policies of their activities, and how a typed
failure of an activity ends a run."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.common import (
    RawValue,
    RetryPolicy,
    SearchAttributeKey,
    SearchAttributePair,
    SearchAttributeUpdate,
    TypedSearchAttributes,
)
from temporalio.exceptions import ActivityError, ApplicationError

from tidemark.errors import END_STATES, InputError
from tidemark.limits import LABEL_MAX, REASON_MAX, cut, decode_json
from tidemark.needs import ATTRIBUTE as NEEDS_ATTRIBUTE
from tidemark.needs import Need
from tidemark.words import TaskState

TASK_ID = SearchAttributeKey.for_keyword("TidemarkTaskId")
STATE = SearchAttributeKey.for_keyword("TidemarkState")
# What the task needs from a person (tidemark.needs.Need): the Web UI's worklist filters on it.
NEEDS = SearchAttributeKey.for_keyword(NEEDS_ATTRIBUTE)
# Every attribute the workflows upsert: a server must have them all registered (the tests' and
# benches' dev servers, tools/stack/devstack.py, docker/temporal-setup.sh), or the upsert fails the
# workflow task.
SEARCH_ATTRIBUTES = [TASK_ID, STATE, NEEDS]


def start_attributes(task_id: str) -> TypedSearchAttributes:
    """What a RunPlan run of ``task_id`` shows once it began, given by its starter.

    Attributes given at the start cost no action on Temporal Cloud, and the run then upserts
    none after prepare (already_set). The run sets them itself when a starter gave none or
    others (`temporal workflow start` without --search-attribute)."""
    return TypedSearchAttributes([SearchAttributePair(TASK_ID, task_id),
                                  SearchAttributePair(STATE, str(TaskState.RUNNING)),
                                  SearchAttributePair(NEEDS, str(Need.NOTHING))])


def already_set(pairs: list[SearchAttributeUpdate[Any]]) -> bool:
    """Whether the run's search attributes hold every one of ``pairs`` already.

    Workflow code: it reads the run's own attributes, as its start and its upserts set them."""
    held = workflow.info().typed_search_attributes
    return all(held.get(p.key) == p.value for p in pairs)

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
# The worker's bookkeeping activities (prepare, the run's end, a halt, an unwind's) heartbeat as a
# step does (activities.steps.beats): one on a dead worker is retried after this, not after
# BOOKKEEPING_TIMEOUT. A fleet's kill meets runs while they prepare as often as while they act.
BOOKKEEPING_HEARTBEAT = STEP_HEARTBEAT
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



def decisions_queue(task_queue: str) -> str:
    """The task queue a decider serves for the runs of ``task_queue``."""
    return task_queue + DECISIONS_QUEUE_SUFFIX


def end_state_of(e: ActivityError | ApplicationError,
                 step: int | None) -> tuple[TaskState, dict[str, Any]]:
    """The named end state and error of a typed, non-retryable failure.

    Any other failure (a bug) is re-raised, which fails the workflow task visibly in the Web UI.

    An activity's failure arrives as an ActivityError around our ApplicationError; a step's
    error that a batch reports (the fast path) as the ApplicationError itself."""
    cause = e.cause if isinstance(e, ActivityError) else e
    if not isinstance(cause, ApplicationError) or cause.type not in END_STATES:
        raise e
    return END_STATES[cause.type], {"type": cause.type, "message": cause.message, "step": step}


# -- what arrives from outside: a workflow's input, a signal's payload ----------------------------

# A workflow's input and its signals' payloads are taken raw (RawValue) and decoded here, in the
# workflow's code: decoded by the SDK before the code runs, an input Python's json cannot read
# (nesting deeper than its recursion limit, an integer of thousands of digits) would fail every
# workflow task ("Failed decoding arguments") and leave the run Running for ever, and a signal
# whose payload does not decode would be dropped (a halt that never halts).
NO_INPUT = RawValue(Payload())  # no payload at all (`temporal workflow start` without --input)
# JSON as Temporal's converters, the `temporal` command and every SDK write it.
JSON_ENCODING = b"json/plain"


def decoded(raw: RawValue, field: str) -> Any:
    """The JSON value a payload holds, or InputError.

    None for no payload, or a null. The InputError names ``field`` and the limit it passes
    (tidemark.limits.decode_json): not JSON, too large, too deep, a number Python cannot
    convert."""
    payload = raw.payload
    encoding = payload.metadata.get("encoding", b"")
    if (not payload.metadata and not payload.data) or encoding == b"binary/null":
        return None
    if encoding != JSON_ENCODING:
        raise InputError(field, f"must be JSON ({JSON_ENCODING.decode()}), not "
                                f"{cut(encoding.decode('utf-8', 'replace'), 40)}")
    return decode_json(payload.data, field)


def signal_text(raw: RawValue, what: str, max_chars: int = REASON_MAX) -> str:
    """A signal's payload as one line of text that the journal can hold.

    A string as it is, any other value as its JSON, an undecodable payload as the line that
    refuses it. Each is cut to ``max_chars`` (tidemark.limits.cut). Empty for no payload. Never
    raises: the signal acts whatever it carries."""
    try:
        value = decoded(raw, what)
    except InputError as e:
        return cut(f"({e})", max_chars)
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return cut(text, max_chars)


def signal_note(raw: RawValue, what: str) -> dict[str, str]:
    """A signal's object payload with each value as a line the journal can hold.

    The payload is ``{"by", "reason"}`` of a kill: a ``by`` as a label, the rest as a reason.
    ``{}`` for anything else."""
    try:
        value = decoded(raw, what)
    except InputError:
        return {}
    if not isinstance(value, dict):
        return {}
    return {cut(str(k), LABEL_MAX): cut(v if isinstance(v, str) else json.dumps(v, sort_keys=True),
                                         LABEL_MAX if k == "by" else REASON_MAX)
            for k, v in value.items()}
