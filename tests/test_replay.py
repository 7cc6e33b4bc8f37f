"""Replay safety: the recorded histories of RunPlan and UnwindPlan (tests/histories, written by
tools/record_histories.py) replay against the workflow code as it is now. A change to a workflow
that would break a run already open (a command added, removed or reordered without
workflow.patched) fails here, before a worker with it meets such a run."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from workflows.run_plan import RunPlan
from workflows.unwind_plan import UnwindPlan

HISTORIES = Path(__file__).parent / "histories"
WORKFLOW_IDS: dict[str, str] = json.loads((HISTORIES / "workflow_ids.json").read_text())
RECORDED = sorted(p for p in HISTORIES.glob("*.json") if p.name in WORKFLOW_IDS)


def history(path: Path) -> WorkflowHistory:
    return WorkflowHistory.from_json(WORKFLOW_IDS[path.name], path.read_text())


def test_every_recorded_history_is_indexed_and_the_cases_are_all_there() -> None:
    on_disk = {p.name for p in HISTORIES.glob("*.json")} - {"workflow_ids.json"}
    assert on_disk == set(WORKFLOW_IDS)
    stems = {name.split(".")[0] for name in on_disk}
    assert {"run_completed", "run_halted", "run_resumed_in_doubt", "run_continued_as_new",
            "run_fast", "run_fast_halted", "run_fast_continued_as_new", "run_fast_unbatched",
            "run_fast_resumed_in_doubt", "unwind", "run_killed", "unwind_failed",
            "unwind_awaiting_approval"} <= stems


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
async def test_a_recorded_history_replays_against_the_current_workflows(path: Path) -> None:
    result = await Replayer(workflows=[RunPlan, UnwindPlan]).replay_workflow(history(path))
    assert result.replay_failure is None


@workflow.defn(name="RunPlan")
class ReorderedRunPlan:
    """RunPlan as a careless edit could leave it: the step descriptions read before the plan
    is prepared."""

    @workflow.run
    async def run(self, document: Any) -> None:
        for name in ("describe_steps", "prepare"):
            await workflow.execute_activity(name, document,
                                            start_to_close_timeout=timedelta(seconds=30))


async def test_a_reordered_run_plan_is_caught_by_the_replay() -> None:
    with pytest.raises(NondeterminismError):
        await Replayer(workflows=[ReorderedRunPlan]).replay_workflow(
            history(HISTORIES / "run_completed.json"))
