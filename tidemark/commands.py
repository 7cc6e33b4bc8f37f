"""What the `tidemark` command does, as plain functions that tests call directly.

Each returns data (for ``--json``) or a text; errors are TidemarkError subclasses that the CLI
prints as one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from activities.catalog import spec_registry
from tidemark.boundary import ApprovalError, check_approver, irreversible_lines
from tidemark.errors import TidemarkError
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


def resolve(url: str, task_id: str, step: int, as_: str, note: str, by: str) -> dict[str, Any]:
    """A person's decision about the step in doubt, after looking at the target.

    ``done``: the step's outcome is recorded as done (resolved_by=operator) and a resumed run
    goes on after it. ``absent``: the decision is recorded; a resumed run still probes first,
    and only if the probe still cannot tell does it take the person's word and execute.
    ``never``: it did not happen and must not happen. Only for a stopped task: the row is
    closed as failed (resolved_by=operator) without executing anything, so the task never runs
    that step and an unwind can proceed past it.
    """
    if as_ not in DECISIONS:
        raise DecisionError(f"--as must be one of {', '.join(DECISIONS)}, not {as_!r}")
    with open_store(url) as store:
        doubt = store.progress(task_id).in_doubt
        if doubt is None or doubt.step != step or doubt.phase != "do":
            where = (f"step {doubt.step} ({doubt.phase})" if doubt else "no step")
            raise DecisionError(f"task {task_id!r}: step {step} is not in doubt ({where} is)")
        detail = {"as": as_, "note": note, "key": doubt.idem_key}
        with store.execution(task_id, step) as s:
            if as_ == "never":
                if s.stopped is None:
                    raise DecisionError(
                        f"task {task_id!r} is not stopped; stop it first (`tidemark stop "
                        f"{task_id}`) so that no run acts on step {step} meanwhile")
                if s.lease_left is not None and s.lease_left > 0:
                    raise DecisionError(
                        f"task {task_id!r}: an attempt on step {step} may still be acting for "
                        f"{s.lease_left:.1f}s; decide once that has passed")
            s.event(task_id, "decision", detail, step, by)
            if as_ == "done":
                s.complete(key=doubt.idem_key, outcome={"operator": by, "note": note},
                           status="done", resolved_by="operator")
            elif as_ == "never":
                s.complete(key=doubt.idem_key,
                           outcome={"operator": by, "note": note, "never": True,
                                    "decision": "it did not happen and must not happen"},
                           status="failed", resolved_by="operator")
    return {"task_id": task_id, "step": step, **detail, "by": by}


def journal(url: str, task_id: str) -> dict[str, Any]:
    """Every journal row and event of a task, oldest first: the audit trail."""
    with JournalStore(url) as store:
        store.progress(task_id)  # UnknownTask for a task that does not exist
        return {"rows": [r.as_json() for r in store.rows(task_id)],
                "events": [{**e, "at": e["at"].isoformat()} for e in store.events(task_id)]}


def decide_approval(url: str, task_id: str, decision: str, by: str,
                    note: str = "") -> dict[str, Any]:
    """Journals a person's approve or reject of a task's irreversible steps.

    The plan must ask for approval and name ``by`` among its approvers (if it names any), and
    no irreversible step may have been attempted yet. A reject also sets the stop state: the
    task stays stopped, ready for unwind. The latest decision is the one that counts.
    """
    if decision not in ("approve", "reject"):
        raise ApprovalError(f"decision must be approve or reject, not {decision!r}")
    with open_store(url) as store:
        plan = store.load_plan(task_id)  # UnknownTask
        check_approver(plan.approval, by)
        progress = store.progress(task_id)
        first = progress.first_irreversible
        if first is None:
            raise ApprovalError(f"task {task_id!r} has no irreversible steps to approve")
        if progress.last_step >= first:
            raise ApprovalError(f"task {task_id!r}: irreversible step {first} was attempted "
                                "already; a decision now would change nothing")
        store.record_approval(task_id, decision, by, note)
    return {"task_id": task_id, "decision": decision, "by": by, "note": note,
            "irreversible": irreversible_lines(plan)}
DECISIONS = ("done", "absent", "never")


class DecisionError(TidemarkError):
    """A decision that does not fit the journal's state."""
