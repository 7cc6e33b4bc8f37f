"""`tidemark fleet` in small: many steps in flight, a worker killed, nothing duplicated.

Many steps are in flight over two real worker processes, one of them SIGKILLed and replaced while
the steps wait on the target; nothing duplicated, nothing done that did not happen, every run
completed, and the Postgres connections bounded by the pools, not by the steps in flight. The
1,000-task run is `tidemark fleet` by hand (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import glob
import json
import math
import os
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.client import WorkflowExecutionStatus
from temporalio.common import RetryPolicy
from temporalio.testing import WorkflowEnvironment

from helpers.ledger import ledger_step
from staging.core import StagingServer
from tidemark.activity_names import ActivityName
from tools.cli.main import EXIT_ERROR, EXIT_USAGE, main
from tools.fleet import FleetConfig, FleetReport, _results, run_fleet
from workflows.shared import STEP_RETRY

PLAN = Path(__file__).resolve().parent.parent / "examples" / "fleet-rename.json"
# Two workers, each allowed far more steps at once than its pool has connections.
SMALL = FleetConfig(tasks=60, workers=2, wait_s=2.0, kills=1, seed=22, steps_per_worker=64,
                    pool=4, timeout_s=45.0)
# Steps in flight at once that the fleet must exceed: every connection the two workers may
# open (each pool, each lease keeper, one spare per worker). A step that held a pooled
# connection across its call would cap it at the pools (8); how far above the bound it gets
# depends on how quickly the workers take the starts (22 to 40 seen on two loaded cores).
INFLIGHT_AT_LEAST = 2 * (4 + 2) + 1


def asked_after_a_kill(report: FleetReport) -> list[dict[str, Any]]:
    """The runs that ask a person because a kill met their step between its mark and its send.

    A worker killed after it marked its request as leaving, and before it reported back, cannot
    be told from one that stands still with the request still to leave: its step asks a person
    (docs/safety-rules.md, the mark). That is the safe end, not a miss: nothing acted twice, and
    nothing is called done that is not."""
    return [n for n in report.not_completed if n["state"] == "needs_decision"
            and "marked its request as leaving" in n["why"]]


async def test_a_small_fleet_with_a_kill_is_exact_and_its_connections_stay_bounded(
        temporal_env: WorkflowEnvironment, db_url: str, server: StagingServer) -> None:
    report = await run_fleet(json.loads(PLAN.read_text()), SMALL, client=temporal_env.client,
                             db_url=db_url, staging_url=server.url)
    summary = (f"completed {report.completed}/{SMALL.tasks}, steps in flight at most "
               f"{report.inflight_steps_peak}, connections at most {report.db_connections_peak} "
               f"(bound {SMALL.connection_bound}), duplicates {report.duplicates}, false done "
               f"{len(report.false_done)}, kills {len(report.kills)}; not completed: "
               f"{report.not_completed[:3]}")
    asked = asked_after_a_kill(report)
    assert report.completed + len(asked) == SMALL.tasks, summary
    assert (report.duplicates, report.false_done, report.missing) == (0, [], 0), summary
    assert len(report.kills) == SMALL.kills and report.kills[0].writes_in_flight > 0, summary
    assert len(asked) <= sum(k.writes_in_flight for k in report.kills), summary
    assert report.inflight_steps_peak >= INFLIGHT_AT_LEAST, summary
    assert 0 < report.db_connections_peak <= SMALL.connection_bound, summary
    # What the steps in flight cost the workers is read from each worker process itself (the
    # two started and the one that replaced the killed one), not from the harness: their
    # memory, and threads beyond those they had while only polling (one per running step).
    use = (f"sampled {report.workers_sampled} of {report.worker_pids}; RSS "
           f"{report.worker_rss_start_kib} -> {report.worker_rss_peak_kib} KiB, threads "
           f"{report.worker_threads_start} -> {report.worker_threads_peak}")
    assert len(report.worker_pids) == SMALL.workers + SMALL.kills, use
    assert sorted(report.workers_sampled) == sorted(report.worker_pids), use
    assert os.getpid() not in report.worker_pids, use
    assert 0 < report.worker_rss_start_kib <= report.worker_rss_peak_kib, use
    assert report.worker_threads_peak > report.worker_threads_start > 0, use
    assert report.worker_cpu_s > 0, use


# A third of the Drive's requests throttled (403 userRateLimitExceeded, its worst answer), reads
# and writes alike, with a worker killed meanwhile: every throttled read is waited out, every
# throttled write is retried by the run, and no run stops for a person but one the kill met
# between its mark and its send (asked_after_a_kill). The 1,000-task run is
# `tidemark fleet examples/fleet-rename.json --throttle 0.3` (docs/benchmarks.md).
THROTTLE, THROTTLED_TASKS = 0.3, 40
# How unlikely the test may be to fail on throttling alone: a write throttled k times in a row is
# retried after the retry policy's next k intervals (Drive documents no Retry-After for it, so
# nothing shortens them), and the chance that one of the runs meets that is tasks * rate ** k.
TAIL_ODDS = 1e-5
# The lease of the Drive call a kill meets (twice the fleet's 5 s client timeout, and 5 s): the
# run's retries that wait it out (StepBusy, the policy's doubling intervals) come first, so
# each throttle after them waits a longer interval.
KILLED_LEASE_S = 15.0
# Beyond the intervals: the heartbeat timeout, a twin's count of the lease on a worker of its
# own, throttled reads, start-up.
TAIL_SLACK_S = 90.0


def intervals(retry: RetryPolicy) -> Iterator[float]:
    """The retry policy's intervals, in seconds: 0.5, 1, 2, ... each at most its maximum."""
    first = (retry.initial_interval or timedelta(seconds=1)).total_seconds()
    most = (retry.maximum_interval or timedelta(seconds=100 * first)).total_seconds()
    n = 0
    while True:
        yield min(most, first * retry.backoff_coefficient ** n)
        n += 1


def throttled_tail_s(rate: float, tasks: int, retry: RetryPolicy, odds: float,
                     lease_s: float) -> float:
    """Seconds of retry intervals that at most ``odds`` of the fleets exceed.

    The intervals that wait out a killed attempt's lease of ``lease_s``, then those of the least
    run of k throttled attempts in a row that one of ``tasks`` runs meets with odds below
    ``odds``."""
    k = math.ceil(math.log(odds / tasks) / math.log(rate))
    waits = intervals(retry)
    waited = 0.0
    while waited < lease_s:  # the attempts that meet the killed attempt's lease
        waited += next(waits)
    return waited + sum(next(waits) for _ in range(k))


THROTTLED = FleetConfig(
    tasks=THROTTLED_TASKS, workers=2, wait_s=1.0, kills=1, seed=40, steps_per_worker=64, pool=4,
    timeout_s=TAIL_SLACK_S + throttled_tail_s(THROTTLE, THROTTLED_TASKS, STEP_RETRY, TAIL_ODDS,
                                             KILLED_LEASE_S),
    throttle=THROTTLE)


async def test_a_throttled_fleet_completes_every_run_with_nothing_twice(
        temporal_env: WorkflowEnvironment, db_url: str, server: StagingServer) -> None:
    report = await run_fleet(json.loads(PLAN.read_text()), THROTTLED,
                             client=temporal_env.client, db_url=db_url, staging_url=server.url)
    summary = (f"completed {report.completed}/{THROTTLED.tasks}, for a person "
               f"{report.stopped_for_a_person[:3]}, duplicates {report.duplicates}, false done "
               f"{report.false_done[:3]}, not completed {report.not_completed[:3]}")
    asked = asked_after_a_kill(report)
    assert report.completed + len(asked) == THROTTLED.tasks, summary
    assert len(report.stopped_for_a_person) == len(asked), summary
    assert (report.duplicates, report.false_done, report.missing) == (0, [], 0), summary
    refused = [r for r in server.staging.requests_of("drive") if r.status in (403, 429)]
    assert refused, "the Drive throttled no write: the test shows nothing"


# One worker with 4 threads for its steps' blocking parts, and 40 runs whose renames each wait
# 4 s at the staging Drive (its client gives up at 5 s). drive.rename awaits its call, so a
# waiting step holds none of the 4: the steps wait side by side. Were each wait a thread's, at
# most 4 intents would stand open at once, and the 40 steps would take ten rounds of 4 s. The
# runs start over a few seconds on a loaded machine (each prepares and describes its steps
# first): the test asks for three times the threads in flight at once, not for all 40.
ONE_WORKER = FleetConfig(tasks=40, workers=1, wait_s=4.0, kills=0, seed=7, steps_per_worker=64,
                         pool=4, timeout_s=60.0)
STEP_THREADS = 4


async def test_one_worker_holds_many_more_waiting_steps_than_it_has_step_threads(
        temporal_env: WorkflowEnvironment, db_url: str, server: StagingServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDEMARK_STEP_THREADS", str(STEP_THREADS))
    report = await run_fleet(json.loads(PLAN.read_text()), ONE_WORKER,
                             client=temporal_env.client, db_url=db_url, staging_url=server.url)
    summary = (f"completed {report.completed}/{ONE_WORKER.tasks} in {report.wall_s:.1f} s, "
               f"steps in flight at most {report.inflight_steps_peak}, duplicates "
               f"{report.duplicates}, false done {len(report.false_done)}")
    assert report.completed == ONE_WORKER.tasks, summary
    assert (report.duplicates, report.false_done, report.missing) == (0, [], 0), summary
    assert report.inflight_steps_peak >= 3 * STEP_THREADS, summary


def fleet_dirs() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "tidemark-fleet-*")))


@pytest.mark.parametrize(("args", "message"), [
    (["--tasks", "0"], "--tasks must be 1 or more, got 0"),
    (["--workers", "-1"], "--workers must be 1 or more, got -1"),
    (["--pool", "1"], "--pool must be 2 or more, got 1"),
    (["--kills", "-2"], "--kills must be 0 or more, got -2"),
    (["--wait-s", "-1"], "--wait-s must be at least 0 and below the Drive client's timeout"),
    (["--wait-s", "5"], "--wait-s must be at least 0 and below the Drive client's timeout "
                        "(TIDEMARK_DRIVE_TIMEOUT_S, 5 s here), got 5"),
])
def test_bad_flags_are_one_line_and_start_nothing(args: list[str], message: str,
                                                  capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIDEMARK_DRIVE_TIMEOUT_S", raising=False)  # the staging client's 5 s
    before = fleet_dirs()
    assert main(["fleet", str(PLAN), *args]) == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"tidemark: {message}" or err[-1].startswith(f"tidemark: {message}"), err
    assert fleet_dirs() == before


@pytest.mark.parametrize(("step", "message"), [
    ({"action": "gmail.send", "args": {"to": ["a@b.example"], "subject": "s", "body": "b"}},
     "step 1 is 'gmail.send'; a fleet plan's steps are drive.rename"),
    ({"action": "drive.rename", "args": {"file_id": "one-file", "name": "x"}},
     "step 1's file_id must hold {n}"),
])
def test_a_plan_the_fleet_cannot_spread_is_refused_in_one_line(
        step: dict[str, object], message: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"task_id": "f", "steps": [step]}))
    before = fleet_dirs()
    assert main(["fleet", str(plan), "--tasks", "3"]) == EXIT_ERROR
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert fleet_dirs() == before


@pytest.mark.slow
async def test_a_run_that_outlives_the_timeout_is_reported_with_the_activity_it_waits_on(
        temporal_env: WorkflowEnvironment, workers, task_queue: str, tmp_path: Path) -> None:
    """A run still going when the fleet's time is up is terminated, and says where it stood.

    The report names the activity it waited on and which attempt: what a fleet that did not
    complete is read by."""
    client = temporal_env.client
    workers.start()
    hold = tmp_path / "hold"
    hold.touch()
    doc = {"task_id": "fleet-outlived", "steps": [ledger_step(tmp_path, hold_while=str(hold))]}
    handle = await client.start_workflow("RunPlan", doc, id="tidemark-fleet-outlived",
                                         task_queue=task_queue)

    async def step_running() -> bool:
        desc = await handle.describe()
        return any(a.activity_type.name == ActivityName.RUN_STEP
                   and a.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
                   for a in desc.raw_description.pending_activities)
    for _ in range(600):
        if await step_running():
            break
        await asyncio.sleep(0.05)
    results = await _results([handle], timeout=0.5)
    hold.unlink()
    state, why = results["fleet-outlived"]
    assert state == "running", why
    assert why.startswith("still running when --timeout-s passed; terminated"), why
    assert f"{ActivityName.RUN_STEP} attempt 1" in why, why
    assert (await handle.describe()).status == WorkflowExecutionStatus.TERMINATED
