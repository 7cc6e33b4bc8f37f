"""The attempt sequence (tidemark.attempt) as a compensation goes through it.

The lease rules that the forward step's tests pin (test_hazards, test_lease, test_leases) hold
for the undo phase too, because both phases run one sequence. Each test here is the undo phase's
twin of one of them, named with the same mutant in dev/mutation_check.py. And the sequence is the
only code that writes or claims an intent, or holds an attempt's lease."""

from __future__ import annotations

import ast
import os
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import psycopg
import pytest

from activities.catalog import spec_registry
from helpers.ledger import HOLD_LIMIT_S, LedgerRecord, ledger_lines, ledger_step
from helpers.steps import cut_sessions, persist
from helpers.wait import assert_eventually
from tidemark.actions import Arg, Registry, StepContext
from tidemark.errors import StepBusy, TargetUnavailable
from tidemark.run_step import run_step
from tidemark.store import LEASE_RENEW_S, LEASE_S, JournalStore
from tidemark.unwind import UndoResult, unwind_step


class Reversible(LedgerRecord):
    """ledger.record with a compensation that states its end state.

    The end state is "the ledger holds an undo line for our key" (so applying it again is
    harmless), held while ``undo_hold_while`` exists and failing ambiguously (TargetUnavailable,
    nothing written) while ``undo_unavailable_while`` exists."""

    name: ClassVar[str] = "ledger.reversible"
    irreversible: ClassVar[bool] = False
    args: ClassVar[dict[str, Arg]] = {
        **LedgerRecord.args,
        "undo_hold_while": Arg(str, required=False),
        "undo_unavailable_while": Arg(str, required=False),
    }

    def compensate(self, ctx: StepContext) -> dict[str, Any]:
        down = ctx.args.get("undo_unavailable_while")
        if down and os.path.exists(down):
            raise TargetUnavailable(f"the ledger is unavailable while {down} exists")
        hold = ctx.args.get("undo_hold_while")
        deadline = time.monotonic() + HOLD_LIMIT_S
        while hold and os.path.exists(hold):
            if time.monotonic() > deadline:  # a twin that should never have got this far
                raise RuntimeError(f"{hold} still exists after {HOLD_LIMIT_S} s; nothing written")
            time.sleep(0.02)
        line = f"{ctx.key} undo {ctx.args['entry']}"
        if line not in ledger_lines(ctx.args["ledger"]):
            with open(ctx.args["ledger"], "a") as f:
                f.write(line + "\n")
        return {"undone": ctx.args["entry"]}


SPECS = spec_registry(Reversible)
ROOT = Path(__file__).resolve().parent.parent
# The journal's steps of an attempt that let it act: the intent written or claimed, the lease held
# while the call runs and after an ambiguous failure (the store package defines them). The step's
# lock is not among them: a person's `tidemark resolve` takes it to settle a step without acting.
SEQUENCE_CALLS = frozenset({"begin", "claim", "keep_lease", "renew_lease"})
SEQUENCE_HOME = "tidemark/attempt.py"


def sequence_calls_outside_its_module(root: Path) -> list[str]:
    """Where a worker's code calls a step of the attempt sequence outside its module.

    The code is that of the packages a worker runs. Calls in the module that holds the step (and
    in the store that defines it) do not count. Each place reads ``path:line name``."""
    found = []
    for package in ("tidemark", "activities", "workflows", "probes", "tools"):
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel == SEQUENCE_HOME or rel.startswith("tidemark/store/"):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in SEQUENCE_CALLS):
                    found.append(f"{rel}:{node.lineno} {node.func.attr}")
    return found


def test_only_the_attempt_module_writes_an_intent_or_holds_an_attempts_lease() -> None:
    """Only the attempt module writes an intent or holds an attempt's lease.

    A rule of the sequence fixed in one place holds for a forward step and a compensation alike
    only if nothing else writes an intent or holds a lease."""
    assert sequence_calls_outside_its_module(ROOT) == []
    home = {n.func.attr for n in ast.walk(ast.parse((ROOT / SEQUENCE_HOME).read_text()))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    assert home >= SEQUENCE_CALLS  # the names still say what the store calls them


def undo_lines(tmp_path: Path) -> list[str]:
    return [line for line in ledger_lines(tmp_path / "ledger") if " undo " in line]


def done_and_stopped(store: JournalStore, registry: Registry, tmp_path: Path,
                     **args: object) -> str:
    """A one-step task whose reversible step is done, stopped for unwinding."""
    step = ledger_step(tmp_path, **args)
    task = persist(store, SPECS, [{**step, "action": Reversible.name}])
    assert run_step(store, registry, task, 1).status == "done"
    store.set_control(task, "stopped", "unwind", "ops@example")
    return task


def unwound_or_busy(store: JournalStore, registry: Registry, task: str) -> UndoResult | None:
    try:
        return unwind_step(store, registry, task, 1)
    except StepBusy:
        return None


def test_a_compensation_whose_attempt_lost_its_session_is_not_applied_by_a_twin_meanwhile(
        store: JournalStore, db_url: str, tmp_path: Path) -> None:
    """A compensation that lost its sessions keeps a twin from applying it meanwhile.

    It is the undo phase's twin of test_hazards' forward one. The first compensation is still
    acting when every database session of its worker is lost; its lease, renewed on a new
    connection, keeps a second unwind from applying the compensation at the same time, and the
    first records its outcome once its call returns (it held no session to lose)."""
    registry = Registry([Reversible()])
    hold = tmp_path / "hold"
    task = done_and_stopped(store, registry, tmp_path, undo_hold_while=str(hold))
    hold.write_text("")
    first_error: list[BaseException] = []
    lapses: list[list[str]] = []  # a lapsing lease is noted, not this process ended
    acting = JournalStore(db_url, on_lapse=lapses.append).open()

    def first() -> None:
        try:
            unwind_step(acting, registry, task, 1)
        except BaseException as e:
            first_error.append(e)

    a = threading.Thread(target=first)
    a.start()
    assert_eventually(lambda: store.step_row(task, 1, "undo"))
    time.sleep(LEASE_S + 1.0)  # past the lease the intent was written with: renewals hold it
    assert cut_sessions(db_url) >= 1  # at least the lease keeper's connection
    with pytest.raises(StepBusy):  # the lease, renewed anew, keeps the twin out
        unwind_step(store, registry, task, 1)
    hold.unlink()
    a.join(30)
    acting.close()
    assert not a.is_alive() and first_error == []
    assert lapses == [], "the acting compensation's lease would have lapsed under its call"
    assert len(undo_lines(tmp_path)) == 1
    result = unwind_step(store, registry, task, 1)
    assert result.status == "already_undone"
    assert len(undo_lines(tmp_path)) == 1


class SlowToLand(Reversible):
    """A target whose requests may still land for a few seconds after the client gave up."""

    horizon_s = 3.0


def test_a_compensation_that_fails_ambiguously_holds_its_lease_for_the_horizon(
        store: JournalStore, tmp_path: Path) -> None:
    """After an ambiguous failure, a compensation holds its lease for the target's horizon.

    It is the undo phase's twin of test_lease's and test_leases' forward ones. After an ambiguous
    failure the compensation's lease is the target's horizon from then, neither cut to zero nor
    kept for a renewal's length; the failure is journaled; the compensation in doubt is applied
    again once the horizon has passed."""
    registry = Registry([SlowToLand()])
    down = tmp_path / "down"
    task = done_and_stopped(store, registry, tmp_path, undo_unavailable_while=str(down))
    down.write_text("")
    with pytest.raises(TargetUnavailable):
        unwind_step(store, registry, task, 1)
    failed_at = time.monotonic()
    row = store.step_row(task, 1, "undo")
    assert row is not None and row.outcome is None and row.lease_until is not None
    left = (row.lease_until - datetime.now(UTC)).total_seconds()
    assert SlowToLand.horizon_s - 1.0 < left <= SlowToLand.horizon_s, left
    errors = [e["detail"] for e in store.events(task) if e["kind"] == "error"]
    assert [e["type"] for e in errors] == ["TargetUnavailable"]
    down.unlink()
    with pytest.raises(StepBusy):  # its request may still land: nothing acts before
        unwind_step(store, registry, task, 1)
    result = assert_eventually(lambda: unwound_or_busy(store, registry, task), timeout=10)
    assert time.monotonic() - failed_at >= SlowToLand.horizon_s - 0.2
    assert result.status == "undone"
    assert len(undo_lines(tmp_path)) == 1


def test_the_lease_written_with_a_compensations_intent_covers_its_deadline_and_horizon(
        store: JournalStore, tmp_path: Path) -> None:
    """The undo phase's twin of test_leases' forward one."""
    seen: list[float] = []

    class Watched(Reversible):
        deadline_s = 40.0
        horizon_s = 20.0

        def compensate(self, ctx: StepContext) -> dict[str, Any]:
            with psycopg.connect(store.conninfo, autocommit=True) as conn:
                for _ in range(2):  # at the call's start, and after a few renewals
                    r = conn.execute(
                        "SELECT extract(epoch FROM lease_until - clock_timestamp())::float8"
                        " FROM tidemark.journal WHERE task_id = %s AND phase = 'undo'"
                        " AND outcome IS NULL", (ctx.task_id,)).fetchone()
                    assert r is not None
                    seen.append(r[0])
                    time.sleep(3 * LEASE_RENEW_S)
            return super().compensate(ctx)

    registry = Registry([Watched()])
    task = done_and_stopped(store, registry, tmp_path)
    assert unwind_step(store, registry, task, 1).status == "undone"
    assert seen[0] is not None and 55 < seen[0] <= 60  # deadline + horizon, before the call
    assert 50 < seen[1] < seen[0]  # renewals (to LEASE_S + horizon) did not cut it short
