"""A stop names the command that lifts it.

The task's own stop `tidemark release T`, a series' `release --series S`, the global one
`release --all`. Releasing a task by name does not lift a stop of its series or of every task, so
a hint naming the task would send the person on call round in a circle."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from activities.steps import StepActivities
from helpers.ledger import ledger_registry, persisted
from tidemark.errors import TaskStopped
from tidemark.needs import Act
from tidemark.needs import command as render
from tidemark.needs_journal import entry_for
from tidemark.payloads import PrepareInput
from tidemark.run_step import run_step
from tidemark.store import JournalStore
from tidemark.words import ControlState


@pytest.mark.parametrize(("scope", "command"), [
    ("t", "tidemark release t"),
    ("*", "tidemark release --all"),
    ("series:nightly", "tidemark release --series nightly"),
    (None, "tidemark release t"),
])
def test_each_scope_of_a_stop_has_its_own_release(scope: str | None, command: str) -> None:
    assert render(Act.RELEASE, "t", scope=scope) == command
    assert f"`{command}`" in str(TaskStopped("t", "why", scope))


@pytest.mark.parametrize(("scope", "command"), [
    ("t", "tidemark release t"),
    ("*", "tidemark release --all"),
])
def test_a_step_that_meets_a_stop_names_the_release_of_that_stop(
        store: JournalStore, tmp_path: Path, scope: str, command: str,
        step_threads: ThreadPoolExecutor) -> None:
    persisted(store, tmp_path, "t", 1)
    store.set_control(scope, ControlState.STOPPED, "incident", "ops@example")
    with pytest.raises(TaskStopped) as stopped:
        run_step(store, ledger_registry(), "t", 1)
    assert f"`{command}`" in str(stopped.value)
    activities = StepActivities(store, ledger_registry(), executor=step_threads)
    prepared = ActivityEnvironment().run(activities.prepare,
                                         PrepareInput(document={"task_id": "t"}))
    assert prepared.stopped == "incident" and prepared.release == command


@pytest.mark.parametrize("state", [ControlState.STOPPED, ControlState.KILLED])
def test_the_inbox_names_the_release_of_a_series_stop(store: JournalStore, tmp_path: Path,
                                                      state: ControlState) -> None:
    """The inbox names `release --series S` for a run of a stopped or killed series.

    Such a run waits in the inbox for `release --series S`:
    releasing the run by name would leave the series' stop holding it."""
    store.declare_series("nightly", "ops", "ops")
    persisted(store, tmp_path, "nightly-7", 1)
    assert store.admit_to_series("nightly-7", "nightly", lambda runs: []) == (None, [])
    store.set_control("series:nightly", state, "incident", "ops@example")
    entry = entry_for(store, "nightly-7")
    assert entry is not None and entry.command == "tidemark release --series nightly", entry
