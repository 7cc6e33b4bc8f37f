"""What the verification gate costs at the irreversible boundary, next to what a step costs.

For each target (local ``fs.rename``, and ``drive.rename`` through the real Google client on
an in-process staging Drive) it runs a plan of N reversible steps through run_step (the
two-phase journal, gates, snapshot, action, outcome), then the gate over all N done steps
(tidemark.boundary.verify_reversible: one probe per step, one event) several times, and prints
per step: run_step's p50 and mean, the gate's time per verified step, and their ratio, side by
side. Run on the embedded Postgres (or DATABASE_URL).

    python bench/boundary_gate.py [--steps 1000] [--gates 3] [--targets fs,drive]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from journal_overhead import bench_store, pct

from activities.drive import DriveRename, drive_client
from activities.fs import FsRename
from staging.core import StagingServer
from staging.drive import DEFAULT_READ_TOKEN, DEFAULT_WRITE_TOKEN, DriveTarget
from staging.targets import build_staging
from tidemark.actions import Registry
from tidemark.boundary import verify_reversible
from tidemark.plan import load_plan
from tidemark.run_step import run_step
from tidemark.store import JournalStore


def fs_plan(n: int, task_id: str) -> tuple[Registry, dict]:
    docs = Path(tempfile.mkdtemp(prefix="tidemark-gate-"))
    for i in range(n):
        (docs / f"scan-{i}.pdf").write_text(str(i))
    return Registry([FsRename([str(docs)])]), {"task_id": task_id, "steps": [
        {"action": "fs.rename", "args": {"path": str(docs / f"scan-{i}.pdf"),
                                         "name": f"invoice {i}.pdf"}} for i in range(n)]}


def drive_plan(n: int, task_id: str, server: StagingServer) -> tuple[Registry, dict]:
    drive = server.staging.targets[DriveTarget.name]
    assert isinstance(drive, DriveTarget)
    ids = [drive.seed(f"{task_id}-scan-{i}.pdf").id for i in range(n)]
    action = DriveRename(drive_client(server.url, DEFAULT_WRITE_TOKEN),
                         drive_client(server.url, DEFAULT_READ_TOKEN))
    return Registry([action]), {"task_id": task_id, "steps": [
        {"action": "drive.rename", "args": {"file_id": f, "name": f"invoice {i}.pdf"}}
        for i, f in enumerate(ids)]}


def measure(store: JournalStore, registry: Registry, doc: dict,
            gates: int) -> tuple[list[float], list[float]]:
    plan = load_plan(doc, registry)
    store.persist_plan(plan)
    steps: list[float] = []
    for s in plan.steps:
        t0 = time.perf_counter()
        run_step(store, registry, plan.task_id, s.number)
        steps.append(time.perf_counter() - t0)
    per_verified: list[float] = []
    for _ in range(gates):
        t0 = time.perf_counter()
        v = verify_reversible(store, registry, plan.task_id, len(plan.steps) + 1)
        elapsed = time.perf_counter() - t0
        assert v.passed and v.verified == len(plan.steps), v.failures[:3]
        per_verified.append(elapsed / v.verified)
    return steps, per_verified


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--gates", type=int, default=3, help="gate runs per target")
    ap.add_argument("--targets", default="fs,drive")
    a = ap.parse_args()
    ms = 1000.0
    rows = []
    with bench_store() as (store, embedded), StagingServer(build_staging()) as server:
        for target in a.targets.split(","):
            task_id = f"gate-{target}-{time.time_ns()}"
            registry, doc = (fs_plan(a.steps, task_id) if target == "fs"
                             else drive_plan(a.steps, task_id, server))
            steps, gate = measure(store, registry, doc, a.gates)
            rows.append((target, pct(steps, 0.5) * ms, statistics.mean(steps) * ms,
                         statistics.median(gate) * ms, statistics.median(gate) * a.steps))
    print(f"{a.steps} reversible steps per target, gate run {a.gates}x "
          f"(postgres: {'embedded' if embedded else 'URL'})")
    print(f"{'target':<8}{'step p50 ms':>13}{'step mean ms':>14}{'gate ms/step':>14}"
          f"{'gate/step':>11}{'gate total s':>14}")
    for target, p50, mean, g, total in rows:
        print(f"{target:<8}{p50:>13.3f}{mean:>14.3f}{g:>14.3f}{g / mean:>10.2f}x{total:>14.2f}")
    print("a step through Temporal adds about 46 ms of activity round trip on the dev server "
          "(bench/step_overhead.py); the gate is one activity whatever N is")


if __name__ == "__main__":
    main()
