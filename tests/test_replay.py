"""Replay safety: the recorded histories replay against the workflow code as it is now.

The histories are those of RunPlan and UnwindPlan (tests/histories, written by
dev/record_histories.py). A change to a workflow that would break a run already open (a command
added, removed or reordered without workflow.patched) fails here, before a worker with it meets
such a run. The histories are recorded again at each release, and the patches since then are
counted here.

The worker runs the workflows outside Temporal's sandbox; the suite replays its runs in the
sandbox at its end (helpers/sandbox_replay.py), and the last tests here show what that finds."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity, workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from helpers.sandbox_replay import claim, replay, shape, shape_id
from tidemark.activity_names import ActivityName
from workflows.run_plan import RunPlan
from workflows.unwind_plan import UnwindPlan

ROOT = Path(__file__).parent.parent
HISTORIES = Path(__file__).parent / "histories"
WORKFLOW_IDS: dict[str, str] = json.loads((HISTORIES / "workflow_ids.json").read_text())
RECORDED = sorted(p for p in HISTORIES.glob("*.json") if p.name in WORKFLOW_IDS)
# The patches the workflow code may hold (docs/develop.md, "Changing a workflow while runs are
# open"): none at 0.1.0, whose histories were recorded from the release. A later change to the
# commands adds its name here with its workflow.patched call, and takes it out when the call goes.
PATCHES: set[str] = set()
PATCH_CALLS = {"patched", "deprecate_patch"}


def history(path: Path) -> WorkflowHistory:
    return WorkflowHistory.from_json(WORKFLOW_IDS[path.name], path.read_text())


def test_every_recorded_history_is_indexed_and_the_cases_are_all_there() -> None:
    on_disk = {p.name for p in HISTORIES.glob("*.json")} - {"workflow_ids.json"}
    assert on_disk == set(WORKFLOW_IDS)
    stems = {name.split(".")[0] for name in on_disk}
    assert {"run_completed", "run_halted", "run_resumed_in_doubt", "run_continued_as_new",
            "run_fast", "run_fast_halted", "run_fast_continued_as_new",
            "run_fast_resumed_in_doubt", "unwind", "run_killed", "unwind_failed",
            "unwind_awaiting_approval"} <= stems


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
async def test_a_recorded_history_replays_against_the_current_workflows(path: Path) -> None:
    result = await Replayer(workflows=[RunPlan, UnwindPlan]).replay_workflow(history(path))
    assert result.replay_failure is None


async def test_the_recorded_histories_in_clear_replay_with_the_payload_codec_on() -> None:
    """Histories written before the codec (payloads in clear) replay on a worker that has it."""
    # Imported here: the sandbox re-imports this module, and cryptography's native module does
    # not load twice.
    from helpers.codec_keys import suite_converter

    replayer = Replayer(workflows=[RunPlan, UnwindPlan], data_converter=suite_converter())
    async def recorded() -> AsyncIterator[WorkflowHistory]:
        for path in RECORDED:
            yield history(path)

    results = await replayer.replay_workflows(recorded(), raise_on_replay_failure=False)
    assert results.replay_failures == {}


def test_each_activity_is_named_once_by_the_names_the_histories_recorded() -> None:
    """Each activity is named once, by ActivityName, and the histories recorded only those.

    The activities a worker registers are named by ActivityName, one member each, and the
    recorded histories scheduled no other name: a value changed in tidemark/activity_names.py
    would leave the runs already open waiting for an activity nobody registers."""
    # Imported here: the sandbox re-imports this module for the workflows defined below.
    from activities.boundary import BoundaryActivities
    from activities.decisions import DecisionActivities
    from activities.planner import PlannerActivities
    from activities.steps import StepActivities

    defined = [defn.name for cls in (StepActivities, BoundaryActivities, PlannerActivities,
                                     DecisionActivities)
               for fn in vars(cls).values()
               if (defn := activity._Definition.from_callable(fn)) is not None]
    assert sorted(defined) == sorted(ActivityName)
    scheduled = {e.activity_task_scheduled_event_attributes.activity_type.name
                 for path in RECORDED for e in history(path).events
                 if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED}
    assert ActivityName.RUN_STEP in scheduled and scheduled <= set(ActivityName)


def patch_calls(source: str) -> list[str]:
    """The patch name of each workflow.patched or deprecate_patch call in ``source``.

    A name is the string passed, or the module constant's string (its name if it holds none)."""
    tree = ast.parse(source)
    constants = {t.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
                 and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
                 for t in node.targets if isinstance(t, ast.Name)}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        called = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) \
            else ""
        if called not in PATCH_CALLS:
            continue
        arg = node.args[0] if node.args else None
        found.append(arg.value if isinstance(arg, ast.Constant) else
                     constants.get(arg.id, arg.id) if isinstance(arg, ast.Name) else
                     ast.unparse(arg) if arg is not None else "")
    return found


def test_the_workflow_code_holds_only_the_patches_listed_since_the_release() -> None:
    found = sorted((name, str(p.relative_to(ROOT))) for p in (ROOT / "workflows").rglob("*.py")
                   for name in patch_calls(p.read_text(encoding="utf-8")))
    assert {name for name, _ in found} == PATCHES, f"{len(found)} calls: {found}"


def test_the_patch_count_sees_every_spelling_of_a_patch() -> None:
    source = ("from temporalio import workflow\nfrom temporalio.workflow import patched\n"
              "MOVED = 'step-moved'\n"
              "def f():\n    if workflow.patched(MOVED) or patched('other'):\n"
              "        workflow.deprecate_patch('gone')\n")
    assert patch_calls(source) == ["step-moved", "other", "gone"]


@workflow.defn(name="RunPlan")
class ReorderedRunPlan:
    """RunPlan as a careless edit could leave it: a step run before the plan is prepared."""

    @workflow.run
    async def run(self, document: Any) -> None:
        for name in (ActivityName.RUN_STEP, ActivityName.PREPARE):
            await workflow.execute_activity(name, document,
                                            start_to_close_timeout=timedelta(seconds=30))


async def test_a_reordered_run_plan_is_caught_by_the_replay() -> None:
    with pytest.raises(NondeterminismError):
        await Replayer(workflows=[ReorderedRunPlan]).replay_workflow(
            history(HISTORIES / "run_completed.json"))


@workflow.defn(name="RunPlan")
class ClockReadingRunPlan:
    """RunPlan as a careless edit could leave it: a wall-clock read in workflow code.

    The read decides differently on replay, and the worker, outside the sandbox, would not refuse
    it."""

    @workflow.run
    async def run(self, document: Any) -> None:
        import datetime

        document["started"] = datetime.datetime.now().isoformat()
        await workflow.execute_activity(ActivityName.PREPARE, document,
                                        start_to_close_timeout=timedelta(seconds=30))


async def test_the_sandbox_replay_refuses_a_clock_read_and_passes_the_workflows_as_they_are(
        ) -> None:
    runs = [history(HISTORIES / "run_completed.json"), history(HISTORIES / "run_halted.json")]
    assert await replay(runs) == []
    failed = await replay(runs, [ClockReadingRunPlan])
    assert len(failed) == 2 and all("RestrictedWorkflowAccessError" in f for f in failed), failed


def test_runs_of_one_shape_differ_in_step_counts_not_in_paths() -> None:
    completed, halted, fast = (history(HISTORIES / f"{n}.json")
                               for n in ("run_completed", "run_halted", "run_fast"))
    assert shape("RunPlan", completed) != shape("RunPlan", halted) != shape("RunPlan", fast)
    fewer = WorkflowHistory(completed.workflow_id, [
        e for e in completed.events if e.event_id not in _one_step_cycle(completed)])
    assert len(fewer.events) < len(completed.events)
    assert shape("RunPlan", fewer) == shape("RunPlan", completed)


def test_xdist_workers_replay_each_shape_once_between_them(tmp_path: Path) -> None:
    completed, halted, fast = (history(HISTORIES / f"{n}.json")
                               for n in ("run_completed", "run_halted", "run_fast"))
    ids = [shape_id(shape("RunPlan", h)) for h in (completed, halted, fast)]
    # The id of a shape is the same in another process (a worker of the same session).
    code = ("import sys; sys.path[:0] = ['tests', '.']; from test_replay import history, "
            "HISTORIES; from helpers.sandbox_replay import shape, shape_id; "
            "print(shape_id(shape('RunPlan', history(HISTORIES / 'run_halted.json'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout.split()
    assert out == [ids[1]]
    claims = tmp_path / "claims"
    assert claim(claims, ids[:2]) == set(ids[:2])  # the first worker done
    assert claim(claims, ids) == {ids[2]}  # the next one replays only what is new
    assert claim(claims, ids) == set()
    assert claim(None, ids) == set(ids)  # one process alone replays every shape it has


def _one_step_cycle(h: WorkflowHistory) -> set[int]:
    """The event ids of the second run_step's cycle, when the history has three steps or more.

    The cycle is scheduled, started, completed and the workflow task after it."""
    ids = [e.event_id for e in h.events]
    starts = [i for i, e in enumerate(h.events)
              if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
              and e.activity_task_scheduled_event_attributes.activity_type.name
              == ActivityName.RUN_STEP]
    assert len(starts) >= 3, len(starts)
    return set(ids[starts[1]:starts[2]])
