"""The nightly supplier sync's planner: lists the Drive inbox and plans tonight's run.

Schedule it::

    tidemark schedule create supplier-sync --cron '0 3 * * *' \\
        --planner examples.supplier_sync_planner:plan \\
        --args '{"prefix": "scan-", "to": ["ap@supplier.example"]}'

Every night the schedule starts ``ScheduledRun``; if the series is not stopped and the last run
is settled, it calls ``plan(args, scheduled)`` on a worker (which must be able to import this
module) and runs what it returns. The plan: every inbox file (a non-trashed file whose name
starts with ``prefix``) renamed to ``<date> supplier <name>``, then one mail to ``to`` listing
them — renames first, the irreversible mail last. A night with an empty inbox plans only the
mail saying so.

A real agent plugs in here: replace the body with a call to your model that reads the same
inbox and returns the same shape; Tidemark validates the plan, persists it under a task id
derived from the series and the scheduled time, and journals every step.
"""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any

from activities.drive_list import list_files, reader_from_env


def plan(args: dict[str, Any], scheduled: datetime) -> dict[str, Any]:
    prefix = str(args.get("prefix", "scan-"))
    to = list(args.get("to") or ["ap@supplier.example"])
    quoted = prefix.replace("\\", "\\\\").replace("'", "\\'")
    inbox = [f for f in list_files(reader_from_env(os.environ),
                                   f"name contains '{quoted}' and trashed = false")
             if f["name"].startswith(prefix)]
    day = f"{scheduled:%Y-%m-%d}"
    steps: list[dict[str, Any]] = [
        {"action": "drive.rename",
         "args": {"file_id": f["id"], "name": f"{day} supplier {f['name'][len(prefix):]}"}}
        for f in sorted(inbox, key=lambda f: f["name"])]
    listed = "\n".join(f"- {s['args']['name']}" for s in steps) or "(the inbox was empty)"
    steps.append({"action": "gmail.send", "args": {
        "to": to, "subject": f"Supplier invoices filed {day}",
        "body": f"Filed tonight ({len(steps)} files):\n{listed}\n"}})
    return {"steps": steps}
