"""What a task needs from a person, in one word and in one plain sentence.

The word is the value of the ``TidemarkNeeds`` search attribute every RunPlan and UnwindPlan run
keeps up to date (workflows/shared.py): ``nothing`` while a run goes on by itself and once its
task is settled, otherwise what the person on call is asked for. The Temporal Web UI's list
filtered on it (``TidemarkNeeds IN (...)``, see ``worklist_query``) is the worklist of runs
that wait for someone; docs/who-needs-me.md shows it.

The sentence is the first line of the failure a run ends with (workflows/outcome.py), so that
the Web UI shows what happened and what to do next above the technical detail, and the line
`tidemark status T` prints first. Pure (tidemark.words only): workflow code imports it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from tidemark.words import TaskState


class Need(StrEnum):
    """The values of the ``TidemarkNeeds`` search attribute."""

    NOTHING = "nothing"  # running by itself, or settled (completed, unwound, being unwound)
    APPROVAL = "approval"  # waits at its first irreversible step for `tidemark approve|reject`
    DECISION = "decision"  # a step in doubt its probe cannot decide: `tidemark resolve`
    HALTED = "halted"  # a person halted it: resume or unwind
    STOPPED = "stopped"  # a stop holds it (a person's, its series', a rejected credential)
    KILLED = "killed"  # killed: nothing acts until a person releases it
    BLOCKED = "blocked"  # a run of a series refused to start
    VERIFICATION = "verification"  # a reversible step before the boundary no longer holds
    FAILED = "failed"  # a target refused a step, or the plan or input is wrong
    UNWIND = "unwind"  # rejected, or partly unwound: only an unwind settles it
    RESUME = "resume"  # its run ended and nothing holds it now: nothing runs it until resumed


# The states a run is in while it goes on, or ends in when its task is settled.
_SETTLED = {TaskState.RUNNING, TaskState.COMPLETED, TaskState.UNWOUND, "unwinding"}
_BY_STATE: dict[str, Need] = {
    TaskState.AWAITING_APPROVAL: Need.APPROVAL, TaskState.NEEDS_DECISION: Need.DECISION,
    TaskState.HALTED: Need.HALTED, TaskState.STOPPED: Need.STOPPED,
    TaskState.KILLED: Need.KILLED, TaskState.BLOCKED: Need.BLOCKED,
    TaskState.VERIFICATION_FAILED: Need.VERIFICATION, TaskState.FAILED: Need.FAILED,
    TaskState.PRECONDITION_FAILED: Need.FAILED, TaskState.PARTLY_UNWOUND: Need.UNWIND,
    TaskState.IN_DOUBT: Need.DECISION, TaskState.ENDED: Need.RESUME,
}
# Every value but ``nothing``: the worklist.
WAITING: tuple[Need, ...] = tuple(n for n in Need if n != Need.NOTHING)
ATTRIBUTE = "TidemarkNeeds"
# The errors of a run that acted on nothing: the plan, the input or the worker is wrong.
_NOT_RUN = {"PlanError", "InputError", "PlanChanged", "UnknownTask", "ActionNotConfigured"}


def need_of(state: str, error: dict[str, Any] | None = None) -> Need:
    """What a run in (or ended in) ``state`` with ``error`` needs from a person.

    A run stopped because its task's unwind began needs nothing: the unwind settles the task,
    and if it cannot, the unwind's own run says so. A rejected run needs its unwind."""
    if state in _SETTLED:
        return Need.NOTHING
    kind = (error or {}).get("type")
    if kind == "Unwinding":
        return Need.NOTHING
    if kind == "Rejected":
        return Need.UNWIND
    return _BY_STATE.get(state, Need.FAILED)


def worklist_query() -> str:
    """The visibility query that selects the runs waiting for a person.

    For the Web UI, CLI and SDK: the open executions that need one. Open only: a closed run's
    attributes cannot change, so a run that ended needing a person keeps saying so after a later
    run settled its task; while its task needs a person, its open NeedsPerson row
    (workflows/needs_person.py) says it instead."""
    return (f'ExecutionStatus = "Running" AND '
            f"{ATTRIBUTE} IN ({', '.join(repr_q(n) for n in WAITING)})")


def repr_q(value: str) -> str:
    return '"' + value.replace('"', '\\"') + '"'


def sentence(task_id: str, state: str, error: dict[str, Any] | None = None,
             confirmed: str = "") -> str:
    """One plain sentence: what happened to the task's run and what to do next.

    What to do next is a command. ``confirmed`` (e.g. "3/7 steps confirmed") is said in passing
    when given."""
    err = error or {}
    step, msg, t = err.get("step"), _clean(err.get("message")), task_id
    at = f" at step {step}" if step else ""
    done = f" ({confirmed})" if confirmed and not confirmed.startswith("0/0 ") else ""
    why_done = f"; {confirmed}" if done else ""
    need = need_of(state, err)
    if state == TaskState.COMPLETED:
        return f"Task {t} completed{done}; nothing to do."
    if state == TaskState.UNWOUND:
        return f"Task {t} was unwound{done}; it does not run again, nothing to do."
    if need == Need.NOTHING:
        return f"Task {t} stopped{at} because its unwind began: {msg}; nothing to do here."
    if need == Need.KILLED:
        return (f"Task {t} was killed{at} ({msg or 'kill'}{why_done}); nothing acts on it "
                "until a "
                f"person runs `tidemark release {t}` (or `tidemark release {t} --for-unwind`, "
                f"then `tidemark unwind {t} --yes`).")
    if need == Need.HALTED:
        return (f"Task {t} was halted{at} ({msg or 'halt'}{why_done}); continue it with "
                f"`tidemark resume {t}` or put its steps back with `tidemark unwind {t} --yes`.")
    if need == Need.DECISION:
        return (f"Step {step} of task {t} is in doubt and its probe cannot tell whether it "
                f"happened ({msg}); decide with `tidemark resolve {t} --step {step} --as "
                "done|absent|never --yes`, then `tidemark resume " + t + "`.")
    if need == Need.UNWIND:
        return (f"Task {t} stopped{at}{done}: {msg}; settle it with "
                f"`tidemark unwind {t} --yes`.")
    if need == Need.VERIFICATION and step is None:  # the verification at the end of the plan
        return (f"Task {t} did every step, but not to the end state: a target shows an earlier "
                f"step's state ({msg}); see `tidemark status {t}`, then `tidemark resume {t}` "
                f"or `tidemark unwind {t} --yes`.")
    if need == Need.VERIFICATION:
        return (f"Task {t} did not start its irreversible steps{at}: a reversible step before "
                f"them no longer holds ({msg}); see `tidemark status {t}`, then "
                f"`tidemark resume {t}` or `tidemark unwind {t} --yes`.")
    if need == Need.STOPPED:
        return f"Task {t} is stopped{at}{done}: {msg}."
    if need == Need.BLOCKED:
        return f"Task {t} did not start: {msg}."
    if err.get("type") in _NOT_RUN:
        return (f"Task {t} failed before any step ran: {msg}; nothing acted and nothing of this "
                "start was stored, so correct the plan (`tidemark plan check PLAN` shows what "
                "it refuses) or the worker's configuration and start it again.")
    return (f"Task {t} failed{at}{done}: {msg or err.get('type') or state}; see "
            f"`tidemark status {t}`, fix the cause, then `tidemark resume {t}` or "
            f"`tidemark unwind {t} --yes`.")


def _clean(message: Any) -> str:
    """A message as part of a sentence: one line, without a trailing full stop."""
    return " ".join(str(message or "").split()).rstrip(".")
