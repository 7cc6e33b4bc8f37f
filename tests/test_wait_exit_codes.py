"""`--wait` tells the truth in its exit code.

`tidemark resume --wait`, `unwind --wait` and `approve/reject --wait` exit 0 only when the run
ends in the command's success state (resume and approve: completed; unwind: unwound; reject:
stopped), and exit 3 with one line naming the end state otherwise — through the real CLI, a real
worker process, the Temporal dev server and Postgres."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

from temporalio.testing import WorkflowEnvironment

from activities.catalog import spec_registry
from helpers.ledger import LedgerRecord, ledger_lines
from helpers.steps import crash_at, run_one
from tidemark.plan import load_plan
from tidemark.store import JournalStore
from tools.cli.main import EXIT_NOT_DONE
from tools.operate.starter import start_plan
from workflows.outcome import run_result

SPECS = spec_registry(LedgerRecord)


class Task:
    """Two renames (reversible) and a ledger line (irreversible), as in the control matrix."""

    def __init__(self, tmp_path: Path, *, approval: bool = False) -> None:
        self.id = "wx-" + uuid.uuid4().hex[:10]
        self.docs, self.ledger = tmp_path / "docs", tmp_path / "ledger"
        self.docs.mkdir(parents=True)
        for i in range(2):
            (self.docs / f"d{i}.txt").write_text(str(i))
        self.refuse, self.blind = tmp_path / "refuse", tmp_path / "blind"
        self.doc: dict[str, Any] = {"task_id": self.id, "steps": [
            *({"action": "fs.rename", "args": {"path": str(self.docs / f"d{i}.txt"),
                                               "name": f"f{i}.txt"}} for i in range(2)),
            {"action": "ledger.record", "args": {
                "ledger": str(self.ledger), "entry": "pay", "refused_while": str(self.refuse),
                "blind_while": str(self.blind)}}]}
        if approval:
            self.doc["approval"] = {"required": True}


def one_line(err: str, *fragments: str) -> None:
    assert err.count("\n") == 1, err
    for fragment in fragments:
        assert fragment in err, err


async def test_resume_wait_exits_3_when_the_run_ends_failed_and_0_when_it_completes(
        cli: Any, store: JournalStore, tmp_path: Path, workers: Any, task_queue: str) -> None:
    task = Task(tmp_path)
    store.persist_plan(load_plan(task.doc, SPECS))
    store.set_control(task.id, "stopped", "incident", "ops")
    task.refuse.write_text("")  # the target refuses the irreversible step for good
    workers.start()
    code, out, err = await cli("resume", task.id, "--wait", "--task-queue", task_queue)
    assert code == EXIT_NOT_DONE, (code, out, err)
    assert json.loads(out)["state"] == "failed"
    one_line(err, f"tidemark-{task.id} ended failed", "not completed")

    other = Task(tmp_path / "b")
    store.persist_plan(load_plan(other.doc, SPECS))
    code, out, err = await cli("resume", other.id, "--wait", "--task-queue", task_queue)
    assert (code, err) == (0, ""), (out, err)
    assert json.loads(out)["state"] == "completed"


async def test_resume_wait_exits_3_when_the_run_needs_a_decision(
        cli: Any, store: JournalStore, tmp_path: Path, workers: Any, task_queue: str) -> None:
    task = Task(tmp_path)
    task.blind.write_text("")  # the probe of the irreversible step cannot tell
    store.persist_plan(load_plan(task.doc, SPECS))
    for step in (1, 2):
        assert run_one(store.conninfo, task.id, step).wait(timeout=60) == 0
    crash_at(store.conninfo, task.id, 3, "after_intent")
    workers.start()
    code, out, err = await cli("resume", task.id, "--wait", "--task-queue", task_queue)
    assert code == EXIT_NOT_DONE, (code, out, err)
    one_line(err, f"tidemark-{task.id} ended needs_decision")
    assert ledger_lines(task.ledger) == []


async def test_unwind_wait_exits_3_when_a_compensation_is_refused(
        cli: Any, store: JournalStore, temporal_env: WorkflowEnvironment, tmp_path: Path,
        workers: Any, task_queue: str) -> None:
    task = Task(tmp_path)
    workers.start()
    handle = await start_plan(temporal_env.client, task.doc, task.id, task_queue)
    assert (await run_result(handle)).state == "completed"
    (task.docs / "f1.txt").rename(task.docs / "theirs.txt")  # step 2's restore is refused
    code, out, err = await cli("unwind", task.id, "--yes", "--wait", "--task-queue",
                               task_queue)
    assert code == EXIT_NOT_DONE, (code, out, err)
    assert json.loads(out)["state"] == "failed"
    one_line(err, f"tidemark-unwind-{task.id} ended failed", "not unwound")

    (task.docs / "theirs.txt").rename(task.docs / "f1.txt")  # the way is clear again
    code, out, err = await cli("unwind", task.id, "--yes", "--wait", "--task-queue",
                               task_queue)
    assert (code, err) == (0, ""), (out, err)
    assert json.loads(out)["state"] == "unwound"


async def test_approve_wait_exits_3_when_the_run_ends_failed_after_the_decision(
        cli: Any, store: JournalStore, temporal_env: WorkflowEnvironment, tmp_path: Path,
        workers: Any, task_queue: str) -> None:
    task, handle = await awaiting_approval(temporal_env, tmp_path, workers, task_queue)
    task.refuse.write_text("")  # approved, the target refuses the payment
    code, out, err = await cli("approve", task.id, "--wait", "--task-queue", task_queue)
    assert code == EXIT_NOT_DONE, (code, out, err)
    assert out.strip().splitlines()[-1].startswith(
        f"tidemark-{task.id} took the decision and ended failed: failed"), out
    one_line(err, f"tidemark-{task.id} ended failed", "not completed")
    assert (await run_result(handle)).state == "failed"


async def test_approve_wait_waits_for_the_end_and_exits_0_when_it_completes(
        cli: Any, store: JournalStore, temporal_env: WorkflowEnvironment, tmp_path: Path,
        workers: Any, task_queue: str) -> None:
    task, _ = await awaiting_approval(temporal_env, tmp_path, workers, task_queue)
    code, out, err = await cli("approve", task.id, "--wait", "--task-queue", task_queue)
    assert (code, err) == (0, ""), (out, err)
    assert out.strip().splitlines()[-1] == (
        f"tidemark-{task.id} took the decision and ended completed: completed"), out
    assert len(ledger_lines(task.ledger)) == 1


async def test_reject_wait_exits_0_for_a_run_that_ends_stopped(
        cli: Any, store: JournalStore, temporal_env: WorkflowEnvironment, tmp_path: Path,
        workers: Any, task_queue: str) -> None:
    task, _ = await awaiting_approval(temporal_env, tmp_path, workers, task_queue)
    code, out, err = await cli("reject", task.id, "--wait", "--task-queue", task_queue)
    assert (code, err) == (0, ""), (out, err)
    assert "took the decision and ended failed: stopped" in out.strip().splitlines()[-1]
    assert ledger_lines(task.ledger) == []


async def test_json_wait_carries_the_same_exit_code(
        cli: Any, store: JournalStore, temporal_env: WorkflowEnvironment, tmp_path: Path,
        workers: Any, task_queue: str) -> None:
    task, _ = await awaiting_approval(temporal_env, tmp_path, workers, task_queue)
    task.refuse.write_text("")
    code, out, err = await cli("approve", task.id, "--wait", "--json", "--task-queue",
                               task_queue)
    assert code == EXIT_NOT_DONE, (code, out, err)
    stands = json.loads(out)["run"]
    assert (stands["open"], stands["state"]) == (False, "failed")
    one_line(err, f"tidemark-{task.id} ended failed")


async def awaiting_approval(temporal_env: WorkflowEnvironment, tmp_path: Path, workers: Any,
                            task_queue: str) -> tuple[Task, Any]:
    """A task with an irreversible step, its run started and waiting at the boundary."""
    task = Task(tmp_path, approval=True)
    workers.start()
    handle = await start_plan(temporal_env.client, task.doc, task.id, task_queue)
    await wait_for_boundary(temporal_env, task.id)
    return task, handle


async def wait_for_boundary(temporal_env: WorkflowEnvironment, task_id: str) -> None:
    handle = temporal_env.client.get_workflow_handle(f"tidemark-{task_id}")
    deadline = time.monotonic() + 60
    while True:
        desc = await handle.describe()
        attrs = dict((k.name, v) for k, v in desc.typed_search_attributes)
        if attrs.get("TidemarkState") == "awaiting_approval":
            return
        assert time.monotonic() < deadline, attrs
        await asyncio.sleep(0.1)
