"""What the `tidemark` command does, as plain functions that tests call directly.

Each returns data (for ``--json``) or a text; errors are TidemarkError subclasses that the CLI
prints as one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from activities.catalog import spec_registry
from tidemark.plan import Plan, load_plan_file
from tidemark.report import Report, build_report
from tidemark.store import JournalStore


def open_store(url: str) -> JournalStore:
    """Opens the journal and brings its schema up to date."""
    store = JournalStore(url).open()
    store.migrate()
    return store


def db_migrate(url: str) -> list[str]:
    with JournalStore(url) as store:
        return store.migrate()


def plan_check(path: str | Path, *, sort: bool = False) -> Plan:
    """Validates a plan file against every known action; with ``sort``, reorders it."""
    return load_plan_file(path, spec_registry(), sort=sort)


def plan_summary(plan: Plan) -> dict[str, Any]:
    first_irr = next((s.number for s in plan.steps if s.irreversible), None)
    return {"task_id": plan.task_id, "plan_hash": plan.plan_hash, "steps": len(plan.steps),
            "first_irreversible": first_irr, "plan": plan.canonical()}


def status(url: str, task_id: str) -> Report:
    with JournalStore(url) as store:
        return build_report(store, task_id)


def stop(url: str, task_id: str, reason: str, by: str) -> None:
    with open_store(url) as store:
        store.set_control(task_id, "stopped", reason, by)


def release(url: str, task_id: str, reason: str, by: str) -> None:
    with open_store(url) as store:
        store.set_control(task_id, "released", reason, by)


def unwind_preview(url: str, task_id: str) -> dict[str, Any]:
    """What an unwind would do: the reversible steps it compensates (last first) and the
    irreversible steps that happened, which it leaves alone."""
    with JournalStore(url) as store:
        store.progress(task_id)  # raises UnknownTask for a task that does not exist
        undo = store.undo_candidates(task_id)
        irreversible = store.irreversible_steps(task_id)
    return {"task_id": task_id, "undo_steps": undo,
            "irreversible_done": [{"step": n, "action": a} for n, a, status in irreversible
                                  if status == "done"]}
