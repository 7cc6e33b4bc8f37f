"""How long the `tidemark` command takes to start and answer, side by side with Python itself.

    python bench/cli_start.py [--runs N] [--json]

``tidemark status T`` (on a task whose first step ran, in a journal on an embedded Postgres or
DATABASE_URL) and ``tidemark --help`` run as subprocesses, the way an operator runs them, and
alternate in rounds with a bare ``python -c pass``, with a process that only imports the
provider SDKs (Google's, Microsoft Graph's, Stripe's), and with one that only imports what
`status` cannot do without: the journal's driver and its connection pool (psycopg,
psycopg_pool), ending as the command ends. `--help` needs neither, and `status` no Temporal
SDK (tests/test_cli_imports.py holds both to that). The machine's load moves every absolute
number; the ratios to those neighbours, measured in the same rounds, say what the command
itself costs beyond its driver and whether it still pays for the SDKs. bench/run_all.py
reports the median as ``cli_status_ms``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from activities.fs import FsRename  # noqa: E402 (after the path above)
from tidemark.actions import Registry  # noqa: E402
from tidemark.approval import unattended  # noqa: E402
from tidemark.database import ENV_URL, EmbeddedPostgres  # noqa: E402
from tidemark.plan import load_plan  # noqa: E402
from tidemark.run_step import run_step  # noqa: E402
from tidemark.store import JournalStore  # noqa: E402

# What the console script `tidemark` runs (pyproject's [project.scripts]), without depending on
# where the script was installed.
TIDEMARK = "from tools.cli.main import run; run()"
SDKS = "import googleapiclient.discovery, msgraph, stripe"
# What `tidemark status` cannot start without: the journal's driver and the pool the store
# opens (tidemark.store.base). A command's floor: what it costs beyond this is ours. It ends as
# the command does, without the interpreter's teardown (tidemark.process_exit), which costs
# a process that loaded psycopg tens of milliseconds more.
FLOOR = "import os, psycopg, psycopg_pool; os._exit(0)"


def variants(task_id: str) -> dict[str, list[str]]:
    """The command lines compared, by the key their median is reported under."""
    py = sys.executable
    return {"python_bare_ms": [py, "-c", "pass"],
            "python_sdk_import_ms": [py, "-c", SDKS],
            "python_psycopg_ms": [py, "-c", FLOOR],
            "cli_status_ms": [py, "-c", TIDEMARK, "status", task_id],
            "cli_help_ms": [py, "-c", TIDEMARK, "--help"]}


def seed_task(db_url: str, work: Path) -> str:
    """A task of three renames whose first step ran: what `status` is asked about."""
    task_id = f"cli-start-{uuid.uuid4().hex[:8]}"
    for i in range(3):
        (work / f"f{i}.txt").write_text(str(i))
    doc = {"task_id": task_id, "steps": [
        {"action": "fs.rename", "args": {"path": str(work / f"f{i}.txt"), "name": f"g{i}.txt"}}
        for i in range(3)]}
    registry = Registry([FsRename([work])])
    with JournalStore(db_url) as store:
        store.migrate()
        unattended(store, "bench")  # a scratch journal: unattended
        store.persist_plan(load_plan(doc, registry))
        run_step(store, registry, task_id, 1)
    return task_id


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Time one run: (milliseconds from spawn to exit, CPU milliseconds the process used).

    A failing run fails the benchmark. The CPU time moves much less with the machine's load than
    the wall time: a process waiting for a core is not charged for the wait."""
    cpu0 = _children_cpu_s()
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    ms = (time.perf_counter() - t0) * 1000
    cpu_ms = (_children_cpu_s() - cpu0) * 1000
    if done.returncode != 0:
        raise RuntimeError(f"{argv[2:]} exited {done.returncode}: {done.stderr.strip()[-400:]}")
    return ms, cpu_ms


def measure_cli_start(db_url: str, runs: int) -> dict[str, Any]:
    """Medians of ``runs`` rounds, each running every variant once.

    One round runs every variant, so that the machine's noise hits them alike. Also returns the
    ratios of the status command to its neighbours, and the same medians in CPU time under
    ``cli_start_cpu_ms``."""
    with tempfile.TemporaryDirectory(prefix="tidemark-cli-start-") as work:
        task_id = seed_task(db_url, Path(work))
        # This tree first on the path, so that a worktree measures its own code. Its bytecode
        # is cached as an installed package's is (pip compiles it), in a directory of this run:
        # under PYTHONDONTWRITEBYTECODE (a container's or a CI's setting) every start would
        # otherwise compile each of our modules again, and a tree that happens to hold
        # __pycache__ would be measured against one that does not.
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env.update({ENV_URL: db_url, "PYTHONPYCACHEPREFIX": str(Path(work) / "pycache"),
                    "PYTHONPATH": os.pathsep.join(
                        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)})
        lines = variants(task_id)
        wall: dict[str, list[float]] = {k: [] for k in lines}
        cpu: dict[str, list[float]] = {k: [] for k in lines}
        for argv in lines.values():  # warm the page cache and the .pyc files once, unmeasured
            time_once(argv, env)
        for _ in range(runs):
            for key, argv in lines.items():
                ms, cpu_ms = time_once(argv, env)
                wall[key].append(ms)
                cpu[key].append(cpu_ms)
    out: dict[str, Any] = {k: round(statistics.median(v), 1) for k, v in wall.items()}
    out["cli_status_vs_python_bare"] = round(out["cli_status_ms"] / out["python_bare_ms"], 2)
    out["cli_status_vs_sdk_import"] = round(out["cli_status_ms"] / out["python_sdk_import_ms"],
                                            2)
    out["cli_status_vs_psycopg"] = round(out["cli_status_ms"] / out["python_psycopg_ms"], 2)
    out["cli_start_cpu_ms"] = {k: round(statistics.median(v), 1) for k, v in cpu.items()}
    out["cli_start_runs"] = runs
    return out


@contextlib.contextmanager
def journal_url() -> Iterator[str]:
    """DATABASE_URL, or a fresh database on an embedded Postgres that goes away afterwards."""
    url = os.environ.get(ENV_URL)
    if url:
        yield url
        return
    with tempfile.TemporaryDirectory(prefix="tidemark-cli-start-pg-") as data:
        pg = EmbeddedPostgres(Path(data) / "pg", delete=True)
        try:
            yield pg.url()
        finally:
            pg.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15, help="rounds of every variant (default 15)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args()
    if a.runs < 1:
        ap.error("--runs must be at least 1")
    with journal_url() as url:
        result = measure_cli_start(url, a.runs)
    result["load_avg"] = os.getloadavg()[0]
    if a.json:
        print(json.dumps(result, indent=1))
    else:
        for k, v in result.items():
            print(f"{k}: {v}")


if __name__ == "__main__":
    main()
