"""One word per state, the same on every surface.

These are cases 6 and 7 of "Hostile input and the emergency controls". A task's state is said in
one word (tidemark.words.TaskState) by `tidemark status` and its JSON, by `tidemark inbox` (an
entry's ``why``), by its Web UI worklist row (TidemarkState) and by the state table of
docs/operate.md; the inbox lists every task the worklist shows, with the one command that works
now and, where a person must put something right first, what; a command that changes a task ends
with what happens next. Real CLI, worker, dev server and Postgres."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

from temporalio.testing import WorkflowEnvironment
from test_control_matrix import Task, verification_failed

from helpers.steps import crash_at, run_one
from helpers.worklist import SPECS, attribute, awaiting, plan, until
from tidemark.needs import Need, need_of
from tidemark.needs_journal import NEED_OF_WHY
from tidemark.plan import load_plan
from tidemark.store import JournalStore
from tidemark.words import TaskState
from tools.operate.starter import start_plan
from workflows.outcome import run_result

OPERATE = Path(__file__).parent.parent / "docs" / "operate.md"
ROW = re.compile(r"^\| `(\w+)` \|")


def documented_states() -> set[str]:
    """The first column of docs/operate.md's table of a task's states."""
    text = OPERATE.read_text()
    table = text[text.index("| state | meaning | what a person does |"):]
    table = table[:table.index("\n\n")]
    return {m.group(1) for line in table.splitlines() if (m := ROW.match(line))}


def test_the_docs_state_table_lists_every_state_word_once() -> None:
    assert documented_states() == {str(s) for s in TaskState}


def test_every_inbox_why_is_a_state_word_with_a_need() -> None:
    assert set(NEED_OF_WHY) <= set(TaskState)
    for state in TaskState:  # every state a run or a task is in says what it needs
        assert isinstance(need_of(state), Need)


async def said(cli: Any, temporal_env: WorkflowEnvironment, task: str) -> dict[str, Any]:
    """What each surface says of ``task``.

    It is status --json's state, the inbox entry (its why, need, command and what to put right
    first) and its worklist row's TidemarkState."""
    code, out, err = await cli("status", task, "--json")
    assert code == 0, err
    state = json.loads(out)["state"]
    code, out, err = await cli("inbox", "--json")
    entry = {e["task_id"]: e for e in json.loads(out)}.get(task)
    row = await attribute(temporal_env.client, f"tidemark-needs-{task}", "TidemarkState")
    return {"status": state, "entry": entry, "row": row}


async def test_case7_a_halted_task_is_halted_in_status_the_inbox_and_its_row(
        temporal_env: WorkflowEnvironment, store: JournalStore, workers: Any, task_queue: str,
        tmp_path: Path, cli: Any) -> None:
    workers.start()
    task = f"v7h-{uuid.uuid4().hex[:6]}"
    handle = await awaiting(temporal_env.client, plan(task, tmp_path, approval=True), task_queue)
    await handle.signal("halt", "end of shift")
    assert (await run_result(handle)).state == "halted"
    seen = await said(cli, temporal_env, task)
    assert (seen["status"], seen["entry"]["why"], seen["row"]) == ("halted",) * 3, seen
    assert seen["status"] in documented_states()


async def test_case7_resolve_ends_with_what_happens_next_and_the_inbox_agrees(
        temporal_env: WorkflowEnvironment, store: JournalStore, workers: Any, task_queue: str,
        tmp_path: Path, cli: Any) -> None:
    workers.start()
    task = f"v7r-{uuid.uuid4().hex[:6]}"
    doc = plan(task, tmp_path, approval=False)
    (tmp_path / "blind").write_text("")  # the irreversible step's probe cannot tell
    store.persist_plan(load_plan(doc, SPECS))
    for step in (1, 2):
        assert run_one(store.conninfo, task, step).wait(timeout=60) == 0
    crash_at(store.conninfo, task, 3, "after_intent")
    resumed = await start_plan(temporal_env.client, {"task_id": task}, task, task_queue)
    assert (await run_result(resumed)).state == "needs_decision"
    code, out, err = await cli("resolve", task, "--step", "3", "--as", "absent", "--yes")
    assert code == 0 and json.loads(out)["as"] == "absent"
    assert err.startswith("next: ") and f"`tidemark resume {task}`" in err, err
    seen = await said(cli, temporal_env, task)
    assert seen["status"] == seen["entry"]["why"] == "in_doubt", seen
    assert seen["entry"]["command"] == f"tidemark resume {task}", seen


async def test_case7_a_failed_verification_says_what_to_put_right_before_the_resume(
        temporal_env: WorkflowEnvironment, store: JournalStore, workers: Any, task_queue: str,
        tmp_path: Path, cli: Any) -> None:
    task = Task(tmp_path)
    await verification_failed(task, store, temporal_env, workers, task_queue)
    seen = await said(cli, temporal_env, task.id)
    assert seen["status"] == seen["entry"]["why"] == "verification_failed", seen
    entry = seen["entry"]
    assert entry["command"] == f"tidemark resume {task.id}"
    assert entry["fix"].startswith("put back what the gate found changed"), entry
    code, out, _ = await cli("inbox")
    assert code == 0 and "  first     put back what the gate found changed" in out, out


async def test_case6_a_plan_gate_that_refuses_at_the_start_is_in_the_inbox_and_status(
        temporal_env: WorkflowEnvironment, store: JournalStore, workers: Any, task_queue: str,
        tmp_path: Path, cli: Any) -> None:
    workers.start()
    task = f"v6g-{uuid.uuid4().hex[:6]}"
    outside = "/proc/tidemark-outside-the-roots"  # not under TIDEMARK_FS_ROOTS
    doc = {"task_id": task, "steps": [{"action": "fs.rename", "args": {
        "path": f"{outside}/a.txt", "name": "b.txt"}}]}
    handle = await start_plan(temporal_env.client, doc, task, task_queue)
    assert (await run_result(handle)).state == "precondition_failed"
    assert store.task_known(task)  # its plan is stored: the task exists and waits

    async def row_open() -> bool:
        return await attribute(temporal_env.client, f"tidemark-needs-{task}",
                               "TidemarkState") is not None
    await until(row_open)
    seen = await said(cli, temporal_env, task)
    assert seen["status"] == seen["entry"]["why"] == seen["row"] == "precondition_failed", seen
    assert seen["entry"]["command"] == f"tidemark resume {task}"
    assert "outside the directories fs.rename may touch" in seen["entry"]["fix"], seen
    code, out, _ = await cli("status", task)
    assert code == 0 and "First put right what its gate refused" in out.splitlines()[0], out


async def test_case6_a_plan_refused_before_it_is_stored_is_in_the_inbox_and_status_says_so(
        temporal_env: WorkflowEnvironment, store: JournalStore, workers: Any, task_queue: str,
        cli: Any) -> None:
    workers.start()
    task = f"v6r-{uuid.uuid4().hex[:6]}"
    doc = {"task_id": task, "steps": [{"action": "fs.frobnicate", "args": {}}]}
    handle = await start_plan(temporal_env.client, doc, task, task_queue)
    assert (await run_result(handle)).state == "failed"
    assert not store.task_known(task)

    async def row_open() -> bool:
        return await attribute(temporal_env.client, f"tidemark-needs-{task}",
                               "TidemarkState") is not None
    await until(row_open)
    code, out, _ = await cli("inbox", "--json")
    entry = {e["task_id"]: e for e in json.loads(out)}.get(task)
    assert entry is not None, out  # the worklist shows it: so does the inbox
    assert entry["why"] == "failed" and "`tidemark status" not in entry["detail"], entry
    assert entry["command"] == "tidemark plan check PLAN" and "correct the plan" in entry["fix"]
    code, out, err = await cli("status", task)
    assert code == 1 and "UnknownTask" in err and "refused before its plan was stored" in err
    assert "unknown action 'fs.frobnicate'" in err and err.count("\n") == 1, err
