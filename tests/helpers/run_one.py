"""Runs one step in a separate process.

Usage: ``python tests/helpers/run_one.py URL TASK STEP`` (``... STEP undo`` runs its compensation
through unwind_step instead).

Used by tests that race processes or SIGKILL one (via TIDEMARK_CRASH_AT). Prints the result as
JSON on stdout, or the error's class name on stderr with exit code 3. With
``TIDEMARK_GRAPH_URL`` (``TIDEMARK_DRIVE_URL``) and its tokens in the environment,
``graph.send_mail`` (``drive.rename``) is bound too, as a worker binds it.
"""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from activities.fs import FsRename
from activities.wiring import bound_actions
from helpers.fs_roots import FS_ROOTS
from helpers.ledger import LedgerRecord
from tidemark.actions import Registry
from tidemark.errors import TidemarkError
from tidemark.run_step import run_step
from tidemark.store import JournalStore
from tidemark.unwind import unwind_step

# The actions bound as a worker binds them, each when its target's URL is configured.
BOUND_WITH = {"graph.send_mail": "TIDEMARK_GRAPH_URL", "drive.rename": "TIDEMARK_DRIVE_URL"}


def main() -> int:
    url, task_id, step = sys.argv[1], sys.argv[2], int(sys.argv[3])
    undo = sys.argv[4:] == ["undo"]
    targets = [name for name, variable in BOUND_WITH.items() if os.environ.get(variable)]
    bound = [a for a in bound_actions(os.environ) if a.name in targets] if targets else []
    registry = Registry([FsRename([FS_ROOTS]), LedgerRecord(), *bound])
    with JournalStore(url) as store:
        try:
            if undo:
                undone = unwind_step(store, registry, task_id, step)
                print(json.dumps({"status": undone.status}))
                return 0
            result = run_step(store, registry, task_id, step)
        except TidemarkError as e:
            print(type(e).__name__, file=sys.stderr)
            return 3
    print(json.dumps({"status": result.status, "resolved_by": result.resolved_by,
                      "skipped": result.skipped}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
