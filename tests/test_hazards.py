"""Hazards that are easy to reintroduce, one test each.

Each test pins one way a step could act twice, a person's decision could be overstretched, a stop
could be lost, or bad input could loop forever.

Nothing of our own is mocked: real Postgres, real Temporal, real worker processes, the staging
servers; ``ledger.record`` (tests/helpers/ledger.py) is the test target that counts effects.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from activities.catalog import spec_registry
from activities.fs import FsRename
from activities.gmail import GmailSend
from helpers.fs_roots import FS_ROOTS
from helpers.ledger import LedgerRecord, ledger_lines, ledger_step
from helpers.steps import cut_sessions, run_one, wait_unlocked
from helpers.wait import assert_eventually
from tidemark.actions import Registry
from tidemark.errors import NeedsDecision, PlanError, StepBusy, TidemarkError
from tidemark.faults import CRASH_ENV
from tidemark.payloads import RunResult
from tidemark.plan import load_plan
from tidemark.run_step import StepResult, run_step
from tidemark.store import JournalStore
from tools.operate import commands
from workflows.outcome import run_result

SPECS = spec_registry(LedgerRecord)
REGISTRY = Registry([FsRename([FS_ROOTS]), LedgerRecord()])


def persist(store: JournalStore, steps: list[dict[str, Any]], task_id: str = "t") -> str:
    plan = load_plan({"task_id": task_id, "steps": steps}, SPECS)
    store.persist_plan(plan)
    return plan.task_id


async def until(handle: WorkflowHandle[Any, RunResult], check: Callable[[dict[str, Any]], Any],
                timeout: float = 30.0) -> None:
    """Polls the workflow's status query until ``check`` holds; fails at the timeout."""
    deadline = time.monotonic() + timeout
    while not check(status := await handle.query("status")):
        assert time.monotonic() < deadline, f"status never met the condition: {status}"
        await asyncio.sleep(0.1)


def crash_at(db_url: str, task: str, step: int, point: str) -> None:
    proc = run_one(db_url, task, step, **{CRASH_ENV: point})
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    wait_unlocked(db_url)


# -- 1. an operator's "absent" decision licenses every later execution of the step -----------

def test_operator_absent_decision_is_used_for_one_execution_only(
        store: JournalStore, db_url: str, tmp_path: Path) -> None:
    """An operator's "absent" decision is used for one execution only.

    After `resolve --as absent`, resume executes (effect 1) and dies before its outcome; the next
    resume finds the probe still blind and executes AGAIN on the same, already spent, decision."""
    blind = tmp_path / "blind"
    task = persist(store, [ledger_step(tmp_path, blind_while=str(blind))])
    crash_at(db_url, task, 1, "after_intent")  # in doubt, nothing happened
    blind.write_text("")  # the target cannot be read: the probe cannot tell
    with pytest.raises(NeedsDecision):
        run_step(store, REGISTRY, task, 1)
    commands.resolve(db_url, task, 1, "absent", "looked: not there", "ops")

    # Resume on the person's word: it executes, then the worker dies before the outcome.
    crash_at(db_url, task, 1, "after_execute")
    assert len(ledger_lines(tmp_path / "ledger")) == 1  # the effect happened once

    # The probe is still blind. The decision was about the world BEFORE that execution; it
    # must not license a second one.
    with pytest.raises(NeedsDecision):
        run_step(store, REGISTRY, task, 1)
    assert len(ledger_lines(tmp_path / "ledger")) == 1, "the step acted twice"


# -- 2. the execution lock is released before the outcome is durable -------------------------

def test_twin_taking_the_lock_between_unlock_and_commit_sees_a_settled_step(
        store: JournalStore, db_url: str, tmp_path: Path) -> None:
    """A twin taking the lock between unlock and commit sees a settled step.

    StepSession.complete unlocks inside the UPDATE, i.e. before its commit. A commit that
    takes a while (synchronous replication, a slow fsync; here a deferred trigger) lets a twin
    take the lock, read the intent as still open, probe and act on it."""
    with psycopg.connect(db_url, autocommit=True) as admin:
        admin.execute("""
            CREATE FUNCTION public.slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN PERFORM pg_sleep(1.5); RETURN NULL; END $$;
            CREATE CONSTRAINT TRIGGER slow_commit AFTER UPDATE ON tidemark.journal
              DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
              WHEN (NEW.outcome IS NOT NULL) EXECUTE FUNCTION public.slow_commit();
        """)
    hold = tmp_path / "hold"
    hold.write_text("")
    task = persist(store, [ledger_step(tmp_path, hold_while=str(hold))])
    first: list[object] = []
    a = threading.Thread(target=lambda: first.append(run_step(store, REGISTRY, task, 1)))
    a.start()
    assert_eventually(lambda: store.step_row(task, 1))  # A holds the lock, inside execute

    twin: list[object] = []

    def attempt_until_not_busy() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                twin.append(run_step(store, REGISTRY, task, 1))
                return
            except StepBusy:
                time.sleep(0.005)
            except TidemarkError as e:
                twin.append(e)
                return

    b = threading.Thread(target=attempt_until_not_busy)
    b.start()
    time.sleep(0.2)
    hold.unlink()  # A acts and writes its outcome
    a.join(30)
    b.join(30)
    assert len(ledger_lines(tmp_path / "ledger")) == 1
    [result] = twin
    # A twin must either be refused (StepBusy) or see the outcome; it must never meet an open
    # intent that is in fact settled (here it probes, then fails with InvariantViolation, which
    # ends the workflow as `failed`; with a lagging probe it would execute a second time).
    assert isinstance(result, StepResult) and result.skipped, f"twin got {result!r}"


# -- 3. a dropped journal connection frees the lock while the action is still running --------

def test_twin_does_not_act_while_the_first_attempt_is_alive_but_lost_its_connection(
        store: JournalStore, db_url: str, tmp_path: Path) -> None:
    """A twin does not act while the first attempt is alive but lost its connection.

    The lock lives on the connection, not with the attempt. A Postgres restart, failover or
    network blip ends the session while attempt A is inside its action. Twin B (Temporal retries
    after the heartbeat timeout, or another worker) gets the lock, probes 'absent' because A has
    not landed yet, and executes. Then A lands too: two effects."""
    hold = tmp_path / "hold"
    hold.write_text("")
    task = persist(store, [ledger_step(tmp_path, hold_while=str(hold))])
    a_errors: list[BaseException] = []

    def first() -> None:
        try:
            run_step(store, REGISTRY, task, 1)
        except BaseException as e:  # recorded for the assertion message
            a_errors.append(e)

    a = threading.Thread(target=first)
    a.start()
    assert_eventually(lambda: store.step_row(task, 1))  # intent committed; A is acting
    cut_sessions(db_url)
    with pytest.raises(StepBusy):  # B: must not act while A may still be acting
        run_step(store, REGISTRY, task, 1)
    hold.unlink()  # A's call lands
    a.join(60)
    assert len(ledger_lines(tmp_path / "ledger")) == 1, (
        f"two effects for one step (A ended with {a_errors!r})")


# -- 4. bad input that validation lets through ---------------------------------------------

def test_plan_with_nul_character_is_refused_with_a_plan_error(store: JournalStore) -> None:
    """A plan with a NUL character is refused with a plan error.

    JSON allows "\\u0000"; Postgres jsonb does not. Unchecked, persist_plan raises a raw
    psycopg DataError (not a TidemarkError), which the prepare activity retries forever; the
    plan must be refused as a plan error naming the field, and nothing stored."""
    doc = {"task_id": "nul", "steps": [{"action": "fs.rename",
                                        "args": {"path": "/tmp/a", "name": "b\u0000c"}}]}
    with pytest.raises(PlanError, match=r"steps\[0\]\.args\.name: contains a NUL character"):
        store.persist_plan(load_plan(doc, SPECS))
    assert not store.task_known("nul")


def test_plan_with_lone_surrogate_is_refused_with_a_plan_error() -> None:
    """A plan with a lone surrogate is refused with a plan error.

    A JSON "\\ud800" escape parses to a lone surrogate; load_plan without a task_id dies in
    plan_hash with UnicodeEncodeError instead of naming the field."""
    doc = {"steps": [{"action": "fs.rename", "args": {"path": "/tmp/a", "name": "b\ud800"}}]}
    with pytest.raises(PlanError):
        load_plan(doc, SPECS)


def test_gmail_subject_with_a_newline_is_a_typed_error_not_an_endless_retry(
        store: JournalStore) -> None:
    """A Gmail subject with a newline is a typed error, not an endless retry.

    Unchecked, the plan validates, the intent is committed, then EmailMessage raises
    ValueError while the draft is built: not a TidemarkError, so Temporal retries the step
    forever (each retry probes, finds it absent, and fails again), and the task never reaches a
    named end state. The plan check refuses it first, with a plan error naming the field that
    no retry can change, and nothing is stored."""
    args = {"to": ["bob@example.com"], "subject": "Q3\nreport", "body": "x"}
    with pytest.raises(PlanError, match=r"steps\[0\]\.args\.subject: must be one line") as e:
        load_plan({"task_id": "nl", "steps": [{"action": "gmail.send", "args": args}]},
                  Registry([GmailSend]))
    assert not e.value.retryable
    assert not store.task_known("nl")


# -- 5. RunPlan: halt and counts -------------------------------------------------------------

async def test_halt_is_durable_even_when_the_current_step_ends_the_run(
        temporal_env: WorkflowEnvironment, store: JournalStore, db_url: str, tmp_path: Path,
        workers, task_queue: str) -> None:
    """A halt is durable even when the current step ends the run.

    A halt arrives while step 1 is running (here: retrying StepBusy); step 1 then ends the run
    (precondition_failed). The hazard: the halt's stop state is never written, so the next start
    (a Schedule, a script) runs the task although a person asked it to stop."""
    gate = tmp_path / "gate"
    doc = {"task_id": "halt-pf", "steps": [
        ledger_step(tmp_path, "e1", gate_file=str(gate)), ledger_step(tmp_path, "e2")]}
    hold = tmp_path / "hold"
    doc["steps"][0]["args"]["hold_while"] = str(hold)
    hold.write_text("")
    store.persist_plan(load_plan(doc, SPECS))
    # A live twin acts on step 1 (another process): the workflow's attempt meets StepBusy and
    # retries while the twin's lease runs.
    twin = run_one(db_url, "halt-pf", 1)
    assert_eventually(lambda: store.step_row("halt-pf", 1))
    workers.start()
    handle = await temporal_env.client.start_workflow(
        "RunPlan", doc, id="tidemark-halt-pf", task_queue=task_queue, result_type=RunResult)
    await until(handle, lambda s: s["current_step"] == 1)
    await handle.signal("halt", "maintenance")
    await until(handle, lambda s: s["halt_requested"])
    gate.write_text("")  # the world changed: step 1's gate now refuses
    twin.send_signal(signal.SIGKILL)  # the twin dies in its call; its lease runs out
    twin.communicate(timeout=30)
    result = await run_result(handle)
    # The halt is written while step 1 still retries; its next attempt meets the stop state
    # before its gate, so the run ends halted, with nothing after it started.
    assert (result.state, result.stopped_at) == ("halted", 1)
    assert store.stop_state("halt-pf") is not None, "halt requested but no stop state written"
    assert ledger_lines(tmp_path / "ledger") == []


async def test_step_settled_by_a_live_twin_counts_as_confirmed(
        temporal_env: WorkflowEnvironment, store: JournalStore, db_url: str, tmp_path: Path,
        workers, task_queue: str) -> None:
    """A step settled by a live twin counts as confirmed.

    A twin attempt (the one Temporal gave up on after a heartbeat timeout, emulated by a
    separate process) settles step 1 while the workflow's attempt retries StepBusy; the retry
    then finds the outcome (skipped=True) and RunPlan counts it as skipped, not confirmed."""
    hold = tmp_path / "hold"
    hold.write_text("")
    doc = {"task_id": "twin-count", "steps": [ledger_step(tmp_path, "e1",
                                                          hold_while=str(hold))]}
    store.persist_plan(load_plan(doc, SPECS))
    twin = run_one(db_url, "twin-count", 1)
    assert_eventually(lambda: store.step_row("twin-count", 1))
    workers.start()
    handle = await temporal_env.client.start_workflow(
        "RunPlan", {"task_id": "twin-count"}, id="tidemark-twin-count", task_queue=task_queue,
        result_type=RunResult)
    await until(handle, lambda s: s["current_step"] == 1)
    hold.unlink()
    twin.communicate(timeout=60)
    assert twin.returncode == 0
    result = await run_result(handle)
    assert result.state == "completed"
    assert store.progress("twin-count").confirmed == 1
    assert result.confirmed == 1, f"result says {result.confirmed} of 1 confirmed"
    assert (result.executed, result.skipped) == (0, 1)  # the twin acted, the workflow did not
    # One effect: the twin's. The workflow's retry found the outcome and acted on nothing.
    assert [line.split(" ", 1)[1] for line in ledger_lines(tmp_path / "ledger")] == ["e1"]
