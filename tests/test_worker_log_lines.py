"""A worker logs an expected outcome in one line; a traceback is for a bug.

A step busy (another attempt holds it) and a stopped task are outcomes the design expects: the
worker's log says each in one line, without a traceback. A real worker process, the Temporal
dev server and Postgres."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from temporalio.testing import WorkflowEnvironment

from activities.catalog import spec_registry
from helpers.ledger import LedgerRecord, ledger_lines
from helpers.steps import run_one
from tidemark.plan import load_plan
from tidemark.store import JournalStore
from tools.operate.starter import start_plan
from workflows.outcome import run_result

WORKER_MAIN = str(Path(__file__).parent / "helpers" / "worker_main.py")
SPECS = spec_registry(LedgerRecord)


def logged(path: Path, fragment: str, timeout: float = 30) -> str:
    """The worker's log once it holds ``fragment``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text()
        if fragment in text:
            return text
        time.sleep(0.1)
    raise AssertionError(f"no {fragment!r} in the worker's log:\n{path.read_text()[-3000:]}")


async def test_a_busy_step_and_a_stopped_task_are_one_log_line_without_a_traceback(
        store: JournalStore, temporal_env: WorkflowEnvironment, tmp_path: Path, workers: Any,
        task_queue: str, migrated_url: str) -> None:
    log = tmp_path / "worker.log"
    with log.open("w") as f:
        workers.procs.append(subprocess.Popen(
            [sys.executable, WORKER_MAIN], env={**workers.env, "TIDEMARK_LOG_LEVEL": "INFO"},
            stdout=f, stderr=f))
    tag = uuid.uuid4().hex[:8]
    held = tmp_path / "held"
    held.write_text("")
    busy = f"busy-{tag}"
    store.persist_plan(load_plan({"task_id": busy, "steps": [{"action": "ledger.record", "args": {
        "ledger": str(tmp_path / "ledger"), "entry": "e", "hold_while": str(held)}}]}, SPECS))
    twin = run_one(migrated_url, busy, 1)  # holds step 1 until `held` is gone
    while not store.task_known(busy) or store.progress(busy).in_doubt is None:
        time.sleep(0.05)
    handle = await start_plan(temporal_env.client, {"task_id": busy}, busy, task_queue)
    text = logged(log, "StepBusy")
    held.unlink()
    twin.communicate(timeout=30)
    assert (await run_result(handle)).state == "completed"
    assert len(ledger_lines(tmp_path / "ledger")) == 1

    # Stopped while its first step is under way: the next step's activity meets the stop.
    stopped = f"stopped-{tag}"
    held.write_text("")
    store.persist_plan(load_plan({"task_id": stopped, "steps": [
        {"action": "ledger.record", "args": {"ledger": str(tmp_path / "l2"), "entry": f"e{i}",
                                             "hold_while": str(held)}} for i in range(2)]},
        SPECS))
    handle = await start_plan(temporal_env.client, {"task_id": stopped}, stopped, task_queue)
    while not store.task_known(stopped) or store.progress(stopped).in_doubt is None:
        time.sleep(0.05)
    store.set_control(stopped, "stopped", "incident", "ops")
    held.unlink()
    assert (await run_result(handle)).state == "stopped"
    text = log.read_text()
    busy_lines = [x for x in text.splitlines() if "StepBusy" in x]
    assert busy_lines and all(busy in x for x in busy_lines), text
    assert "Traceback" not in text, text
