"""The control matrix (docs/control-matrix.md): each task state against each command, through
the real `tidemark` CLI, real Postgres, the Temporal dev server and a real worker process.

Every cell checks the exit code, a fragment of the one line printed, the task's state after
(`tidemark status --json`), and what acted: the files the plan renames and the ledger lines its
irreversible step writes, counted before and after. The states that are plain journal facts
(not started, stopped, killed, unwound, unknown) are set with the store's own methods; completed
and partly unwound are reached by real runs and a real unwind."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from activities.catalog import spec_registry
from helpers.ledger import LedgerRecord, ledger_lines
from tidemark.plan import load_plan
from tidemark.store import JournalStore
from tidemark.tools.cli import main
from tidemark.tools.starter import start_plan
from workflows.outcome import run_result, unwind_result
from workflows.types import UnwindResult

SPECS = spec_registry(LedgerRecord)
TASK = "cm-1"

# (exit code, fragment of the line printed, state after, what acted: renames, undos, ledger)
# -- the table of docs/control-matrix.md for the states a test reaches without a run under way.
Cell = tuple[int, str, str, tuple[int, int, int]]
NONE = (0, 0, 0)
UNKNOWN = "no task 'cm-1' is known"
NOT_WAITING = "is not waiting for approval"
NOT_IN_DOUBT = "step 1 is not in doubt"
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
    ("not_started", "resume"): (0, '"state": "completed"', "completed", (2, 0, 1)),
    ("not_started", "stop"): (0, "task cm-1 is stopped", "stopped", NONE),
    ("not_started", "release"): (0, "task cm-1 is released", "not_started", NONE),
    ("not_started", "kill"): (0, "stopped: no workflow was running", "killed", NONE),
    ("not_started", "unwind"): (0, '"state": "unwound"', "unwound", NONE),
    ("not_started", "resolve"): (1, NOT_IN_DOUBT, "not_started", NONE),
    ("not_started", "approve"): (1, NOT_WAITING, "not_started", NONE),
    ("not_started", "reject"): (1, NOT_WAITING, "not_started", NONE),
    # `tidemark stop T`
    ("stopped", "start"): (0, "stopped", "stopped", NONE),
    ("stopped", "resume"): (0, '"state": "completed"', "completed", (2, 0, 1)),
    ("stopped", "stop"): (0, "task cm-1 is stopped", "stopped", NONE),
    ("stopped", "release"): (0, "task cm-1 is released", "not_started", NONE),
    ("stopped", "kill"): (0, "stopped: no workflow was running", "killed", NONE),
    ("stopped", "unwind"): (0, '"state": "unwound"', "unwound", NONE),
    ("stopped", "resolve"): (1, NOT_IN_DOUBT, "stopped", NONE),
    ("stopped", "approve"): (1, NOT_WAITING, "stopped", NONE),
    ("stopped", "reject"): (1, NOT_WAITING, "stopped", NONE),
    # `tidemark kill T`: released only explicitly
    ("killed", "start"): (0, "stopped", "killed", NONE),
    ("killed", "resume"): (1, "`tidemark release cm-1`", "killed", NONE),
    ("killed", "stop"): (0, "task cm-1 is stopped", "killed", NONE),
    ("killed", "release"): (0, "task cm-1 is released", "not_started", NONE),
    ("killed", "kill"): (0, "stopped: no workflow was running", "killed", NONE),
    ("killed", "unwind"): (1, "--for-unwind", "killed", NONE),
    ("killed", "resolve"): (1, NOT_IN_DOUBT, "killed", NONE),
    ("killed", "approve"): (1, NOT_WAITING, "killed", NONE),
    ("killed", "reject"): (1, NOT_WAITING, "killed", NONE),
    # every step done: nothing acts twice
    ("completed", "start"): (0, "completed", "completed", NONE),
    ("completed", "resume"): (0, '"state": "completed"', "completed", NONE),
    ("completed", "stop"): (0, "task cm-1 is stopped", "stopped", NONE),
    ("completed", "release"): (0, "task cm-1 is released", "completed", NONE),
    ("completed", "kill"): (0, "stopped: no workflow was running", "killed", NONE),
    ("completed", "unwind"): (0, '"state": "unwound"', "unwound", (0, 2, 0)),
    ("completed", "resolve"): (1, NOT_IN_DOUBT, "completed", NONE),
    ("completed", "approve"): (1, NOT_WAITING, "completed", NONE),
    ("completed", "reject"): (1, NOT_WAITING, "completed", NONE),
    # some compensations journaled: never forward again
    ("partly_unwound", "start"): (0, "partly_unwound", "partly_unwound", NONE),
    ("partly_unwound", "resume"): (1, "partly unwound", "partly_unwound", NONE),
    ("partly_unwound", "stop"): (0, "task cm-1 is stopped", "partly_unwound", NONE),
    ("partly_unwound", "release"): (0, "task cm-1 is released", "partly_unwound", NONE),
    ("partly_unwound", "kill"): (0, "stopped: no workflow was running", "partly_unwound",
                                 NONE),
    ("partly_unwound", "unwind"): (0, '"state": "unwound"', "unwound", (0, 1, 0)),
    ("partly_unwound", "resolve"): (1, NOT_IN_DOUBT, "partly_unwound", NONE),
    ("partly_unwound", "approve"): (1, NOT_WAITING, "partly_unwound", NONE),
    ("partly_unwound", "reject"): (1, NOT_WAITING, "partly_unwound", NONE),
    # terminal
    ("unwound", "start"): (0, "unwound", "unwound", NONE),
    ("unwound", "resume"): (1, "TaskUnwound", "unwound", NONE),
    ("unwound", "stop"): (0, "task cm-1 is stopped", "unwound", NONE),
    ("unwound", "release"): (0, "task cm-1 is released", "unwound", NONE),
    ("unwound", "kill"): (0, "stopped: no workflow was running", "unwound", NONE),
    ("unwound", "unwind"): (0, '"state": "unwound"', "unwound", NONE),
    ("unwound", "resolve"): (1, NOT_IN_DOUBT, "unwound", NONE),
    ("unwound", "approve"): (1, NOT_WAITING, "unwound", NONE),
    ("unwound", "reject"): (1, NOT_WAITING, "unwound", NONE),
}


class Task:
    """The task of one cell: two renames (reversible) and a ledger line (irreversible)."""

    def __init__(self, tmp_path: Path) -> None:
        self.docs = tmp_path / "docs"
        self.docs.mkdir()
        for i in range(2):
            (self.docs / f"d{i}.txt").write_text(str(i))
        self.ledger = tmp_path / "ledger"
        self.doc: dict[str, Any] = {"task_id": TASK, "steps": [
            *({"action": "fs.rename", "args": {"path": str(self.docs / f"d{i}.txt"),
                                               "name": f"f{i}.txt"}} for i in range(2)),
            {"action": "ledger.record", "args": {"ledger": str(self.ledger), "entry": "pay"}}]}

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
        handle = await start_plan(client, task.doc, TASK, task_queue)
        assert (await run_result(handle)).state == "completed"
        if state == "partly_unwound":
            # somebody took the name step 2 would restore: its compensation is refused
            (task.docs / "f1.txt").rename(task.docs / "theirs.txt")
            store.set_control(TASK, "stopped", "undo", "ops")
            unwind = await client.start_workflow(
                "UnwindPlan", {"task_id": TASK}, id=f"tidemark-unwind-{TASK}",
                task_queue=task_queue, result_type=UnwindResult)
            assert (await unwind_result(unwind)).state == "failed"
            (task.docs / "theirs.txt").rename(task.docs / "f1.txt")  # the way is clear again
            store.set_control(TASK, "released", "looked", "ops")
        return
    store.persist_plan(load_plan(task.doc, SPECS))
    if state == "stopped":
        store.set_control(TASK, "stopped", "incident", "ops")
    elif state == "killed":
        store.set_killed(TASK, "incident", "ops")
    elif state == "unwound":
        store.set_control(TASK, "stopped", "undo", "ops")
        assert store.record_unwound(TASK, "ops", {}) == []


async def command(state: str, name: str, task: Task, temporal_env: WorkflowEnvironment,
                  workers: Any, task_queue: str) -> tuple[int, str]:
    """Runs the cell's command; returns (exit code, everything it printed)."""
    address = temporal_env.client.service_client.config.target_host
    temporal = ["--address", address, "--task-queue", task_queue]
    if name == "start":  # a start carries the plan; of an unknown task, only a (typo'd) id
        workers.start()
        doc = {"task_id": TASK} if state == "unknown" else task.doc
        handle = await start_plan(temporal_env.client, doc, TASK, task_queue)
        return 0, (await run_result(handle)).state
    argv = {
        "resume": ["resume", TASK, "--wait", *temporal],
        "stop": ["stop", TASK],
        "release": ["release", TASK],
        "kill": ["kill", TASK, "--address", address, "--grace", "0"],
        "unwind": ["unwind", TASK, "--yes", "--wait", *temporal],
        "resolve": ["resolve", TASK, "--step", "1", "--as", "done", "--yes"],
        "approve": ["approve", TASK, *temporal],
        "reject": ["reject", TASK, *temporal],
    }[name]
    if name in ("resume", "unwind"):
        workers.start()
    code = await asyncio.to_thread(main, argv)
    return code, ""


def end_state(store: JournalStore, capsys: pytest.CaptureFixture[str]) -> str:
    if not store.task_known(TASK) and store.stop_state(TASK) is None:
        return "unknown"
    assert main(["status", TASK, "--json"]) == 0
    return str(json.loads(capsys.readouterr().out)["state"])


@pytest.mark.parametrize(("state", "name"), list(MATRIX))
async def test_control_matrix(state: str, name: str, tmp_path: Path, store: JournalStore,
                              temporal_env: WorkflowEnvironment, workers: Any, task_queue: str,
                              monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("DATABASE_URL", store.conninfo)
    task = Task(tmp_path)
    await reach(state, task, store, temporal_env, workers, task_queue)
    before = task.effects()
    events = len(store.events(TASK))
    capsys.readouterr()
    code, said = await command(state, name, task, temporal_env, workers, task_queue)
    out = capsys.readouterr()
    said = said + out.out + out.err
    after = task.effects()
    acted = tuple(a - b for a, b in zip(after, before, strict=True))
    # acts: (renames done, renames put back, ledger lines)
    acted = (max(acted[0], 0), max(acted[1], 0), acted[2])
    got = (code, end_state(store, capsys), acted)
    want_code, fragment, want_state, want_acted = MATRIX[(state, name)]
    assert got == (want_code, want_state, want_acted), (said, got)
    assert fragment in said, said
    if code != 0:  # refused: one line, and nothing written
        assert out.out == "" and out.err.count("\n") == 1, said
        assert len(store.events(TASK)) == events


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
