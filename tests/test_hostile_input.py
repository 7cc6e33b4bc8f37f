"""Hostile input where it enters, and the emergency controls whatever the journal holds.

The controls work whatever the journal and the worklist hold. Through the real CLI, a real worker
process, the Temporal dev server and Postgres.

The numbered cases of the issue "Hostile input and the emergency controls":
1. a task id with a NUL (or another character the journal cannot hold) opens no worklist row,
   and a row under such an id (opened by an earlier version) breaks neither `stop --all`,
   `release --all` nor `kill --all`: each goes through every row, skips that one with one line,
   and kill prints its four layers;
2. a reason over the journal's 2,000 characters is refused by `stop` and `kill` with one line,
   exit 2, nothing written; a `halt` signal with such a reason, or with any payload at all,
   halts, its reason cut to size;
3. JSON Python cannot decode (deep nesting, a huge integer) is one line from `tidemark plan
   check` and ends a started RunPlan at once, never leaves it Running.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.common import RawValue
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from helpers.runs import ended_in_one_go, signal_handled
from helpers.worklist import awaiting, plan
from tidemark.limits import REASON_MAX
from tidemark.store import JournalStore
from tools.cli.main import main
from workflows.outcome import run_result

JSON = {"encoding": b"json/plain"}
# Three inputs no version of Python's json decodes (RecursionError, ValueError) and one that is
# not JSON at all: each ends the run at once, one line naming the limit.
UNDECODABLE = {
    "deep": (b"[" * 50_000 + b"]" * 50_000, "input: nested too deeply; at most 32 levels"),
    "huge integer": (b'{"steps": [{"action": "stripe.payment_intent", "args": {"amount": '
                     + b"9" * 5000 + b', "currency": "eur"}}]}',
                     "input: an integer of 5,000 digits; at most 30"),
    "not UTF-8": (b'{"task_id": "\xff"}', "input: not UTF-8 (byte 14)"),
}


def one_line(err: str) -> str:
    """The one line a refusal prints (and that it is one)."""
    assert err.count("\n") == 1 and err.startswith("tidemark: "), err
    return err


async def open_row(client: Client, workflow_id: str, task_queue: str) -> None:
    """A worklist row as an earlier version opened it for any task id the input named."""
    await client.start_workflow("NeedsPerson", {"task_id": workflow_id, "state": "failed",
                                                "need": "failed", "sentence": "refused"},
                                id=workflow_id, task_queue=task_queue)


async def test_case1_a_task_id_the_journal_cannot_hold_breaks_no_emergency_control(
        temporal_env: WorkflowEnvironment, store: JournalStore, workers: Any, task_queue: str,
        tmp_path: Path, cli: Any) -> None:
    client = temporal_env.client
    workers.start()
    tag = uuid.uuid4().hex[:6]
    # A plan naming a task id with a NUL, started under a well-formed workflow id: it is refused
    # before anything is stored, and opens no row under the id it named.
    named = f"h1-{tag}\x00x"
    refused = await client.start_workflow(
        "RunPlan", {"task_id": named, "steps": [{"action": "fs.rename", "args": {
            "path": str(tmp_path / "a"), "name": "b"}}]},
        id=f"tidemark-h1-{tag}", task_queue=task_queue)
    result = await run_result(refused)
    assert result.state == "failed", result
    # Rows an earlier version opened under ids no task can have: a NUL, a control character,
    # an id longer than the journal holds.
    bad = [f"tidemark-needs-h1-{tag}\x00a", f"tidemark-needs-h1-{tag}\x01b",
           f"tidemark-needs-h1-{tag}" + "c" * 300]
    for workflow_id in bad:
        await open_row(client, workflow_id, task_queue)
    try:
        # and a task of the journal that waits at its boundary: the controls reach it all the same
        doc = plan(f"h1-ok-{tag}", tmp_path / "ok", approval=True)
        waiting = await awaiting(client, doc, task_queue)

        for command in (["stop", "--all", "--reason", "incident"], ["release", "--all"]):
            code, out, err = await cli(*command)
            assert code == 0, (command, err)
            skipped = [line for line in err.splitlines() if line.startswith("tidemark: skipped")]
            assert len(skipped) == len(bad) and all("names no task" in line for line in skipped)
        code, out, err = await cli("kill", "--all", "--yes", "--grace", "0", "--reason", "incident")
        layers = [line for line in out.splitlines() if " layer " in line]
        assert [line.split(":")[0] for line in layers] == [
            "ok   layer 1", "ok   layer 2", "ok   layer 3", "ok   layer 4"], out
        assert code == 0 and f"tidemark-h1-ok-{tag}" in out, (out, err)
        assert (await run_result(waiting)).state == "killed"
        for workflow_id in bad:  # rows act on nothing: a kill leaves them, as it leaves every row
            assert (await client.get_workflow_handle(workflow_id).describe()).status == \
                WorkflowExecutionStatus.RUNNING
    finally:  # the dev server is shared by the session's tests
        for workflow_id in bad:
            await client.get_workflow_handle(workflow_id).terminate("test over")
    assert not store.task_known(f"h1-{tag}")  # the refused start stored nothing
    assert result.error["type"] == "InputError", result  # refused where it entered, one line
    assert result.error["message"].startswith("task_id: contains U+0000 (a control character)")
    with pytest.raises(RPCError):  # and it opened no row under the id it named
        await client.get_workflow_handle(f"tidemark-needs-{named}").describe()


async def waiting_run(temporal_env: WorkflowEnvironment, workers: Any, task_queue: str,
                      root: Path) -> tuple[str, Any]:
    """A task whose run waits at its boundary for approval: its id and the run's handle."""
    workers.start()
    task = f"h2-{uuid.uuid4().hex[:6]}"
    return task, await awaiting(temporal_env.client, plan(task, root, approval=True),
                                task_queue)


async def test_case2_a_reason_over_the_journal_limit_is_refused_before_anything_is_written(
        temporal_env: WorkflowEnvironment, store: JournalStore, workers: Any, task_queue: str,
        tmp_path: Path, cli: Any) -> None:
    task, handle = await waiting_run(temporal_env, workers, task_queue, tmp_path)
    long = "r" * (REASON_MAX + 1)
    for command in ("stop", "kill"):
        code, out, err = await cli(command, task, "--reason", long)
        assert (code, out) == (2, ""), (command, err)
        assert one_line(err).startswith("tidemark: --reason: 2,001 characters; at most 2,000")
    assert store.stop_state(task) is None  # nothing written: no stop, no kill
    desc = await handle.describe()
    assert desc.status == WorkflowExecutionStatus.RUNNING  # and the run was not terminated
    code, _, err = await cli("stop", task, "--by", "b" * 201)
    assert code == 2 and "--by: 201 characters; at most 200" in one_line(err)

    # A halt signal carries what its sender wrote: too long, it halts all the same.
    await handle.signal("halt", "h" * 5000)
    result = await run_result(handle)
    assert result.state == "halted", result
    stop = store.stop_state(task)
    assert stop is not None and len(stop["reason"]) == REASON_MAX


@pytest.mark.parametrize("payload", [
    pytest.param(RawValue(Payload(metadata=JSON, data=b"[" * 50_000 + b"]" * 50_000)),
                 id="undecodable"),
    pytest.param({"reason": "not a string"}, id="an object"),
    pytest.param(RawValue(Payload(metadata={"encoding": b"binary/plain"}, data=b"\x00\x01")),
                 id="not JSON"),
])
async def test_case2_a_halt_with_any_payload_halts(
        temporal_env: WorkflowEnvironment, store: JournalStore, workers: Any, task_queue: str,
        tmp_path: Path, payload: Any) -> None:
    task, handle = await waiting_run(temporal_env, workers, task_queue, tmp_path)
    await handle.signal("halt", payload)
    await signal_handled(handle, "halt")
    assert (await handle.query("status"))["halt_requested"], "the run did not take the halt"
    result = await asyncio.wait_for(run_result(handle), 60)
    assert result.state == "halted", result
    stop = store.stop_state(task)
    assert stop is not None and "\n" not in stop["reason"] and 0 < len(stop["reason"]) \
        <= REASON_MAX


def test_case3_plan_check_refuses_json_python_cannot_decode_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name, (data, said) in UNDECODABLE.items():
        path = tmp_path / f"{name}.json"
        path.write_bytes(data)
        assert main(["plan", "check", str(path)]) == 2, name
        out = capsys.readouterr()
        assert out.out == "" and one_line(out.err).startswith(
            "tidemark: " + said.replace("input:", "plan:")), out.err


@pytest.mark.parametrize("name", list(UNDECODABLE))
async def test_case3_a_run_started_with_undecodable_json_ends_at_once(
        temporal_env: WorkflowEnvironment, store: JournalStore, workers: Any, task_queue: str,
        name: str) -> None:
    client = temporal_env.client
    workers.start()
    data, said = UNDECODABLE[name]
    task = f"h3-{uuid.uuid4().hex[:6]}"
    handle = await client.start_workflow("RunPlan", RawValue(Payload(metadata=JSON, data=data)),
                                         id=f"tidemark-{task}", task_queue=task_queue)
    result = await ended_in_one_go(handle, 60)  # ended, not Running for ever
    assert (result.state, result.error["message"]) == ("failed", said), result
    assert not store.task_known(task)
    history = await handle.fetch_history()
    assert not [e for e in history.events if e.HasField(
        "workflow_task_failed_event_attributes")], "a workflow task failed on the input"


async def test_case3_no_input_at_all_ends_the_run_at_once(
        temporal_env: WorkflowEnvironment, workers: Any, task_queue: str) -> None:
    client = temporal_env.client
    workers.start()
    task = f"h3n-{uuid.uuid4().hex[:6]}"
    handle = await client.start_workflow("RunPlan", id=f"tidemark-{task}", task_queue=task_queue)
    result = await asyncio.wait_for(run_result(handle), 60)
    assert result.state == "failed" and "not NoneType" in result.error["message"], result



@pytest.mark.parametrize("workflow", ["UnwindPlan", "ScheduledRun"])
async def test_case3_the_other_workflows_end_at_once_on_undecodable_input_too(
        temporal_env: WorkflowEnvironment, workers: Any, task_queue: str, workflow: str) -> None:
    client = temporal_env.client
    workers.start()
    data, said = UNDECODABLE["deep"]
    handle = await client.start_workflow(workflow, RawValue(Payload(metadata=JSON, data=data)),
                                         id=f"tidemark-h3w-{uuid.uuid4().hex[:6]}",
                                         task_queue=task_queue)
    with pytest.raises(WorkflowFailureError) as e:
        await asyncio.wait_for(handle.result(), 60)
    assert said in str(e.value.cause), e.value.cause
    history = await handle.fetch_history()
    assert not [e for e in history.events if e.HasField(
        "workflow_task_failed_event_attributes")], "a workflow task failed on the input"
