"""The control matrix (docs/control-matrix.md): each task state against each command.

It runs through the real `tidemark` CLI, real Postgres, the Temporal dev server and a real worker
process.

Every cell checks the exit code, a fragment of the one line printed, the task's state after
(`tidemark status --json`), and what acted: the files the plan renames and the ledger lines its
irreversible step writes, counted before and after. The states that are plain journal facts
(not started, stopped, killed, unwound, unknown) are set with the store's own methods; completed
and partly unwound are reached by real runs and a real unwind."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import PostgresServer, WorkerProcesses, with_test_roles, worker_processes
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from activities.catalog import spec_registry
from helpers.ledger import LedgerRecord, ledger_lines
from helpers.planners import calls
from helpers.steps import crash_at, run_one
from helpers.worklist import attribute, open_needs
from tidemark.approval import unattended
from tidemark.payloads import UnwindResult
from tidemark.plan import load_plan
from tidemark.store import JournalStore
from tools.cli.main import main
from tools.operate import schedules
from tools.operate.starter import start_plan
from workflows.outcome import run_result, unwind_result

SPECS = spec_registry(LedgerRecord)

# (exit code, fragment of the line printed, state after, what acted: renames, undos, ledger)
# -- the table of docs/control-matrix.md for the states a test reaches without a run under way.
Acted = tuple[int, int, int]
Cell = tuple[int, str, str, Acted | set[Acted]]
NONE = (0, 0, 0)
UNKNOWN = "no task '{T}' is known"
NOT_WAITING = "is not waiting for approval"
NOT_IN_DOUBT = "step 3 is not in doubt"
BLOCKED = "the start of {T} was blocked before its plan was stored"
UNWIND_OPEN = "tidemark-unwind-{T} is running: an unwind of {T} is under way"
MATRIX: dict[tuple[str, str], Cell] = {
    # nothing of the task is known: every control refuses, one line, nothing written
    ("unknown", "start"): (0, "failed", "unknown", NONE),
    ("unknown", "resume"): (1, "UnknownTask", "unknown", NONE),
    ("unknown", "stop"): (1, UNKNOWN, "unknown", NONE),
    ("unknown", "release"): (1, UNKNOWN, "unknown", NONE),
    ("unknown", "kill"): (1, UNKNOWN, "unknown", NONE),
    ("unknown", "unwind"): (1, "UnknownTask", "unknown", NONE),
    ("unknown", "resolve"): (1, "UnknownTask", "unknown", NONE),
    ("unknown", "approve"): (1, "UnknownTask", "unknown", NONE),
    ("unknown", "reject"): (1, "UnknownTask", "unknown", NONE),
    # the plan is stored, nothing ran
    ("not_started", "start"): (0, "completed", "completed", (2, 0, 1)),
    ("not_started", "resume"): (0, "started tidemark-{T}", "completed", (2, 0, 1)),
    ("not_started", "stop"): (0, "task {T} is stopped", "stopped", NONE),
    ("not_started", "release"): (0, "task {T} is released", "not_started", NONE),
    ("not_started", "kill"): (0, "stopped: no workflow was running", "killed", NONE),
    ("not_started", "unwind"): (0, '"state": "unwound"', "unwound", NONE),
    ("not_started", "resolve"): (1, NOT_IN_DOUBT, "not_started", NONE),
    ("not_started", "approve"): (1, NOT_WAITING, "not_started", NONE),
    ("not_started", "reject"): (1, NOT_WAITING, "not_started", NONE),
    # `tidemark stop T`
    ("stopped", "start"): (0, "stopped", "stopped", NONE),
    ("stopped", "resume"): (0, "started tidemark-{T}", "completed", (2, 0, 1)),
    ("stopped", "stop"): (0, "task {T} is stopped", "stopped", NONE),
    ("stopped", "release"): (0, "task {T} is released", "not_started", NONE),
    ("stopped", "kill"): (0, "stopped: no workflow was running", "killed", NONE),
    ("stopped", "unwind"): (0, '"state": "unwound"', "unwound", NONE),
    ("stopped", "resolve"): (1, NOT_IN_DOUBT, "stopped", NONE),
    ("stopped", "approve"): (1, NOT_WAITING, "stopped", NONE),
    ("stopped", "reject"): (1, NOT_WAITING, "stopped", NONE),
    # `tidemark kill T`: released only explicitly
    ("killed", "start"): (0, "stopped", "killed", NONE),
    ("killed", "resume"): (1, "`tidemark release {T}`", "killed", NONE),
    ("killed", "stop"): (0, "task {T} is stopped", "killed", NONE),
    ("killed", "release"): (0, "task {T} is released", "not_started", NONE),
    ("killed", "kill"): (0, "stopped: no workflow was running", "killed", NONE),
    ("killed", "unwind"): (1, "--for-unwind", "killed", NONE),
    ("killed", "resolve"): (1, NOT_IN_DOUBT, "killed", NONE),
    ("killed", "approve"): (1, NOT_WAITING, "killed", NONE),
    ("killed", "reject"): (1, NOT_WAITING, "killed", NONE),
    # every step done: nothing acts twice
    ("completed", "start"): (0, "completed", "completed", NONE),
    ("completed", "resume"): (0, "started tidemark-{T}", "completed", NONE),
    ("completed", "stop"): (0, "task {T} is stopped", "stopped", NONE),
    ("completed", "release"): (0, "task {T} is released", "completed", NONE),
    ("completed", "kill"): (0, "stopped: no workflow was running", "killed", NONE),
    ("completed", "unwind"): (0, '"state": "unwound"', "unwound", (0, 2, 0)),
    ("completed", "resolve"): (1, NOT_IN_DOUBT, "completed", NONE),
    ("completed", "approve"): (1, NOT_WAITING, "completed", NONE),
    ("completed", "reject"): (1, NOT_WAITING, "completed", NONE),
    # some compensations journaled: never forward again
    ("partly_unwound", "start"): (0, "partly_unwound", "partly_unwound", NONE),
    ("partly_unwound", "resume"): (1, "partly unwound", "partly_unwound", NONE),
    ("partly_unwound", "stop"): (0, "task {T} is stopped", "partly_unwound", NONE),
    ("partly_unwound", "release"): (0, "task {T} is released", "partly_unwound", NONE),
    ("partly_unwound", "kill"): (0, "stopped: no workflow was running", "partly_unwound",
                                 NONE),
    ("partly_unwound", "unwind"): (0, '"state": "unwound"', "unwound", (0, 1, 0)),
    ("partly_unwound", "resolve"): (1, NOT_IN_DOUBT, "partly_unwound", NONE),
    ("partly_unwound", "approve"): (1, NOT_WAITING, "partly_unwound", NONE),
    ("partly_unwound", "reject"): (1, NOT_WAITING, "partly_unwound", NONE),
    # terminal
    ("unwound", "start"): (0, "unwound", "unwound", NONE),
    ("unwound", "resume"): (1, "TaskUnwound", "unwound", NONE),
    ("unwound", "stop"): (0, "task {T} is stopped", "unwound", NONE),
    ("unwound", "release"): (0, "task {T} is released", "unwound", NONE),
    ("unwound", "kill"): (0, "stopped: no workflow was running", "unwound", NONE),
    ("unwound", "unwind"): (0, '"state": "unwound"', "unwound", NONE),
    ("unwound", "resolve"): (1, NOT_IN_DOUBT, "unwound", NONE),
    ("unwound", "approve"): (1, NOT_WAITING, "unwound", NONE),
    ("unwound", "reject"): (1, NOT_WAITING, "unwound", NONE),
    # a run under way: its irreversible step has begun and holds until the command returned
    ("running", "start"): (1, "is running already", "completed", (0, 0, 1)),
    ("running", "resume"): (1, "AlreadyRunning", "completed", (0, 0, 1)),
    ("running", "stop"): (0, "task {T} is stopped", "stopped", (0, 0, 1)),
    ("running", "release"): (0, "task {T} is released", "completed", (0, 0, 1)),
    # --grace 0 terminates the run once it took the kill signal; the attempt already in its call
    # is not waited for and may still complete that one write (nothing after it starts): either
    # count is right.
    ("running", "kill"): (0, "stopped: tidemark-{T}", "killed", {NONE, (0, 0, 1)}),
    ("running", "unwind"): (3, "ended failed, not unwound", "stopped", (0, 0, 1)),
    ("running", "resolve"): (1, "StepBusy", "completed", (0, 0, 1)),
    ("running", "approve"): (1, NOT_WAITING, "completed", (0, 0, 1)),
    ("running", "reject"): (1, NOT_WAITING, "completed", (0, 0, 1)),
    # the run waits at the boundary for a person
    ("awaiting_approval", "start"): (1, "is running already", "awaiting_approval", NONE),
    ("awaiting_approval", "resume"): (1, "AlreadyRunning", "awaiting_approval", NONE),
    ("awaiting_approval", "stop"): (0, "task {T} is stopped", "stopped", NONE),
    ("awaiting_approval", "release"): (0, "task {T} is released", "awaiting_approval", NONE),
    ("awaiting_approval", "kill"): (0, "stopped: tidemark-{T}", "killed", NONE),
    ("awaiting_approval", "unwind"): (0, '"state": "unwound"', "unwound", (0, 2, 0)),
    ("awaiting_approval", "resolve"): (1, NOT_IN_DOUBT, "awaiting_approval", NONE),
    ("awaiting_approval", "approve"): (0, "took the decision", "completed", (0, 0, 1)),
    ("awaiting_approval", "reject"): (0, "took the decision and ended", "stopped", NONE),
    # halted at the boundary (the halt signal sets the stop state)
    ("halted", "start"): (0, "stopped", "halted", NONE),
    ("halted", "resume"): (0, "started tidemark-{T}", "awaiting_approval", NONE),
    ("halted", "stop"): (0, "task {T} is stopped", "stopped", NONE),
    # released, nothing runs it: its run ended halted (the inbox says `ended`, so does status)
    ("halted", "release"): (0, "task {T} is released", "ended", NONE),
    ("halted", "kill"): (0, "stopped: no workflow was running", "killed", NONE),
    ("halted", "unwind"): (0, '"state": "unwound"', "unwound", (0, 2, 0)),
    ("halted", "resolve"): (1, NOT_IN_DOUBT, "halted", NONE),
    ("halted", "approve"): (1, "Release it first", "halted", NONE),
    ("halted", "reject"): (0, "no run of tidemark-{T} is open", "stopped", NONE),
    # the verification gate found a renamed file of step 1
    ("verification_failed", "start"): (0, "verification_failed", "verification_failed", NONE),
    ("verification_failed", "resume"): (0, "started tidemark-{T}", "verification_failed",
                                        NONE),
    ("verification_failed", "stop"): (0, "task {T} is stopped", "stopped", NONE),
    ("verification_failed", "release"): (0, "task {T} is released", "verification_failed",
                                         NONE),
    ("verification_failed", "kill"): (0, "stopped: no workflow was running", "killed", NONE),
    ("verification_failed", "unwind"): (3, "ended failed, not unwound", "partly_unwound",
                                        (0, 1, 0)),
    ("verification_failed", "resolve"): (1, NOT_IN_DOUBT, "verification_failed", NONE),
    ("verification_failed", "approve"): (0, "no run of tidemark-{T} is open",
                                         "verification_failed", NONE),
    ("verification_failed", "reject"): (0, "no run of tidemark-{T} is open", "stopped", NONE),
    # the target refused the irreversible step for good
    ("failed", "start"): (0, "failed", "failed", NONE),
    ("failed", "resume"): (0, "started tidemark-{T}", "failed", NONE),
    ("failed", "stop"): (0, "task {T} is stopped", "stopped", NONE),
    ("failed", "release"): (0, "task {T} is released", "failed", NONE),
    ("failed", "kill"): (0, "stopped: no workflow was running", "killed", NONE),
    ("failed", "unwind"): (0, '"state": "unwound"', "unwound", (0, 2, 0)),
    ("failed", "resolve"): (1, NOT_IN_DOUBT, "failed", NONE),
    ("failed", "approve"): (1, NOT_WAITING, "failed", NONE),
    ("failed", "reject"): (1, NOT_WAITING, "failed", NONE),
    # the irreversible step's process died after its intent; its probe cannot tell
    ("in_doubt", "start"): (0, "completed", "completed", (0, 0, 1)),
    ("in_doubt", "resume"): (0, "started tidemark-{T}", "in_doubt", NONE),
    ("in_doubt", "stop"): (0, "task {T} is stopped", "stopped", NONE),
    ("in_doubt", "release"): (0, "task {T} is released", "in_doubt", NONE),
    ("in_doubt", "kill"): (0, "stopped: no workflow was running", "killed", NONE),
    ("in_doubt", "unwind"): (3, "not unwound", "stopped", NONE),
    ("in_doubt", "resolve"): (0, '"as": "done"', "completed", NONE),
    ("in_doubt", "approve"): (1, NOT_WAITING, "in_doubt", NONE),
    ("in_doubt", "reject"): (1, NOT_WAITING, "in_doubt", NONE),
    # a run of a declared series whose start was refused (an earlier run of the series failed
    # and is not settled): nothing of it was stored, so nothing of it can act or be controlled
    ("blocked", "start"): (0, "blocked", "blocked", NONE),
    ("blocked", "resume"): (1, BLOCKED, "blocked", NONE),
    ("blocked", "stop"): (1, BLOCKED, "blocked", NONE),
    ("blocked", "release"): (1, BLOCKED, "blocked", NONE),
    ("blocked", "kill"): (1, BLOCKED, "blocked", NONE),
    ("blocked", "unwind"): (1, BLOCKED, "blocked", NONE),
    ("blocked", "resolve"): (1, BLOCKED, "blocked", NONE),
    ("blocked", "approve"): (1, BLOCKED, "blocked", NONE),
    ("blocked", "reject"): (1, BLOCKED, "blocked", NONE),
    # `tidemark unwind T --yes` of a completed task: the stop is set and the unwind started,
    # its worker has not taken it up yet (it does after the command: what acted is counted then)
    ("unwinding", "start"): (0, "stopped", "unwound", (0, 2, 0)),
    ("unwinding", "resume"): (1, UNWIND_OPEN, "unwound", (0, 2, 0)),
    ("unwinding", "stop"): (0, "task {T} is stopped", "unwound", (0, 2, 0)),
    ("unwinding", "release"): (0, "task {T} is released", "completed", NONE),
    ("unwinding", "kill"): (0, "stopped: tidemark-unwind-{T}", "killed", NONE),
    ("unwinding", "unwind"): (1, UNWIND_OPEN, "unwound", (0, 2, 0)),
    ("unwinding", "resolve"): (1, NOT_IN_DOUBT, "unwound", (0, 2, 0)),
    ("unwinding", "approve"): (1, NOT_WAITING, "unwound", (0, 2, 0)),
    ("unwinding", "reject"): (1, NOT_WAITING, "unwound", (0, 2, 0)),
}
# The unwind's (Temporal status, end state) once its worker took it up, in the unwinding
# row: a release takes away the stop it needs (it ends before its next compensation), a kill
# terminates it before its first.
UNWIND_WORKFLOW: dict[str, tuple[str, str]] = {
    **{c: ("COMPLETED", "unwound") for c in (
        "start", "resume", "stop", "unwind", "resolve", "approve", "reject")},
    "release": ("FAILED", "stopped"),
    "kill": ("TERMINATED", "killed"),
}
# The cells that leave a row of the worklist for a task `tidemark inbox` (the journal) does
# not list: none. A start whose plan never reached the journal is journaled as refused, and the
# inbox lists it as its row does.
WORKLIST_ONLY: set[tuple[str, str]] = set()
# The run's (Temporal status, TidemarkState) after the cell, for the states a run reached.
# (None would leave the TidemarkState unpinned.)
WORKFLOW: dict[tuple[str, str], tuple[str, str | None]] = {
    **{("running", c): ("COMPLETED", "completed") for c in (
        "start", "resume", "stop", "release", "resolve", "approve", "reject", "unwind")},
    # --grace 0 terminates the run once it took the kill signal: it says killed.
    ("running", "kill"): ("TERMINATED", "killed"),
    **{("awaiting_approval", c): ("RUNNING", "awaiting_approval") for c in (
        "start", "resume", "release", "resolve")},
    # the stop reaches the waiting run, which reads it and waits on, saying it is stopped
    ("awaiting_approval", "stop"): ("RUNNING", "stopped"),
    ("awaiting_approval", "kill"): ("TERMINATED", "killed"),
    # the unwind tells the waiting run, which ends stopped rather than waiting for ever
    ("awaiting_approval", "unwind"): ("FAILED", "stopped"),
    ("awaiting_approval", "approve"): ("COMPLETED", "completed"),
    ("awaiting_approval", "reject"): ("FAILED", "stopped"),
    **{("halted", c): ("FAILED", "halted") for c in (
        "stop", "release", "kill", "unwind", "resolve", "approve", "reject")},
    ("halted", "start"): ("FAILED", "stopped"),
    ("halted", "resume"): ("RUNNING", "awaiting_approval"),
    **{("verification_failed", c): ("FAILED", "verification_failed") for c in (
        "start", "resume", "stop", "release", "kill", "unwind", "resolve", "approve",
        "reject")},
    **{("failed", c): ("FAILED", "failed") for c in (
        "start", "resume", "stop", "release", "kill", "unwind", "resolve", "approve",
        "reject")},
    ("in_doubt", "start"): ("COMPLETED", "completed"),
    ("in_doubt", "resume"): ("FAILED", "needs_decision"),
}


class Task:
    """The task of one cell: two renames (reversible) and a ledger line (irreversible)."""

    def __init__(self, tmp_path: Path) -> None:
        # Each cell its own id: workflow ids are shared by every test on the dev server.
        self.id = "cm-" + uuid.uuid4().hex[:10]
        self.docs = tmp_path / "docs"
        self.docs.mkdir()
        for i in range(2):
            (self.docs / f"d{i}.txt").write_text(str(i))
        self.ledger = tmp_path / "ledger"
        # While these exist: the irreversible step holds (a run under way), its target refuses
        # it (failed), its probe cannot tell (in doubt).
        self.hold, self.refuse, self.blind = (tmp_path / "hold", tmp_path / "refuse",
                                              tmp_path / "blind")
        self.doc: dict[str, Any] = {"task_id": self.id, "steps": [
            *({"action": "fs.rename", "args": {"path": str(self.docs / f"d{i}.txt"),
                                               "name": f"f{i}.txt"}} for i in range(2)),
            {"action": "ledger.record", "args": {
                "ledger": str(self.ledger), "entry": "pay", "hold_while": str(self.hold),
                "refused_while": str(self.refuse), "blind_while": str(self.blind)}}]}

    def let_go(self) -> None:
        """Whatever held the task in its state outside (not the journal) is cleared."""
        for f in (self.hold, self.refuse, self.blind):
            f.unlink(missing_ok=True)

    def effects(self) -> tuple[int, int, int]:
        """(files under our name, files back under their own name, ledger lines)."""
        names = sorted(p.name for p in self.docs.iterdir())
        return (sum(n.startswith("f") for n in names),
                sum(n.startswith("d") for n in names), len(ledger_lines(self.ledger)))


async def reach(state: str, task: Task, store: JournalStore, temporal_env: WorkflowEnvironment,
                workers: Any, task_queue: str) -> None:
    """Brings the task to ``state`` by the quickest honest route."""
    client = temporal_env.client
    if state == "unknown":
        return
    if state in ("completed", "partly_unwound"):
        workers.start()
        handle = await start_plan(client, task.doc, task.id, task_queue)
        assert (await run_result(handle)).state == "completed"
        if state == "partly_unwound":
            # somebody took the name step 2 would restore: its compensation is refused
            (task.docs / "f1.txt").rename(task.docs / "theirs.txt")
            store.set_control(task.id, "stopped", "undo", "ops")
            unwind = await client.start_workflow(
                "UnwindPlan", {"task_id": task.id}, id=f"tidemark-unwind-{task.id}",
                task_queue=task_queue, result_type=UnwindResult)
            assert (await unwind_result(unwind)).state == "failed"
            (task.docs / "theirs.txt").rename(task.docs / "f1.txt")  # the way is clear again
            store.set_control(task.id, "released", "looked", "ops")
        return
    if state in RUN_STATES:
        await RUN_STATES[state](task, store, temporal_env, workers, task_queue)
        return
    if state == "blocked":
        await blocked(task, store, temporal_env, workers, task_queue)
        return
    if state == "unwinding":
        await unwinding(task, store, temporal_env, workers, task_queue)
        return
    store.persist_plan(load_plan(task.doc, SPECS))
    if state == "stopped":
        store.set_control(task.id, "stopped", "incident", "ops")
    elif state == "killed":
        store.set_killed(task.id, "incident", "ops")
    elif state == "unwound":
        store.set_control(task.id, "stopped", "undo", "ops")
        assert store.record_unwound(task.id, "ops", {}) == []


async def tidemark_state(temporal_env: WorkflowEnvironment,
                         task_id: str) -> tuple[str, str | None]:
    """(Temporal status, TidemarkState) of the task's run, as the Web UI lists them."""
    desc = await temporal_env.client.get_workflow_handle(f"tidemark-{task_id}").describe()
    attrs = dict((k.name, v) for k, v in desc.typed_search_attributes)
    return (desc.status.name if desc.status else "?"), attrs.get("TidemarkState")


async def until(check: Any, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "the run did not get there"
        await asyncio.sleep(0.05)


async def running(task: Task, store: JournalStore, temporal_env: WorkflowEnvironment,
                  workers: Any, task_queue: str, doc: dict[str, Any] | None = None) -> None:
    """A run under way: its irreversible step has begun and holds."""
    task.hold.write_text("")
    workers.start()
    await start_plan(temporal_env.client, doc or task.doc, task.id, task_queue)

    async def begun() -> bool:
        return store.task_known(task.id) and store.step_row(task.id, 3) is not None
    await until(begun)


async def halted(task: Task, store: JournalStore, temporal_env: WorkflowEnvironment,
                 workers: Any, task_queue: str) -> None:
    await awaiting(task, store, temporal_env, workers, task_queue)
    handle = temporal_env.client.get_workflow_handle(f"tidemark-{task.id}")
    await handle.signal("halt", "end of shift")  # nothing from the boundary on starts
    assert (await run_result(handle)).state == "halted"


async def awaiting(task: Task, store: JournalStore, temporal_env: WorkflowEnvironment,
                   workers: Any, task_queue: str) -> None:
    task.doc["approval"] = {"required": True}  # the same plan for every later start
    workers.start()
    await start_plan(temporal_env.client, task.doc, task.id, task_queue)

    async def waits() -> bool:
        return (await tidemark_state(temporal_env, task.id))[1] == "awaiting_approval"
    await until(waits)


async def verification_failed(task: Task, store: JournalStore,
                              temporal_env: WorkflowEnvironment, workers: Any,
                              task_queue: str) -> None:
    """Somebody renamed a file of step 1 while the run waited at the boundary.

    A later run's gate finds it."""
    await awaiting(task, store, temporal_env, workers, task_queue)
    await temporal_env.client.get_workflow_handle(f"tidemark-{task.id}").terminate("restart")
    (task.docs / "f0.txt").rename(task.docs / "theirs.txt")
    handle = await start_plan(temporal_env.client, {"task_id": task.id}, task.id, task_queue)
    assert (await run_result(handle)).state == "verification_failed"


async def failed(task: Task, store: JournalStore, temporal_env: WorkflowEnvironment,
                 workers: Any, task_queue: str) -> None:
    task.refuse.write_text("")
    workers.start()
    handle = await start_plan(temporal_env.client, task.doc, task.id, task_queue)
    assert (await run_result(handle)).state == "failed"
    task.refuse.unlink()  # the refusal is journaled: nothing outside holds it any more


async def in_doubt(task: Task, store: JournalStore, temporal_env: WorkflowEnvironment,
                   workers: Any, task_queue: str) -> None:
    """The process running the irreversible step died after its intent.

    The probe cannot tell."""
    task.blind.write_text("")
    store.persist_plan(load_plan(task.doc, SPECS))
    for step in (1, 2):
        assert run_one(store.conninfo, task.id, step).wait(timeout=60) == 0
    crash_at(store.conninfo, task.id, 3, "after_intent")


async def blocked(task: Task, store: JournalStore, temporal_env: WorkflowEnvironment,
                  workers: Any, task_queue: str) -> None:
    """A run of a declared series whose earlier run failed.

    Its start is refused before its plan is stored."""
    series = "cm-s-" + uuid.uuid4().hex[:8]
    store.declare_series(series, "ops", "ops")
    refuse = task.docs.parent / "earlier-refused"
    refuse.write_text("")  # for good: the earlier run stays failed
    earlier = {"task_id": task.id + "-e", "series": series, "steps": [
        {"action": "ledger.record", "args": {"ledger": str(task.docs.parent / "earlier"),
                                             "entry": "e", "refused_while": str(refuse)}}]}
    workers.start()
    handle = await start_plan(temporal_env.client, earlier, earlier["task_id"], task_queue)
    assert (await run_result(handle)).state == "failed"
    task.doc["series"] = series
    handle = await start_plan(temporal_env.client, task.doc, task.id, task_queue)
    result = await run_result(handle)
    assert (result.state, result.error["type"]) == ("blocked", "SeriesBlocked"), result


def undo_queue(task_queue: str, task: Task) -> str:
    """The task queue the unwinding row's unwind is started on: the cell's own.

    No worker polls it until the cell's command has run."""
    return f"{task_queue}-undo-{task.id}"


async def unwinding(task: Task, store: JournalStore, temporal_env: WorkflowEnvironment,
                    workers: Any, task_queue: str) -> None:
    """A completed task whose unwind a person started (`tidemark unwind T --yes`).

    The stop is set, the unwind's workflow is open, its worker has not taken it up yet."""
    workers.start()
    handle = await start_plan(temporal_env.client, task.doc, task.id, task_queue)
    assert (await run_result(handle)).state == "completed"
    address = temporal_env.client.service_client.config.target_host
    assert await asyncio.to_thread(main, ["unwind", task.id, "--yes", "--address", address,
                                          "--task-queue", undo_queue(task_queue, task)]) == 0


async def take_up_unwind(task: Task, temporal_env: WorkflowEnvironment, workers: Any,
                         task_queue: str) -> tuple[str, str | None]:
    """The unwinding row, after its command: a worker takes up the unwind.

    The unwind ends (or was ended). Returns its (Temporal status, end state)."""
    undo = undo_queue(task_queue, task)
    workers.start(TIDEMARK_TASK_QUEUE=undo)
    handle = temporal_env.client.get_workflow_handle(f"tidemark-unwind-{task.id}")

    async def ended() -> bool:
        desc = await handle.describe()
        return desc.status is not None and desc.status.name != "RUNNING"
    await until(ended, timeout=60)
    if isinstance(workers, SharedWorkers):
        workers.stop(TIDEMARK_TASK_QUEUE=undo)  # nothing else is ever started on its queue
    desc = await handle.describe()
    # the state its result says (a terminated unwind's: `killed` from the kill's reason; one
    # terminated before any worker ran it never set its TidemarkState)
    return (desc.status.name if desc.status else "?"), (await unwind_result(handle)).state


RUN_STATES = {"running": running, "halted": halted, "awaiting_approval": awaiting,
              "verification_failed": verification_failed, "failed": failed,
              "in_doubt": in_doubt}


async def settle(task: Task, temporal_env: WorkflowEnvironment,
                 want: tuple[str, str | None] | None = None) -> None:
    """After the command, lets the task go and gives an open run time to end.

    What held the task outside lets go. A run still waiting for a person is left waiting, and
    ended after the test. ``want``: the cell's WORKFLOW, which the run reaches in its time (a
    signal the command sent may not have reached it yet)."""
    task.hold.unlink(missing_ok=True)  # a probe that cannot tell stays so
    handle = temporal_env.client.get_workflow_handle(f"tidemark-{task.id}")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            status, state = await tidemark_state(temporal_env, task.id)
        except RPCError:
            return  # no run of it was ever started
        if status != "RUNNING" or (want is None and state == "awaiting_approval") or (
                want is not None and want == ("RUNNING", state)):
            return
        await asyncio.sleep(0.05)
    await handle.terminate("the run did not end")
    raise AssertionError("the run did not end")


async def command(state: str, name: str, task: Task, temporal_env: WorkflowEnvironment,
                  workers: Any, task_queue: str) -> tuple[int, str]:
    """Runs the cell's command; returns (exit code, everything it printed)."""
    address = temporal_env.client.service_client.config.target_host
    temporal = ["--address", address, "--task-queue", task_queue]
    if name == "start":  # a start carries the plan; of an unknown task, only a (typo'd) id
        workers.start()
        doc = {"task_id": task.id} if state in ("unknown", "in_doubt") else task.doc
        try:
            handle = await start_plan(temporal_env.client, doc, task.id, task_queue)
        except WorkflowAlreadyStartedError:
            print(f"tidemark-{task.id} is running already", file=sys.stderr)
            return 1, ""
        task.let_go()
        return 0, (await run_result(handle)).state
    argv = {
        "resume": ["resume", task.id, *temporal],  # settle() waits for the run
        "stop": ["stop", task.id],
        "release": ["release", task.id],
        "kill": ["kill", task.id, "--address", address, "--grace", "0"],
        "unwind": ["unwind", task.id, "--yes", "--wait", *temporal],
        "resolve": ["resolve", task.id, "--step", "3", "--as", "done", "--yes"],
        "approve": ["approve", task.id, "--wait", *temporal],
        "reject": ["reject", task.id, "--wait", *temporal],
    }[name]
    if name in ("resume", "unwind"):
        workers.start()
    code = await asyncio.to_thread(main, argv)
    return code, ""


def end_state(task: Task, store: JournalStore, capsys: pytest.CaptureFixture[str]) -> str:
    """`tidemark status T --json`'s state.

    ``unknown`` when nothing of the task is stored (and status says so), ``blocked`` for a start
    its series refused before its plan was stored."""
    known = store.task_known(task.id) or store.stop_state(task.id) is not None
    code = main(["status", task.id, "--json"])
    out = capsys.readouterr()
    if not known and code == 1 and "UnknownTask" in out.err:
        return "unknown"
    assert code == 0, out.err
    return str(json.loads(out.out)["state"])


@dataclass
class SharedWorkers:
    """Worker processes kept for the module: one for each environment asked for.

    ``start`` starts one only where none of that environment runs (or it died), so the cells
    of the matrix share the module's worker instead of paying a worker's start-up each. A
    cell's tasks are its own (ids, files, series), so what one leaves cannot reach another."""

    procs: WorkerProcesses
    running: dict[tuple[tuple[str, str], ...], subprocess.Popen[bytes]] = field(
        default_factory=dict)

    def start(self, **extra: str) -> None:
        key = tuple(sorted(extra.items()))
        proc = self.running.get(key)
        if proc is None or proc.poll() is not None:
            self.running[key] = self.procs.start(**extra)

    def stop(self, **extra: str) -> None:
        proc = self.running.pop(tuple(sorted(extra.items())), None)
        if proc is not None:
            WorkerProcesses(self.procs.env, [proc]).stop_all(grace=10.0)


@dataclass
class Matrix:
    """The module's journal, task queue and workers, shared by the cells of the matrix."""

    store: JournalStore
    task_queue: str
    workers: SharedWorkers


@pytest.fixture(scope="module")
def matrix(pg: PostgresServer, temporal_env: WorkflowEnvironment) -> Iterator[Matrix]:
    url = with_test_roles(pg.new_database(migrated=True))
    queue = "tq-cm-" + uuid.uuid4().hex[:10]
    shared = SharedWorkers(worker_processes(temporal_env, url, queue))
    store = JournalStore(url).open()
    unattended(store, "tests")
    yield Matrix(store, queue, shared)
    shared.procs.stop_all(grace=3.0)
    store.close()


@pytest.mark.parametrize(("state", "name"), list(MATRIX))
async def test_control_matrix(state: str, name: str, tmp_path: Path, matrix: Matrix,
                              temporal_env: WorkflowEnvironment,
                              monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    store, workers, task_queue = matrix.store, matrix.workers, matrix.task_queue
    monkeypatch.setenv("DATABASE_URL", store.conninfo)
    monkeypatch.setenv("TEMPORAL_ADDRESS", temporal_env.client.service_client.config.target_host)
    task = Task(tmp_path)
    await reach(state, task, store, temporal_env, workers, task_queue)
    before = task.effects()
    events = len(store.events(task.id))
    capsys.readouterr()
    code, said = await command(state, name, task, temporal_env, workers, task_queue)
    written = len(store.events(task.id)) - events  # by the command (an unwind writes later)
    await settle(task, temporal_env, WORKFLOW.get((state, name)))
    unwind_ended = (await take_up_unwind(task, temporal_env, workers, task_queue)
                    if state == "unwinding" else None)
    out = capsys.readouterr()
    said = said + out.out + out.err
    after = task.effects()
    acted = tuple(a - b for a, b in zip(after, before, strict=True))
    # acts: (renames done, renames put back, ledger lines)
    acted = (max(acted[0], 0), max(acted[1], 0), acted[2])
    got = (code, end_state(task, store, capsys), acted)
    want_code, fragment, want_state, want_acted = MATRIX[(state, name)]
    fragment = fragment.replace("{T}", task.id)
    if isinstance(want_acted, set):  # a race the cell documents: any of these
        want_acted = acted if acted in want_acted else min(want_acted)
    assert got == (want_code, want_state, want_acted), (said, got)
    assert fragment in said, said
    if code == 1:  # refused: one line, and nothing written
        assert out.out == "" and out.err.count("\n") == 1, said
        assert written == 0, store.events(task.id)[events:]
    elif code == 3:  # --wait: the run ended, not as the command meant; one line says how
        assert out.err.count("\n") == 1 and "ended" in out.err, said
    if unwind_ended is not None:
        assert unwind_ended == UNWIND_WORKFLOW[name], unwind_ended
        if name == "release":  # it never began: it asks nobody for anything, itself included
            assert await attribute(temporal_env.client, f"tidemark-unwind-{task.id}",
                                   "TidemarkNeeds") == "nothing"
    if (state, name) in WORKFLOW:
        status, run_state = WORKFLOW[(state, name)]
        seen = await tidemark_state(temporal_env, task.id)
        assert seen == (status, run_state or seen[1]), seen
    rows = await open_needs(temporal_env.client, task.id)
    if got[1] in ("completed", "unwound"):  # settled: nothing on the worklist says otherwise
        assert rows == {}, rows
    if rows:  # what the Web UI's worklist says waits, the journal's inbox lists too
        needs = await inbox_needs(capsys)
        listed = task.id in needs
        assert listed != ((state, name) in WORKLIST_ONLY), (rows, got)
        # and in the same word: the row asks for what the inbox asks for
        assert not listed or set(rows.values()) == {needs[task.id]}, (rows, needs[task.id])
    await end_open_run(temporal_env, task)


async def inbox_needs(capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    """The tasks `tidemark inbox --json` lists (from the journal), each with its need."""
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["inbox", "--json"]) == 0
    out = capsys.readouterr()
    assert out.err == "", out.err
    return {e["task_id"]: e["need"] for e in json.loads(out.out)}


async def end_open_run(temporal_env: WorkflowEnvironment, task: Task) -> None:
    try:
        if (await tidemark_state(temporal_env, task.id))[0] == "RUNNING":
            await temporal_env.client.get_workflow_handle(f"tidemark-{task.id}").terminate("end")
    except RPCError:
        pass


@pytest.mark.parametrize("argv", [["stop", "--series", "nightly"],
                                  ["release", "--series", "nightly"],
                                  ["kill", "--series", "nightly", "--address", "127.0.0.1:1"],
                                  ["status", "--series", "nightly"]])
def test_a_control_of_an_undeclared_series_is_one_line_and_changes_nothing(
        argv: list[str], store: JournalStore, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The series row of the table: a series nobody declared is refused like an unknown id."""
    monkeypatch.setenv("DATABASE_URL", store.conninfo)
    store.declare_series("nightly-b", "ops", "ops")  # a longer name is not a match
    assert main(argv) == 1
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1
    assert "no series 'nightly'" in out.err
    assert store.stop_state("series:nightly") is None
    assert store.events("series:nightly") == []


# -- controls that meet in time ---------------------------------------------------------------

async def test_two_resumes_at_once_start_one_run_and_nothing_acts_twice(
        tmp_path: Path, store: JournalStore, temporal_env: WorkflowEnvironment, workers: Any,
        task_queue: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Resume against resume: two operators resume the same stopped task at the same moment."""
    monkeypatch.setenv("DATABASE_URL", store.conninfo)
    task = Task(tmp_path)
    store.persist_plan(load_plan(task.doc, SPECS))
    store.set_control(task.id, "stopped", "incident", "ops")
    task.hold.write_text("")  # the run that starts holds its irreversible step
    workers.start()
    address = temporal_env.client.service_client.config.target_host
    argv = ["resume", task.id, "--address", address, "--task-queue", task_queue]
    codes = await asyncio.gather(*(asyncio.to_thread(main, argv) for _ in range(2)))
    err = capsys.readouterr().err
    assert sorted(codes) == [0, 1], (codes, err)
    assert err.count("AlreadyRunning") == 1 and err.count("\n") == 1, err
    await settle(task, temporal_env)
    assert (await tidemark_state(temporal_env, task.id)) == ("COMPLETED", "completed")
    assert task.effects() == (2, 0, 1)  # every step once


async def test_a_reject_after_the_first_irreversible_step_was_attempted_changes_nothing(
        tmp_path: Path, store: JournalStore, temporal_env: WorkflowEnvironment, workers: Any,
        task_queue: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A reject after the first irreversible step was attempted changes nothing.

    Reject against the first irreversible step. At the boundary a reject stops the task (the
    matrix's awaiting_approval row); once the step was attempted, a reject is refused, records
    nothing and sets no stop, and the step acts once."""
    monkeypatch.setenv("DATABASE_URL", store.conninfo)
    task = Task(tmp_path)
    await awaiting(task, store, temporal_env, workers, task_queue)
    task.hold.write_text("")  # once approved, the irreversible step begins and holds
    address = temporal_env.client.service_client.config.target_host
    temporal = ["--address", address, "--task-queue", task_queue]
    assert await asyncio.to_thread(main, ["approve", task.id, *temporal]) == 0

    async def begun() -> bool:
        return store.step_row(task.id, 3) is not None
    await until(begun)
    capsys.readouterr()
    events = len(store.events(task.id))
    assert await asyncio.to_thread(main, ["reject", task.id, *temporal]) == 1
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1
    assert "irreversible step 3 was attempted already" in out.err
    assert len(store.events(task.id)) == events and store.stop_state(task.id) is None
    await settle(task, temporal_env)
    assert (await tidemark_state(temporal_env, task.id)) == ("COMPLETED", "completed")
    assert task.effects() == (2, 0, 1)


async def test_a_schedule_firing_after_kill_series_starts_nothing(
        tmp_path: Path, store: JournalStore, temporal_env: WorkflowEnvironment, workers: Any,
        task_queue: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A schedule firing after `kill --series` starts nothing that acts.

    The kill pauses the schedule, but a firing already due (or a trigger, which a paused schedule
    still obeys) starts a run; that run calls no planner and acts on nothing."""
    monkeypatch.setenv("DATABASE_URL", store.conninfo)
    client = temporal_env.client
    series = "cm-" + uuid.uuid4().hex[:8]
    planner_calls, ledger = tmp_path / "calls", tmp_path / "ledger"
    workers.start()
    store.declare_series(series, "ops", "ops")
    await schedules.create(client, series, "0 3 * * *", "helpers.planners:nightly",
                           {"calls": str(planner_calls), "ledger": str(ledger), "n": 2},
                           task_queue)
    address = client.service_client.config.target_host
    assert await asyncio.to_thread(main, ["kill", "--series", series, "--address",
                                          address]) == 0
    assert "paused" in capsys.readouterr().out
    await schedules.trigger(client, series)
    deadline = time.monotonic() + 30
    while not (fired := [wf.id async for wf in client.list_workflows(
            'WorkflowType="ScheduledRun"') if wf.id.startswith(f"tidemark-sched-{series}-")]):
        assert time.monotonic() < deadline, "the trigger started no run"
        await asyncio.sleep(0.2)
    result = await run_result(client.get_workflow_handle(fired[0]))
    assert result.state == "blocked", result
    assert calls(planner_calls) == [] and ledger_lines(ledger) == []
    await schedules.delete(client, series)
