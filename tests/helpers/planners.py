"""Planners for the scheduled-run tests, each call counted in a file.

So a test can show that a blocked run never called its planner."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any


def nightly(args: dict[str, Any], scheduled: datetime) -> dict[str, Any]:
    """Appends a line to ``args["calls"]`` and plans ``args["n"]`` ledger entries.

    Each entry is held ``args["hold_s"]`` seconds, if given, so that a test finds the run under
    way."""
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


def paying(args: dict[str, Any], scheduled: datetime) -> dict[str, Any]:
    """A planner whose plan ends in a mail and a payment: what a model might return.

    The payment is ``args["amount"]`` of ``args["currency"]``. The planner may try to set its own
    ``approval`` (``args["approval"]``)."""
    doc: dict[str, Any] = {"steps": [
        {"action": "ledger.record", "args": {"ledger": args["ledger"],
                                             "entry": f"{scheduled:%H%M%S%f}"}},
        {"action": "gmail.send", "args": {"to": ["ap@supplier.example"], "subject": "Paid",
                                          "body": "Paid tonight."}},
        {"action": "stripe.payment_intent", "args": {"amount": int(args["amount"]),
                                                     "currency": args["currency"]}}]}
    if "approval" in args:
        doc["approval"] = args["approval"]
    return doc


def reads_twice(args: dict[str, Any], scheduled: datetime) -> dict[str, Any]:
    """A planner still reading when its task is killed.

    It lists the Drive, says so in ``args["ready"]``, waits (up to 30 s) for ``args["go"]`` to
    exist, lists again, and plans one ledger entry."""
    import os
    import time

    from activities.drive_list import list_files, reader_from_env

    reader = reader_from_env(os.environ)
    list_files(reader, "trashed = false")
    Path(args["ready"]).write_text(scheduled.isoformat())
    deadline = time.monotonic() + 30
    while not Path(args["go"]).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    list_files(reader, "trashed = false")
    return {"steps": [{"action": "ledger.record",
                       "args": {"ledger": args["ledger"], "entry": "read twice"}}]}
