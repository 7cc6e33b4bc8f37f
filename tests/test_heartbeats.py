"""A step's heartbeats come from one thread per worker process.

The heartbeats are activities/steps.py ``_heartbeating``. They do not come from a thread started and
joined for every step: same beats, no thread per step.

Run in the SDK's activity environment (temporalio.testing.ActivityEnvironment), which gives the
block a real activity context and records its heartbeats."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment

from activities.steps import HEARTBEAT_EVERY_S, _heartbeating


def beats_of(seconds: float) -> list[float]:
    """The monotonic times of the heartbeats of one activity that runs ``seconds``."""
    env = ActivityEnvironment()
    beats: list[float] = []
    env.on_heartbeat = lambda *details: beats.append(time.monotonic())

    def step() -> None:
        with _heartbeating():
            time.sleep(seconds)

    env.run(step)
    return beats


def test_a_running_step_heartbeats_every_period_and_never_after_it_returned() -> None:
    t0 = time.monotonic()
    beats = beats_of(3.2 * HEARTBEAT_EVERY_S)
    ended = time.monotonic()
    # One a period from the start, each after the one before: 3 in 3.2 periods, or fewer when
    # this loaded machine delays one (each waits a whole period after the last).
    assert 2 <= len(beats) <= 3, beats
    first = beats[0] - t0
    assert HEARTBEAT_EVERY_S * 0.9 <= first <= HEARTBEAT_EVERY_S * 3, first
    gaps = [b - a for a, b in itertools.pairwise(beats)]
    # never sooner than a period, and well within the 2 s heartbeat timeout
    assert all(HEARTBEAT_EVERY_S * 0.9 <= g <= HEARTBEAT_EVERY_S * 3 for g in gaps), gaps
    count = len(beats)
    time.sleep(2 * HEARTBEAT_EVERY_S)
    assert all(b <= ended for b in beats), "a heartbeat came after the step returned"
    assert len(beats) == count, beats


def test_quick_steps_start_no_thread_each(monkeypatch: pytest.MonkeyPatch) -> None:
    beats_of(0.0)  # the process's heartbeat thread, if any, is up
    started: list[threading.Thread] = []
    start = threading.Thread.start

    def counted(self: threading.Thread, *args: Any, **kwargs: Any) -> None:
        started.append(self)
        start(self, *args, **kwargs)

    monkeypatch.setattr(threading.Thread, "start", counted)
    for _ in range(50):
        beats_of(0.001)
    assert started == [], f"{len(started)} threads started for 50 steps"


def test_steps_at_once_each_get_their_beats() -> None:
    beats: dict[int, list[float]] = {}

    def run(i: int) -> None:
        beats[i] = beats_of(2.5 * HEARTBEAT_EVERY_S)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # 2 in 2.5 periods each (1 if the loaded machine delayed the first by half a period)
    assert len(beats) == 8 and all(1 <= len(b) <= 2 for b in beats.values()), beats
