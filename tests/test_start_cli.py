"""`tidemark start PLAN.json`, `--wait`, `--follow`, `--json`, and `resume --follow`.

Through the real CLI (in this process, or as a process of its own where the time of a line
counts), a real worker process, the Temporal dev server and Postgres."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from helpers.staging_fixtures import StagingServer
from tidemark.needs import Act, command
from tools.cli.main import EXIT_NOT_DONE

ROOT = Path(__file__).resolve().parent.parent
MAIL = {"to": ["ap@supplier.example"], "subject": "Q3 invoices paid", "body": "Paid."}


def plan_file(tmp_path: Path, doc: dict[str, Any]) -> str:
    path = tmp_path / f"{doc.get('task_id', 'plan')}.json"
    path.write_text(json.dumps(doc))
    return str(path)


def renames(tmp_path: Path, task_id: str, n: int = 2) -> dict[str, Any]:
    docs = tmp_path / task_id
    docs.mkdir()
    for i in range(n):
        (docs / f"d{i}.txt").write_text(str(i))
    return {"task_id": task_id, "steps": [
        {"action": "fs.rename", "args": {"path": str(docs / f"d{i}.txt"), "name": f"f{i}.txt"}}
        for i in range(n)]}


async def test_start_refuses_a_bad_plan_in_one_line_and_starts_nothing(
        cli: Any, temporal_env: WorkflowEnvironment, tmp_path: Path) -> None:
    bad = {"task_id": "st-bad", "steps": [{"action": "fs.frobnicate", "args": {}}]}
    code, out, err = await cli("start", plan_file(tmp_path, bad))
    assert (code, out) == (1, ""), (code, out, err)
    assert err.count("\n") == 1 and "unknown action 'fs.frobnicate'" in err, err
    try:
        await temporal_env.client.get_workflow_handle("tidemark-st-bad").describe()
        raise AssertionError("a run was started for a plan that plan check refuses")
    except RPCError:
        pass


async def test_start_runs_the_plan_and_refuses_a_second_start_while_one_is_open(
        cli: Any, temporal_env: WorkflowEnvironment, tmp_path: Path, workers: Any,
        task_queue: str) -> None:
    workers.start()
    doc = renames(tmp_path, "st-" + uuid.uuid4().hex[:8])
    code, out, err = await cli("start", plan_file(tmp_path, doc), "--wait", "--task-queue",
                               task_queue)
    assert (code, err) == (0, ""), (out, err)
    lines = out.splitlines()
    assert lines[0].startswith(f"started tidemark-{doc['task_id']} (task {doc['task_id']}, 2 "
                               f"steps) on task queue {task_queue}"), out
    assert lines[1] == (f"Web UI: http://localhost:8233/namespaces/default/workflows/"
                        f"tidemark-{doc['task_id']}"), out
    assert lines[-1].startswith(f"tidemark-{doc['task_id']}: ended completed"), out
    # The same task again, on a queue no worker polls: its run stays open, and a third start
    # of it is refused in one line, exit 1, nothing started.
    other = renames(tmp_path, "so-" + uuid.uuid4().hex[:8])
    path = plan_file(tmp_path, other)
    code, out, err = await cli("start", path, "--json", "--task-queue", "nobody-" + task_queue)
    assert code == 0, (out, err)
    started = json.loads(out)
    assert started["committed"]["workflow_id"] == f"tidemark-{other['task_id']}"
    assert started["run"] is None and started["next"]["state"] == "running"
    code, out, err = await cli("start", path, "--task-queue", task_queue)
    assert (code, out) == (1, ""), (code, out, err)
    assert err.count("\n") == 1 and "is running already" in err, err
    assert f"`{command(Act.STATUS, other['task_id'])}`" in err
    await temporal_env.client.get_workflow_handle(f"tidemark-{other['task_id']}").terminate()


class Lines:
    """The lines a `tidemark` process prints, each with the moment it was read."""

    def __init__(self, *args: str) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen([sys.executable, "-m", "tools.cli.main", *args], cwd=ROOT,
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.seen: list[tuple[float, str]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.seen.append((time.monotonic(), line.rstrip("\n")))

    async def first(self, fragment: str, timeout: float = 60) -> float:
        """When the first line holding ``fragment`` was read."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for at, line in self.seen:
                if fragment in line:
                    return at
            await asyncio.sleep(0.05)
        raise AssertionError(f"no line with {fragment!r}: {[s for _, s in self.seen]}")

    def end(self) -> tuple[int, list[str], str]:
        assert self.proc.stderr is not None
        code = self.proc.wait(timeout=60)
        self.reader.join(timeout=5)
        return code, [s for _, s in self.seen], self.proc.stderr.read()


async def waiting_since(temporal_env: WorkflowEnvironment, task_id: str) -> float:
    """The moment this test first sees the run wait for approval (TidemarkState)."""
    handle = temporal_env.client.get_workflow_handle(f"tidemark-{task_id}")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            desc = await handle.describe()
        except RPCError:  # not started yet
            await asyncio.sleep(0.05)
            continue
        attrs = {k.name: v for k, v in desc.typed_search_attributes}
        if (desc.status == WorkflowExecutionStatus.RUNNING
                and attrs.get("TidemarkState") == "awaiting_approval"):
            return time.monotonic()
        await asyncio.sleep(0.05)
    raise AssertionError("the run never waited for approval")


async def test_start_and_resume_follow_say_who_approves_and_the_command_within_seconds(
        cli: Any, temporal_env: WorkflowEnvironment, tmp_path: Path, workers: Any,
        task_queue: str, server: StagingServer) -> None:
    """The issue's case: `resume --wait` printed nothing for 25 s before a person's approval.

    With --follow, a line says that it waits, for whom, and the command, within two seconds of
    the run's state saying so; halted, it ends exit 3 with the end state named."""
    workers.start(TIDEMARK_STAGING_URL=server.url)
    doc = renames(tmp_path, "sf-" + uuid.uuid4().hex[:8], 1)
    doc["steps"].append({"action": "gmail.send", "args": MAIL})
    doc["approval"] = {"required": True}
    t = doc["task_id"]
    handle = temporal_env.client.get_workflow_handle(f"tidemark-{t}")
    asks = (f"waits for approval by any member of tidemark_approver: "
            f"`{command(Act.APPROVE, t)}`")
    for args in (["start", plan_file(tmp_path, doc), "--follow"],
                 ["resume", t, "--wait", "--follow"]):
        run = Lines(*args, "--task-queue", task_queue)
        waits = await waiting_since(temporal_env, t)
        said = await run.first(asks)
        assert said - waits < 2.0, (said - waits, run.seen)
        await handle.signal("halt", "test over")
        code, lines, err = run.end()
        assert code == EXIT_NOT_DONE, (lines, err)
        assert f"(or `{command(Act.REJECT, t)}`)" in next(x for x in lines if asks in x)
        assert lines[-1].startswith(f"tidemark-{t}: ended halted"), lines
        assert err == f"tidemark: tidemark-{t} ended halted, not completed\n" or \
            err.startswith(f"tidemark: tidemark-{t} ended halted, not completed ("), err
        # Step 1 is said once, by the run that confirmed it, not again by the resumed one.
        assert (f"tidemark-{t}: step 1/2 confirmed" in lines) == (args[0] == "start"), lines
