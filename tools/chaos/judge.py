"""How `tidemark chaos` judges a run (see tools/chaos/run.py).

It reads what an observer sees on the staging servers after the run, and counts its
mismatches, duplicates and misses against the reference run."""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from tidemark.actions import Action, Registry, StepContext
from tidemark.keys import key_for
from tidemark.plan import Plan
from tidemark.store import JournalStore
from tidemark.words import Phase, ResolvedBy
from tools.chaos.kills import Kill
from tools.chaos.world import HarnessError, staging_http

# unsent (documented in activities/gmail.py and graph.py). Counted as left-over handles, not
# as duplicates. A plugin class may name its own in ``provisional_ops``.
PROVISIONAL_OPS = {"gmail.send": ("drafts.create",), "graph.send_mail": ("messages.create",)}


@dataclass
class Observed:
    """What an observer sees after a run, with keys and task ids factored out.

    It is read from the staging servers (and each reversible step's snapshot)."""

    journal: list[str | None]
    resolved_by: list[str | None]
    state: list[Any]
    effects: Counter[tuple[str, str]]  # writes applied, per (target, op), whatever their key
    provisional: frozenset[tuple[str, str]]  # (target, op) that create provisional handles
    self_duplicates: int  # an effect applied twice under the key it carried
    requests: dict[tuple[str, str], Counter[str]]  # (target, "METHOD route") -> sent, ...


SNAPSHOT_TRIES = 3  # a read of the oracle that fails this often is a harness error


def world(store: JournalStore, registry: Registry, plan: Plan, staging_url: str) -> Observed:
    """Reads what the run left behind.

    The state compared is each reversible step's snapshot (what compensation would restore,
    read now); an irreversible step's effect is compared through the effect log instead (its
    snapshot may be a cursor, such as a mailbox's history id, that moves with every write).

    Raises:
        HarnessError: the staging servers' logs or a snapshot could not be read.
    """
    keys = {key_for(plan.task_id, s.number, s.action, s.args): s.number for s in plan.steps}
    try:
        effects = staging_http(staging_url, "/_staging/effects")
        requests = staging_http(staging_url, "/_staging/requests")
    except Exception as e:
        raise HarnessError(f"reading the staging logs: {type(e).__name__}: {e}") from e

    def plain(value: Any) -> Any:
        text = json.dumps(value, sort_keys=True, default=str)
        for key, n in keys.items():
            text = text.replace(key, f"<key {n}>")
        return json.loads(text.replace(plan.task_id, "<task>"))

    state: list[Any] = []
    for s in plan.steps:
        action = registry.bound(s.action)
        if action.irreversible:
            state.append(None)
            continue
        ctx = StepContext(task_id=plan.task_id, step=s.number, action=s.action, args=s.args,
                          key=key_for(plan.task_id, s.number, s.action, s.args))
        state.append(plain(_snapshot(action, ctx)))
    provisional = frozenset((e["target"], e["op"]) for e in effects for s in plan.steps
                            if e["op"] in _provisional(registry.bound(s.action)))
    keyed = Counter((e["target"], e["op"], e["key"]) for e in effects if e.get("key"))
    by_route: dict[tuple[str, str], Counter[str]] = {}
    for q in requests:
        counts = by_route.setdefault((q["target"], f"{q['method']} {q['route']}"), Counter())
        counts["sent"] += 1
        if q.get("replayed"):
            counts["absorbed"] += 1
        elif q.get("status") and not 200 <= q["status"] < 300:
            counts["refused"] += 1
    rows = {r.step: r for r in store.rows(plan.task_id) if r.phase == Phase.DO}
    numbers = [s.number for s in plan.steps]
    return Observed(
        journal=[rows[n].status if n in rows else None for n in numbers],
        resolved_by=[rows[n].resolved_by if n in rows else None for n in numbers],
        state=state, effects=Counter((e["target"], e["op"]) for e in effects),
        provisional=provisional,
        self_duplicates=sum(n - 1 for (t, op, _), n in keyed.items()
                            if (t, op) not in provisional),
        requests=by_route)


def _snapshot(action: Action, ctx: StepContext) -> Any:
    """The action's snapshot, tried a few times.

    A read that keeps failing is the harness's problem (a target slow under load), not a finding
    about the run."""
    for attempt in range(1, SNAPSHOT_TRIES + 1):
        try:
            return action.snapshot(ctx)
        except Exception as e:
            if attempt == SNAPSHOT_TRIES:
                raise HarnessError(f"step {ctx.step} {ctx.action}: the snapshot for the "
                                   f"comparison failed {SNAPSHOT_TRIES} times: "
                                   f"{type(e).__name__}: {e}") from e
            time.sleep(0.5 * attempt)
    raise AssertionError("unreachable")


def _provisional(action: Action) -> tuple[str, ...]:
    return PROVISIONAL_OPS.get(action.name) or tuple(getattr(action, "provisional_ops", ()))


def expected_resolved_by(kill: Kill | None, step: int, provisional: frozenset[tuple[str, str]]
                         ) -> set[str]:
    """How each step must have been settled after ``kill``: see the module docstring."""
    if kill is None or kill.step != step:
        return {ResolvedBy.EXECUTE}
    if kill.phase == "after_execute":
        return {ResolvedBy.PROBE}  # the effect landed: only the probe may settle it
    if kill.phase == "lost_response":
        # The answer to the final write was lost: the write committed, the probe must find it.
        # A lost answer to a provisional handle's creation (a draft) is staged again instead.
        return {ResolvedBy.EXECUTE} if kill.op in provisional else {ResolvedBy.PROBE}
    if kill.phase in ("slow_provider", "clock_step"):
        # The late commit seen, or absorbed by a fence or key; or, under a clock step, the
        # worker's own outcome or its twin's probe of it.
        return {ResolvedBy.PROBE, ResolvedBy.EXECUTE}
    return {ResolvedBy.EXECUTE}  # before the action (absent, then executed), or after its outcome


def judge(ref: Observed, got: Observed, kill: Kill) -> tuple[list[str], int, int, int]:
    """The mismatches of a run against the reference, and its other faults.

    The faults are its duplicate and missing writes, and its left-over provisional handles."""
    out = []
    for i, (a, b) in enumerate(zip(ref.journal, got.journal, strict=True), 1):
        if a != b:
            out.append(f"step {i} is {b}, was {a}")
    for i, by in enumerate(got.resolved_by, 1):
        want = expected_resolved_by(kill, i, got.provisional)
        if by not in want:
            out.append(f"step {i} resolved_by {by!r} after {kill.phase} at step {kill.step}, "
                       f"expected {' or '.join(sorted(want))}")
    for i, (a, b) in enumerate(zip(ref.state, got.state, strict=True), 1):
        if a != b:
            out.append(f"step {i} left {json.dumps(b)[:120]}, the reference {json.dumps(a)[:120]}")
    duplicates = misses = left_over = 0
    for t_op in sorted(set(ref.effects) | set(got.effects)):
        extra = got.effects[t_op] - ref.effects[t_op]
        if extra > 0 and t_op in got.provisional:
            left_over += extra
        elif extra > 0:
            duplicates += extra
            out.append(f"{extra} duplicate {t_op[0]} {t_op[1]} write(s)")
        elif extra < 0:
            misses -= extra
            out.append(f"{-extra} missing {t_op[0]} {t_op[1]} write(s)")
    return out, max(duplicates, got.self_duplicates), misses, left_over
