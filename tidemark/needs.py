"""What a task needs from a person, in one word and in one plain sentence.

The word is the value of the ``TidemarkNeeds`` search attribute every RunPlan and UnwindPlan run
keeps up to date (workflows/shared.py): ``nothing`` while a run goes on by itself and once its
task is settled, otherwise what the person on call is asked for. The Temporal Web UI's list
filtered on it (``TidemarkNeeds IN (...)``, see ``needs_query``) is the worklist of runs
that wait for someone; docs/who-needs-me.md shows it.

The sentence is the first line of the failure a run ends with (workflows/outcome.py), so that
the Web UI shows what happened and what to do next above the technical detail, and the line
`tidemark status T` prints first. Pure (tidemark.words only): workflow code imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
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


class Act(StrEnum):
    """A command a person runs when a task needs them: ``tidemark <act> ...`` (see ``command``)."""

    APPROVE = "approve"
    REJECT = "reject"
    RELEASE = "release"  # the stop of the scope that holds the task: its own, a series', all
    RELEASE_FOR_UNWIND = "release_for_unwind"  # lifts a kill for an unwind only
    RESOLVE = "resolve"  # a person's verdict on the step in doubt
    RESUME = "resume"
    UNWIND = "unwind"
    STATUS = "status"
    PLAN_CHECK = "plan_check"


# Each act as the command line a person types; ``{target}`` is the task, ``--series S`` or
# ``--all`` (a stop's scope, see ``target``), and an empty field drops out.
_LINES: dict[Act, str] = {
    Act.APPROVE: "tidemark approve {target}",
    Act.REJECT: "tidemark reject {target}",
    Act.RELEASE: "tidemark release {target}",
    Act.RELEASE_FOR_UNWIND: "tidemark release {target} --for-unwind",
    Act.RESOLVE: "tidemark resolve {target} --step {step} --as {verdict} --yes",
    Act.RESUME: "tidemark resume {target}",
    Act.UNWIND: "tidemark unwind {target} --yes",
    Act.STATUS: "tidemark status {target}",
    Act.PLAN_CHECK: "tidemark plan check {target}",
}
# What decides each need, first the one command that settles it, then its alternatives.
NEXT: dict[Need, tuple[Act, ...]] = {
    Need.APPROVAL: (Act.APPROVE, Act.REJECT),
    Need.DECISION: (Act.RESOLVE, Act.RESUME),
    Need.HALTED: (Act.RESUME, Act.UNWIND),
    Need.STOPPED: (Act.RELEASE,),
    Need.KILLED: (Act.RELEASE, Act.RELEASE_FOR_UNWIND, Act.UNWIND),
    Need.BLOCKED: (Act.STATUS,),
    Need.VERIFICATION: (Act.RESUME, Act.UNWIND),  # once what the gate found is put back
    Need.FAILED: (Act.STATUS, Act.RESUME, Act.UNWIND),
    Need.UNWIND: (Act.UNWIND,),
    Need.RESUME: (Act.RESUME, Act.UNWIND),
}


def target(task_id: str, scope: str | None = None) -> str:
    """What a command names: the task, or the scope of the stop that holds it.

    ``series:S`` is ``--series S``, ``*`` is ``--all``. Releasing the task by name does not lift a
    stop of its series or of every task."""
    if scope == "*":
        return "--all"
    if scope is not None and scope.startswith("series:"):
        return f"--series {scope.removeprefix('series:')}"
    return task_id or scope or ""


def command(act: Act, task_id: str = "", *, scope: str | None = None,
            step: int | str | None = "N", verdict: str = "done|absent|never") -> str:
    """The command line of ``act`` on the task, or on the stop ``scope``.

    No task: the bare command, as a help text names it. A step not known is ``N``."""
    line = _LINES[act].format(target=target(task_id, scope),
                              step="N" if step is None else step, verdict=verdict)
    return " ".join(line.split())


def next_command(need: Need, task_id: str, *, scope: str | None = None,
                 step: int | str | None = "N") -> str:
    """The one command that decides ``need`` for the task (the first of ``NEXT``)."""
    return command(NEXT[need][0], task_id, scope=scope, step=step)


def release_of(task_id: str, stop: dict[str, Any] | None) -> str | None:
    """The release of ``stop``, or None when nothing stops the task.

    ``stop`` is a task's controls row: its own, a series' or every task's stop."""
    return command(Act.RELEASE, task_id, scope=stop["scope"]) if stop else None


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
NEEDED: tuple[Need, ...] = tuple(n for n in Need if n != Need.NOTHING)
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


def needs_query() -> str:
    """The visibility query that selects the runs waiting for a person.

    For the Web UI, CLI and SDK: the open executions that need one. Open only: a closed run's
    attributes cannot change, so a run that ended needing a person keeps saying so after a later
    run settled its task; while its task needs a person, its open NeedsPerson row
    (workflows/needs_person.py) says it instead."""
    return (f'ExecutionStatus = "Running" AND '
            f"{ATTRIBUTE} IN ({', '.join(repr_q(n) for n in NEEDED)})")


def repr_q(value: str) -> str:
    return '"' + value.replace('"', '\\"') + '"'


@dataclass(frozen=True)
class _Run:
    """What a sentence says of a run's end: the task, the step and the error's message."""

    t: str
    step: Any
    msg: str
    confirmed: str  # e.g. "3/7 steps confirmed", said in passing; "" when not

    @property
    def at(self) -> str:
        return f" at step {self.step}" if self.step else ""

    @property
    def done(self) -> str:
        return f" ({self.confirmed})" if self.confirmed else ""

    def or_unwind(self, act: Act = Act.RESUME) -> str:
        """The usual close: the command that goes on, or the unwind that puts the steps back."""
        return f"`{command(act, self.t)}` or `{command(Act.UNWIND, self.t)}`"


def _killed(r: _Run) -> str:
    why = f"; {r.confirmed}" if r.confirmed else ""
    return (f"Task {r.t} was killed{r.at} ({r.msg or 'kill'}{why}); nothing acts on it until a "
            f"person runs `{command(Act.RELEASE, r.t)}` (or "
            f"`{command(Act.RELEASE_FOR_UNWIND, r.t)}`, then `{command(Act.UNWIND, r.t)}`).")


def _halted(r: _Run) -> str:
    why = f"; {r.confirmed}" if r.confirmed else ""
    return (f"Task {r.t} was halted{r.at} ({r.msg or 'halt'}{why}); continue it with "
            f"`{command(Act.RESUME, r.t)}` or put its steps back with "
            f"`{command(Act.UNWIND, r.t)}`.")


def _decision(r: _Run) -> str:
    return (f"Step {r.step} of task {r.t} is in doubt and its probe cannot tell whether it "
            f"happened ({r.msg}); decide with `{command(Act.RESOLVE, r.t, step=r.step)}`, then "
            f"`{command(Act.RESUME, r.t)}`.")


def _verification(r: _Run) -> str:
    see = f"see `{command(Act.STATUS, r.t)}`, then {r.or_unwind()}."
    if r.step is None:  # the verification at the end of the plan
        return (f"Task {r.t} did every step, but not to the end state: a target shows an "
                f"earlier step's state ({r.msg}); {see}")
    return (f"Task {r.t} did not start its irreversible steps{r.at}: a reversible step before "
            f"them no longer holds ({r.msg}); {see}")


# The sentence of each need that has its own (the others: failed, or not run at all).
_SENTENCES: dict[Need, Callable[[_Run], str]] = {
    Need.NOTHING: lambda r: (f"Task {r.t} stopped{r.at} because its unwind began: {r.msg}; "
                             "nothing to do here."),
    Need.KILLED: _killed,
    Need.HALTED: _halted,
    Need.DECISION: _decision,
    Need.UNWIND: lambda r: (f"Task {r.t} stopped{r.at}{r.done}: {r.msg}; settle it with "
                            f"`{command(Act.UNWIND, r.t)}`."),
    Need.VERIFICATION: _verification,
    Need.STOPPED: lambda r: f"Task {r.t} is stopped{r.at}{r.done}: {r.msg}.",
    Need.BLOCKED: lambda r: f"Task {r.t} did not start: {r.msg}.",
}


def sentence(task_id: str, state: str, error: dict[str, Any] | None = None,
             confirmed: str = "") -> str:
    """One plain sentence: what happened to the task's run and what to do next.

    What to do next is a command. ``confirmed`` (e.g. "3/7 steps confirmed") is said in passing
    when given."""
    err = error or {}
    shown = "" if confirmed.startswith("0/0 ") else confirmed
    r = _Run(task_id, err.get("step"), _clean(err.get("message")), shown)
    if state == TaskState.COMPLETED:
        return f"Task {r.t} completed{r.done}; nothing to do."
    if state == TaskState.UNWOUND:
        return f"Task {r.t} was unwound{r.done}; it does not run again, nothing to do."
    said = _SENTENCES.get(need_of(state, err))
    if said is not None:
        return said(r)
    if err.get("type") in _NOT_RUN:
        return (f"Task {r.t} failed before any step ran: {r.msg}; nothing acted and nothing of "
                "this start was stored, so correct the plan "
                f"(`{command(Act.PLAN_CHECK, 'PLAN')}` shows what it refuses) or the worker's "
                "configuration and start it again.")
    return (f"Task {r.t} failed{r.at}{r.done}: {r.msg or err.get('type') or state}; see "
            f"`{command(Act.STATUS, r.t)}`, fix the cause, then {r.or_unwind()}.")


def _clean(message: Any) -> str:
    """A message as part of a sentence: one line, without a trailing full stop."""
    return " ".join(str(message or "").split()).rstrip(".")


# Temporal's user metadata of a run (the Web UI): a summary of one line in the list, at most
# 200 bytes, and details in Markdown on the run's page. They hold ids, state words and commands
# only, never what a plan carries: a payload codec encrypts them as any payload, yet the list
# shows them to whoever may open it.
SUMMARY_BYTES = 200


def fit(text: str, max_bytes: int = SUMMARY_BYTES) -> str:
    """``text`` cut to ``max_bytes`` of UTF-8, on a character's edge."""
    data = text.encode()
    if len(data) <= max_bytes:
        return text
    return data[:max_bytes - 3].decode(errors="ignore") + "..."


def metadata(workflow: str, task_id: str) -> tuple[str, str]:
    """The static summary and details of a run of ``workflow`` (RunPlan, UnwindPlan) on the task.

    The summary says what the run needs and the command that says where it stands; the details
    list each need it may end with and the command that settles it."""
    status = command(Act.STATUS, task_id)
    if workflow == "UnwindPlan":
        return (fit(f"Unwind of task {task_id}: puts its reversible steps back; {status}"),
                f"**The unwind of task {task_id}** puts its completed reversible steps back, "
                "last first; it needs nothing from a person while it goes on. Where it stands: "
                f"`{status}`.\n\n"
                f"- {Need.UNWIND}: `{command(Act.UNWIND, task_id)}` once the cause is cleared\n"
                f"- {Need.KILLED}: `{command(Act.RELEASE_FOR_UNWIND, task_id)}`, then "
                f"`{command(Act.UNWIND, task_id)}`")
    each = "\n".join(f"- {need}: " + ", or ".join(f"`{command(act, task_id)}`" for act in acts)
                     for need, acts in NEXT.items())
    return (fit(f"Task {task_id}: needs a person only when TidemarkNeeds says so; {status}"),
            f"**Task {task_id}** runs its plan: it needs nothing from a person while it goes "
            "on. When it does, the TidemarkNeeds column names the need and the current details "
            f"open with the command. Where it stands: `{status}`.\n\n{each}")


def series_metadata(series: str) -> tuple[str, str]:
    """The static summary and details of a scheduled run of the series (its schedule's action).

    The run needs nobody itself: its task's own run says what it needs."""
    return (fit(f"Series {series}: plans its next task and runs it; the task's own run says "
                "what it needs"),
            f"**A scheduled run of series {series}** asks the series' planner for a plan and "
            "runs it as the child run `tidemark-<task>`, whose summary and current details say "
            "what it needs and the command. This run needs nothing from a person; it ends "
            f"{TaskState.BLOCKED} when the series refuses to start (see "
            f"`{command(Act.STATUS, '<task>')}`).")


def headline(task_id: str, state: str, need: Need, *, line: str | None = None,
             step: int | str | None = None, progress: str = "") -> str:
    """The first line of a run's current details: its state, its need and the command.

    ``line`` is the command when the run knows a closer one (the release of a series' stop);
    ``step`` the step a decision is about."""
    said = f" · {progress}" if progress else ""
    if need == Need.NOTHING:
        return f"**{state}**{said} · needs nothing · `{command(Act.STATUS, task_id)}`"
    the = line or next_command(need, task_id, step="N" if step is None else step)
    return f"**{state}**{said} · needs {need}: `{the}`"
