"""Client-side helpers: start RunPlan for a plan, wait for its result — and the demo.

The demo is the essay's morning on the embedded stack: forty renames and two mails (Gmail and
Microsoft Graph, on the staging servers), the worker SIGKILLed right after step 32 changed the
world and before its outcome was journaled, the interruption report, a new worker, and the
check that every effect happened exactly once.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.exceptions import WorkflowAlreadyStartedError

from tidemark.database import redacted
from tidemark.devstack import DevStack
from tidemark.errors import TidemarkError
from tidemark.faults import CRASH_ENV
from tidemark.report import build_report
from tidemark.store import JournalStore
from workflows.outcome import run_result
from workflows.types import TASK_QUEUE, RunResult, UnwindResult

DEMO_FILES = 40
DEMO_KILL_AT = 32  # the essay's step: 31 confirmed, one in doubt, the mails provably not sent


async def start_plan(client: Client, document: dict[str, Any], task_id: str,
                     task_queue: str = TASK_QUEUE) -> WorkflowHandle[Any, RunResult]:
    """Starts ``tidemark-<task_id>``, as `temporal workflow start` would."""
    return await client.start_workflow("RunPlan", document, id=f"tidemark-{task_id}",
                                       task_queue=task_queue, result_type=RunResult)


class TemporalUnavailable(TidemarkError):
    """The Temporal frontend could not be reached."""


class AlreadyRunning(TidemarkError):
    """A workflow with this id is running already; a task runs once at a time."""


async def connect(address: str, namespace: str) -> Client:
    try:
        return await Client.connect(address, namespace=namespace)
    except RuntimeError as e:  # the SDK reports a failed connect as RuntimeError
        raise TemporalUnavailable(f"cannot reach Temporal at {address}: {e}") from e


async def _start(client: Client, workflow: str, task_id: str, workflow_id: str,
                 task_queue: str, result_type: type[Any]) -> WorkflowHandle[Any, Any]:
    try:
        return await client.start_workflow(workflow, {"task_id": task_id}, id=workflow_id,
                                           task_queue=task_queue, result_type=result_type)
    except WorkflowAlreadyStartedError as e:
        raise AlreadyRunning(f"{workflow_id} is running already; halt it first "
                             f"(temporal workflow signal --workflow-id {workflow_id} "
                             "--name halt)") from e


async def resume_task(address: str, namespace: str, task_id: str, *, wait: bool,
                      task_queue: str = TASK_QUEUE) -> RunResult | None:
    """Starts RunPlan on the stored plan of ``task_id`` (the caller has released it)."""
    client = await connect(address, namespace)
    handle = await _start(client, "RunPlan", task_id, f"tidemark-{task_id}", task_queue,
                          RunResult)
    return await run_result(handle) if wait else None


async def unwind_task(address: str, namespace: str, task_id: str, *, wait: bool,
                      task_queue: str = TASK_QUEUE) -> UnwindResult | None:
    """Starts UnwindPlan for a stopped task, as ``tidemark-unwind-<task_id>``."""
    client = await connect(address, namespace)
    handle = await _start(client, "UnwindPlan", task_id, f"tidemark-unwind-{task_id}",
                          task_queue, UnwindResult)
    return await handle.result() if wait else None


def demo_plan(docs: Path, task_id: str, files: int) -> dict[str, Any]:
    """``files`` renames, then the two mails (irreversible, last)."""
    steps: list[dict[str, Any]] = [
        {"action": "fs.rename", "args": {"path": str(docs / f"scan-{i:03d}.pdf"),
                                         "name": f"2026-Q3 supplier {i:02d} invoice.pdf"}}
        for i in range(1, files + 1)]
    mail = {"to": ["accounts@supplier.example"], "subject": "Q3 invoices filed",
            "body": f"All {files} Q3 invoices are filed under their final names."}
    steps.append({"action": "gmail.send", "args": mail})
    steps.append({"action": "graph.send_mail", "args": {**mail, "to": ["finance@ours.example"]}})
    return {"task_id": task_id, "steps": steps}


def _effects(staging_url: str, target: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{staging_url}/_staging/effects?target={target}") as r:
        return list(json.load(r))


async def _demo(stack: DevStack, files: int, kill_at: int, say: Callable[[str], None]) -> bool:
    assert stack.staging is not None
    run_dir = stack.home / "demo" / time.strftime("%Y%m%d-%H%M%S")
    docs = run_dir / "docs"
    docs.mkdir(parents=True)
    for i in range(1, files + 1):
        (docs / f"scan-{i:03d}.pdf").write_bytes(f"invoice {i}\n".encode())
    task_id = f"demo-{run_dir.name}"
    doc = demo_plan(docs, task_id, files)
    (run_dir / "plan.json").write_text(json.dumps(doc, indent=2))
    say(f"plan: {len(doc['steps'])} steps ({files} renames in {docs}, then 2 mails); "
        f"saved as {run_dir / 'plan.json'}")

    doomed = stack.start_worker(**{CRASH_ENV: f"after_execute:{kill_at}"})
    client = await Client.connect(stack.address)
    handle = await start_plan(client, doc, task_id)
    say(f"started workflow tidemark-{task_id}; the worker will be SIGKILLed right after step "
        f"{kill_at} renames its file, before the outcome is journaled")
    t0 = time.monotonic()
    while doomed.poll() is None:
        await asyncio.sleep(0.05)
    killed_at = time.monotonic()
    say(f"worker killed (exit {doomed.returncode}) after {killed_at - t0:.1f}s. "
        f"The journal, read by `tidemark status {task_id}`:")
    with JournalStore(stack.db_url) as store:
        say(build_report(store, task_id).text())
        stack.start_worker()
        say("a new worker started; Temporal retries step "
            f"{kill_at}, whose probe finds the file renamed by our inode")
        result = await run_result(handle)
        say(f"workflow ended: {result.state}, {result.confirmed}/{result.steps} confirmed, "
            f"{result.resolved_by_probe} resolved by probe, {time.monotonic() - killed_at:.1f}s "
            "after the kill")
        say(build_report(store, task_id).text())
    renamed = sorted(p.name for p in docs.iterdir())
    expected = sorted(f"2026-Q3 supplier {i:02d} invoice.pdf" for i in range(1, files + 1))
    mails = {t: len(_effects(stack.staging.url, t)) for t in ("gmail", "graph")}
    ok = result.state == "completed" and renamed == expected and mails == {"gmail": 1,
                                                                           "graph": 1}
    say(f"files renamed once each: {renamed == expected}; mails sent: gmail {mails['gmail']}, "
        f"graph {mails['graph']} (each exactly once: {mails == {'gmail': 1, 'graph': 1}})")
    run_id = (await handle.describe()).run_id  # the Web UI's page is per run
    say(f"history in the Web UI: {stack.ui_url}/namespaces/default/workflows/tidemark-{task_id}"
        f"/{run_id}/history")
    return ok


def run_demo(*, files: int = DEMO_FILES, kill_at: int = DEMO_KILL_AT, keep: bool = False,
             say: Callable[[str], None] = print) -> bool:
    """Runs the demo on a stack of its own; returns whether every check held."""
    if not 1 <= kill_at <= files:
        raise ValueError(f"--kill-at must be a rename step, 1..{files}")
    with DevStack(port=0, ui_port=0, staging_port=0, with_worker=False) as stack:
        say(f"stack: Temporal {stack.address}, Web UI {stack.ui_url}, staging "
            f"{stack.staging.url if stack.staging else '-'}, journal {redacted(stack.db_url)}")
        ok = asyncio.run(_demo(stack, files, kill_at, say))
        if keep:
            say("stack kept running for the Web UI; Ctrl-C stops it")
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
    return ok
