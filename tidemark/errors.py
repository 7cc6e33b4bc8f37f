"""Typed errors. Callers branch on the class, never on the message.

Each class declares what it means to a run, once, here:

* ``retryable``: whether another attempt of the same step can help (Temporal retries it, and
  every retry is safe: it goes through the journal and, if the step is in doubt, its probe);
* ``end_state``: the state a run ends in when a step raises it (tidemark.words.TaskState), for
  the errors another attempt cannot fix; None for the others: they are retried, or (a bug, an
  error no run meets) fail the workflow visibly;
* ``stop_reason``: how the metrics name the stop, for the errors that end a run waiting for a
  person (tidemark.metrics, ``tidemark_tasks_stopped``).

An error crosses to the workflow as an ApplicationError whose ``type`` is its class name, so the
workflow looks the end state up by name: END_STATES, derived from the classes below. Pure (the
standard library, tidemark.words and tidemark.needs only), so that workflow code may import it.

The classes, in four families by what the caller does with them (each family is a class, so
``except ControlError`` catches every error that holds a task for a person)::

    TidemarkError
        SetupError: the plan, an input or the worker cannot run as asked; fix it, start again
            PlanError
                InputError
            PlanChanged
            UnknownTask
            ActionNotConfigured
            ActionUnavailable
            ConfigError
        JournalError: the journal could not write, or refused what it was asked to write
            StoreUnavailable
            StepBusy
            JournalMismatch
            InvariantViolation
            NotAuthorized
            DecisionRefused
        ControlError: a stop, an unwind, a gate or a doubt holds the task for a person
            PreconditionFailed
            NeedsDecision
            TaskStopped
            TaskUnwound
            TaskKilled
            PartlyUnwound
            NotStopped
            ApprovalRequired
            SeriesBlocked
        ActionError: what the target answered a step's action
            Refused
            Unauthorized
            TargetUnavailable
                NotSent
                    Throttled
            StepFailed

tests/test_error_states.py holds this tree to the classes below.
"""

from collections.abc import Iterator
from typing import Any, ClassVar

from tidemark.needs import Act, command
from tidemark.words import TaskState


class TidemarkError(Exception):
    """Base class of every error Tidemark raises on purpose."""

    retryable: ClassVar[bool] = False
    end_state: ClassVar[TaskState | None] = None
    stop_reason: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Refuses a contradiction at definition.

        A run cannot both end on an error and retry it, and only an error that ends a run can stop
        it for a person."""
        super().__init_subclass__(**kwargs)
        if cls.end_state is not None and cls.retryable:
            raise TypeError(f"{cls.__name__}: an error that ends a run ({cls.end_state}) "
                            "cannot be retryable")
        if cls.stop_reason is not None and cls.end_state is None:
            raise TypeError(f"{cls.__name__}: a stop reason needs an end state")

    def details(self) -> dict[str, Any]:
        """Fields worth carrying across a process boundary (Temporal failure details)."""
        return {}


def one_line(text: str) -> str:
    """``text`` as one printable line.

    Each character that would break it or is not printable (a control character, a line separator,
    a lone surrogate) written as its escape, as Python's repr writes it."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or ch == " " else repr(ch)[1:-1] for ch in text)


class SetupError(TidemarkError):
    """What was asked cannot run as asked; another attempt cannot help.

    A plan or an input the journal cannot take, a task id that holds another plan or none, an
    action or a configuration this worker lacks. Nothing acted: fix the request or the worker,
    then start again.
    """


class JournalError(TidemarkError):
    """The journal could not write, or refused the write.

    Postgres away, or another attempt owning the step, is retried. A write against one of the
    journal's rules, or beyond the authority of the connection's role, is not.
    """


class ControlError(TidemarkError):
    """Something holds the task for a person.

    A stop, a kill or an unwind, an approval not given, a gate that refused, or a step in doubt
    that its probe cannot settle. Nothing acted. The run ends waiting, and `tidemark inbox`
    says what the person may do.
    """


class PlanError(SetupError):
    """A plan is malformed.

    ``field`` names the offending place, e.g. ``steps[3].args.name`` (escaped to one line: a plan's
    keys are the plan writer's)."""

    end_state = TaskState.FAILED

    def __init__(self, field: str, message: str) -> None:
        field = one_line(field)
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def details(self) -> dict[str, Any]:
        return {"field": self.field, "message": self.message}


class InputError(PlanError):
    """An input over the journal's limits or otherwise unfit to enter.

    An input over one of the journal's limits, holding a character it cannot hold, or JSON
    that cannot be decoded (tidemark.limits): refused where it enters, before anything is
    written. ``field`` names the input (``--reason``, ``task_id``, ``plan``)."""


class PlanChanged(SetupError):
    """A task id already holds a different plan. A changed plan is a new task."""

    end_state = TaskState.FAILED

    def __init__(self, task_id: str, stored_hash: str, new_hash: str) -> None:
        super().__init__(
            f"task {task_id!r} already holds plan {stored_hash[:12]}, not {new_hash[:12]}; "
            "a changed plan is a new task: give it a new task_id"
        )
        self.task_id = task_id
        self.stored_hash = stored_hash
        self.new_hash = new_hash

    def details(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "stored_hash": self.stored_hash,
                "new_hash": self.new_hash}


class UnknownTask(SetupError):
    """No plan is stored under this task id."""

    end_state = TaskState.FAILED

    def __init__(self, task_id: str) -> None:
        super().__init__(f"no plan is stored for task {task_id!r}")
        self.task_id = task_id


class ActionNotConfigured(SetupError):
    """The plan names an action this worker has no client for (its configuration is missing)."""

    end_state = TaskState.FAILED

    def __init__(self, action: str, bound: list[str]) -> None:
        super().__init__(f"action {action!r} is not configured on this worker "
                         f"(configured: {', '.join(bound) or 'none'}); see the "
                         "configuration table of docs/reference.md")
        self.action = action


class ActionUnavailable(SetupError):
    """The plan names an action whose client library is not installed here.

    The action's module cannot even be imported. The message names the extra that installs it."""

    end_state = TaskState.FAILED

    def __init__(self, action: str, library: str, extra: str) -> None:
        super().__init__(f"action {action} needs {library}: pip install 'tidemark[{extra}]'")
        self.action = action
        self.extra = extra

    def details(self) -> dict[str, Any]:
        return {"action": self.action, "extra": self.extra}


class JournalMismatch(JournalError):
    """The journal holds a different action at this step than the stored plan says."""

    end_state = TaskState.FAILED


class InvariantViolation(JournalError):
    """The database refused a write that would break a journal invariant."""

    end_state = TaskState.FAILED


class StoreUnavailable(JournalError):
    """Postgres could not be reached or dropped the connection. Safe to retry the step."""

    retryable = True


class StepBusy(JournalError):
    """Another attempt owns this step; retry later.

    Another attempt owns this step (its intent's lease runs, or it wrote or took over the
    intent first). Retry later."""

    retryable = True

    def __init__(self, key: str, why: str = "another live attempt owns it") -> None:
        super().__init__(f"step {key}: {why}")
        self.key = key


class PreconditionFailed(ControlError):
    """A precondition gate refused the step; nothing was executed."""

    end_state = TaskState.PRECONDITION_FAILED
    stop_reason = "precondition_failed"

    def __init__(self, step: int, action: str, reason: str) -> None:
        super().__init__(f"step {step} {action}: precondition failed: {reason}")
        self.step = step
        self.action = action
        self.reason = reason

    def details(self) -> dict[str, Any]:
        return {"step": self.step, "action": self.action, "reason": self.reason}


class NeedsDecision(ControlError):
    """The in-doubt step's probe could not decide; a person must resume, unwind or stop."""

    end_state = TaskState.NEEDS_DECISION
    stop_reason = "needs_decision"

    def __init__(self, step: int, action: str, reason: str) -> None:
        super().__init__(f"step {step} {action} is in doubt and its probe cannot decide: {reason}")
        self.step = step
        self.action = action
        self.reason = reason

    def details(self) -> dict[str, Any]:
        return {"step": self.step, "action": self.action, "reason": self.reason}


class TaskStopped(ControlError):
    """The task's durable stop state is set; nothing acts until a person releases it."""

    end_state = TaskState.STOPPED
    stop_reason = "stopped"

    def __init__(self, task_id: str, reason: str, scope: str | None = None) -> None:
        super().__init__(f"task {task_id!r} is stopped ({reason}); "
                         f"release it with `{command(Act.RELEASE, task_id, scope=scope)}`")
        self.task_id = task_id
        self.reason = reason

    def details(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "reason": self.reason}


class TaskUnwound(ControlError):
    """The task was unwound: a terminal state. Nothing runs it forward again."""

    end_state = TaskState.UNWOUND

    def __init__(self, task_id: str) -> None:
        super().__init__(f"task {task_id!r} was unwound; it does not run again (a new plan "
                         "needs a new task id)")
        self.task_id = task_id

    def details(self) -> dict[str, Any]:
        return {"task_id": self.task_id}


class TaskKilled(ControlError):
    """A kill applies to the task: no compensation acts.

    None acts until a person lifts the kill for unwinding; an unwind under way stops before its
    next one."""

    end_state = TaskState.KILLED

    def __init__(self, task_id: str) -> None:
        super().__init__(f"task {task_id!r} is killed; nothing acts on it, compensations "
                         f"included. `{command(Act.RELEASE_FOR_UNWIND, task_id)}` lets an unwind "
                         f"run (the task stays stopped), then `{command(Act.UNWIND, task_id)}`")
        self.task_id = task_id

    def details(self) -> dict[str, Any]:
        return {"task_id": self.task_id}


class PartlyUnwound(ControlError):
    """Some of the task's steps were compensated: it never runs forward again.

    A run to the end would report done while steps it did are put back."""

    end_state = TaskState.PARTLY_UNWOUND

    def __init__(self, task_id: str) -> None:
        super().__init__(f"task {task_id!r} is partly unwound; it never runs forward again. "
                         f"Finish the unwind (`{command(Act.UNWIND, task_id)}`) or leave it "
                         "stopped; new work is a new task id")
        self.task_id = task_id

    def details(self) -> dict[str, Any]:
        return {"task_id": self.task_id}


class ActionError(TidemarkError):
    """Raised by an action. Subclasses say whether the target applied anything."""


class Refused(ActionError):
    """The target definitely refused the write and changed nothing (e.g. a 400 or a 404).

    Retrying the same request cannot succeed, so the step is closed as failed.
    """

    end_state = TaskState.FAILED


class Unauthorized(ActionError):
    """The credential was rejected or revoked. Nothing was applied; the task must stop.

    The step is left in doubt on purpose: after a person restores the grant, resuming probes it
    and then executes it, exactly as for a crash.
    """

    end_state = TaskState.STOPPED
    stop_reason = "unauthorized"


class TargetUnavailable(ActionError):
    """The target timed out, dropped the connection or answered 5xx.

    The write may or may not have been applied; the step stays in doubt and the next attempt probes
    it."""

    retryable = True


class NotSent(TargetUnavailable):
    """Nothing of this attempt's effect reached the target.

    The request was held back at the wire (the attempt no longer owns its intent, or its lease no
    longer covers the request: tidemark.wire), or the target answered that it did not process it.
    The step stays in doubt with no request of this attempt in flight, so the next attempt's probe
    may trust *absent*."""


class Throttled(NotSent):
    """The target turned the request away for now (throttled).

    The target turned the request away for now, as its documentation says a throttled
    request is (Graph: a 429 and "the requests fail"; Drive and Gmail: 403 rate limit
    exceeded or 429, try again later): nothing was applied, and nothing of it can land later,
    so it is NotSent: a send mark is taken back and no horizon is waited out; the next attempt
    (after ``retry_after`` seconds, when the target said) probes at once. A timeout or a 5xx
    is never this: it stays ambiguous (TargetUnavailable)."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after

    def details(self) -> dict[str, Any]:
        return {"retry_after": self.retry_after}


class StepFailed(ActionError):
    """The target refused the step for good; the failure is recorded as the step's outcome."""

    end_state = TaskState.FAILED

    def __init__(self, step: int, action: str, reason: str) -> None:
        super().__init__(f"step {step} {action} failed: {reason}")
        self.step = step
        self.action = action
        self.reason = reason

    def details(self) -> dict[str, Any]:
        return {"step": self.step, "action": self.action, "reason": self.reason}


class NotStopped(ControlError):
    """Unwinding needs the task stopped first, so that no run acts on it meanwhile."""

    end_state = TaskState.STOPPED

    def __init__(self, task_id: str) -> None:
        super().__init__(f"task {task_id!r} is not stopped; stop it first "
                         f"(`tidemark stop {task_id}`) so that nothing runs while it unwinds")
        self.task_id = task_id


class ApprovalRequired(ControlError):
    """The journal refused an irreversible step's intent; nothing acted.

    The journal refused an irreversible step's intent: a person must approve the task's
    irreversible steps in its current epoch (every stop, kill, release or reject starts a new
    one), or the intent's action and arguments are not the stored plan's. Nothing acted; the
    run asks for the approval again."""

    end_state = TaskState.AWAITING_APPROVAL

    def __init__(self, task_id: str, step: int) -> None:
        super().__init__(f"task {task_id!r} step {step}: no approval of its irreversible steps "
                         "holds now (a stop, kill, release or reject since voids one); the run "
                         f"asks again: `{command(Act.APPROVE, task_id)}`")
        self.task_id = task_id
        self.step = step

    def details(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "step": self.step}


class NotAuthorized(JournalError):
    """The journal refused an act to the login role of the connection.

    Releasing, lifting a kill, declaring a series, setting the policy or deciding needs a role an
    operator grants (tidemark_operator, tidemark_approver). The message is the database's, one
    line."""


class DecisionRefused(JournalError):
    """The journal did not record an approve or reject.

    ``why`` says which rule refused it: ``decided`` (another decision of this epoch came first),
    ``approvers`` (the role is not among the task's approvers), ``stopped`` (a stop or kill holds
    the task), ``nothing`` (the task waits for no decision), ``plan`` (the plan shown is not the
    stored plan)."""

    def __init__(self, message: str, why: str) -> None:
        super().__init__(message)
        self.why = why


class ConfigError(SetupError):
    """The worker's configuration is incomplete, unreadable or inconsistent.

    For example, a target's read credential reads another account than its write credential
    writes."""


class SeriesBlocked(ControlError):
    """A run of a series may not start.

    The series is stopped, or an earlier run is not settled. Nothing acted. ``blockers`` are the
    unsettled runs, ``{"task_id", "state"}`` each (tidemark.series.run_state)."""

    end_state = TaskState.BLOCKED

    def __init__(self, task_id: str, series: str, stop: dict[str, Any] | None,
                 blockers: list[dict[str, Any]]) -> None:
        self.task_id, self.series, self.stop = task_id, series, stop
        self.blockers = blockers
        if stop is not None:
            why = (f"series {series} is {stop.get('state')} ({stop.get('scope')}: "
                   f"{stop.get('reason') or 'no reason given'}, by {stop.get('set_by')}); "
                   f"`{command(Act.RELEASE, task_id, scope=f'series:{series}')}` lifts it")
        else:
            listed = ", ".join(f"{b['task_id']} ({b['state']})" for b in self.blockers)
            why = (f"an earlier run of series {series} is not settled: {listed}; settle it "
                   "(resume to completion, or unwind), release it, then start this run again")
        super().__init__(f"run {task_id} is blocked: {why}")

    def details(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "series": self.series, "blockers": self.blockers,
                "stopped": self.stop is not None}


def _family(cls: type[TidemarkError]) -> Iterator[type[TidemarkError]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _family(sub)


def _end_states() -> dict[str, TaskState]:
    """Class name -> declared end state, of the classes that declare one.

    The classes are those above. Built once, when this module is imported, from this module's
    classes only: the workflow's lookup (and its retry policy, part of every activity it schedules)
    must not depend on which other modules a worker happened to import."""
    return {cls.__name__: cls.end_state for cls in _family(TidemarkError)
            if cls.__module__ == __name__ and cls.end_state is not None}


# What RunPlan ends in for each error type that arrives (ApplicationError.type is the class
# name); the names are also its retry policy's non-retryable error types.
END_STATES: dict[str, TaskState] = _end_states()
