"""An unwind's list of steps against an intent being written, in both orders, on real Postgres.

An intent is written in a transaction that first takes the task's plan row FOR SHARE
(StepSession.begin); an unwind reads its list of steps to compensate in a transaction that takes
that row FOR UPDATE first, waiting at most LOCK_WAIT_MS (undo_candidates). Here the intent's
transaction is held open for real: a trigger on the journal makes the INSERT of step 2's intent
wait for a row this test keeps locked from a connection of its own, so the transaction has taken
its share lock and its statement has read the stop state, but has not committed. The other
order holds the unwind's transaction open the same way: its read of the plan's steps waits for a
table this test keeps locked, after it has taken the plan row.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from activities.fs import FsRename
from helpers.fs_roots import FS_ROOTS
from helpers.renames import RENAME_SPECS as SPECS
from helpers.renames import RENAMES as REGISTRY
from helpers.renames import two_renames
from helpers.steps import Attempts, persist
from helpers.wait import assert_eventually
from tidemark.actions import Registry, StepContext
from tidemark.errors import StepBusy, TaskStopped, TaskUnwound
from tidemark.run_step import run_step
from tidemark.store import JournalStore
from tidemark.store.unwinds import LOCK_WAIT_MS
from tidemark.unwind import unwind_step

# Step 2's intent waits in its INSERT, inside the transaction that holds the plan row FOR
# SHARE, for as long as this test holds the gate row; so does an unwind's mark.
GATE = """
CREATE TABLE public.intent_gate (id int);
INSERT INTO public.intent_gate VALUES (1);
CREATE FUNCTION public.intent_waits_at_gate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM 1 FROM public.intent_gate FOR UPDATE; RETURN NEW; END $$;
CREATE TRIGGER intent_waits_at_gate BEFORE INSERT ON tidemark.journal FOR EACH ROW
  WHEN (NEW.step = 2 AND NEW.phase = 'do') EXECUTE FUNCTION public.intent_waits_at_gate();
CREATE TRIGGER mark_waits_at_gate BEFORE INSERT ON tidemark.unwinds FOR EACH ROW
  EXECUTE FUNCTION public.intent_waits_at_gate();
"""


def names(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".txt")


def waits_on_a_lock(db_url: str, statement: str) -> bool:
    """Whether a session runs a statement containing ``statement`` and waits for a lock.

    The session is any session of the database."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND strpos(query, %s) > 0", (statement,)).fetchone()
    return row is not None and row[0] > 0


INTENT = "INSERT INTO tidemark.journal"
MARK = "INSERT INTO tidemark.unwinds"
PLAN_ROW_SHARED = "FROM tidemark.plans WHERE task_id = $1 FOR SHARE"
PLAN_ROW_TAKEN = "FROM tidemark.plans WHERE task_id = $1 FOR UPDATE"
UNWIND_STEPS = "JOIN tidemark.plan_steps"


@pytest.fixture
def gate(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    """The gate row, locked in an open transaction.

    Step 2's intent waits in its INSERT until the test commits."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(GATE)
    with psycopg.connect(db_url) as conn:
        conn.execute("SELECT 1 FROM public.intent_gate FOR UPDATE")
        yield conn


class HeldRename(FsRename):
    """fs.rename whose call waits for ``go``: the step stays in doubt, its lease fresh."""

    def __init__(self, go: threading.Event) -> None:
        super().__init__([FS_ROOTS])
        self.go = go

    def execute(self, ctx: StepContext) -> dict[str, Any]:
        assert self.go.wait(20), "the test never let the rename go"
        return super().execute(ctx)


def test_an_unwind_waits_for_an_intent_being_written_and_lists_its_step(
        store: JournalStore, db_url: str, tmp_path: Path,
        gate: psycopg.Connection[Any]) -> None:
    """An unwind waits for an intent being written, and lists its step.

    Step 2's intent has read the task as running and is being written when the stop is
    committed and the unwind starts: the unwind waits for it, lists step 2, and leaves it to
    the attempt that owns it (StepBusy) until that attempt has settled it; then both steps
    are compensated. Without the plan row's lock the list would be [1]: an unwind planned
    from it would miss step 2, whose intent commits right after."""
    task = two_renames(store, tmp_path, "unwind-waits")
    go = threading.Event()
    forward = Attempts(lambda step: run_step(store, Registry([HeldRename(go)]), task, step), [2])
    try:
        assert_eventually(lambda: waits_on_a_lock(db_url, INTENT))
        store.set_control(task, "stopped", "unwind", "ops")  # after the intent's statement read
        unwind = Attempts(store.undo_candidates, [task])
        assert_eventually(lambda: unwind.results or unwind.errors
                          or waits_on_a_lock(db_url, PLAN_ROW_TAKEN))
        assert (unwind.results, unwind.errors) == ({}, {}), \
            "the unwind read its list while an intent was being written"
        gate.commit()  # the intent commits
        assert unwind.join(10) == {}
        assert unwind.results[task] == [2, 1]
        row = assert_eventually(lambda: store.step_row(task, 2))
        assert row.outcome is None  # in doubt: its attempt is acting under a fresh lease
        with pytest.raises(StepBusy, match="may still be acting"):
            unwind_step(store, REGISTRY, task, 2)
    finally:
        gate.rollback()
        go.set()
        forward.join(20)
    assert forward.errors == {}  # the stop came after its intent's statement began: it acted
    assert forward.results[2].status == "done"
    assert [unwind_step(store, REGISTRY, task, s).status for s in (2, 1)] == ["undone"] * 2
    assert names(tmp_path) == ["draft-1.txt", "draft-2.txt"]
    assert store.record_unwound(task, "ops", {}) == []


def test_an_unwind_that_waits_too_long_for_an_intent_says_so_and_plans_nothing(
        store: JournalStore, db_url: str, tmp_path: Path,
        gate: psycopg.Connection[Any]) -> None:
    """An unwind that waits too long for an intent says so and plans nothing.

    An intent's transaction is held open past LOCK_WAIT_MS. The unwind's list ends in StepBusy
    (retryable, naming the intent being written), not in a list without step 2; retried once the
    intent has committed, it lists step 2."""
    task = two_renames(store, tmp_path, "unwind-times-out")
    forward = Attempts(lambda step: run_step(store, REGISTRY, task, step), [2])
    try:
        assert_eventually(lambda: waits_on_a_lock(db_url, INTENT))
        store.set_control(task, "stopped", "unwind", "ops")
        started = time.monotonic()
        unwind = Attempts(store.undo_candidates, [task])
        unwind.join(LOCK_WAIT_MS / 1000 + 10)  # an unbounded wait fails here
        waited = time.monotonic() - started
        assert unwind.results == {}
        [busy] = unwind.errors.values()
        assert isinstance(busy, StepBusy) and "an intent is being written" in str(busy)
        assert waited >= LOCK_WAIT_MS / 1000 - 0.1
        assert [r.step for r in store.rows(task)] == [1]  # still writing; nothing planned
    finally:
        gate.rollback()
        forward.join(20)
    assert forward.errors == {}
    assert store.undo_candidates(task) == [2, 1]


def test_an_intent_attempted_while_an_unwind_reads_its_list_waits_and_is_refused(
        store: JournalStore, db_url: str, tmp_path: Path) -> None:
    """An intent attempted while an unwind reads its list waits, and is refused.

    Step 2's attempt read the task as running and is in its snapshot when the stop is
    committed; the unwind then holds the plan row while it reads its list (held open here).
    The intent's transaction waits for the unwind's, then its statement sees the stop: no
    intent, nothing renamed, and the list the unwind read ([1]) was complete."""
    task = two_renames(store, tmp_path, "intent-waits")
    in_snapshot, go_on = threading.Event(), threading.Event()

    class SlowSnapshot(FsRename):
        def snapshot(self, ctx: StepContext) -> dict[str, Any]:
            in_snapshot.set()
            assert go_on.wait(20), "the test never let the snapshot go"
            return super().snapshot(ctx)

    forward = Attempts(
        lambda step: run_step(store, Registry([SlowSnapshot([FS_ROOTS])]), task, step), [2])
    try:
        assert in_snapshot.wait(20)
        store.set_control(task, "stopped", "unwind", "ops")
        with psycopg.connect(db_url) as hold:
            # The unwind takes the plan row, then waits to read the plan's steps.
            hold.execute("LOCK TABLE tidemark.plan_steps IN ACCESS EXCLUSIVE MODE")
            unwind = Attempts(store.undo_candidates, [task])
            assert_eventually(lambda: waits_on_a_lock(db_url, UNWIND_STEPS))
            go_on.set()  # the forward attempt goes on to write its intent
            assert_eventually(lambda: forward.errors or waits_on_a_lock(db_url, PLAN_ROW_SHARED))
            assert forward.errors == {}, "the intent did not wait for the unwind's list"
            hold.rollback()
        assert unwind.join(10) == {}
        assert unwind.results[task] == [1]
    finally:
        go_on.set()
        forward.join(20)
    assert [type(e) for e in forward.errors.values()] == [TaskStopped]
    assert [r.step for r in store.rows(task)] == [1]  # no intent for step 2
    assert names(tmp_path) == ["draft-2.txt", "final-1.txt"]
    assert store.undo_candidates(task) == [1]  # what the unwind read is still all there is


def test_an_intent_never_stands_beside_an_unwound_mark_that_did_not_see_it(
        store: JournalStore, db_url: str, tmp_path: Path,
        gate: psycopg.Connection[Any]) -> None:
    """An intent never stands beside an unwound mark that did not see it.

    Nothing of the task had run when it was stopped; its unwind's mark has found nothing
    to compensate and is being written when a person releases the task and step 1's attempt
    writes its intent (nothing was compensated, so only the stop and the mark could refuse
    it). The intent waits for the mark and is refused as an unwound task requires. Written
    beside a mark that did not see it, the task would read unwound, terminal, with a
    reversible step done that no unwind will ever visit."""
    task = "mark-vs-intent"
    (tmp_path / "draft-1.txt").write_text("1")
    persist(store, SPECS, [{"action": "fs.rename", "args": {
        "path": str(tmp_path / "draft-1.txt"), "name": "final-1.txt"}}], task)
    store.set_control(task, "stopped", "unwind", "ops")
    mark = Attempts(lambda t: store.record_unwound(t, "ops", {}), [task])
    forward: Attempts[int] | None = None
    try:
        assert_eventually(lambda: waits_on_a_lock(db_url, MARK))
        store.set_control(task, "released", "go on after all", "ops")
        forward = Attempts(lambda step: run_step(store, REGISTRY, task, step), [1])
        assert_eventually(lambda: forward.results or forward.errors
                          or waits_on_a_lock(db_url, PLAN_ROW_SHARED))
        gate.commit()  # the mark commits
        assert mark.join(10) == {}
        forward.join(10)
    finally:
        gate.rollback()
        mark.join(10)
        if forward is not None:
            forward.join(10)
    assert mark.results[task] == []  # marked unwound
    assert forward.results == {}, "an intent was written beside the unwound mark"
    assert [type(e) for e in forward.errors.values()] == [TaskUnwound]
    assert store.rows(task) == []
    assert names(tmp_path) == ["draft-1.txt"]
