"""The essay's morning as a plan: 38 Drive renames, then two mails and two payments.

Steps 1-38 rename the supplier's scans on the (staging) Drive, 39 mails the supplier through
Gmail, 40 tells finance through Microsoft Graph, 41 and 42 create the two Stripe payments. The
irreversible steps are last, so the verification gate runs before step 39.

File ids are fixed (``supplier-q3-scan-01`` ... ``-38``): ``seed_requests`` lists the staging
Drive's control calls that create exactly those files under their original names on any staging
server (a file with the same id is replaced), so ``examples/supplier-sync.json`` runs on a fresh
one after seeding. ``python -m tidemark.supplier_sync [TASK_ID]`` prints the plan; the checked-in
example is that output for the default task id.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Iterable
from typing import Any

RENAMES = 38
DEFAULT_TASK_ID = "supplier-sync-2026-11-30"
PAYMENTS = ((18_450, "eur", "Q3 supplier invoices, batch 1"),
            (27_300, "eur", "Q3 supplier invoices, batch 2"))


def file_id(i: int) -> str:
    return f"supplier-q3-scan-{i:02d}"


def original_name(i: int) -> str:
    return f"scan-{i:03d}.pdf"


def final_name(i: int) -> str:
    return f"2026-Q3 supplier {i:02d} invoice.pdf"


def seed_requests() -> list[tuple[str, dict[str, Any]]]:
    """(path, body) of the staging control calls that create the 38 scans."""
    return [("/_staging/drive/files", {"id": file_id(i), "name": original_name(i),
                                        "mimeType": "application/pdf"})
            for i in range(1, RENAMES + 1)]


def supplier_sync_plan(task_id: str = DEFAULT_TASK_ID) -> dict[str, Any]:
    steps: list[dict[str, Any]] = [
        {"action": "drive.rename", "args": {"file_id": file_id(i), "name": final_name(i)}}
        for i in range(1, RENAMES + 1)]
    steps.append({"action": "gmail.send", "args": {
        "to": ["accounts@supplier.example"], "subject": "Q3 invoices filed",
        "body": f"All {RENAMES} Q3 invoices are filed under their final names; payment "
                "follows today."}})
    steps.append({"action": "graph.send_mail", "args": {
        "to": ["finance@ours.example"], "subject": "Q3 supplier invoices filed",
        "body": f"{RENAMES} invoices filed; two payments of the supplier run follow."}})
    for amount, currency, description in PAYMENTS:
        steps.append({"action": "stripe.payment_intent", "args": {
            "amount": amount, "currency": currency, "description": description}})
    return {"task_id": task_id, "steps": steps}


def effects_summary(effects: Iterable[dict[str, Any]], keys: set[str]) -> dict[str, Any]:
    """Counts the staging effects that carry one of ``keys`` (one task's steps).

    The counts: ``total``, ``duplicates`` (records beyond the first of the same target, operation
    and key: an effect that happened twice) and ``by_target`` {target: {operation: count}}."""
    ours = [(e["target"], e["op"], e["key"]) for e in effects if e.get("key") in keys]
    seen = Counter(ours)
    by_target: dict[str, dict[str, int]] = {}
    for (target, op, _), n in seen.items():
        by_target.setdefault(target, {}).setdefault(op, 0)
        by_target[target][op] += n
    return {"total": len(ours), "duplicates": sum(n - 1 for n in seen.values()),
            "by_target": {t: dict(sorted(ops.items())) for t, ops in sorted(by_target.items())}}


if __name__ == "__main__":
    print(json.dumps(supplier_sync_plan(*sys.argv[1:2]), indent=2, ensure_ascii=False))
