"""`tidemark chaos` on the ledger plugin (installed from examples/ledger-plugin): it passes
twenty interrupted runs, and a probe that matches on the name alone is caught."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from activities.wiring import worker_registry
from staging.core import StagingServer
from tidemark.plan import load_plan
from tidemark.tools import chaos

ROOT = Path(__file__).parent.parent
LEDGER_PLAN = ROOT / "examples" / "ledger-invoices.json"
KEYS = {"runs", "duplicates", "mismatches", "phases", "seed", "failures"}


def tidemark_chaos(db_url: str, server: StagingServer, *args: str) -> tuple[int, dict[str, Any]]:
    env = {**os.environ, "DATABASE_URL": db_url,
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "tidemark.tools.cli", "chaos", str(LEDGER_PLAN),
                           "--staging-url", server.url, "--json", *args],
                          env=env, capture_output=True, text=True, timeout=280)
    assert proc.stdout, proc.stderr[-2000:]
    assert "/20" in proc.stderr or "/3" in proc.stderr  # the progress bar went to stderr
    return proc.returncode, json.loads(proc.stdout)


def test_the_ledger_plugin_passes_twenty_interrupted_runs(db_url: str,
                                                          server: StagingServer) -> None:
    code, out = tidemark_chaos(db_url, server, "--runs", "20", "--seed", "5")
    assert set(out) == KEYS
    assert (out["runs"], out["duplicates"], out["mismatches"], out["failures"]) == (20, 0, 0, [])
    assert sum(out["phases"].values()) == 20 and out["seed"] == 5
    assert {"lost_response", "slow_provider"} & set(out["phases"]), out["phases"]
    assert code == 0


def test_chaos_catches_a_probe_that_matches_on_the_name_alone(db_url: str,
                                                             server: StagingServer) -> None:
    # Seed 3 kills the first run after the intent of step 2, the second invoice with the
    # same customer and reference as step 1's: the name-only probe takes step 1's invoice
    # for step 2's, and step 2 is never posted.
    code, out = tidemark_chaos(db_url, server, "--runs", "3", "--seed", "3",
                               "--action", "helpers.wrong_ledger:ByReference")
    assert code == 1
    assert out["mismatches"] >= 1, out
    first = out["failures"][0]
    assert (first["phase"], first["step"]) == ("after_intent", 2)
    assert any("step 2 left" in m for m in first["mismatch"]), first
    code, out = tidemark_chaos(db_url, server, "--runs", "3", "--seed", "3")  # the real probe
    assert (code, out["mismatches"], out["duplicates"]) == (0, 0, 0), out


def test_the_same_seed_gives_the_same_kills(server: StagingServer) -> None:
    registry = worker_registry({"TIDEMARK_STAGING_URL": server.url})
    plan = load_plan(json.loads(LEDGER_PLAN.read_text()), registry)
    writes = {n: [("ledger", "invoices.post")] for n in range(1, 5)}
    a = chaos.choose_kills(plan, registry, writes, 30, seed=9)
    assert a == chaos.choose_kills(plan, registry, writes, 30, seed=9)
    assert a != chaos.choose_kills(plan, registry, writes, 30, seed=10)
    phases = {k.phase for k in a}
    assert "after_stage" not in phases  # the ledger action does not stage
    assert {"before_intent", "after_intent", "after_execute", "after_outcome",
            "lost_response", "slow_provider"} <= phases


def test_a_plan_on_the_local_filesystem_is_refused_with_a_reason(db_url: str,
                                                                server: StagingServer,
                                                                tmp_path: Path) -> None:
    plan = tmp_path / "local.json"
    plan.write_text(json.dumps({"task_id": "local", "steps": [
        {"action": "fs.rename", "args": {"path": str(tmp_path / "a.txt"), "name": "b.txt"}}]}))
    proc = subprocess.run([sys.executable, "-m", "tidemark.tools.cli", "chaos", str(plan),
                           "--staging-url", server.url, "--runs", "1"],
                          env={**os.environ, "DATABASE_URL": db_url}, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1
    assert "fs.rename acts on this machine" in proc.stderr
