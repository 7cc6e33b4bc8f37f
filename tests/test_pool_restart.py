"""A restart of Postgres under a running store: the pool checks each connection before it
hands it out, so a connection the restart killed is never given to a step. A step attempt
that starts once Postgres is back runs; the restart costs at most the attempts that were
running while it happened."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.ledger import ledger_registry, persisted
from helpers.restart import Restartable, restartable_postgres
from tidemark.errors import StoreUnavailable
from tidemark.run_step import run_step
from tidemark.store import JournalStore

pytestmark = pytest.mark.postgres  # a server of its own, started in the test's fixture

TASKS = 8  # steps in flight at once before the restart: as many pooled connections


@pytest.fixture
def restartable() -> Iterator[Restartable]:
    with restartable_postgres() as pg:
        yield pg


def fill_pool(store: JournalStore, tmp_path: Path) -> None:
    """Runs step 1 of TASKS tasks at once, each holding a pooled connection for a moment, so
    that the pool keeps TASKS connections afterwards."""
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


def test_steps_started_after_a_restart_of_postgres_never_get_a_dead_connection(
        restartable: Restartable, tmp_path: Path) -> None:
    with JournalStore(restartable.url) as store:
        store.migrate()
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
