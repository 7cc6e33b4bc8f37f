"""What a two-statement transaction costs in round trips, sent two ways by psycopg.

The transaction is written the way the journal's intent is: a share lock on the task's plan
row, then the insert.

    python bench/intent_round_trips.py [--steps 600] [--rounds 6] [--gap-ms 15]

* ``transaction``: ``conn.pipeline()`` with ``conn.transaction()`` inside, the row fetched in
  the block: BEGIN is sent and waited for, the two statements are flushed and waited for, then
  a Sync, COMMIT and the pipeline's own Sync (five waits);
* ``one sync``: ``conn.pipeline()`` alone, the row fetched after it: the two statements and one
  Sync, which ends the transaction they run in (StepSession.begin; one wait).

Both run on one connection with autocommit, as the pool's are, against a table of the same
shape as the journal's hot columns; alternated in rounds, back to back and then ``--gap-ms``
apart (a step's intent follows a pause in which the connection and its backend went idle).
Prints the p50 of each and their ratio, per round and over all rounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg
from journal_overhead import bench_store
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

TABLE = """
CREATE TEMP TABLE intents (task_id text, step int, idem_key text PRIMARY KEY, args jsonb,
                           before_state jsonb, started_at timestamptz DEFAULT clock_timestamp())
"""
LOCK = "SELECT 1 FROM tidemark.plans WHERE task_id = %s FOR SHARE"
INSERT = ("INSERT INTO intents (task_id, step, idem_key, args, before_state)"
          " VALUES (%s, %s, %s, %s, '{}') RETURNING *")

Write = Callable[[psycopg.Connection[dict[str, Any]], str, int], object]


def in_a_transaction(conn: psycopg.Connection[dict[str, Any]], task: str, step: int) -> object:
    with conn.pipeline(), conn.transaction():
        conn.execute(LOCK, (task,))
        return conn.execute(INSERT, (task, step, uuid.uuid4().hex, Jsonb({"i": step}))
                            ).fetchone()


def in_one_sync(conn: psycopg.Connection[dict[str, Any]], task: str, step: int) -> object:
    with conn.pipeline():
        conn.execute(LOCK, (task,))
        cur = conn.execute(INSERT, (task, step, uuid.uuid4().hex, Jsonb({"i": step})))
    return cur.fetchone()


FORMS: dict[str, Write] = {"transaction": in_a_transaction, "one sync": in_one_sync}


def timed(conn: psycopg.Connection[dict[str, Any]], write: Write, task: str, first: int,
          n: int, gap_s: float) -> list[float]:
    out = []
    for step in range(first, first + n):
        if gap_s:
            time.sleep(gap_s)
        t0 = time.perf_counter()
        write(conn, task, step)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=600, help="intents per form and round")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--gap-ms", type=float, default=15.0)
    a = ap.parse_args()
    with bench_store() as (store, _), psycopg.connect(store.conninfo, autocommit=True,
                                                      row_factory=dict_row) as conn:
        conn.execute(TABLE)
        task = f"intents-{uuid.uuid4().hex[:8]}"
        conn.execute("INSERT INTO tidemark.plans (task_id, plan_hash, step_count)"
                     " VALUES (%s, %s, 1)", (task, "0" * 64))
        for label, gap_s in (("back to back", 0.0), (f"{a.gap_ms:g} ms apart", a.gap_ms / 1000)):
            n = a.steps if not gap_s else max(a.steps // 6, 20)
            p50: dict[str, list[float]] = {form: [] for form in FORMS}
            step = 1
            for r in range(a.rounds):
                order = list(FORMS) if r % 2 == 0 else list(reversed(FORMS))
                for form in order:
                    p50[form].append(statistics.median(
                        timed(conn, FORMS[form], task, step, n, gap_s)))
                    step += n
            ratios = [t / o for t, o in zip(p50["transaction"], p50["one sync"], strict=True)]
            print(f"{label}: " + "; ".join(
                f"{form} p50 {statistics.median(v):.3f} ms" for form, v in p50.items())
                + f"; transaction / one sync {statistics.median(ratios):.2f}x (rounds: "
                + ", ".join(f"{x:.2f}" for x in ratios) + ")")


if __name__ == "__main__":
    main()
