"""A step whose action awaits its call (Action.awaits) waits without a thread.

tidemark.run_step.run_step_async awaits the call on the event loop and runs only the attempt's
blocking parts (the journal, gates, snapshot, probe) on the step threads. The target here is
``ledger.await`` (tests/helpers/ledger.py), whose hold is an asyncio.sleep."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from helpers.ledger import ledger_lines, ledger_registry, ledger_step
from tidemark.errors import StepFailed, TargetUnavailable, TaskStopped
from tidemark.plan import load_plan
from tidemark.run_step import StepResult, run_step_async
from tidemark.step_threads import StepThreads
from tidemark.store import JournalStore

THREADS = 4


def awaited_plan(store: JournalStore, tmp_path: Path, task_id: str, **args: Any) -> None:
    step = ledger_step(tmp_path, task_id, **args)
    step["action"] = "ledger.await"
    store.persist_plan(load_plan({"task_id": task_id, "steps": [step]}, ledger_registry()))


def run(store: JournalStore, threads: StepThreads, task_id: str) -> Any:
    return run_step_async(store, ledger_registry(), task_id, 1, threads)


def test_many_steps_wait_at_once_on_a_few_threads(store: JournalStore, tmp_path: Path) -> None:
    """Many steps wait at once on a few threads, each done once.

    40 steps each wait 1.5 s on their target, on 4 step threads. All wait at once (were each wait
    a thread's, 4 threads would take 15 s), the process starts no thread per step, and each step
    is done once."""
    tasks = [f"t{i}" for i in range(40)]
    for t in tasks:
        awaited_plan(store, tmp_path, t, hold_s=1.5)
    peak = threading.active_count()
    with ThreadPoolExecutor(THREADS) as executor:
        threads = StepThreads(executor)

        async def all_steps() -> list[StepResult]:
            nonlocal peak
            steps = asyncio.gather(*(run(store, threads, t) for t in tasks))
            while not steps.done():
                peak = max(peak, threading.active_count())
                await asyncio.sleep(0.05)
            return await steps

        started = time.monotonic()
        before = threading.active_count()
        results = asyncio.run(all_steps())
        took = time.monotonic() - started
    assert [r.status for r in results] == ["done"] * len(tasks)
    assert {r.resolved_by for r in results} == {"execute"}
    assert sorted(line.split()[1] for line in ledger_lines(tmp_path / "ledger")) == sorted(tasks)
    assert took < 1.5 * 4, f"40 steps waiting 1.5 s took {took:.1f} s on {THREADS} threads"
    assert peak - before <= THREADS + 2, f"{peak - before} threads started for 40 steps"


@pytest.mark.parametrize("cancels", [1, 2])
def test_an_attempt_cancelled_while_its_call_waits_lets_the_call_end_and_settles_it(
        store: JournalStore, tmp_path: Path, cancels: int) -> None:
    """A cancelled attempt lets its waiting call end and settles the step.

    The attempt is cancelled while it waits on the target (Temporal timed the attempt out, the
    worker shuts down). The request has left, and the target applies it after. Were the step then
    left in doubt, the retry would probe before the write landed, find it absent and write again.
    The attempt instead waits for its call, records the outcome, and only then ends cancelled;
    the next attempt finds the step done. A second cancellation meanwhile (the timeout, then the
    worker's shutdown) is absorbed the same way: the attempt still ends only once settled."""
    held = tmp_path / "held"
    held.touch()
    awaited_plan(store, tmp_path, "t", hold_while=str(held))
    with ThreadPoolExecutor(THREADS) as executor:
        threads = StepThreads(executor)

        async def cancelled() -> None:
            step = asyncio.ensure_future(run(store, threads, "t"))
            while store.step_row("t", 1) is None:
                await asyncio.sleep(0.02)
            for _ in range(cancels):
                await asyncio.sleep(0.1)
                step.cancel()
            await asyncio.sleep(0.3)
            row = store.step_row("t", 1)
            assert row is not None and row.outcome is None and not step.done()  # still acting
            held.unlink()  # the target applies the write it was sent
            with pytest.raises(asyncio.CancelledError):
                await step

        asyncio.run(cancelled())
        row = store.step_row("t", 1)
        assert row is not None and (row.status, row.resolved_by) == ("done", "execute")
        again = asyncio.run(run(store, threads, "t"))
    assert again.skipped and again.status == "done"
    assert len(ledger_lines(tmp_path / "ledger")) == 1
    assert [e for e in store.events("t") if e["kind"] == "error"] == []


def test_a_stop_written_while_an_awaited_call_waits_lets_it_settle_and_stops_the_next_step(
        store: JournalStore, tmp_path: Path) -> None:
    """A stop written while an awaited call waits lets it settle, and stops the next step.

    A halt (the task's durable stop) is written while an awaited call waits on its target. The
    request has left, so the attempt still records what it did (a stop that refused the outcome
    would leave the step in doubt with its write applied), and the next step meets the stop
    before it writes an intent."""
    held = tmp_path / "held"
    held.touch()
    steps = [ledger_step(tmp_path, "e1", hold_while=str(held)), ledger_step(tmp_path, "e2")]
    for step in steps:
        step["action"] = "ledger.await"
    store.persist_plan(load_plan({"task_id": "t", "steps": steps}, ledger_registry()))
    with ThreadPoolExecutor(THREADS) as executor:
        threads = StepThreads(executor)

        async def halted_while_waiting() -> StepResult:
            step = asyncio.ensure_future(run_step_async(store, ledger_registry(), "t", 1,
                                                        threads))
            while store.step_row("t", 1) is None:
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.1)
            store.set_control("t", "stopped", "incident", "ops")
            assert not step.done()  # still waiting on the target
            held.unlink()
            return await step

        first = asyncio.run(halted_while_waiting())
        with pytest.raises(TaskStopped):
            asyncio.run(run_step_async(store, ledger_registry(), "t", 2, threads))
    assert (first.status, first.resolved_by) == ("done", "execute")
    row = store.step_row("t", 1)
    assert row is not None and row.status == "done"
    assert store.step_row("t", 2) is None
    assert [line.split()[1] for line in ledger_lines(tmp_path / "ledger")] == ["e1"]


def test_an_attempt_cancelled_before_its_call_still_acts_once_and_settles(
        store: JournalStore, tmp_path: Path) -> None:
    """An attempt cancelled before its call still acts once and settles.

    The attempt is cancelled while its first statements run on a step thread. A thread cannot be
    stopped, so the intent is written anyway. Were the attempt dropped there, its intent would
    stand open under the call's lease, and the step would wait that lease out and be probed. It
    goes on instead: it acts, settles, and then ends cancelled."""
    awaited_plan(store, tmp_path, "t")
    with ThreadPoolExecutor(THREADS) as executor:
        threads = StepThreads(executor)

        async def cancelled_at_once() -> None:
            step = asyncio.ensure_future(run(store, threads, "t"))
            await asyncio.sleep(0)  # the attempt has handed its first part to a thread
            step.cancel()
            with pytest.raises(asyncio.CancelledError):
                await step

        asyncio.run(cancelled_at_once())
    row = store.step_row("t", 1)
    assert row is not None and (row.status, row.resolved_by) == ("done", "execute")
    assert len(ledger_lines(tmp_path / "ledger")) == 1


def test_an_awaited_call_refused_is_failed_and_one_unavailable_is_in_doubt(
        store: JournalStore, tmp_path: Path) -> None:
    refuse, down = tmp_path / "refuse", tmp_path / "down"
    refuse.touch()
    down.touch()
    awaited_plan(store, tmp_path, "refused", refused_while=str(refuse))
    awaited_plan(store, tmp_path, "down", unavailable_while=str(down))
    with ThreadPoolExecutor(THREADS) as executor:
        threads = StepThreads(executor)
        with pytest.raises(StepFailed):
            asyncio.run(run(store, threads, "refused"))
        with pytest.raises(TargetUnavailable):
            asyncio.run(run(store, threads, "down"))
    failed, doubt = store.step_row("refused", 1), store.step_row("down", 1)
    assert failed is not None and failed.status == "failed"
    assert doubt is not None and doubt.outcome is None
    assert ledger_lines(tmp_path / "ledger") == []
