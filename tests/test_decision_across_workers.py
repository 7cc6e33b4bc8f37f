"""A person's decision outlives the worker the run waited on.

Recorded while the run waits on one worker process, it is taken by the run when it goes on on
another, after the first was SIGKILLed — real worker processes, the real CLI, the Temporal dev
server and Postgres.

Each plan: two renames (reversible) and a ledger line (irreversible). The ledger counts what
acted; while ``blind`` exists, the ledger's probe cannot tell, so a run that ignored a person's
``resolve`` would end needing a decision instead of completing."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from helpers.ledger import ledger_lines
from tidemark.store import JournalStore
from tools.operate.starter import start_plan
from workflows.outcome import run_result


def plan(tmp_path: Path, task_id: str, **ledger_args: str) -> dict[str, Any]:
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(2):
        (docs / f"d{i}.txt").write_text(str(i))
    return {"task_id": task_id, "steps": [
        *({"action": "fs.rename", "args": {"path": str(docs / f"d{i}.txt"),
                                           "name": f"f{i}.txt"}} for i in range(2)),
        {"action": "ledger.record", "args": {"ledger": str(tmp_path / "ledger"),
                                             "entry": "pay", **ledger_args}}]}


async def tidemark_state(handle: WorkflowHandle[Any, Any]) -> str | None:
    desc = await handle.describe()
    return dict((k.name, v) for k, v in desc.typed_search_attributes).get("TidemarkState")


async def eventually(check: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "it did not get there"
        await asyncio.sleep(0.1)


def renamed(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "docs").iterdir())


async def test_an_approval_recorded_while_the_run_waits_is_taken_on_another_worker(
        cli: Any, temporal_env: WorkflowEnvironment, store: JournalStore, tmp_path: Path,
        workers: Any, task_queue: str) -> None:
    task_id = "dx-a-" + uuid.uuid4().hex[:8]
    doc = {**plan(tmp_path, task_id), "approval": {"required": True}}
    first = workers.start()
    handle = await start_plan(temporal_env.client, doc, task_id, task_queue)

    async def waits() -> bool:
        return await tidemark_state(handle) == "awaiting_approval"
    await eventually(waits)
    first.kill()  # SIGKILL: the worker the run waited on is gone
    first.wait()

    code, out, err = await cli("approve", task_id)
    assert (code, err) == (0, ""), (out, err)
    assert f"the waiting run of tidemark-{task_id} was told" in out
    assert store.current_decision(task_id) is not None
    await asyncio.sleep(2)  # nothing runs the task while no worker does
    assert ledger_lines(tmp_path / "ledger") == []

    workers.start()  # another worker process takes the run up
    result = await asyncio.wait_for(run_result(handle), timeout=90)
    assert (result.state, result.confirmed) == ("completed", 3), result
    assert len(ledger_lines(tmp_path / "ledger")) == 1  # approved once, acted once
    assert renamed(tmp_path) == ["f0.txt", "f1.txt"]


async def test_a_resolve_recorded_while_the_run_waits_is_taken_on_another_worker(
        cli: Any, temporal_env: WorkflowEnvironment, store: JournalStore, tmp_path: Path,
        workers: Any, task_queue: str) -> None:
    task_id = "dx-r-" + uuid.uuid4().hex[:8]
    hold, blind = tmp_path / "hold", tmp_path / "blind"
    hold.write_text("")  # the irreversible step's attempt begins and holds before writing
    blind.write_text("")  # its probe cannot tell: only a person's word settles it
    first = workers.start()
    handle = await start_plan(temporal_env.client,
                              plan(tmp_path, task_id, hold_while=str(hold),
                                   blind_while=str(blind)), task_id, task_queue)

    async def begun() -> bool:
        return store.task_known(task_id) and store.step_row(task_id, 3) is not None
    await eventually(begun)
    first.kill()  # SIGKILL mid-attempt: step 3's intent is journaled, its outcome is not
    first.wait()
    hold.unlink()  # were the step executed again now, its line would land

    # The person looked at the target and records that the step happened. A worker's lock
    # goes with its session; the decision waits until no attempt is live.
    async def resolved() -> bool:
        code, out, err = await cli("resolve", task_id, "--step", "3", "--as", "done",
                                   "--yes", "--note", "seen in the ledger")
        assert code == 0 or "StepBusy" in err, (code, out, err)
        return code == 0
    await eventually(resolved, timeout=30)
    assert await tidemark_state(handle) not in ("completed", "needs_decision")

    workers.start()  # another worker process: the run's attempt is retried there
    result = await asyncio.wait_for(run_result(handle), timeout=90)
    assert (result.state, result.confirmed) == ("completed", 3), result
    row = store.step_row(task_id, 3)
    assert row is not None and (row.status, row.resolved_by) == ("done", "operator"), row
    assert ledger_lines(tmp_path / "ledger") == []  # the person's word: nothing executed it
    assert renamed(tmp_path) == ["f0.txt", "f1.txt"]
