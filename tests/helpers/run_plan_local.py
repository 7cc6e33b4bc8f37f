"""Runs every step of a stored plan through run_step in this process, in order.

Usage: ``python tests/helpers/run_plan_local.py DB_URL TASK STAGING_URL [POOL_MAX]``.

The chaos test starts it with TIDEMARK_CRASH_AT set, so it SIGKILLs itself at one named point
of one step; the same actions (real SDKs, staging servers) as a worker configured with
TIDEMARK_STAGING_URL and this process's TIDEMARK_* variables (e.g. TIDEMARK_GMAIL_TIMEOUT_S),
plus the test action ledger.record, with short deadlines (see ``short_deadlines``).
POOL_MAX sizes the journal's connection pool: 1 is a worker at full load, every pooled
connection held by a step.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from activities.wiring import worker_registry
from helpers.fs_roots import FS_ROOTS
from helpers.ledger import LedgerRecord
from tidemark.actions import Registry
from tidemark.errors import ActionNotConfigured
from tidemark.run_step import run_step
from tidemark.store import POOL_MAX, JournalStore

# The staging servers answer in milliseconds when no fault is armed, and the chaos rounds arm
# none: a call of these tests never takes more than this. A killed attempt's lease (deadline
# plus horizon, written before its call) then lapses after seconds, not the minute of a real
# provider's client timeout.
TEST_DEADLINE_S = 2.0


# What staging is like, unless the environment says otherwise: it applies every write within
# its request, so Drive and Gmail need no horizon, a Graph send leaves Drafts at once, and a
# Graph send that got no answer needs watching for seconds only.
STAGING_DEFAULTS = {"TIDEMARK_DRIVE_HORIZON_S": "0", "TIDEMARK_GMAIL_HORIZON_S": "0",
                    "TIDEMARK_GRAPH_CONFIRM_S": "1", "TIDEMARK_GRAPH_LATE_S": "2"}


def short_deadlines(registry: Registry, env: dict[str, str] | None = None) -> Registry:
    """Gives every bound action of ``registry`` the test deadline; horizons stay as they are.

    The exception is a target whose client timeout ``env`` sets (TIDEMARK_<T>_TIMEOUT_S): a test
    that sets one arms a slow provider for it, and that action keeps the deadline its timeout
    implies."""
    for name in registry.names():
        if f"TIDEMARK_{name.partition('.')[0].upper()}_TIMEOUT_S" in (env or {}):
            continue
        try:
            registry.bound(name).deadline_s = TEST_DEADLINE_S
        except ActionNotConfigured:  # known but not bound here (no credentials for it)
            continue
    return registry


def main() -> int:
    url, task_id, staging_url = sys.argv[1:4]
    pool_max = int(sys.argv[4]) if len(sys.argv) > 4 else POOL_MAX
    env = {k: v for k, v in os.environ.items() if k.startswith("TIDEMARK_")}
    registry = worker_registry({"TIDEMARK_FS_ROOTS": FS_ROOTS, **STAGING_DEFAULTS, **env,
                                "TIDEMARK_STAGING_URL": staging_url})
    registry.register(LedgerRecord())
    short_deadlines(registry, env)
    with JournalStore(url, max_size=pool_max) as store:
        for step in range(1, store.progress(task_id).step_count + 1):
            run_step(store, registry, task_id, step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
