"""A DBOS workflow of no-op steps on a given Postgres.

``python bench/dbos_steps.py URL N ROUNDS`` prints {"step_ms": ...}: the median over rounds of
wall time per step.

DBOS writes a row per step to its system database (here a database of the same Postgres the
journal uses) and nothing else: no workflow server in between.
"""

import json
import statistics
import sys
import time
import uuid

from dbos import DBOS, DBOSConfig, SetWorkflowID


def main() -> None:
    url, n, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    config: DBOSConfig = {"name": "tidemark-bench", "system_database_url": url,
                          "log_level": "WARNING"}
    DBOS(config=config)

    @DBOS.step()
    def noop(i: int) -> int:
        return i

    @DBOS.workflow()
    def steps(count: int) -> int:
        for i in range(count):
            noop(i)
        return count

    DBOS.launch()
    per_step = []
    try:
        for _ in range(rounds):
            t0 = time.perf_counter()
            with SetWorkflowID(f"bench-{uuid.uuid4().hex}"):
                steps(n)
            per_step.append((time.perf_counter() - t0) * 1000 / n)
    finally:
        DBOS.destroy()
    print(json.dumps({"step_ms": statistics.median(per_step), "rounds": per_step}))


if __name__ == "__main__":
    main()
