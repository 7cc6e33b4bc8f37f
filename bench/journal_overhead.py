"""What the two-phase journal costs per step, on the embedded Postgres (or DATABASE_URL).

Runs a plan of N no-op steps three ways in the same process, interleaved in rounds so machine
noise hits all three alike, and prints p50/p99 per step and the ratios:

* ``bare``: INSERT intent + UPDATE outcome, two commits, nothing else (the journal's floor);
* ``run_step``: the full algorithm — look the step up, gates, snapshot, the intent (owned by
  the attempt), action (a no-op), outcome;
* ``seed``: the essay's figure of about 15 ms per step against a local Postgres (a constant, not
  measured here), to say how far under it we are.

    python bench/journal_overhead.py [--steps 2000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

from psycopg.types.json import Jsonb

from tidemark.actions import Action, Arg, ProbeResult, Registry, StepContext
from tidemark.approval import unattended
from tidemark.database import ENV_URL, EmbeddedPostgres
from tidemark.plan import load_plan
from tidemark.run_step import run_step
from tidemark.store import JournalStore

SEED_MS_PER_STEP = 15.0  # "about 15 ms against a local Postgres", the essay's yardstick
ROUNDS = 10  # interleave the two variants in this many slices


class Noop(Action):
    name: ClassVar[str] = "bench.noop"
    irreversible: ClassVar[bool] = True
    args: ClassVar[dict[str, Arg]] = {"i": Arg(int)}

    def probe(self, ctx: StepContext) -> ProbeResult:
        return ProbeResult.absent("no-op")

    def execute(self, ctx: StepContext) -> dict[str, Any]:
        return {"i": ctx.args["i"]}


@contextmanager
def bench_store() -> Iterator[tuple[JournalStore, bool]]:
    """A migrated JournalStore on DATABASE_URL, or on a throwaway embedded Postgres.

    Yields it with whether it is embedded."""
    url = os.environ.get(ENV_URL)
    embedded = None
    if not url:
        embedded = EmbeddedPostgres(Path(tempfile.mkdtemp()) / "pg", delete=True)
        url = embedded.url()
    store = JournalStore(url).open()
    try:
        store.migrate()
        unattended(store, "bench")  # a scratch journal: unattended
        yield store, embedded is not None
    finally:
        store.close()
        if embedded:
            embedded.close()


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000)
    n = ap.parse_args().steps

    with bench_store() as (store, embedded):
        t_full, t_bare = measure(store, n)
    report(t_full, t_bare, n, embedded)


def measure(store: JournalStore, n: int) -> tuple[list[float], list[float]]:
    registry = Registry([Noop()])
    doc = {"steps": [{"action": "bench.noop", "args": {"i": i}} for i in range(n)]}
    full = load_plan({**doc, "task_id": f"bench-full-{time.time_ns()}"}, registry)
    bare = load_plan({**doc, "task_id": f"bench-bare-{time.time_ns()}"}, registry)
    store.persist_plan(full)
    store.persist_plan(bare)

    t_full: list[float] = []
    t_bare: list[float] = []
    per_round = n // ROUNDS
    with store._conn() as conn:  # the bare variant: just the two journal statements
        for r in range(ROUNDS):
            for i in range(r * per_round + 1, (r + 1) * per_round + 1):
                t0 = time.perf_counter()
                run_step(store, registry, full.task_id, i)
                t_full.append(time.perf_counter() - t0)
            for i in range(r * per_round + 1, (r + 1) * per_round + 1):
                key = f"{i:032x}"
                t0 = time.perf_counter()
                conn.execute(
                    "INSERT INTO tidemark.journal (task_id, step, idem_key, action, args,"
                    " before_state) VALUES (%s, %s, %s, 'bench.noop', %s, '{}')",
                    (bare.task_id, i, key, Jsonb({"i": i})))
                conn.execute(
                    "UPDATE tidemark.journal SET outcome = %s, status = 'done',"
                    " resolved_by = 'execute', finished_at = clock_timestamp()"
                    " WHERE idem_key = %s", (Jsonb({"i": i}), key))
                t_bare.append(time.perf_counter() - t0)
    return t_full, t_bare


def report(t_full: list[float], t_bare: list[float], n: int, embedded: bool) -> None:
    ms = 1000.0
    f50, f99 = pct(t_full, 0.5) * ms, pct(t_full, 0.99) * ms
    b50, b99 = pct(t_bare, 0.5) * ms, pct(t_bare, 0.99) * ms
    print(f"steps per variant: {len(t_full)}  (postgres: {'embedded' if embedded else 'URL'})")
    print(f"{'variant':<10}{'p50 ms':>10}{'p99 ms':>10}{'mean ms':>10}")
    print(f"{'bare':<10}{b50:>10.3f}{b99:>10.3f}{statistics.mean(t_bare) * ms:>10.3f}")
    print(f"{'run_step':<10}{f50:>10.3f}{f99:>10.3f}{statistics.mean(t_full) * ms:>10.3f}")
    print(f"ratio run_step/bare p50: {f50 / b50:.2f}x")
    print(f"ratio seed 15 ms / bare p50: {SEED_MS_PER_STEP / b50:.1f}x, "
          f"/ run_step p50: {SEED_MS_PER_STEP / f50:.1f}x")
    print(f"42-step morning: {42 * f50:.1f} ms of journal time "
          f"(seed: {42 * SEED_MS_PER_STEP:.0f} ms)")
    print(f"target p50 of intent + outcome <= 1 ms: {'met' if b50 <= 1.0 else 'NOT met'} "
          f"({b50:.3f} ms); the whole step with lock and lookup: {f50:.3f} ms")


if __name__ == "__main__":
    main()
