"""Typed errors. Callers branch on the class, never on the message.

``retryable`` tells the Temporal layer whether another attempt of the same step can help.
"""

from typing import Any


class TidemarkError(Exception):
    """Base class of every error Tidemark raises on purpose."""

    retryable = False

    def details(self) -> dict[str, Any]:
        """Fields worth carrying across a process boundary (Temporal failure details)."""
        return {}


class PlanError(TidemarkError):
    """A plan is malformed. ``field`` names the offending place, e.g. ``steps[3].args.name``."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def details(self) -> dict[str, Any]:
        return {"field": self.field, "message": self.message}


class PlanChanged(TidemarkError):
    """A task id already holds a different plan. A changed plan is a new task."""

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


class UnknownTask(TidemarkError):
    """No plan is stored under this task id."""

    def __init__(self, task_id: str) -> None:
        super().__init__(f"no plan is stored for task {task_id!r}")
        self.task_id = task_id


class ActionNotConfigured(TidemarkError):
    """The plan names an action this worker has no client for (its configuration is missing)."""

    def __init__(self, action: str, bound: list[str]) -> None:
        super().__init__(f"action {action!r} is not configured on this worker "
                         f"(configured: {', '.join(bound) or 'none'}); see the README's "
                         "configuration table")
        self.action = action


class JournalMismatch(TidemarkError):
    """The journal holds a different action at this step than the stored plan says."""


class InvariantViolation(TidemarkError):
    """The database refused a write that would break a journal invariant."""


class StoreUnavailable(TidemarkError):
    """Postgres could not be reached or dropped the connection. Safe to retry the step."""

    retryable = True


class StepBusy(TidemarkError):
    """Another live attempt holds this step's execution lock. Retry later."""

    retryable = True

    def __init__(self, key: str) -> None:
        super().__init__(f"step {key} is being executed by another live attempt")
        self.key = key


class PreconditionFailed(TidemarkError):
    """A precondition gate refused the step; nothing was executed."""

    def __init__(self, step: int, action: str, reason: str) -> None:
        super().__init__(f"step {step} {action}: precondition failed: {reason}")
        self.step = step
        self.action = action
        self.reason = reason

    def details(self) -> dict[str, Any]:
        return {"step": self.step, "action": self.action, "reason": self.reason}


class NeedsDecision(TidemarkError):
    """The in-doubt step's probe could not decide; a person must resume, unwind or stop."""

    def __init__(self, step: int, action: str, reason: str) -> None:
        super().__init__(f"step {step} {action} is in doubt and its probe cannot decide: {reason}")
        self.step = step
        self.action = action
        self.reason = reason

    def details(self) -> dict[str, Any]:
        return {"step": self.step, "action": self.action, "reason": self.reason}


class TaskStopped(TidemarkError):
    """The task's durable stop state is set; nothing acts until a person releases it."""

    def __init__(self, task_id: str, reason: str) -> None:
        super().__init__(f"task {task_id!r} is stopped ({reason}); "
                         f"release it with `tidemark release {task_id}`")
        self.task_id = task_id
        self.reason = reason

    def details(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "reason": self.reason}


class TaskUnwound(TidemarkError):
    """The task was unwound: a terminal state. Nothing runs it forward again."""

    def __init__(self, task_id: str) -> None:
        super().__init__(f"task {task_id!r} was unwound; it does not run again (a new plan "
                         "needs a new task id)")
        self.task_id = task_id

    def details(self) -> dict[str, Any]:
        return {"task_id": self.task_id}


class TaskKilled(TidemarkError):
    """A kill applies to the task: no compensation acts (an unwind under way stops before its
    next one) until a person lifts the kill for unwinding."""

    def __init__(self, task_id: str) -> None:
        super().__init__(f"task {task_id!r} is killed; nothing acts on it, compensations "
                         f"included. `tidemark release {task_id} --for-unwind` lets an unwind "
                         f"run (the task stays stopped), then `tidemark unwind {task_id} --yes`")
        self.task_id = task_id

    def details(self) -> dict[str, Any]:
        return {"task_id": self.task_id}


class PartlyUnwound(TidemarkError):
    """Some of the task's steps were compensated: it never runs forward again, since a run to
    the end would report done while steps it did are put back."""

    def __init__(self, task_id: str) -> None:
        super().__init__(f"task {task_id!r} is partly unwound; it never runs forward again. "
                         f"Finish the unwind (`tidemark unwind {task_id} --yes`) or leave it "
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


class Unauthorized(ActionError):
    """The credential was rejected or revoked. Nothing was applied; the task must stop.

    The step is left in doubt on purpose: after a person restores the grant, resuming probes it
    and then executes it, exactly as for a crash.
    """


class TargetUnavailable(ActionError):
    """The target timed out, dropped the connection or answered 5xx. The write may or may not
    have been applied; the step stays in doubt and the next attempt probes it."""

    retryable = True


class StepFailed(TidemarkError):
    """The target refused the step for good; the failure is recorded as the step's outcome."""

    def __init__(self, step: int, action: str, reason: str) -> None:
        super().__init__(f"step {step} {action} failed: {reason}")
        self.step = step
        self.action = action
        self.reason = reason

    def details(self) -> dict[str, Any]:
        return {"step": self.step, "action": self.action, "reason": self.reason}


class NotStopped(TidemarkError):
    """Unwinding needs the task stopped first, so that no run acts on it meanwhile."""

    def __init__(self, task_id: str) -> None:
        super().__init__(f"task {task_id!r} is not stopped; stop it first "
                         f"(`tidemark stop {task_id}`) so that nothing runs while it unwinds")
        self.task_id = task_id


class ConfigError(TidemarkError):
    """The worker's configuration is incomplete, unreadable or inconsistent (e.g. a target's
    read credential reads another account than its write credential writes)."""
