"""The conventions every `tidemark` command keeps.

They are `--version`; a closed pipe ends quietly (exit 141, nothing on stderr); a refusal is one
line and a non-zero exit; a listing is a table for people and `--json` for programs; a hint names
the command that helps."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import subprocess
import sys
from datetime import timedelta
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import (
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleCalendarSpec,
    ScheduleIntervalSpec,
    ScheduleRange,
    ScheduleSpec,
)
from temporalio.testing import WorkflowEnvironment

from activities.catalog import spec_registry
from tidemark.plan import load_plan
from tidemark.store import JournalStore
from tools.cli.main import EXIT_BROKEN_PIPE, main
from tools.operate import schedules

ROOT = Path(__file__).resolve().parent.parent


def renames(tmp_path: Path, n: int, task_id: str) -> dict[str, Any]:
    return {"task_id": task_id, "steps": [
        {"action": "fs.rename", "args": {"path": str(tmp_path / f"d{i}.txt"),
                                         "name": f"f{i}.txt"}} for i in range(n)]}


def into_closed_pipe(args: list[str], env: dict[str, str] | None = None
                     ) -> subprocess.CompletedProcess[str]:
    """`tidemark ARGS | head -0`, without the race: the reader is gone before the first write."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([sys.executable, "-m", "tools.cli.main", *args], stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=60, cwd=ROOT,
                              env={**os.environ, **(env or {})})
    finally:
        os.close(write)


# -- --version ---------------------------------------------------------------------------------

def test_version_prints_the_installed_version_and_exits_0(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == f"tidemark {version('tidemark')}\n"
    proc = subprocess.run([sys.executable, "-m", "tools.cli.main", "--version"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"tidemark {version('tidemark')}\n",
                                                           "")


# -- a closed pipe -----------------------------------------------------------------------------

def test_a_listing_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """A long listing (a plan of 400 steps) meets the closed pipe in the middle of its output."""
    plan = tmp_path / "big.json"
    plan.write_text(json.dumps(renames(tmp_path, 400, "big")))
    for args in (["plan", "check", str(plan), "--sort"], ["plan", "check", str(plan)]):
        proc = into_closed_pipe(args)
        assert (proc.returncode, proc.stderr) == (EXIT_BROKEN_PIPE, ""), args


def test_status_into_a_closed_pipe_ends_quietly(db_url: str, store: JournalStore,
                                                tmp_path: Path) -> None:
    store.persist_plan(load_plan(renames(tmp_path, 3, "piped-1"), spec_registry()))
    for args in (["status", "piped-1"], ["status", "piped-1", "--json"],
                 ["journal", "piped-1"]):
        proc = into_closed_pipe(args, {"DATABASE_URL": db_url})
        assert (proc.returncode, proc.stderr) == (EXIT_BROKEN_PIPE, ""), args
    # An error still speaks when only stdout is gone.
    proc = into_closed_pipe(["status", "no-such-task"], {"DATABASE_URL": db_url})
    assert proc.returncode == 1 and proc.stderr.startswith("tidemark: UnknownTask: ")
    assert proc.stderr.count("\n") == 1


# -- schedules ---------------------------------------------------------------------------------

async def test_a_second_schedule_create_is_one_line_and_changes_nothing(
        temporal_env: WorkflowEnvironment, store: JournalStore, cli) -> None:
    create = ("schedule", "create", "twice", "--cron", "0 3 * * *", "--planner",
              "helpers.planners:nightly")
    code, _, err = await cli(*create, "--approval", "payments")
    assert code == 0, err
    code, out, err = await cli(*create[:4], "15 4 * * *", *create[5:], "--approval", "none")
    try:
        assert (code, out) == (1, "") and err.count("\n") == 1, err
        assert err.startswith("tidemark: ScheduleError: series twice already has a schedule "
                              "(tidemark-series-twice)"), err
        declared = store.declared_series("twice")
        assert declared is not None and declared["approval"] == "payments"
        found = await schedules.describe(temporal_env.client, "twice")
        assert found is not None and found["cron"] == ["0 3 * * *"]
    finally:
        await schedules.delete(temporal_env.client, "twice")


async def _schedule_by_hand(env: WorkflowEnvironment, series: str, spec: ScheduleSpec) -> None:
    """A schedule of a series made outside `tidemark`, by interval or calendar.

    For example in the Web UI, or with `temporal schedule create`."""
    action = ScheduleActionStartWorkflow(
        "ScheduledRun", {"series": series, "planner": "helpers.planners:nightly", "args": {}},
        id=f"tidemark-sched-{series}", task_queue="nowhere")
    await env.client.create_schedule(schedules.schedule_id(series),
                                     Schedule(action=action, spec=spec))


async def test_schedule_list_is_a_table_for_people_and_json_for_programs(
        temporal_env: WorkflowEnvironment, store: JournalStore, cli, people) -> None:
    code, _, err = await cli("schedule", "create", "lst-cron", "--cron", "0 3 * * 1-5",
                             "--planner", "helpers.planners:nightly", "--approval", "payments",
                             "--approvers", "ana,ben")
    assert code == 0, err
    await _schedule_by_hand(temporal_env, "lst-every", ScheduleSpec(
        intervals=[ScheduleIntervalSpec(every=timedelta(hours=6), offset=timedelta(minutes=5))]))
    await _schedule_by_hand(temporal_env, "lst-cal", ScheduleSpec(calendars=[
        ScheduleCalendarSpec(hour=[ScheduleRange(4)], minute=[ScheduleRange(30)],
                             comment="daily")]))
    assert (await cli("schedule", "pause", "lst-every"))[0] == 0
    try:
        code, out, err = await cli("schedule", "list", "--json")
        assert code == 0, err
        mine = {s["series"]: s for s in json.loads(out) if s["series"].startswith("lst-")}
        assert mine["lst-cron"]["cron"] == ["0 3 * * 1-5"]  # as given, not the server's calendar
        assert (mine["lst-cron"]["approval"], mine["lst-cron"]["approvers"]) == (
            "payments", ["ana", "ben"])
        assert "cron" not in mine["lst-every"] and "calendars" not in mine["lst-every"]
        assert mine["lst-every"]["intervals"] == [{"every_s": 21600, "offset_s": 300}]
        assert mine["lst-every"]["paused"] is True
        assert "cron" not in mine["lst-cal"] and "intervals" not in mine["lst-cal"]
        assert mine["lst-cal"]["calendars"] == [{"calendar": "30 4 * * *", "comment": "daily"}]
        assert mine["lst-cal"]["approval"] is None  # never declared: the worker's policy

        code, out, err = await cli("schedule", "list")
        assert code == 0, err
        lines = out.splitlines()
        assert lines[0].split() == ["series", "when", "next", "run", "paused", "approval",
                                    "approvers"]
        row = {line.split()[0]: line for line in lines[1:]}
        next_run = mine["lst-cron"]["next"][0][:16].replace("T", " ")
        for want in ("0 3 * * 1-5", next_run, " no ", "payments", "ana,ben"):
            assert want in row["lst-cron"], (want, row["lst-cron"])
        for want in ("every 6h (+5m)", " yes ", "not declared"):
            assert want in row["lst-every"], (want, row["lst-every"])
        assert "calendar 30 4 * * * (daily)" in row["lst-cal"], row["lst-cal"]
    finally:
        for series in ("lst-cron", "lst-every", "lst-cal"):
            await schedules.delete(temporal_env.client, series)


# -- kill --all: the hint names what helps -----------------------------------------------------

async def test_under_kill_all_the_unwind_refusal_names_release_all(
        temporal_env: WorkflowEnvironment, store: JournalStore, tmp_path: Path, cli) -> None:
    store.persist_plan(load_plan(renames(tmp_path, 2, "ka-1"), spec_registry()))
    code, _, err = await cli("kill", "--all", "--yes", "--reason", "drill", "--by", "ops")
    assert code == 0, err
    code, out, err = await cli("unwind", "ka-1", "--yes")
    assert code == 1 and err.count("\n") == 1, err
    named = re.findall(r"`(tidemark release[^`]*)`", err)
    assert named == ["tidemark release --all"], err
    # What the hint names helps, run as printed; releasing the task by name would not.
    code, _, err = await cli("release", "ka-1", "--for-unwind")
    assert code == 1 and re.findall(r"`(tidemark release[^`]*)`", err) == [
        "tidemark release --all"], err
    code, _, err = await cli(*shlex.split(named[0])[1:])
    assert code == 0, err
    code, out, err = await cli("unwind", "ka-1", "--yes")
    try:
        assert code == 0 and out.startswith("started tidemark-unwind-ka-1"), err
    finally:
        handle = temporal_env.client.get_workflow_handle("tidemark-unwind-ka-1")
        await asyncio.wait_for(handle.terminate("test over"), 30)
