"""What one step sends to Postgres, read from libpq's own protocol trace: its journal costs
three round trips, the read, the intent and the outcome. A round trip is the client's turn to
send followed by the server's turn to answer: the trace's lines change from F to B."""

from __future__ import annotations

from pathlib import Path

from psycopg import pq

from activities.catalog import spec_registry
from activities.fs import FsRename
from helpers.fs_roots import FS_ROOTS
from helpers.steps import persist
from tidemark.actions import Registry
from tidemark.run_step import run_step
from tidemark.store import JournalStore

SPECS = spec_registry(FsRename)
REGISTRY = Registry([FsRename([FS_ROOTS])])


def traced_step(store: JournalStore, trace: Path, task: str, step: int) -> list[str]:
    """The messages the pool's connections exchanged while run_step ran ``step``, each as its
    direction and name (``F Sync``, ``B ReadyForQuery``)."""
    idle = list(store._pool._pool)  # the connections the step may be handed
    f = trace.open("w")
    for conn in idle:
        conn.pgconn.trace(f.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
    try:
        assert run_step(store, REGISTRY, task, step).status == "done"
    finally:
        for conn in idle:
            conn.pgconn.untrace()
        f.close()
    return [f"{fields[0]} {fields[2].split(' ')[0]}"
            for fields in (line.split("\t") for line in trace.read_text().splitlines())
            if fields[0] in ("F", "B")]


def test_a_step_journals_its_intent_in_one_round_trip_and_the_whole_step_in_three(
        store: JournalStore, tmp_path: Path) -> None:
    steps = []
    for i in (1, 2):
        (tmp_path / f"draft-{i}.txt").write_text(str(i))
        steps.append({"action": "fs.rename", "args": {"path": str(tmp_path / f"draft-{i}.txt"),
                                                      "name": f"final-{i}.txt"}})
    task = persist(store, SPECS, steps, "round-trips")
    assert run_step(store, REGISTRY, task, 1).status == "done"  # the pool is warm
    sent = traced_step(store, tmp_path / "trace", task, 2)
    turns = [m for i, m in enumerate(sent) if i > 0 and m[0] == "B" and sent[i - 1][0] == "F"]
    assert sent.count("F Execute") >= 4, sent  # the trace saw the step's statements
    assert len(turns) == 3, f"the step waited for Postgres {len(turns)} times: {sent}"
    assert sorted((tmp_path).glob("final-*.txt")) == [tmp_path / "final-1.txt",
                                                       tmp_path / "final-2.txt"]
