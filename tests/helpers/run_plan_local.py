"""Runs every step of a stored plan through run_step in this process, in order:
``python tests/helpers/run_plan_local.py DB_URL TASK STAGING_URL [POOL_MAX]``.

The chaos test starts it with TIDEMARK_CRASH_AT set, so it SIGKILLs itself at one named point
of one step; the same actions (real SDKs, staging servers) as a worker configured with
TIDEMARK_STAGING_URL and this process's TIDEMARK_* variables (e.g. TIDEMARK_GMAIL_TIMEOUT_S),
plus the test action ledger.record. POOL_MAX sizes the journal's connection pool: 1 is a
worker at full load, every pooled connection held by a step.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from activities.wiring import worker_registry
from helpers.ledger import LedgerRecord
from tidemark.run_step import run_step
from tidemark.store import POOL_MAX, JournalStore


def main() -> int:
    url, task_id, staging_url = sys.argv[1:4]
    pool_max = int(sys.argv[4]) if len(sys.argv) > 4 else POOL_MAX
    env = {k: v for k, v in os.environ.items() if k.startswith("TIDEMARK_")}
    registry = worker_registry({**env, "TIDEMARK_STAGING_URL": staging_url})
    registry.register(LedgerRecord())
    with JournalStore(url, max_size=pool_max) as store:
        for step in range(1, store.progress(task_id).step_count + 1):
            run_step(store, registry, task_id, step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
