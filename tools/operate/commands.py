"""What the `tidemark` command does, as plain functions that tests call directly.

Each returns data (for ``--json``) or a text; errors are TidemarkError subclasses that the CLI
prints as one line.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidemark.approval import DEFAULT_POLICY, ApprovalPolicy, parse_policy
from tidemark.boundary import ApprovalError
from tidemark.errors import (
    ConfigError,
    PlanError,
    StepBusy,
    TaskKilled,
    TidemarkError,
    UnknownTask,
)
from tidemark.needs import Act, command
from tidemark.plan import TASK_ID_RE, Plan
from tidemark.words import (
    ControlState,
    Decision,
    DecisionVia,
    EventKind,
    Phase,
    ResolvedBy,
    SeriesAdmits,
    StepStatus,
    Verdict,
    lifted_for_unwind,
)

if TYPE_CHECKING:
    from tidemark.report import Report
    from tidemark.store import JournalStore


def journal_store(url: str) -> JournalStore:
    """The journal at ``url``, not yet opened.

    The store's modules (psycopg and its pool, about half of what `tidemark status` imports) are
    loaded here, by the commands that use the journal: `tidemark --help` and the commands that
    only talk to Temporal never do."""
    from tidemark.store import JournalStore

    return JournalStore(url)


def open_store(url: str) -> JournalStore:
    """Opens the journal and brings its schema up to date."""
    store = journal_store(url).open()
    store.migrate()
    return store


def db_migrate(url: str) -> list[str]:
    with journal_store(url) as store:
        return store.migrate()


def plan_check(path: str | Path, *, sort: bool = False, fs_roots: str | None = None,
               env: Mapping[str, str] | None = None) -> Plan:
    """Validates a plan file against every known action; with ``sort``, reorders it.

    With ``fs_roots`` (``TIDEMARK_FS_ROOTS`` of the command's settings), every ``fs.rename``
    path is checked against those roots as a worker with the same setting would before the
    first step. Its payments are checked against the payment limits of ``env`` (a worker's
    TIDEMARK_STRIPE_MAX_AMOUNT and _MAX_TASK_AMOUNT), as the plan gate of every start does.
    """
    # Every known action's spec and the rename's path gate: only a plan check needs them.
    from activities.catalog import spec_registry
    from activities.fs import FsRename
    from probes.fs import parse_roots
    from tidemark.actions import GateRefused
    from tidemark.payment_limits import limits_from_env
    from tidemark.plan import load_plan_file

    plan = load_plan_file(path, spec_registry(), sort=sort)
    roots = parse_roots(fs_roots)
    if roots:
        fs = FsRename(roots)
        for step in plan.steps:
            if step.action == fs.name:
                try:
                    fs.plan_gate(plan.task_id, [(step.number, step.args)])
                except GateRefused as e:
                    raise PlanError(f"steps[{step.number - 1}].args.path", str(e)) from None
    payments = [(s.number, s.args) for s in plan.steps if s.action == "stripe.payment_intent"]
    try:
        limits_from_env(env or {}).check(plan.task_id, payments)
    except GateRefused as e:
        raise PlanError("steps", str(e)) from None
    return plan


def approval_outlook(plan: Plan, env: Mapping[str, str]) -> str | None:
    """Why a run of ``plan`` will wait for a person, or None.

    The reason is the one under a worker's TIDEMARK_APPROVAL; the run waits before its
    irreversible steps. The journal's policy and a series' may ask for more."""
    from tidemark.approval import policy_from_env, why_asked

    irreversible = [s.args for s in plan.steps if s.irreversible]
    return why_asked([policy_from_env(env)], plan.approval is not None, irreversible)


def plan_summary(plan: Plan) -> dict[str, Any]:
    first_irr = next((s.number for s in plan.steps if s.irreversible), None)
    return {"task_id": plan.task_id, "plan_hash": plan.plan_hash, "steps": len(plan.steps),
            "first_irreversible": first_irr, "plan": plan.canonical()}


def status(url: str, task_id: str) -> Report:
    from tidemark.report import build_report

    with journal_store(url) as store:
        return build_report(store, task_id)


def status_with_first_line(url: str, task_id: str) -> tuple[Report, str]:
    """The interruption report of a task and the sentence `tidemark status T` opens with.

    The sentence is tidemark.needs_journal.first_line. Both are read on one pool and without a
    migration: a status only reads, so it answers from a database that refuses writes (a
    standby, a read-only role). An out-of-date schema is `tidemark db migrate`'s to change, not
    a reader's."""
    from tidemark.needs_journal import first_line
    from tidemark.report import build_report

    with journal_store(url) as store:
        report = build_report(store, task_id)
        return report, first_line(store, report)


ALL_TASKS = "*"  # the control scope that stops every task


def check_scope(store: JournalStore, task_id: str, verb: str, force_unknown: bool) -> None:
    """Refuses a task id that names no task.

    A typo, or an unquoted ``*`` the shell expanded to a file name, must not report "stopped"
    (or "killed") while the real task runs on."""
    if task_id.startswith("series:"):
        check_series_known(store, task_id.removeprefix("series:"))
        return  # a declared series may be stopped before its first run
    if task_id == ALL_TASKS or store.task_known(task_id):
        return
    if force_unknown and TASK_ID_RE.fullmatch(task_id):
        return
    hint = ""
    blocked = blocked_start(store, task_id)
    if blocked is not None:
        hint = (f"; {blocked_line(task_id, blocked)}. Nothing of it can act; pass "
                f"--force-unknown to {verb} it all the same")
    elif os.path.lexists(task_id):
        hint = (f"; {task_id!r} is a file here: did the shell expand an unquoted *? "
                f"`tidemark {verb} --all` means every task")
    elif force_unknown:
        hint = "; it is not a valid task id either"
    else:
        hint = (f"; check the id (`temporal workflow list`), or pass --force-unknown to {verb} "
                "a task whose plan has not arrived yet")
    raise UnknownStopTarget(f"no task {task_id!r} is known{hint}")


def blocked_start(store: JournalStore, task_id: str) -> dict[str, Any] | None:
    """The latest refused start of a task no plan is stored for.

    That is a run of a series blocked (tidemark.series) before anything of it was kept. None
    for any other task."""
    refused = [e for e in store.events(task_id) if e["kind"] == "blocked"]
    return refused[-1] if refused else None


def blocked_line(task_id: str, event: dict[str, Any]) -> str:
    """What blocked the task's start, and what a person does about it, in one line."""
    d = event["detail"]
    series = d.get("series")
    why = (f"series {series} is {(d.get('stop') or {}).get('state', 'stopped')}"
           if d.get("stop") else
           f"earlier run(s) {', '.join(d.get('blockers') or [])} of series {series} are not "
           "settled")
    return (f"the start of {task_id} was blocked before its plan was stored ({why}, at "
            f"{event['at'].isoformat()[:19].replace('T', ' ')}); `tidemark status --series "
            f"{series}` lists the runs, settle them, then start {task_id} again")


def blocked_status(url: str, task_id: str) -> dict[str, Any]:
    """``tidemark status`` of a task that has no stored plan.

    It is ``blocked`` when its start was refused by its series, otherwise UnknownTask."""
    with journal_store(url) as store:
        event = blocked_start(store, task_id)
    if event is None:
        raise UnknownTask(task_id)
    d = event["detail"]
    return {"task_id": task_id, "state": "blocked", "series": d.get("series"),
            "blockers": d.get("blockers") or [], "stop": d.get("stop"),
            "at": event["at"].isoformat(), "line": blocked_line(task_id, event)}


def check_series_known(store: JournalStore, series: str) -> None:
    """Refuses a series nobody declared.

    A series with runs or a stop from before series were declared is known too. A typo must
    not report "stopped" while the real series runs on."""
    if (store.declared_series(series) is None and not store.series_runs(series)
            and not store.task_known("series:" + series)):
        raise UnknownStopTarget(f"no series {series!r} is declared; check the name "
                                "(`tidemark schedule list`), or `tidemark series declare "
                                f"{series}` first")


def stop(url: str, task_id: str, reason: str, by: str, *, force_unknown: bool = False) -> None:
    """Sets the durable stop state of a task, or of every task (``*``).

    Refuses a task id that names no task unless ``force_unknown`` (a task whose plan has not
    arrived yet)."""
    with open_store(url) as store:
        check_scope(store, task_id, "stop", force_unknown)
        store.set_control(task_id, ControlState.STOPPED, reason, by)


def release(url: str, task_id: str, reason: str, by: str, *,
            force_unknown: bool = False) -> None:
    """Releases the stop state of a task, or the global stop (``*``).

    A task's own stop is released only by naming the task."""
    with open_store(url) as store:
        check_scope(store, task_id, "release", force_unknown)
        store.set_control(task_id, ControlState.RELEASED, reason, by)


def release_for_unwind(url: str, task_id: str, reason: str, by: str) -> None:
    """Lifts a task's kill for unwinding.

    The task stays stopped (nothing runs it forward), and `tidemark unwind` may then compensate.
    Refuses a task that is not killed itself."""
    with open_store(url) as store:
        check_scope(store, task_id, "release", False)
        if store.release_kill_for_unwind(task_id, reason or "released for unwind", by):
            return
        stop = store.stop_state(task_id)
    if stop is not None and stop["state"] == ControlState.KILLED:
        raise DecisionError(f"task {task_id!r} is under the kill of {stop['scope']!r} (by "
                            f"{stop['set_by']}), which is not lifted task by task; nothing was "
                            f"changed. `{command(Act.RELEASE, task_id, scope=stop['scope'])}`"
                            f" lifts it, then `{command(Act.UNWIND, task_id)}`")
    raise DecisionError(f"task {task_id!r} is not killed; `{command(Act.UNWIND, task_id)}` "
                        "works as it is, nothing was changed")


def check_unwind_allowed(url: str, task_id: str) -> None:
    """An unwind starts only when no kill applies to the task.

    The refusal names the command that helps. For the task's own kill: `release T --for-unwind`
    (TaskKilled). For a kill of every task or of its series: releasing that scope, as the task's
    name does not lift it."""
    with journal_store(url) as store:
        stop = store.stop_state(task_id)
    if stop is None or stop["state"] != ControlState.KILLED or lifted_for_unwind(stop):
        return
    if stop["scope"] == task_id:
        raise TaskKilled(task_id)
    raise KilledNotReleased(
        f"task {task_id!r} is killed through {stop['scope']} by {stop['set_by']}: "
        f"{stop['reason'] or 'no reason'}; nothing acts on it, compensations included, and "
        f"nothing was changed. `{command(Act.RELEASE, task_id, scope=stop['scope'])}` "
        f"lifts the kill, then `{command(Act.UNWIND, task_id)}`")


def check_not_killed(stop: dict[str, Any], task_id: str) -> None:
    """Refuses to resume a killed task.

    Resume releases a plain stop (resuming is that decision), but a kill is released only by a
    person saying so, as an unwind after a kill needs `release --for-unwind`."""
    if stop["state"] != ControlState.KILLED:
        return
    if lifted_for_unwind(stop):
        raise KilledNotReleased(
            f"task {task_id!r} is killed by {stop['set_by']}: {stop['reason'] or 'no reason'}; "
            "its kill is lifted for an unwind only, and resume does not run it forward. "
            f"`{command(Act.UNWIND, task_id)}` puts its reversible steps back; "
            f"`{command(Act.RELEASE, task_id)}` lifts the kill, then resume runs it on")
    scope = "" if stop["scope"] == task_id else f" (through {stop['scope']})"
    raise KilledNotReleased(
        f"task {task_id!r} is killed{scope} by {stop['set_by']}: "
        f"{stop['reason'] or 'no reason'}; resume does not release a kill, nothing was "
        f"released or started. `{command(Act.RELEASE, task_id, scope=stop['scope'])}` "
        "first, then resume")


def global_stop(url: str) -> dict[str, Any] | None:
    """The stop of every task (``tidemark stop --all``), or None."""
    with open_store(url) as store:
        return store.stop_state(ALL_TASKS)


def unwind_preview(url: str, task_id: str) -> dict[str, Any]:
    """What an unwind would do.

    It lists the reversible steps it compensates (last first) and the irreversible steps that
    happened, which it leaves alone."""
    with journal_store(url) as store:
        store.progress(task_id)  # raises UnknownTask for a task that does not exist
        undo = store.undo_candidates(task_id)
        irreversible = store.irreversible_steps(task_id)
    return {"task_id": task_id, "undo_steps": undo,
            "irreversible_done": [{"step": n, "action": a} for n, a, status, _ in irreversible
                                  if status == StepStatus.DONE]}


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
        if doubt is None or doubt.step != step or doubt.phase != Phase.DO:
            where = (f"step {doubt.step} ({doubt.phase})" if doubt else "no step")
            raise DecisionError(f"task {task_id!r}: step {step} is not in doubt ({where} is)")
        detail = {"as": as_, "note": note, "key": doubt.idem_key}
        with store.execution(task_id, step) as s:
            if as_ == Verdict.NEVER and s.stopped is None:
                raise DecisionError(
                    f"task {task_id!r} is not stopped; stop it first (`tidemark stop "
                    f"{task_id}`) so that no run acts on step {step} meanwhile")
            # What a person saw at the target says nothing while an attempt may still act on
            # it: its request may land after they looked.
            if s.lease_left is not None and s.lease_left > 0:
                raise StepBusy(
                    f"{task_id}/{step}", "an attempt may still be acting on it for "
                    f"{s.lease_left:.1f}s; decide once that has passed")
            s.event(task_id, EventKind.DECISION, detail, step, by)
            if as_ == Verdict.DONE:
                s.complete(key=doubt.idem_key, outcome={"operator": by, "note": note},
                           status=StepStatus.DONE, resolved_by=ResolvedBy.OPERATOR,
                           owned=False)
            elif as_ == Verdict.NEVER:
                s.complete(key=doubt.idem_key,
                           outcome={"operator": by, "note": note, "never": True,
                                    "decision": "it did not happen and must not happen"},
                           status=StepStatus.FAILED, resolved_by=ResolvedBy.OPERATOR,
                           owned=False)
    return {"task_id": task_id, "step": step, **detail, "by": by}


def journal(url: str, task_id: str) -> dict[str, Any]:
    """Every journal row and event of a task, oldest first: the audit trail."""
    with journal_store(url) as store:
        store.progress(task_id)  # UnknownTask for a task that does not exist
        return {"rows": [r.as_json() for r in store.rows(task_id)],
                "events": [{**e, "at": e["at"].isoformat()} for e in store.events(task_id)]}


def os_user() -> str:
    """The operating-system user running this command.

    It is the identity a decision is recorded under, which a person cannot simply type
    (``--by`` is only a label beside it)."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:  # a uid without a passwd entry (a container): the number itself
        return str(os.geteuid())


def decide_approval(url: str, task_id: str, decision: str, by: str, note: str = "", *,
                    via: DecisionVia = DecisionVia.CLI) -> dict[str, Any]:
    """Journals a person's approve or reject of a task's irreversible steps.

    The journal decides, in the one statement that records it (tidemark.check_decision): the
    connection's login role must be an approver every list of the task names, a run of the task
    must wait for a decision, no stop may hold it for an approve (no kill for a reject), and no
    other decision may hold the task's current epoch (the first wins: DecisionRefused names it).
    The operating-system user and ``by`` are labels beside the role. A reject also stops the
    task: it stays stopped, ready for unwind.

    Returns what was committed: the decision, who the journal says made it, its epoch, whether
    it still holds (a stop, kill or release committed meanwhile voids it) and what the
    irreversible steps will do, read from the stored plan the decision names by hash.
    """
    if decision not in (Decision.APPROVE, Decision.REJECT):
        raise ApprovalError(f"decision must be approve or reject, not {decision!r}")
    from tidemark.boundary import irreversible_lines
    from tidemark.will_do import at_a_glance

    with open_store(url) as store:
        plan = store.load_plan(task_id)  # UnknownTask
        stored_hash = store.progress(task_id).plan_hash  # the hash the plan was stored under
        lines = irreversible_lines(plan)
        if not lines:
            raise ApprovalError(f"task {task_id!r} has no irreversible steps to approve")
        row = store.decide(task_id, Decision(decision), stored_hash, os_user=os_user(),
                           label=by or None, note=note, via=via)
        asked = store.approval_request(task_id)
    return {"task_id": task_id, "decision": row["decision"], "by": row["decided_by"],
            "label": row["label"], "os_user": os_user(), "note": row["note"],
            "epoch": row["epoch"], "holds": row["holds"], "plan_hash": stored_hash,
            "irreversible": lines,
            "glance": at_a_glance([(s.action, s.args) for s in plan.steps if s.irreversible]),
            "waiting": list(asked["steps"]) if asked else []}


def series_policy(series: str, approval: str | None,
                  approvers: list[str] | None) -> ApprovalPolicy:
    """Checks a series name and its --approval / --approvers; ConfigError or PlanError."""
    if not TASK_ID_RE.fullmatch(series):
        raise PlanError("series", "must be 1-128 characters of letters, digits and . _ : -, "
                                  "starting with a letter or digit")
    if approvers is not None and not approvers:
        raise ConfigError("--approvers must name at least one database role")
    return parse_policy(approval if approval is not None else "all", approvers or (),
                        where="--approval")


ADMITS = tuple(SeriesAdmits)  # which runs may join a series


def declare_series(url: str, series: str, by: str, approval: str | None = None,
                   approvers: list[str] | None = None, admits: str | None = None
                   ) -> dict[str, Any]:
    """Declares a series, so that plans may name it.

    This is an operator's act: the journal refuses it to any other role (NotAuthorized).
    ``approval`` adds to the operator's policy for its runs (never removes), ``approvers``
    narrows who may decide on them, and ``admits`` says whether a plan started by hand may join
    it (``any``) or only its schedule's runs (``scheduled``). A flag not given keeps what the
    series had. Returns the declaration as it now stands."""
    policy = series_policy(series, approval, approvers)
    if admits is not None and admits not in ADMITS:
        raise ConfigError(f"--admit must be one of {', '.join(ADMITS)}, not {admits!r}")
    with open_store(url) as store:
        store.declare_series(series, by, os_user(), policy.text if approval else None,
                             list(policy.approvers) if approvers is not None else None,
                             rules=policy.rules() if approval else None, admits=admits)
        declared = store.declared_series(series)
    assert declared is not None
    return {"series": series, "approval": declared["approval"],
            "approvers": declared["approvers"], "admits": declared["admits"],
            "declared_by": declared["declared_role"]}


def set_policy(url: str, approval: str, approvers: list[str] | None, by: str) -> dict[str, Any]:
    """Sets the operator's approval policy in the journal (an operator's act).

    The policy says which irreversible steps of every task wait for a person. With
    ``approvers``, it also names the login roles that may decide (each a member of
    tidemark_approver; None: every member)."""
    if approvers is not None and not approvers:
        raise ConfigError("--approvers must name at least one database role")
    policy = parse_policy(approval, approvers or (), where="policy")
    with open_store(url) as store:
        row = store.set_policy(policy.text, policy.rules(),
                               list(policy.approvers) if approvers is not None else None, by)
    return _policy_json(row)


def show_policy(url: str) -> dict[str, Any]:
    """The operator's approval policy as the journal holds it."""
    with open_store(url) as store:
        row = store.policy()
    if row is None:
        return {"approval": DEFAULT_POLICY, "approvers": None, "set_by": None,
                "set_at": None, "default": True}
    return _policy_json(row)


def _policy_json(row: dict[str, Any]) -> dict[str, Any]:
    return {"approval": row["approval"], "approvers": row["approvers"],
            "set_by": row["set_role"], "label": row["set_by"],
            "set_at": row["set_at"].isoformat(), "default": False}


def series_policies(url: str, series: list[str]) -> dict[str, dict[str, Any] | None]:
    """The declared approval policy of each series (None: never declared), for listings."""
    with open_store(url) as store:
        return {s: store.declared_series(s) for s in series}


DECISIONS = tuple(Verdict)


class DecisionError(TidemarkError):
    """A decision that does not fit the journal's state."""


class UnknownStopTarget(TidemarkError):
    """``stop``, ``release`` or ``kill`` named a task id that no plan and no control row knows."""


class KilledNotReleased(TidemarkError):
    """A ``resume`` or ``unwind`` refused because a kill still applies.

    That is ``resume`` of a task under a kill, or ``unwind`` under a kill of every task or of
    its series: the kill is released only by ``tidemark release`` of its scope."""


class GloballyStopped(TidemarkError):
    """Every task is stopped (``tidemark stop --all``); resuming one would stop at once."""
