"""The real worker (worker.main) with only the benchmarks' actions (bench/bench_actions.py)
bound: ``python bench/bench_worker.py`` with the worker's usual environment (TEMPORAL_ADDRESS,
DATABASE_URL, TIDEMARK_TASK_QUEUE)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_actions import BenchStep, ShortBenchStep

import worker
from tidemark.actions import Registry

if __name__ == "__main__":
    worker.main(Registry([BenchStep(), ShortBenchStep()]))
