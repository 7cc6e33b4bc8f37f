"""Each error class declares what it does to a run (tidemark/errors.py).

The state the run ends in, whether another attempt may help, and how the metrics name a stop. The
workflow and the activities read those declarations; no table keyed by class names stands beside
them."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.steps import StepActivities
from helpers.ledger import ledger_registry, persisted
from tidemark import errors, metrics
from tidemark.errors import END_STATES, TidemarkError
from tidemark.payloads import StepBatchInput, StepInput
from tidemark.store import JournalStore
from tidemark.words import ControlState, TaskState
from workflows.shared import STEP_RETRY, end_state_of

# What a run ends in for each error a step may raise that another attempt cannot fix: the
# promises of the end-state table of docs/operate.md, stated once more here as the specification.
SPECIFIED = {
    "NeedsDecision": "needs_decision", "PreconditionFailed": "precondition_failed",
    "TaskStopped": "stopped", "TaskUnwound": "unwound", "Unauthorized": "stopped",
    "StepFailed": "failed", "PlanChanged": "failed", "PlanError": "failed",
    "InputError": "failed",
    "UnknownTask": "failed", "JournalMismatch": "failed", "InvariantViolation": "failed",
    "Refused": "failed", "ActionNotConfigured": "failed", "ActionUnavailable": "failed",
    "NotStopped": "stopped",
    "SeriesBlocked": "blocked", "TaskKilled": "killed", "PartlyUnwound": "partly_unwound",
    "ApprovalRequired": "awaiting_approval",
}


def error_classes() -> list[type[TidemarkError]]:
    found, todo = [], [TidemarkError]
    while todo:
        cls = todo.pop()
        subs = [c for c in cls.__subclasses__() if c.__module__ == errors.__name__]
        found += subs
        todo += subs
    return found


def test_each_error_that_ends_a_run_declares_the_state_it_ends_in() -> None:
    declared = {c.__name__: c.end_state for c in error_classes() if c.end_state is not None}
    assert declared == SPECIFIED
    assert END_STATES == SPECIFIED


@pytest.mark.parametrize("name", sorted(SPECIFIED))
def test_the_workflow_ends_a_run_in_the_state_the_error_declares(name: str) -> None:
    error = ApplicationError("refused", type=name, non_retryable=True)
    state, detail = end_state_of(error, 3)
    assert (state, detail["type"], detail["step"]) == (SPECIFIED[name], name, 3)


@pytest.mark.parametrize("name", ["StoreUnavailable", "StepBusy", "TargetUnavailable",
                                  "ConfigError", "ValueError"])
def test_an_error_that_declares_no_end_state_is_not_an_end_of_the_run(name: str) -> None:
    error = ApplicationError("boom", type=name)
    with pytest.raises(ApplicationError):
        end_state_of(error, 1)


def test_the_retry_policy_gives_up_on_exactly_the_errors_that_end_a_run() -> None:
    """The retry policy gives up on exactly the errors that end a run.

    The policy is part of every activity RunPlan schedules: its list must be the same on every
    worker, whatever else a worker imported."""
    assert STEP_RETRY.non_retryable_error_types == sorted(SPECIFIED)
    retryable = {c.__name__ for c in error_classes() if c.retryable}
    assert retryable == {"StoreUnavailable", "StepBusy", "TargetUnavailable", "NotSent",
                         "Throttled"}
    assert not retryable & set(STEP_RETRY.non_retryable_error_types or [])


def test_only_errors_that_stop_for_a_person_name_a_stop_reason() -> None:
    reasons = {c.__name__: c.stop_reason for c in error_classes() if c.stop_reason is not None}
    assert reasons == {"TaskStopped": "stopped", "NeedsDecision": "needs_decision",
                       "PreconditionFailed": "precondition_failed",
                       "Unauthorized": "unauthorized"}


FAMILIES = (errors.SetupError, errors.JournalError, errors.ControlError, errors.ActionError)


def defined_errors() -> list[type[BaseException]]:
    """Every exception class tidemark/errors.py defines (not those it imports)."""
    return [v for v in vars(errors).values() if isinstance(v, type)
            and issubclass(v, BaseException) and v.__module__ == errors.__name__]


def drawn_tree(doc: str) -> dict[str, str | None]:
    """Each class's parent, as the module docstring draws the hierarchy.

    Class name -> its parent's name: one class a line, four more spaces for each level down, a
    family's line ending in what it means."""
    lines = doc.splitlines()
    first = lines.index("    TidemarkError")
    parents: dict[str, str | None] = {}
    trail: list[str] = []
    for line in lines[first:]:
        if not line.strip():
            break
        depth = (len(line) - len(line.lstrip()) - 4) // 4
        name = line.strip().split(":")[0]
        assert depth <= len(trail) and name.isidentifier(), line
        trail[depth:] = [name]
        parents[name] = trail[depth - 1] if depth else None
    return parents


def test_every_error_belongs_to_exactly_one_family() -> None:
    assert [c for c in defined_errors() if c.__bases__ == (TidemarkError,)] == list(FAMILIES)
    for cls in defined_errors():
        if cls is TidemarkError or cls in FAMILIES:
            continue
        assert len([f for f in FAMILIES if issubclass(cls, f)]) == 1, cls


def test_the_module_docstring_draws_exactly_the_classes_defined() -> None:
    assert errors.__doc__ is not None
    actual = {c.__name__: (c.__base__.__name__ if c is not TidemarkError else None)
              for c in defined_errors()}
    assert drawn_tree(errors.__doc__) == actual


def test_a_drawing_that_left_the_classes_is_caught() -> None:
    assert errors.__doc__ is not None
    missing = drawn_tree(errors.__doc__.replace("            NotAuthorized\n", ""))
    assert "NotAuthorized" not in missing and missing["DecisionRefused"] == "JournalError"
    misplaced = drawn_tree(errors.__doc__.replace("            StepFailed",
                                                  "                StepFailed"))
    assert misplaced["StepFailed"] == "TargetUnavailable"


def test_an_error_that_would_end_a_run_and_be_retried_is_refused_where_it_is_declared() -> None:
    with pytest.raises(TypeError, match="cannot be retryable"):
        type("Confused", (TidemarkError,), {"end_state": TaskState.FAILED, "retryable": True})
    with pytest.raises(TypeError, match="needs an end state"):
        type("Unending", (TidemarkError,), {"stop_reason": "stopped"})


def test_an_error_declared_outside_the_module_does_not_change_what_the_workflow_knows() -> None:
    class Elsewhere(errors.Refused):
        pass

    assert Elsewhere.end_state == TaskState.FAILED
    assert "Elsewhere" not in END_STATES
    assert STEP_RETRY.non_retryable_error_types == sorted(SPECIFIED)


def test_errors_and_words_import_nothing_but_the_standard_library() -> None:
    """Workflow code imports tidemark.errors: it must stay free of I/O (no store, no SDK).

    It renders its advice through tidemark.needs, which imports only the words."""
    code = ("import json, sys; before = set(sys.modules); import tidemark.errors; "
            "print(json.dumps(sorted(m for m in set(sys.modules) - before "
            "if m.split('.')[0] not in sys.stdlib_module_names)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert set(json.loads(out.stdout)) == {"tidemark", "tidemark.errors", "tidemark.needs",
                                           "tidemark.words"}


class Counted(metrics.Metrics):
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, str]]] = []

    def count(self, name: str, labels: Any) -> None:
        if name == metrics.TASKS_STOPPED:
            self.seen.append((name, dict(labels)))


@pytest.fixture
def counted() -> Any:
    sink = Counted()
    previous = metrics.install(sink)
    yield sink
    metrics.install(previous)


def test_a_step_that_meets_a_stop_is_counted_under_its_errors_stop_reason(
        store: JournalStore, tmp_path: Path, counted: Counted,
        step_threads: ThreadPoolExecutor) -> None:
    persisted(store, tmp_path, "t", 2)
    store.set_control("t", ControlState.STOPPED, "looks wrong", "ops@example")
    steps = StepActivities(store, ledger_registry(), executor=step_threads)
    env = ActivityEnvironment()
    with pytest.raises(ApplicationError) as one:
        asyncio.run(env.run(steps.run_step, StepInput(task_id="t", step=1)))
    with pytest.raises(ApplicationError) as first_of_batch:
        env.run(steps.run_steps, StepBatchInput(task_id="t", first=1, last=2, max_steps=2,
                                                budget_s=5.0))
    assert (one.value.type, first_of_batch.value.type) == ("TaskStopped", "TaskStopped")
    assert one.value.non_retryable
    assert counted.seen == [(metrics.TASKS_STOPPED, {"reason": "stopped"})] * 2


def test_a_stop_met_inside_a_batch_is_counted_under_its_errors_stop_reason(
        store: JournalStore, tmp_path: Path, counted: Counted,
        step_threads: ThreadPoolExecutor) -> None:
    """The batch ends at the step that meets the stop and returns the error; it counts the same."""
    persisted(store, tmp_path, "t", 2, s1={"hold_s": 1.0})
    steps = StepActivities(store, ledger_registry(), executor=step_threads)
    with JournalStore(store.conninfo) as other:
        stopper = threading.Timer(0.3, other.set_control,
                                  ("t", ControlState.STOPPED, "mid-batch", "ops@example"))
        stopper.start()
        batch = ActivityEnvironment().run(
            steps.run_steps, StepBatchInput(task_id="t", first=1, last=2, max_steps=2,
                                            budget_s=5.0))
        stopper.join()
    assert batch.ran == 1 and batch.error is not None
    assert (batch.error.type, batch.error.non_retryable) == ("TaskStopped", True)
    assert counted.seen == [(metrics.TASKS_STOPPED, {"reason": "stopped"})]
