"""Inputs and outputs shared by workflows and activities: plain dataclasses, so fields can be
added later without breaking histories that are already running (new fields get defaults)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

TASK_QUEUE = "tidemark"

# End states of a RunPlan or UnwindPlan run, also the values of the TidemarkState search attribute.
RUNNING = "running"
COMPLETED = "completed"
HALTED = "halted"
STOPPED = "stopped"
NEEDS_DECISION = "needs_decision"
PRECONDITION_FAILED = "precondition_failed"
FAILED = "failed"
UNWOUND = "unwound"
BLOCKED = "blocked"  # a run of a series refused to start (tidemark.series); nothing acted


@dataclass
class PrepareInput:
    """The plan document as the user wrote it, or ``{"task_id": ...}`` for the stored plan."""

    document: dict[str, Any]
    # False for a continue-as-new hop: the same run going on, not a new start, so the plan-level
    # gates (which read the whole plan) are not run again every few hundred steps.
    check_gates: bool = True


@dataclass
class Prepared:
    task_id: str
    step_count: int
    next_step: int | None  # None: every step has an outcome already
    confirmed: int
    failed: int
    stopped: str | None  # the stop reason when the durable stop state is set


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
class WindowInput:
    task_id: str
    first: int
    last: int


@dataclass
class HaltInput:
    task_id: str
    reason: str
    by: str = "halt signal"


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
    """What an unwind will visit: reversible steps last first, and the irreversible steps
    that already happened (reported, never touched)."""

    task_id: str
    steps: list[int]
    summaries: list[str]
    irreversible_done: list[str]
    stopped: str | None


@dataclass
class UndoOutput:
    step: int
    status: str  # undone | nothing_to_undo | already_undone


@dataclass
class UnwindResult:
    task_id: str
    state: str
    undone: list[int] = field(default_factory=list)
    nothing_to_undo: list[int] = field(default_factory=list)
    irreversible_done: list[str] = field(default_factory=list)
    error: dict[str, Any] = field(default_factory=dict)


@dataclass
class PlannerInput:
    """What ScheduledRun asks the planner for: tonight's plan of ``series``."""

    series: str
    planner: str  # "module:function"
    args: dict[str, Any]
    scheduled: str  # ISO 8601, the schedule's time for this run (UTC)
    task_id: str  # derived from series and scheduled time
