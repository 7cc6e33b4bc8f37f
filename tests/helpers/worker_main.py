"""The real worker (worker.main) with the test action ``ledger.record`` bound as well.

``python tests/helpers/worker_main.py`` with the worker's usual environment.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import worker
from activities.wiring import worker_registry
from helpers.ledger import LedgerRecord

if __name__ == "__main__":
    registry = worker_registry(os.environ)
    registry.register(LedgerRecord())
    worker.main(registry)
