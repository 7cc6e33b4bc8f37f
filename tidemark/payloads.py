"""Inputs and outputs shared by workflows and activities.

Plain dataclasses, so fields can be added later without breaking histories that are already running
(new fields get defaults).

The annotations here are evaluated (no ``from __future__ import annotations``): the SDK's
converter reads a dataclass's field types with ``typing.get_type_hints`` on every payload it
decodes, and string annotations are compiled anew each time, which made decoding a step's
input or output take 2-3x as long (bench/payload_decode.py)."""

from dataclasses import dataclass, field
from typing import Any

from tidemark.words import HALT_ACTOR, TaskState

TASK_QUEUE = "tidemark"

# End states of a RunPlan or UnwindPlan run, also the values of the TidemarkState search attribute
# (spelled once, in tidemark.words.TaskState).
RUNNING = TaskState.RUNNING
COMPLETED = TaskState.COMPLETED
HALTED = TaskState.HALTED
STOPPED = TaskState.STOPPED
NEEDS_DECISION = TaskState.NEEDS_DECISION
PRECONDITION_FAILED = TaskState.PRECONDITION_FAILED
FAILED = TaskState.FAILED
UNWOUND = TaskState.UNWOUND  # terminal: the unwind completed; every later start refuses the task
BLOCKED = TaskState.BLOCKED  # a run of a series refused to start (tidemark.series); nothing acted
# A kill applies to the task (tidemark kill): nothing acts on it. A run that took the `kill`
# signal starts nothing more and waits for the kill to terminate it, so it ends Terminated with
# this state (tools/operate/kill.py); a run that meets a kill in the journal ends with it.
KILLED = TaskState.KILLED
# Some steps were compensated and others not (a refused compensation, an unwind cut short):
# the task never runs forward again.
PARTLY_UNWOUND = TaskState.PARTLY_UNWOUND


@dataclass
class PrepareInput:
    """The plan document as the user wrote it, or ``{"task_id": ...}`` for the stored plan."""

    document: dict[str, Any]
    # False for a continue-as-new hop: the same run going on, not a new start, so the plan-level
    # gates (which read the whole plan) are not run again every few hundred steps.
    check_gates: bool = True
    # The id of the workflow that asks; it must be ``tidemark-<task_id>`` (None: not checked).
    workflow_id: str | None = None
    # The id of the workflow that started it as a child (a series' ScheduledRun), or None:
    # only a ScheduledRun may take a task id of the scheduled namespace (``sched-<S>-…``).
    parent_workflow_id: str | None = None
    # The most steps the run takes from its next step: Prepared.lines describes them, so that
    # the run needs no activity of its own for that (0: no lines).
    window: int = 0
    # The run may take the boundary's outcome from prepare (Prepared.boundary) when its first
    # step is the plan's first and irreversible: nothing comes before it to verify, and the
    # plan's gates were just checked. False: the run asks the boundary activity, as always.
    boundary: bool = False
    # A new run of the task: prepare closes its open worklist row, if any, and says so
    # (Prepared.released). False: a continue-as-new hop, whose task's row was released already.
    release: bool = False


@dataclass
class BoundaryOutcome:
    """What the boundary activity found.

    The gate's result, and whether a person must (still) approve. ``decision`` is the
    approve/reject of the task's current epoch, if any (a stop, kill or release since voids an
    older one)."""

    passed: bool
    summary: str
    # The first failures, cut (tidemark.boundary.Verification.brief); ``failed`` counts them
    # all, and the journal's verification event holds them in full.
    failures: list[dict[str, Any]] = field(default_factory=list)
    verified: int = 0
    approval_required: bool = False
    approvers: list[str] | None = None
    decision: str | None = None  # approve | reject | None
    decided_by: str | None = None
    irreversible: list[str] = field(default_factory=list)  # what those steps will do
    stopped: str | None = None  # the stop reason when the durable stop state is set
    release: str | None = None  # the command that lifts it (tidemark.needs.release_of)
    failed: int = 0  # the steps that no longer hold, all of them (``failures`` lists the first)
    # The irreversible steps that wait, all of them (``irreversible`` describes the first;
    # `tidemark approve` shows every one from the journal). 0: as many as listed.
    waiting: int = 0
    glance: str | None = None  # every currency's total, recipient and action, in one line
    why: str | None = None  # the policy that asks, in words


@dataclass
class Prepared:
    task_id: str
    step_count: int
    next_step: int | None  # None: every step has an outcome already
    confirmed: int
    failed: int
    stopped: str | None  # the stop reason when the durable stop state is set
    # The command that lifts that stop (tidemark.needs.release_of); None: not stopped.
    release: str | None = None
    first_irreversible: int | None = None  # where the boundary is (tidemark/boundary.py)
    unwound: bool = False  # the task was unwound: it never runs forward again
    # One line per step of the run's window (PrepareInput.window), for the Web UI's details and
    # activity summaries. None when the run was not asked for them or goes no further.
    lines: list[str] | None = None
    # The boundary's outcome before step 1, checked in the same activity (PrepareInput.boundary);
    # None: the run asks the boundary activity when it gets there. A history recorded before
    # this field holds None, so its replay schedules that activity as it did.
    boundary: BoundaryOutcome | None = None
    # False when no two steps of the plan set one target (read from a plan too long to read
    # whole: none of its actions names a target): the verification at the end would probe
    # nothing, and the run completes without it. True, the default: the run verifies its end.
    verify_end: bool = True
    # Prepare closed the task's open worklist row (PrepareInput.release). False: the run sends
    # that signal itself, as a history recorded before this field shows.
    released: bool = False


@dataclass
class StepInput:
    task_id: str
    step: int


@dataclass
class StepOutput:
    step: int
    status: str  # done | failed
    resolved_by: str  # execute | probe | operator
    skipped: bool


@dataclass
class StepBatchInput:
    """Steps ``first``..``last`` of a task, run in one activity (the fast path).

    They run one after another until one does not complete, ``max_steps`` have run or
    ``budget_s`` is spent."""

    task_id: str
    first: int
    last: int
    max_steps: int
    budget_s: float


@dataclass
class StepError:
    """The error of the step that ended a batch after others completed.

    The error of the step that ended a batch after other steps of it had completed: what
    the workflow would have received had that step run on its own."""

    step: int
    type: str
    message: str
    non_retryable: bool
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class StepBatchOutput:
    """What a batch settled, counted as the workflow counts single steps.

    ``ran`` steps from the batch's first, of which ``failed`` (the last one, if any) ended
    ``failed``."""

    ran: int
    executed: int = 0
    resolved_by_probe: int = 0
    skipped: int = 0
    failed: int | None = None  # the step whose target refused it (its outcome is ``failed``)
    error: StepError | None = None  # the next step's error, when it raised one


@dataclass
class HaltInput:
    task_id: str
    reason: str
    by: str = HALT_ACTOR


@dataclass
class RunEndInput:
    """A run's end, journaled when it ends other than completed.

    Written by RunPlan. Until a run of the task begins again, nothing runs it, whatever the
    journal's rows say otherwise."""

    task_id: str
    state: str
    error: dict[str, Any] = field(default_factory=dict)
    confirmed: int = 0
    steps: int = 0


@dataclass
class TaskNeed:
    """What the journal says a task needs from a person now.

    From tidemark.needs_journal.task_need: the word its worklist row shows (a tidemark.needs.Need;
    ``nothing`` when nobody is needed), the task's state and the first line `tidemark status`
    prints. ``settled``: the task is completed or unwound, so nobody is needed and no run goes on
    with it."""

    need: str
    state: str = ""
    sentence: str = ""
    settled: bool = False


@dataclass
class RunResult:
    task_id: str
    state: str
    steps: int
    confirmed: int
    executed: int = 0
    resolved_by_probe: int = 0
    skipped: int = 0
    stopped_at: int | None = None
    error: dict[str, Any] = field(default_factory=dict)


@dataclass
class UnwindPlanned:
    """What an unwind will visit.

    Reversible steps last first, and the irreversible steps that already happened (reported, never
    touched)."""

    task_id: str
    steps: list[int]
    summaries: list[str]
    irreversible_done: list[str]
    stopped: str | None


@dataclass
class UndoOutput:
    step: int
    status: str  # undone | nothing_to_undo | already_undone | refused
    reason: str = ""  # why the target refused the compensation


@dataclass
class UnwindResult:
    task_id: str
    state: str
    undone: list[int] = field(default_factory=list)  # restored by this unwind
    nothing_to_undo: list[int] = field(default_factory=list)
    irreversible_done: list[str] = field(default_factory=list)
    error: dict[str, Any] = field(default_factory=dict)
    already_undone: list[int] = field(default_factory=list)  # restored by an earlier unwind
    refused: list[int] = field(default_factory=list)  # the target refused; nothing restored
    reasons: dict[str, str] = field(default_factory=dict)  # step -> why it was refused


@dataclass
class UnwoundInput:
    task_id: str
    by: str
    detail: dict[str, Any] = field(default_factory=dict)


# -- the irreversible boundary (tidemark/boundary.py) ---------------------------------------

# The run waits at its first irreversible step for a person (`tidemark approve` / `reject`).
AWAITING_APPROVAL = TaskState.AWAITING_APPROVAL
# At the boundary, reversible steps journaled as done no longer hold: a person looks.
VERIFICATION_FAILED = TaskState.VERIFICATION_FAILED


@dataclass
class BoundaryInput:
    task_id: str
    step: int  # the first irreversible step


@dataclass
class DecisionInput:
    """A decision sent to a run as an update (``approve`` or ``reject``).

    For a decider to record under its login role. ``by`` and ``note`` are what the sender typed:
    labels."""

    task_id: str
    decision: str  # tidemark.words.Decision
    by: str = ""
    note: str = ""


@dataclass
class PlannerInput:
    """What ScheduledRun asks the planner for: tonight's plan of ``series``."""

    series: str
    planner: str  # "module:function"
    args: dict[str, Any]
    scheduled: str  # ISO 8601, the schedule's time for this run (UTC)
    task_id: str  # derived from series and scheduled time
    # The schedule that started the run (Temporal's TemporalScheduledById), or None when it was
    # started by hand: only the series' own schedule may take a scheduled task id.
    scheduled_by: str | None = None
