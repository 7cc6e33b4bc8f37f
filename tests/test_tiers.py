"""The test tiers: every test has exactly one of unit, postgres, temporal.

tests/conftest.py gives each test its tier, and slow in addition to the long ones. So
`pytest -m unit` and the rest select by them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
TIERS = {"unit", "postgres", "temporal"}


def collect(tmp_path: Path, *args: str) -> dict[str, list[str]]:
    """Collects the suite in a fresh pytest; returns each test's tier markers."""
    report = tmp_path / f"tiers-{len(list(tmp_path.iterdir()))}.json"
    env = {**os.environ, "TIDEMARK_TIER_REPORT": str(report),
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "helpers.tier_report", "-p", "no:cacheprovider", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 5), done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(report.read_text())


def test_every_test_has_exactly_one_tier_and_m_selects_by_it(tmp_path: Path) -> None:
    everything = collect(tmp_path)
    assert len(everything) > 100  # the whole suite, not a corner of it
    wrong = {node: marks for node, marks in everything.items()
             if len(TIERS & set(marks)) != 1}
    assert not wrong, wrong
    # `-m` selects by those markers: shown on modules that hold every tier (a second
    # collection of the whole suite would only cost the same again).
    mixed = ("tests/test_metrics.py", "tests/test_tiers.py", "tests/test_devstack.py")
    unit = collect(tmp_path, "-m", "unit", *mixed)
    assert set(unit) == {n for n, marks in everything.items()
                         if "unit" in marks and n.startswith(mixed)}
    assert {tier for n, marks in everything.items() if n.startswith(mixed)
            for tier in marks} >= TIERS
    # What the tiers must hold, by the fixtures each test uses:
    assert everything[f"tests/{Path(__file__).name}::"
                      "test_every_test_has_exactly_one_tier_and_m_selects_by_it"] == ["unit"]
    assert everything["tests/test_metrics.py::test_a_sink_that_fails_never_fails_the_step"] == [
        "postgres"]  # the store fixture
    assert everything["tests/test_metrics.py::"
                      "test_a_worker_with_metrics_on_serves_ours_and_the_sdks"] == ["temporal"]
    assert everything["tests/test_metrics.py::test_switches_read_from_the_environment"] == [
        "unit"]
    slow = {n for n, marks in everything.items() if "slow" in marks}
    assert any(n.startswith("tests/test_chaos.py::") for n in slow)
