"""A pytest plugin for tests/test_tiers.py that writes every test's tier markers as JSON.

The file is named by TIDEMARK_TIER_REPORT (``-p helpers.tier_report``). Every collected test is
written."""

from __future__ import annotations

import json
import os

import pytest

MARKERS = ("unit", "postgres", "temporal", "slow")


def pytest_collection_finish(session: pytest.Session) -> None:
    report = {item.nodeid: sorted({m.name for m in item.iter_markers() if m.name in MARKERS})
              for item in session.items}
    with open(os.environ["TIDEMARK_TIER_REPORT"], "w") as out:
        json.dump(report, out)
