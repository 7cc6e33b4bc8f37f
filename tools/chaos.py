"""``tidemark chaos PLAN --runs N --seed S``: kill a plan at random steps and phases against the
staging servers, resume it, and compare with an uninterrupted run.

One reference run first, uninterrupted. Then N runs, each on a reset staging server and under a
fresh task id (the plan's, suffixed), each interrupted once by one of:

* a SIGKILL of the running process at a crash point of one step (``before_intent``,
  ``after_intent``, ``after_stage`` for actions that stage, ``after_execute``,
  ``after_outcome``; see tidemark/faults.py);
* ``lost_response``: the target applies one step's write and drops the answer (the staging
  ``drop_after_commit`` fault);
* ``slow_provider``: the target takes longer over one step's write than the client waits (the
  ``delay`` fault, with the client timeout cut short through the action's timeout variable);

then resumed in order, as a new worker would, and judged from the outside, by what reached the
staging servers and what an observer reads there, never by the journal's word for it:

* **duplicates and misses** come from the staging servers' effect log (``/_staging/effects``):
  the writes applied per target and operation, counted whatever key they carried, against the
  reference run's counts. More is a duplicate, fewer a miss. The request log
  (``/_staging/requests``) gives every write request that reached a target: a retry that the
  provider answered from its idempotency key (``replayed``) is counted as *absorbed*, not as a
  duplicate, and a request refused with an error as *refused*;
* **resolved_by** of the interrupted step is checked against the kill: a kill after the action
  committed (``after_execute``, a ``lost_response`` to the final write) must be settled by the
  probe as done; a kill before it (``before_intent``, ``after_intent``, ``after_stage``) or
  after the outcome must end *executed* (a probe found it absent, then it ran; or it had run);
  a ``slow_provider`` may end either way; every other step executed;
* each reversible step's snapshot (what compensation would restore, read now, keys and task ids
  factored out) and each step's journal status are compared with the reference.

Every (action, phase) pair the plan has is covered on every invocation, whatever the seed: the
first runs are a schedule with one run per pair (the step of that action, the order, and the
write a fault hits drawn from ``random.Random(seed)``), the rest are random draws; ``--runs``
smaller than the number of pairs is refused. The same seed gives the same kills.

An error of the harness itself (seeding a target, binding the registry, reading a snapshot for
the comparison, e.g. an identity check that timed out) is reported as a harness error of that
run, never as a mismatch: such a run was not judged, and it fails the invocation as such.

With ``--worst-case`` every staging switch is at the provider's documented worst case (a sent
Graph draft kept in Drafts, Stripe's clock ten minutes off and its metadata hidden from the read
key, ...). There a resume may rightly stop for a person: a probe that cannot tell (a payment
like ours whose metadata we cannot see) never acts. Such a run is listed under ``needs_person``
with its reason and is not a failure, provided nothing was duplicated; in the default world,
where every probe can tell, it is a failure like any other error.

The plan's steps run in a subprocess (``python -m tools.chaos --run ...``) so that a crash
point can SIGKILL it; the resume runs here. Actions come from the worker's registry (built-ins
and installed plugins, bound against the staging server), plus ``--action MODULE:CLASS``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tidemark.actions import Action, Registry, StepContext
from tidemark.errors import StepBusy, TargetUnavailable, TidemarkError
from tidemark.faults import CRASH_ENV
from tidemark.keys import key_for
from tidemark.plan import Plan, load_plan
from tidemark.plugins import plugin_action_classes
from tidemark.run_step import run_step
from tidemark.store import JournalStore
from tidemark.words import Phase, ResolvedBy

CRASH_PHASES = ("before_intent", "after_intent", "after_stage", "after_execute",
                "after_outcome")
FAULT_PHASES = ("lost_response", "slow_provider")
PHASES = CRASH_PHASES + FAULT_PHASES
# The client timeout in slow_provider runs, and how much longer the provider takes.
SLOW_CLIENT_TIMEOUT_S = 1.0
SLOW_EXTRA_S = 0.75
# The variable that sets each action's client timeout (a plugin class may name its own in
# ``timeout_env``). Actions without one get no slow_provider runs.
TIMEOUT_ENVS = {"gmail.send": "TIDEMARK_GMAIL_TIMEOUT_S",
                "graph.send_mail": "TIDEMARK_GRAPH_TIMEOUT_S"}
# Writes that create a provisional handle (a mail draft) rather than the effect: when the
# answer to one is lost, the next attempt stages again and the first handle stays behind
# unsent (documented in activities/gmail.py and graph.py). Counted as left-over handles, not
# as duplicates. A plugin class may name its own in ``provisional_ops``.
PROVISIONAL_OPS = {"gmail.send": ("drafts.create",), "graph.send_mail": ("messages.create",)}
# The client timeout of a plugin's staging target (its ``timeout_env``) unless the environment
# sets one: a killed attempt's lease, which covers the action's deadline, lapses in seconds.
STAGING_PLUGIN_TIMEOUT_S = "2"
RESUME_PATIENCE_S = 60.0  # how long a resume retries a busy or unavailable step
LOCAL_ACTIONS = frozenset({"fs.rename"})  # no staging server to reset


@dataclass(frozen=True)
class Kill:
    """How one run is interrupted."""

    phase: str
    step: int
    op: tuple[str, str] | None = None  # (target, op) of the write a fault hits


# How a resume that stopped for a person reads in run_once's error (its RunPlan state).
NEEDS_PERSON = ": NeedsDecision: "


class HarnessError(Exception):
    """Chaos's own machinery failed (seeding, binding, reading the world): the run could not be
    judged. Never a mismatch: it says nothing about Tidemark."""


@dataclass
class RunResult:
    run: int
    kill: Kill
    action: str
    duplicates: int
    mismatch: list[str]
    error: str = ""
    left_over: int = 0  # provisional handles (drafts) an interrupted stage left behind
    misses: int = 0
    absorbed: int = 0  # write requests answered from an idempotency key (replayed)
    harness_error: str = ""
    requests: dict[tuple[str, str], Counter[str]] = field(default_factory=dict)
    # Under --worst-case only: the resume stopped for a person (NeedsDecision) with nothing
    # duplicated. The promise is kept (a probe that cannot tell never acts), but the run did not
    # finish: it is listed, and it is a failure in the default world, where probes can tell.
    needs_person: str = ""

    @property
    def failed(self) -> bool:
        return bool(self.duplicates or self.misses or self.mismatch or self.error)


@dataclass
class ChaosReport:
    seed: int
    runs: list[RunResult] = field(default_factory=list)
    reference_duplicates: int = 0
    pairs: list[tuple[str, str]] = field(default_factory=list)  # what the plan has

    def as_json(self) -> dict[str, Any]:
        failures = [{"run": r.run, "phase": r.kill.phase, "step": r.kill.step,
                     "action": r.action, "duplicates": r.duplicates, "misses": r.misses,
                     "mismatch": r.mismatch, "error": r.error}
                    for r in self.runs if r.failed]
        harness = [{"run": r.run, "phase": r.kill.phase, "step": r.kill.step,
                    "action": r.action, "error": r.harness_error}
                   for r in self.runs if r.harness_error]
        person = [{"run": r.run, "phase": r.kill.phase, "step": r.kill.step,
                   "action": r.action, "reason": r.needs_person}
                  for r in self.runs if r.needs_person]
        requests: dict[str, dict[str, dict[str, int]]] = {}
        for r in self.runs:
            for (target, op), counts in r.requests.items():
                into = requests.setdefault(target, {}).setdefault(
                    op, {"sent": 0, "absorbed": 0, "refused": 0})
                for k, n in counts.items():
                    into[k] += n
        coverage: dict[str, dict[str, int]] = {}
        for r in self.runs:
            by_phase = coverage.setdefault(r.action, {})
            by_phase[r.kill.phase] = by_phase.get(r.kill.phase, 0) + 1
        covered = {(r.action, r.kill.phase) for r in self.runs}
        return {"runs": len(self.runs),
                "duplicates": self.reference_duplicates + sum(r.duplicates for r in self.runs),
                "misses": sum(r.misses for r in self.runs),
                "absorbed": sum(r.absorbed for r in self.runs),
                "mismatches": sum(1 for r in self.runs if r.mismatch or r.error),
                "harness_errors": harness,
                "needs_person": person,
                "phases": dict(sorted(Counter(r.kill.phase for r in self.runs).items())),
                "requests": {t: dict(sorted(ops.items())) for t, ops in sorted(requests.items())},
                "coverage": {"pairs": {a: dict(sorted(p.items()))
                                       for a, p in sorted(coverage.items())},
                             "missing": [f"{a} {p}" for a, p in self.pairs
                                         if (a, p) not in covered]},
                "seed": self.seed, "failures": failures}

    @property
    def ok(self) -> bool:
        data = self.as_json()
        return (data["duplicates"] == 0 and data["misses"] == 0 and data["mismatches"] == 0
                and not data["harness_errors"] and not data["coverage"]["missing"])

    def table(self) -> str:
        rows = ["phase            runs  duplicates  misses  mismatches  absorbed"]
        for phase in PHASES:
            mine = [r for r in self.runs if r.kill.phase == phase]
            if mine:
                rows.append(f"{phase:<16} {len(mine):>4}  {sum(r.duplicates for r in mine):>10}"
                            f"  {sum(r.misses for r in mine):>6}"
                            f"  {sum(1 for r in mine if r.mismatch or r.error):>10}"
                            f"  {sum(r.absorbed for r in mine):>8}")
        data = self.as_json()
        rows.append(f"{'total':<16} {data['runs']:>4}  {data['duplicates']:>10}  "
                    f"{data['misses']:>6}  {data['mismatches']:>10}  {data['absorbed']:>8}"
                    f"   (seed {self.seed})")
        rows.append(f"coverage: {len(self.pairs) - len(data['coverage']['missing'])}/"
                    f"{len(self.pairs)} (action, phase) pairs")
        left = sum(r.left_over for r in self.runs)
        if left:
            rows.append(f"{left} unsent draft(s) left behind by a lost answer to their creation "
                        "(not sent, not journaled; see PROVISIONAL_OPS)")
        for h in data["harness_errors"]:
            rows.append(f"  run {h['run']}: HARNESS ERROR, not judged ({h['phase']} at step "
                        f"{h['step']}): {h['error']}")
        for h in data["needs_person"]:
            rows.append(f"  run {h['run']}: stopped for a person, nothing duplicated "
                        f"({h['phase']} at step {h['step']}): {h['reason']}")
        for f in data["failures"][:20]:
            rows.append(f"  run {f['run']}: {f['phase']} at step {f['step']} ({f['action']}): "
                        + "; ".join([*f["mismatch"], f["error"]] if f["error"] else f["mismatch"])
                        + (f" ({f['duplicates']} duplicate writes)" if f["duplicates"] else "")
                        + (f" ({f['misses']} missing writes)" if f["misses"] else ""))
        return "\n".join(rows)


# -- staging control over HTTP ----------------------------------------------------------

def _http(url: str, path: str, body: dict[str, Any] | None = None) -> Any:
    import urllib.request

    req = urllib.request.Request(url + path, method="GET" if body is None else "POST",
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def seed_world(staging_url: str, plan: Plan, worst_case: bool = False) -> None:
    """A reset staging server with what the plan's steps act on: the Drive files it renames
    (under the supplier-sync demo's original names where the ids are the demo's); with
    ``worst_case`` every switch of every target set to its documented worst case."""
    from tidemark.supplier_sync import seed_requests

    _http(staging_url, "/_staging/reset", {})
    if worst_case:  # a reset returns to the server's baseline, which may be the defaults
        _http(staging_url, "/_staging/switches", {"worst": True})
    demo = {body["id"]: (path, body) for path, body in seed_requests()}
    for s in plan.steps:
        if s.action == "drive.rename":
            fid = s.args["file_id"]
            path, body = demo.get(fid, ("/_staging/drive/files",
                                        {"id": fid, "name": f"{fid}.orig"}))
            _http(staging_url, path, body)


# -- the registry -----------------------------------------------------------------------

def load_class(spec: str) -> type[Action]:
    module, _, name = spec.partition(":")
    cls = getattr(importlib.import_module(module), name, None)
    if not (isinstance(cls, type) and issubclass(cls, Action)):
        raise TidemarkError(f"--action {spec}: not an Action class")
    return cls


def chaos_registry(staging_url: str, extra: Sequence[str] = ()) -> Registry:
    """The worker's registry bound against the staging server, with ``extra`` action classes
    (MODULE:CLASS, bound by their ``from_env``) in place of same-named ones."""
    from activities.wiring import worker_registry
    from tools.devstack import STAGING_CLIENTS

    # The staging servers' client settings (short timeouts, so a killed attempt's lease lapses
    # in seconds; no Drive horizon, as staging applies a write within its request), unless the
    # environment says otherwise.
    env = {**STAGING_CLIENTS, "TIDEMARK_STAGING_URL": staging_url, **_passthrough_env()}
    classes = [*plugin_action_classes(), *(load_class(spec) for spec in extra)]
    for cls in classes:  # a plugin's staging target answers in milliseconds too
        if getattr(cls, "timeout_env", None):
            env.setdefault(cls.timeout_env, STAGING_PLUGIN_TIMEOUT_S)  # type: ignore[attr-defined]
    registry = worker_registry(env)
    for spec in extra:
        cls = load_class(spec)
        registry.register(cls)
        bound = cls.from_env(env)  # type: ignore[attr-defined]
        if bound is None:
            raise TidemarkError(f"--action {spec}: from_env bound nothing")
        registry.register(bound)
    return registry


def _passthrough_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith("TIDEMARK_")
            and k not in (CRASH_ENV, "TIDEMARK_STAGING_URL")}


# -- one run ----------------------------------------------------------------------------

def phase_steps(plan: Plan, registry: Registry, writes: dict[int, list[tuple[str, str]]]
                ) -> dict[str, list[int]]:
    """The steps each phase applies to: a crash point to every step (``after_stage`` to those
    whose action stages), a lost answer to steps that write, a slow provider to those whose
    client timeout can be cut short."""
    steps = [s.number for s in plan.steps]
    applies: dict[str, list[int]] = {p: steps for p in CRASH_PHASES}
    applies["after_stage"] = [s.number for s in plan.steps
                              if type(registry.bound(s.action)).stage is not Action.stage]
    applies["lost_response"] = [n for n in steps if writes.get(n)]
    applies["slow_provider"] = [s.number for s in plan.steps if writes.get(s.number)
                                and _timeout_env(registry.bound(s.action))]
    return applies


def plan_pairs(plan: Plan, registry: Registry, writes: dict[int, list[tuple[str, str]]]
               ) -> list[tuple[str, str]]:
    """Every (action, phase) pair the plan has, in plan order."""
    applies = phase_steps(plan, registry, writes)
    actions = list(dict.fromkeys(s.action for s in plan.steps))
    return [(a, p) for a in actions for p in PHASES
            if any(plan.step(n).action == a for n in applies[p])]


def choose_kills(plan: Plan, registry: Registry, writes: dict[int, list[tuple[str, str]]],
                 runs: int, seed: int) -> list[Kill]:
    """The interruption of each run. First one run per (action, phase) pair of the plan, so
    every pair is covered whatever the seed (the order, the step of that action and the write
    a fault hits drawn from ``random.Random(seed)``); then random draws: a phase uniformly
    among those the plan has, then a step uniformly among those it applies to.

    Raises:
        TidemarkError: ``runs`` is smaller than the number of pairs.
    """
    rng = random.Random(seed)
    applies = phase_steps(plan, registry, writes)
    pairs = plan_pairs(plan, registry, writes)
    if runs < len(pairs):
        raise TidemarkError(f"chaos: --runs {runs} cannot cover the plan's {len(pairs)} (action, "
                            f"phase) pairs; give --runs {len(pairs)} or more")

    def kill(phase: str, step: int) -> Kill:
        return Kill(phase, step, rng.choice(writes[step]) if phase in FAULT_PHASES else None)

    kills = [kill(p, rng.choice([n for n in applies[p] if plan.step(n).action == a]))
             for a, p in pairs]
    rng.shuffle(kills)
    phases = [p for p in PHASES if applies[p]]
    for _ in range(runs - len(kills)):
        phase = rng.choice(phases)
        kills.append(kill(phase, rng.choice(applies[phase])))
    return kills


def _timeout_env(action: Action) -> str | None:
    return TIMEOUT_ENVS.get(action.name) or getattr(action, "timeout_env", None)


def run_once(plan_doc: dict[str, Any], task_id: str, kill: Kill | None, *, db_url: str,
             staging_url: str, registry: Registry, store: JournalStore,
             extra: Sequence[str] = (), worst_case: bool = False) -> tuple[Plan, str, Registry]:
    """Seeds the world, runs the plan in a subprocess interrupted by ``kill``, then resumes it
    here. Returns the plan, an error text ('' when every step completed) and the registry bound
    to the seeded world.

    Raises:
        HarnessError: seeding the targets or binding the registry failed.
    """
    plan = load_plan({**plan_doc, "task_id": task_id}, registry)
    try:
        seed_world(staging_url, plan, worst_case)
        # Bound afresh after the reset: an action may cache what it read of the target (Graph
        # reads the well-known folder ids once), and a reset target is a new one.
        registry = chaos_registry(staging_url, extra)
    except Exception as e:
        raise HarnessError(f"preparing the run: {type(e).__name__}: {e}") from e
    store.persist_plan(plan)
    env = {**os.environ, **_passthrough_env()}
    env.pop(CRASH_ENV, None)
    cmd = [sys.executable, "-m", "tools.chaos", "--run", db_url, task_id, staging_url]
    for spec in extra:
        cmd += ["--action", spec]
    if kill is not None and kill.phase in CRASH_PHASES:
        env[CRASH_ENV] = f"{kill.phase}:{kill.step}"
    elif kill is not None:
        assert kill.op is not None
        fault: dict[str, object] = {"target": kill.op[0], "op": kill.op[1],
                                    "kind": "drop_after_commit"}
        if kill.phase == "slow_provider":
            timeout_env = _timeout_env(registry.bound(plan.step(kill.step).action))
            assert timeout_env
            env[timeout_env] = str(SLOW_CLIENT_TIMEOUT_S)
            # Two overlapping drafts.send of one draft may both go out (Google documents
            # nothing else): Gmail's horizon keeps the resume from sending while the slow one
            # may still be sending.
            env["TIDEMARK_GMAIL_HORIZON_S"] = str(SLOW_CLIENT_TIMEOUT_S + SLOW_EXTRA_S + 1.0)
            fault = {**fault, "kind": "delay",
                     "seconds": SLOW_CLIENT_TIMEOUT_S + SLOW_EXTRA_S}
        cmd += ["--fault", json.dumps({**fault, "step": kill.step})]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if kill is None and proc.returncode != 0:
        return plan, f"the reference run failed: {proc.stderr.strip()[-500:]}", registry
    if kill is not None and kill.phase in CRASH_PHASES and proc.returncode != -signal.SIGKILL:
        return plan, (f"the crash point was not reached (exit {proc.returncode}): "
                      f"{proc.stderr.strip()[-300:]}"), registry
    return plan, resume(store, registry, plan), registry


def resume(store: JournalStore, registry: Registry, plan: Plan) -> str:
    """Runs the remaining steps in order, retrying a step that is busy (a dead attempt's
    lease) or whose target is momentarily unavailable. Returns '' or what stopped it."""
    deadline = time.monotonic() + RESUME_PATIENCE_S
    step = store.progress(plan.task_id).next_step
    while step is not None and step <= len(plan.steps):
        try:
            run_step(store, registry, plan.task_id, step)
        except (StepBusy, TargetUnavailable) as e:
            if time.monotonic() > deadline:
                return f"step {step} still busy after {RESUME_PATIENCE_S:.0f}s: {e}"
            time.sleep(0.05)
            continue
        except TidemarkError as e:
            return f"step {step}: {type(e).__name__}: {e}"
        step += 1
    return ""


@dataclass
class Observed:
    """What an observer sees after a run, read from the staging servers (and each reversible
    step's snapshot), with keys and task ids factored out."""

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
        effects = _http(staging_url, "/_staging/effects")
        requests = _http(staging_url, "/_staging/requests")
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
    """The action's snapshot, tried a few times: a read that keeps failing is the harness's
    problem (a target slow under load), not a finding about the run."""
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
    if kill.phase == "slow_provider":
        # The late commit seen, or absorbed by a fence or key.
        return {ResolvedBy.PROBE, ResolvedBy.EXECUTE}
    return {ResolvedBy.EXECUTE}  # before the action (absent, then executed), or after its outcome


def judge(ref: Observed, got: Observed, kill: Kill) -> tuple[list[str], int, int, int]:
    """The mismatches of a run against the reference, its duplicate and missing writes, and
    its left-over provisional handles."""
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


def run_chaos(plan_doc: dict[str, Any], runs: int, seed: int, *, db_url: str,
              staging_url: str, extra: Sequence[str] = (),
              progress: Callable[[int, int, str], None] | None = None,
              worst_case: bool = False) -> ChaosReport:
    """The whole experiment; see the module docstring."""
    registry = chaos_registry(staging_url, extra)
    local = sorted({s["action"] for s in plan_doc.get("steps", [])
                    if isinstance(s, dict) and s.get("action") in LOCAL_ACTIONS})
    if local:
        raise TidemarkError(f"chaos: {', '.join(local)} acts on this machine, which chaos cannot "
                            "reset between runs; it runs plans whose targets have staging "
                            "servers")
    base = f"{plan_doc.get('task_id') or 'plan'}-chaos-{uuid.uuid4().hex[:6]}"
    report = ChaosReport(seed)
    with JournalStore(db_url) as store:
        store.migrate()
        try:
            plan, err, bound = run_once(plan_doc, f"{base}-ref", None, db_url=db_url,
                                        staging_url=staging_url, registry=registry,
                                        store=store, extra=extra, worst_case=worst_case)
            if err:
                raise TidemarkError(f"chaos: {err}")
            reference = world(store, bound, plan, staging_url)
        except HarnessError as e:
            raise TidemarkError(f"chaos: the reference run could not be observed: {e}") from e
        report.reference_duplicates = reference.self_duplicates
        # Which writes each step makes, to aim the faults (lost_response, slow_provider) at
        # them: read once from the reference run's effect log. Only aiming uses the keys the
        # code computes; judging counts what reached the targets.
        keys = {key_for(plan.task_id, s.number, s.action, s.args): s.number for s in plan.steps}
        writes: dict[int, list[tuple[str, str]]] = {}
        for eff in _http(staging_url, "/_staging/effects"):
            where = (eff["target"], eff["op"])
            if eff["key"] in keys and where not in writes.get(keys[eff["key"]], []):
                writes.setdefault(keys[eff["key"]], []).append(where)
        report.pairs = plan_pairs(plan, registry, writes)
        for n, kill in enumerate(choose_kills(plan, registry, writes, runs, seed), 1):
            if progress:
                progress(n - 1, runs, f"{kill.phase} at step {kill.step}")
            report.runs.append(one_run(n, kill, plan_doc, f"{base}-{n}", reference, db_url=db_url,
                                       staging_url=staging_url, registry=registry, store=store,
                                       extra=extra, worst_case=worst_case))
        if progress:
            progress(runs, runs, "done")
    return report


def one_run(n: int, kill: Kill, plan_doc: dict[str, Any], task_id: str, reference: Observed, *,
            db_url: str, staging_url: str, registry: Registry, store: JournalStore,
            extra: Sequence[str], worst_case: bool) -> RunResult:
    """One interrupted run, judged against the reference (or a harness error)."""
    action = str(plan_doc["steps"][kill.step - 1]["action"])
    try:
        plan, err, bound = run_once(plan_doc, task_id, kill, db_url=db_url,
                                    staging_url=staging_url, registry=registry, store=store,
                                    extra=extra, worst_case=worst_case)
        got = world(store, bound, plan, staging_url)
    except HarnessError as e:
        return RunResult(n, kill, action, 0, [], harness_error=str(e))
    mismatch, duplicates, misses, left_over = judge(reference, got, kill)
    if err:  # the resume stopped: what it left undone is that error, not a list of misses
        mismatch, misses = [], 0
    person = ""
    if worst_case and NEEDS_PERSON in err:
        person, err = err, ""
    return RunResult(n, kill, action, duplicates, mismatch, err, left_over, misses,
                     sum(c["absorbed"] for c in got.requests.values()),
                     requests=got.requests, needs_person=person)


def progress_bar(done: int, total: int, what: str) -> None:
    width = 30
    filled = width * done // max(total, 1)
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {what:<32}")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()


# -- the subprocess ---------------------------------------------------------------------

def _run_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.chaos")
    p.add_argument("--run", nargs=3, metavar=("DB_URL", "TASK", "STAGING_URL"), required=True)
    p.add_argument("--action", action="append", default=[])
    p.add_argument("--fault", help="JSON: a staging fault to arm just before its step")
    a = p.parse_args(argv)
    db_url, task_id, staging_url = a.run
    registry = chaos_registry(staging_url, a.action)
    fault = json.loads(a.fault) if a.fault else None
    with JournalStore(db_url) as store:
        for step in range(1, store.progress(task_id).step_count + 1):
            if fault and fault["step"] == step:
                _http(staging_url, "/_staging/faults",
                      {k: v for k, v in fault.items() if k != "step"})
            run_step(store, registry, task_id, step)
    return 0


if __name__ == "__main__":
    sys.exit(_run_main(sys.argv[1:]))

