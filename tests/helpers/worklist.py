"""Six tasks in the states the person on call meets, reached by real runs.

They are a completed one, a halted one, one awaiting approval, one that needs a decision (its
irreversible step in doubt, the probe blind), a killed one (`tidemark kill` while it waited) and an
unwound one (`tidemark unwind` while it waited). tests/test_worklist.py checks the Web UI's worklist
query against them; dev/screenshots.py photographs them.

Each task renames two files (reversible) and writes a ledger line (irreversible, the test action
``ledger.record`` of tests/helpers/ledger.py): the worker must be tests/helpers/worker_main.py.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.service import RPCError

from activities.catalog import spec_registry
from helpers.ledger import LedgerRecord
from helpers.steps import crash_at, run_one
from tidemark.needs import Need
from tidemark.plan import load_plan
from tidemark.store import JournalStore
from tools.cli.main import main
from tools.operate.starter import start_plan
from workflows.outcome import run_result

SPECS = spec_registry(LedgerRecord)
# The states, and whether the task then needs a person.
NEEDS_A_PERSON = {"completed": False, "halted": True, "awaiting_approval": True,
                  "needs_decision": True, "killed": True, "unwound": False,
                  "resumed": False}


def plan(task_id: str, root: Path, *, approval: bool) -> dict[str, Any]:
    """Two renames and a ledger line ``Q3 supplier payment``; ``root/blind`` blinds its probe."""
    docs = root / "docs"
    docs.mkdir(parents=True)
    for i in range(2):
        (docs / f"invoice-{i}.txt").write_text(str(i))
    doc: dict[str, Any] = {"task_id": task_id, "steps": [
        *({"action": "fs.rename", "args": {"path": str(docs / f"invoice-{i}.txt"),
                                           "name": f"2026-Q3 invoice {i}.txt"}}
          for i in range(2)),
        {"action": "ledger.record", "args": {"ledger": str(root / "ledger"),
                                             "entry": "Q3 supplier payment",
                                             "blind_while": str(root / "blind")}}]}
    if approval:
        doc["approval"] = {"required": True}
    return doc


async def until(check: Callable[[], Awaitable[bool]], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "the run did not get there"
        await asyncio.sleep(0.1)


async def open_needs(client: Client, task_id: str) -> dict[str, str]:
    """The task's open executions that say they wait for a person: workflow id -> need."""
    out: dict[str, str] = {}
    for wid in (f"tidemark-{task_id}", f"tidemark-needs-{task_id}",
                f"tidemark-unwind-{task_id}"):
        try:
            desc = await client.get_workflow_handle(wid).describe()
        except RPCError:
            continue  # never started
        need = dict((k.name, v) for k, v in desc.typed_search_attributes).get("TidemarkNeeds")
        if desc.status is not None and desc.status.name == "RUNNING" and need not in (
                None, Need.NOTHING):
            out[wid] = need
    return out


async def attribute(client: Client, workflow_id: str, name: str) -> str | None:
    desc = await client.get_workflow_handle(workflow_id).describe()
    return dict((k.name, v) for k, v in desc.typed_search_attributes).get(name)


async def awaiting(client: Client, doc: dict[str, Any], task_queue: str) -> Any:
    """Starts the plan ``doc``; returns its run's handle once the run waits for approval."""
    task_id = doc["task_id"]
    handle = await start_plan(client, doc, task_id, task_queue)

    async def waits() -> bool:
        return await attribute(client, f"tidemark-{task_id}", "TidemarkState") == \
            "awaiting_approval"
    await until(waits)
    return handle


async def _cli(*args: str) -> None:
    assert await asyncio.to_thread(main, list(args)) == 0, args


async def make_tasks(client: Client, store: JournalStore, task_queue: str,
                     root: Path, prefix: str = "wl") -> dict[str, str]:
    """Brings one task to each state of NEEDS_A_PERSON; returns their ids by state.

    ``resumed`` is halted, resumed, approved and completed. A worker
    (tests/helpers/worker_main.py) must poll ``task_queue``."""
    address = client.service_client.config.target_host
    ids = {state: f"{prefix}-{state.replace('_', '-')}-{uuid.uuid4().hex[:6]}"
           for state in NEEDS_A_PERSON}
    docs = {state: plan(ids[state], root / state, approval=state != "completed")
            for state in NEEDS_A_PERSON}

    done = await start_plan(client, docs["completed"], ids["completed"], task_queue)
    assert (await run_result(done)).state == "completed"

    # halted, then resumed and approved: its first run (halted) is superseded by the second
    await awaiting(client, docs["resumed"], task_queue)
    first = client.get_workflow_handle(f"tidemark-{ids['resumed']}")
    await first.signal("halt", "wrong hour")
    assert (await run_result(first)).state == "halted"
    await _cli("resume", ids["resumed"], "--address", address, "--task-queue", task_queue)

    async def resumed_waits() -> bool:
        return await attribute(client, f"tidemark-{ids['resumed']}", "TidemarkState") == \
            "awaiting_approval"
    await until(resumed_waits)
    await _cli("approve", ids["resumed"], "--address", address)
    assert (await run_result(client.get_workflow_handle(f"tidemark-{ids['resumed']}"))).state \
        == "completed"

    await awaiting(client, docs["halted"], task_queue)
    halted = client.get_workflow_handle(f"tidemark-{ids['halted']}")
    await halted.signal("halt", "end of shift")
    assert (await run_result(halted)).state == "halted"

    # the irreversible step's process died after its intent; its probe is blind: the run that
    # resumes it ends needs_decision
    doubt = docs["needs_decision"]
    (root / "needs_decision" / "blind").write_text("")
    doubt.pop("approval")
    store.persist_plan(load_plan(doubt, SPECS))
    for step in (1, 2):
        assert run_one(store.conninfo, doubt["task_id"], step).wait(timeout=60) == 0
    crash_at(store.conninfo, doubt["task_id"], 3, "after_intent")
    resumed = await start_plan(client, {"task_id": doubt["task_id"]}, doubt["task_id"],
                               task_queue)
    assert (await run_result(resumed)).state == "needs_decision"

    await awaiting(client, docs["killed"], task_queue)
    await _cli("kill", ids["killed"], "--yes", "--address", address, "--grace", "5")

    await awaiting(client, docs["unwound"], task_queue)
    await _cli("unwind", ids["unwound"], "--yes", "--address", address,
               "--task-queue", task_queue)
    unwind = client.get_workflow_handle(f"tidemark-unwind-{ids['unwound']}")
    await unwind.result()  # completed: the task is unwound

    await awaiting(client, docs["awaiting_approval"], task_queue)
    return ids
