"""The recovery path, exercised: SIGKILL at a uniformly random step and phase, resume, and
compare with an uninterrupted run — fifty times, across every target.

Each round runs a seven-step plan (two local renames, two Drive renames, a Gmail and a Graph
mail, a Stripe PaymentIntent) in a separate process that kills itself at one named crash point
of one step, including between the action and its outcome write. The round then resumes in this
process and checks that the world ends as an uninterrupted run leaves it and that the staging
servers saw every write exactly once. The seed is printed on failure; TIDEMARK_CHAOS_SEED
replays a run.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from activities.drive import drive_client
from activities.wiring import worker_registry
from helpers.fs_roots import FS_ROOTS
from helpers.ledger import LedgerRecord
from helpers.run_plan_local import short_deadlines
from helpers.staging_fixtures import get, post
from helpers.steps import wait_unlocked
from staging.core import StagingServer
from staging.drive import DEFAULT_READ_TOKEN
from tidemark.actions import Registry
from tidemark.faults import CRASH_ENV
from tidemark.keys import key_for
from tidemark.plan import Plan, load_plan
from tidemark.run_step import run_step
from tidemark.store import JournalStore

ROUNDS = 50
PHASES = ("before_intent", "after_intent", "after_execute", "after_outcome")
RUNNER = str(Path(__file__).parent / "helpers" / "run_plan_local.py")
SEED = int(os.environ.get("TIDEMARK_CHAOS_SEED", time.time_ns() % 2**32))


def effects(server: StagingServer) -> list[dict[str, Any]]:
    return list(get(server, "/_staging/effects"))


def make_plan(server: StagingServer, work: Path, task_id: str) -> dict[str, Any]:
    work.mkdir()
    steps: list[dict[str, Any]] = []
    for i in range(2):
        (work / f"draft-{i}.txt").write_text(str(i))
        steps.append({"action": "fs.rename", "args": {"path": str(work / f"draft-{i}.txt"),
                                                       "name": f"final-{i}.txt"}})
    for i in range(2):
        f = post(server, "/_staging/drive/files", {"name": f"{task_id}-scan-{i}.pdf"})
        steps.append({"action": "drive.rename",
                      "args": {"file_id": f["id"], "name": f"{task_id} invoice {i}.pdf"}})
    mail = {"to": ["ap@supplier.example"], "subject": f"{task_id} filed", "body": "Filed."}
    steps.append({"action": "gmail.send", "args": mail})
    steps.append({"action": "graph.send_mail", "args": mail})
    steps.append({"action": "stripe.payment_intent",
                  "args": {"amount": 4200, "currency": "eur", "description": task_id}})
    return {"task_id": task_id, "steps": steps}


def world(server: StagingServer, store: JournalStore, work: Path, plan: Plan) -> dict[str, Any]:
    """What an observer sees afterwards, with task-specific names and keys factored out."""
    task_id = plan.task_id
    keys = {key_for(task_id, s.number, s.action, s.args) for s in plan.steps}
    writes = Counter((e["target"], e["op"]) for e in effects(server) if e["key"] in keys)
    reader = drive_client(server.url, DEFAULT_READ_TOKEN)
    drive = [reader.files().get(fileId=s.args["file_id"]).execute()["name"].replace(task_id, "T")
             for s in plan.steps if s.action == "drive.rename"]
    rows = store.rows(task_id)
    return {
        "files": sorted(p.name for p in work.iterdir()),
        "drive": drive,
        "writes": dict(sorted(writes.items())),
        "journal": [(r.step, r.status) for r in rows],
        "in_doubt": store.progress(task_id).in_doubt is not None,
    }


def test_sigkill_at_random_step_and_phase_then_resume(server: StagingServer, db_url: str,
                                                       store: JournalStore,
                                                       tmp_path: Path) -> None:
    rng = random.Random(SEED)
    registry: Registry = worker_registry({"TIDEMARK_STAGING_URL": server.url,
                                                "TIDEMARK_FS_ROOTS": FS_ROOTS})
    registry.register(LedgerRecord())
    short_deadlines(registry)  # as the crashing runner has them

    def run_round(name: str, crash: str | None) -> dict[str, Any]:
        doc = make_plan(server, tmp_path / name, name)
        plan = load_plan(doc, registry)
        store.persist_plan(plan)
        env = {**os.environ, **({CRASH_ENV: crash} if crash else {})}
        proc = subprocess.run([sys.executable, RUNNER, db_url, name, server.url], env=env,
                              capture_output=True, text=True, timeout=120)
        wait_unlocked(db_url)
        expected_code = -signal.SIGKILL if crash else 0
        assert proc.returncode == expected_code, (name, crash, SEED, proc.stderr[-2000:])
        progress = store.progress(name)
        for step in range(progress.next_step or len(plan.steps) + 1, len(plan.steps) + 1):
            run_step(store, registry, name, step)  # resume, in order, as a new worker would
        return world(server, store, tmp_path / name, plan)

    baseline = run_round("chaos-base", None)
    assert baseline["writes"] == {("drive", "files.update"): 2, ("gmail", "drafts.create"): 1,
                                  ("gmail", "drafts.send"): 1, ("graph", "message.send"): 1,
                                  ("graph", "messages.create"): 1,
                                  ("stripe", "payment_intents.create"): 1}
    assert not baseline["in_doubt"]
    seen: Counter[str] = Counter()
    for n in range(ROUNDS):
        step, phase = rng.randint(1, 7), rng.choice(PHASES)
        seen[phase] += 1
        got = run_round(f"chaos-{n}", f"{phase}:{step}")
        assert got == baseline, f"round {n}: crash at {phase} of step {step} (seed {SEED})"
    assert len(seen) == len(PHASES) or ROUNDS < 20, seen
