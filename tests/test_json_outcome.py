"""`--json` of every command that changes state: one shape (tools/operate/outcome.py).

start, stop, release, resume, unwind, approve, reject, kill, resolve and `series declare` each
print {command, task, committed, run, next}, ``next`` being {state, need, command, line} from
tidemark.needs; through the real CLI, a real worker process, Temporal and Postgres."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

from temporalio.testing import WorkflowEnvironment

from activities.catalog import spec_registry
from helpers.ledger import LedgerRecord
from helpers.steps import crash_at
from tidemark.needs import Act, command
from tidemark.plan import load_plan
from tidemark.store import JournalStore
from tools.operate.starter import start_plan

SPECS = spec_registry(LedgerRecord)
KEYS = {"command", "task", "committed", "run", "next"}
NEXT_KEYS = {"state", "need", "command", "line"}


def renames(root: Path, task_id: str, n: int = 2) -> dict[str, Any]:
    root.mkdir(parents=True)
    for i in range(n):
        (root / f"d{i}.txt").write_text(str(i))
    return {"task_id": task_id, "steps": [
        {"action": "fs.rename", "args": {"path": str(root / f"d{i}.txt"), "name": f"f{i}.txt"}}
        for i in range(n)]}


def asking(root: Path, task_id: str) -> dict[str, Any]:
    """Two renames and a ledger line, the plan asking for approval before the ledger line."""
    doc = renames(root, task_id)
    doc["steps"].append({"action": "ledger.record",
                         "args": {"ledger": str(root / "ledger"), "entry": "pay"}})
    doc["approval"] = {"required": True}
    return doc


async def waits(temporal_env: WorkflowEnvironment, task_id: str) -> None:
    handle = temporal_env.client.get_workflow_handle(f"tidemark-{task_id}")
    deadline = time.monotonic() + 60
    while True:
        attrs = {k.name: v for k, v in (await handle.describe()).typed_search_attributes}
        if attrs.get("TidemarkState") == "awaiting_approval":
            return
        assert time.monotonic() < deadline, attrs
        await asyncio.sleep(0.1)


def shape(verb: str, task: str, code: int, out: str, err: str) -> dict[str, Any]:
    """The command's --json object, held to the one shape."""
    assert code == 0, (verb, code, out, err)
    data = json.loads(out)
    assert set(data) == KEYS, (verb, data)
    assert (data["command"], data["task"]) == (verb, task), data
    assert isinstance(data["committed"], dict) and data["committed"], data
    assert set(data["next"]) == NEXT_KEYS, data["next"]
    assert data["next"]["line"], data
    return data


async def test_every_command_that_changes_state_prints_one_json_shape(
        cli: Any, store: JournalStore, temporal_env: WorkflowEnvironment, tmp_path: Path,
        workers: Any, task_queue: str, migrated_url: str) -> None:
    workers.start()
    q = ["--task-queue", task_queue]
    tag = uuid.uuid4().hex[:8]
    r, a, b, c = (f"j{x}-{tag}" for x in "rabc")

    plan = tmp_path / "r.json"
    plan.write_text(json.dumps(renames(tmp_path / "r", r)))
    done = shape("start", r, *await cli("start", str(plan), "--wait", "--json", *q))
    assert done["run"]["state"] == "completed" and done["next"]["need"] == "nothing"
    assert done["committed"]["workflow_id"] == f"tidemark-{r}"

    for task in (a, b):
        await start_plan(temporal_env.client, asking(tmp_path / task, task), task, task_queue)
        await waits(temporal_env, task)
    approved = shape("approve", a, *await cli("approve", a, "--wait", "--json", *q))
    assert approved["committed"]["decision"] == "approve"
    assert approved["run"]["state"] == "completed" and approved["next"]["command"] is None
    rejected = shape("reject", b, *await cli("reject", b, "--json", *q))
    assert rejected["committed"]["decision"] == "reject"
    assert rejected["next"]["command"] == command(Act.UNWIND, b)

    stopped = shape("stop", a, *await cli("stop", a, "--reason", "audit", "--json"))
    assert stopped["committed"] == {"control": "stopped", "scope": a, "reason": "audit",
                                    "by": stopped["committed"]["by"]}
    shape("release", a, *await cli("release", a, "--json"))
    resumed = shape("resume", r, *await cli("resume", r, "--wait", "--json", *q))
    assert resumed["run"]["executed"] == 0 and resumed["committed"]["released"] is False
    unwound = shape("unwind", r, *await cli("unwind", r, "--yes", "--wait", "--json", *q))
    assert unwound["run"]["state"] == "unwound" and unwound["committed"]["undo_steps"] == [2, 1]

    killed = shape("kill", b, *await cli("kill", b, "--grace", "0", "--json"))
    assert [x["layer"] for x in killed["committed"]["layers"]] == [1, 2, 3, 4]
    assert (killed["next"]["need"], killed["next"]["command"]) == (
        "killed", command(Act.RELEASE, b))

    doubt = {"task_id": c, "steps": [{"action": "ledger.record", "args": {
        "ledger": str(tmp_path / "c-ledger"), "entry": "e", "blind_while": str(tmp_path)}}]}
    store.persist_plan(load_plan(doubt, SPECS))
    crash_at(migrated_url, c, 1, "after_intent")
    resolved = shape("resolve", c, *await cli("resolve", c, "--step", "1", "--as", "done",
                                              "--yes", "--json"))
    assert resolved["committed"]["as"] == "done"

    series = f"s-{tag}"
    declared = shape("series declare", f"series:{series}",
                     *await cli("series", "declare", series, "--json"))
    assert declared["next"]["need"] == "nothing"
    held = shape("stop", f"series:{series}", *await cli("stop", "--series", series, "--json"))
    assert held["next"]["command"] == command(Act.RELEASE, scope=f"series:{series}")
    shape("release", f"series:{series}", *await cli("release", "--series", series, "--json"))
