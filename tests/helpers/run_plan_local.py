"""Runs every step of a stored plan through run_step in this process, in order:
``python tests/helpers/run_plan_local.py DB_URL TASK STAGING_URL``.

The chaos test starts it with TIDEMARK_CRASH_AT set, so it SIGKILLs itself at one named point
of one step; the same actions (real SDKs, staging servers) as a worker configured with
TIDEMARK_STAGING_URL, plus the test action ledger.record, with short deadlines (see
``short_deadlines``).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from activities.wiring import worker_registry
from helpers.fs_roots import FS_ROOTS
from helpers.ledger import LedgerRecord
from tidemark.actions import Registry
from tidemark.errors import ActionNotConfigured
from tidemark.run_step import run_step
from tidemark.store import JournalStore

# The staging servers answer in milliseconds when no fault is armed, and the chaos rounds arm
# none: a call of these tests never takes more than this. A killed attempt's lease (deadline
# plus horizon, written before its call) then lapses after seconds, not the minute of a real
# provider's client timeout.
TEST_DEADLINE_S = 2.0


def short_deadlines(registry: Registry) -> Registry:
    """Gives every bound action of ``registry`` the test deadline (horizons stay as they are)."""
    for name in registry.names():
        try:
            registry.bound(name).deadline_s = TEST_DEADLINE_S
        except ActionNotConfigured:  # known but not bound here (no credentials for it)
            continue
    return registry


def main() -> int:
    url, task_id, staging_url = sys.argv[1:4]
    registry = worker_registry({"TIDEMARK_STAGING_URL": staging_url,
                                "TIDEMARK_FS_ROOTS": FS_ROOTS})
    registry.register(LedgerRecord())
    short_deadlines(registry)
    with JournalStore(url) as store:
        for step in range(1, store.progress(task_id).step_count + 1):
            run_step(store, registry, task_id, step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
