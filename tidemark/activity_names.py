"""The names of Tidemark's activities, each spelled once.

An activity's name is what a workflow schedules (``workflow.execute_activity(name, ...)``) and
what a worker registers (``@activity.defn(name=...)``), and it is recorded in every history
that schedules it: a name changed here no longer matches the runs already open, and
tests/test_replay.py fails. Pure (the standard library only), so that workflow code and the
activities may both import it.
"""

from enum import StrEnum


class ActivityName(StrEnum):
    """What a workflow schedules and a worker registers; a member is its string."""

    # RunPlan's steps (activities/steps.py)
    PREPARE = "prepare"
    RUN_STEP = "run_step"
    RUN_STEPS = "run_steps"  # the fast path: a batch of steps in one activity
    RECORD_HALT = "record_halt"
    RECORD_RUN_END = "record_run_end"
    TASK_NEED = "task_need"
    # UnwindPlan's (activities/steps.py)
    PLAN_UNWIND = "plan_unwind"
    UNWIND_STEP = "unwind_step"
    RECORD_UNWOUND = "record_unwound"
    END_UNWIND = "end_unwind"
    # The irreversible boundary (activities/boundary.py) and a decision (activities/decisions.py)
    REACH_BOUNDARY = "reach_boundary"
    VERIFY_END = "verify_end"
    RECORD_DECISION = "record_decision"
    # ScheduledRun's (activities/planner.py)
    SERIES_GATE = "series_gate"
    CALL_PLANNER = "call_planner"
