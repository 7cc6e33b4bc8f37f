"""Planners for the scheduled-run tests: each call is counted in a file, so a test can show
that a blocked run never called its planner."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any


def nightly(args: dict[str, Any], scheduled: datetime) -> dict[str, Any]:
    """Appends a line to ``args["calls"]`` and plans ``args["n"]`` ledger entries (each held
    ``args["hold_s"]`` seconds, if given, so that a test finds the run under way)."""
    with Path(args["calls"]).open("a") as f:
        f.write(scheduled.isoformat() + "\n")
    stamp = f"{scheduled:%H%M%S%f}"
    hold = {"hold_s": float(args["hold_s"])} if "hold_s" in args else {}
    return {"steps": [{"action": "ledger.record",
                       "args": {"ledger": args["ledger"], "entry": f"{stamp}-{i}", **hold}}
                      for i in range(1, int(args["n"]) + 1)]}


def calls(path: str | Path) -> list[str]:
    p = Path(path)
    return p.read_text().splitlines() if p.exists() else []
