"""The real worker with only the benchmarks' actions bound.

This is worker.main with the actions of bench/bench_actions.py: ``python bench/bench_worker.py``
with the worker's usual environment (TEMPORAL_ADDRESS, DATABASE_URL, TIDEMARK_TASK_QUEUE).

With ``TIDEMARK_BENCH_LATENCIES=FILE`` it also keeps every step's latency as the journal
reports it (tidemark_step_latency: from the attempt's start to its outcome written). It writes
them to FILE when it exits, one per line in seconds. That is what the journal's part of a step
costs inside a worker, between the steps of real runs (bench/path_breakdown.py)."""

import atexit
import os
import sys
from collections.abc import Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_actions import BenchStep, ShortBenchStep

import worker
from tidemark import metrics
from tidemark.actions import Registry

LATENCIES_ENV = "TIDEMARK_BENCH_LATENCIES"


class Latencies(metrics.Metrics):
    """A metrics sink that keeps each step's latency exactly.

    The runtime's meter keeps whole milliseconds, in buckets."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def observe(self, name: str, seconds: float, labels: Mapping[str, str]) -> None:
        if name == metrics.STEP_LATENCY:
            self.seconds.append(seconds)

    def write(self, path: Path) -> None:
        path.write_text("".join(f"{s:.7f}\n" for s in self.seconds))


if __name__ == "__main__":
    if os.environ.get(LATENCIES_ENV):
        kept = Latencies()
        metrics.install(kept)
        atexit.register(kept.write, Path(os.environ[LATENCIES_ENV]))
    worker.main(Registry([BenchStep(), ShortBenchStep()]))
