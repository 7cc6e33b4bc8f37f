"""A restart of Postgres under a running store never gives a step a dead connection.

The pool checks each connection before it hands it out, so a connection the restart killed is
never given to a step. A step attempt that starts once Postgres is back runs; the restart costs
at most the attempts that were running while it happened."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from helpers.ledger import ledger_lines, ledger_registry, ledger_step, persisted
from helpers.restart import Restartable, restartable_postgres
from tidemark.approval import unattended
from tidemark.errors import StoreUnavailable
from tidemark.payloads import RunResult
from tidemark.run_step import run_step
from tidemark.store import JournalStore
from workflows.outcome import run_result

TASKS = 8  # steps in flight at once before the restart: as many pooled connections


@pytest.fixture
def restartable() -> Iterator[Restartable]:
    with restartable_postgres() as pg:
        yield pg


def fill_pool(store: JournalStore, tmp_path: Path) -> None:
    """Runs step 1 of TASKS tasks at once, so the pool keeps TASKS connections.

    Each holds a pooled connection for a moment, so that the pool keeps TASKS connections
    afterwards."""
    for i in range(TASKS):
        persisted(store, tmp_path / f"t{i}", f"t{i}", 2, s1={"hold_s": 0.3})
        (tmp_path / f"t{i}").mkdir()
    threads = [threading.Thread(target=run_step, args=(store, ledger_registry(), f"t{i}", 1))
               for i in range(TASKS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(store.step_row(f"t{i}", 1).status == "done" for i in range(TASKS))


@pytest.mark.postgres  # a server of its own, started by a fixture of this module
def test_steps_started_after_a_restart_of_postgres_never_get_a_dead_connection(
        restartable: Restartable, tmp_path: Path) -> None:
    with JournalStore(restartable.url) as store:
        store.migrate()
        unattended(store, "tests")  # its ledger steps are irreversible
        fill_pool(store, tmp_path)
        back = restartable.restart(down_s=0.5)
        failed: dict[str, int] = {}
        first_done: float | None = None
        for i in range(TASKS):
            task = f"t{i}"
            while True:
                try:
                    run_step(store, ledger_registry(), task, 2)
                    break
                except StoreUnavailable:
                    failed[task] = failed.get(task, 0) + 1
                    assert failed[task] <= TASKS + 1, f"{task}: Postgres is back, still failing"
            if first_done is None:
                first_done = time.monotonic()
        assert first_done is not None
        print(f"failed attempts after the restart: {sum(failed.values())} {failed}; first step "
              f"ran {first_done - back:.3f}s after Postgres accepted connections again")
        assert failed == {}, f"attempts given a connection the restart had killed: {failed}"
        assert all(store.step_row(f"t{i}", 2).status == "done" for i in range(TASKS))


# -- under a running worker ------------------------------------------------------------------

STEPS = 4


@pytest.fixture
def db_url(restartable: Restartable) -> str:
    """The database of this module's `store` and `workers`: one the test can restart."""
    return restartable.url


async def run_all(env: WorkflowEnvironment, task_queue: str, tmp_path: Path, prefix: str,
                  steps: int) -> list[WorkflowHandle[Any, RunResult]]:
    """Starts TASKS runs of ``steps`` ledger steps each and waits until all completed."""
    handles = [await env.client.start_workflow(
        "RunPlan", {"task_id": f"{prefix}{i}",
                    "steps": [ledger_step(tmp_path, f"{prefix}{i}-e{n}", hold_s=0.3)
                              for n in range(1, steps + 1)]},
        id=f"tidemark-{prefix}{i}", task_queue=task_queue, result_type=RunResult)
        for i in range(TASKS)]
    assert [(await run_result(h)).state for h in handles] == ["completed"] * TASKS
    return handles


async def failed_attempts(handles: list[WorkflowHandle[Any, RunResult]]) -> dict[str, int]:
    """Failed step attempts per step: the history keeps each activity's last attempt number."""
    failed: dict[str, int] = {}
    for h in handles:
        async for event in h.fetch_history_events():
            started = event.activity_task_started_event_attributes
            if event.HasField("activity_task_started_event_attributes") and started.attempt > 1:
                failed[f"{h.id}/{event.event_id}"] = started.attempt - 1
    return failed


@pytest.mark.temporal
async def test_a_restart_under_a_running_worker_costs_no_attempt_once_postgres_is_back(
        temporal_env: WorkflowEnvironment, restartable: Restartable, store: JournalStore,
        tmp_path: Path, workers: Any, task_queue: str) -> None:
    """A restart under a running worker costs no attempt once Postgres is back.

    The worker's pool holds TASKS connections from a first burst of runs. Postgres restarts while
    they are idle. The next runs' step attempts never get one of them."""
    workers.start()
    await run_all(temporal_env, task_queue, tmp_path, "a", 1)
    back = await asyncio.to_thread(restartable.restart, 0.5)
    handles = await run_all(temporal_env, task_queue, tmp_path, "b", STEPS)
    done = time.monotonic()
    lines = ledger_lines(tmp_path / "ledger")
    assert len(lines) == len(set(lines)) == TASKS * (1 + STEPS)
    failed = await failed_attempts(handles)
    print(f"failed step attempts after the restart: {sum(failed.values())} over {len(failed)} "
          f"of {TASKS * STEPS} steps; the {TASKS} runs completed {done - back:.2f}s after "
          "Postgres accepted connections again")
    assert failed == {}, f"step attempts given a connection the restart had killed: {failed}"
