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

then resumed in order, as a new worker would, and compared with the reference: each step's
journal status, the target's state as each step's snapshot reads it (keys and task ids factored
out), and the writes per target and operation in the staging effect log. A write applied twice
under one key is a duplicate. The kills come from ``random.Random(seed)``: the same seed gives
the same kills.

The plan's steps run in a subprocess (``python -m tidemark.tools.chaos --run ...``) so that a crash
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


@dataclass
class RunResult:
    run: int
    kill: Kill
    duplicates: int
    mismatch: list[str]
    error: str = ""
    left_over: int = 0  # provisional handles (drafts) an interrupted stage left behind


@dataclass
class ChaosReport:
    seed: int
    runs: list[RunResult] = field(default_factory=list)
    reference_duplicates: int = 0

    def as_json(self) -> dict[str, Any]:
        failures = [{"run": r.run, "phase": r.kill.phase, "step": r.kill.step,
                     "duplicates": r.duplicates, "mismatch": r.mismatch, "error": r.error}
                    for r in self.runs if r.duplicates or r.mismatch or r.error]
        return {"runs": len(self.runs),
                "duplicates": self.reference_duplicates + sum(r.duplicates for r in self.runs),
                "mismatches": sum(1 for r in self.runs if r.mismatch or r.error),
                "phases": dict(sorted(Counter(r.kill.phase for r in self.runs).items())),
                "seed": self.seed, "failures": failures}

    @property
    def ok(self) -> bool:
        data = self.as_json()
        return data["duplicates"] == 0 and data["mismatches"] == 0

    def table(self) -> str:
        rows = ["phase            runs  duplicates  mismatches"]
        for phase in PHASES:
            mine = [r for r in self.runs if r.kill.phase == phase]
            if mine:
                rows.append(f"{phase:<16} {len(mine):>4}  {sum(r.duplicates for r in mine):>10}"
                            f"  {sum(1 for r in mine if r.mismatch or r.error):>10}")
        data = self.as_json()
        rows.append(f"{'total':<16} {data['runs']:>4}  {data['duplicates']:>10}  "
                    f"{data['mismatches']:>10}   (seed {self.seed})")
        left = sum(r.left_over for r in self.runs)
        if left:
            rows.append(f"{left} unsent draft(s) left behind by a lost answer to their creation "
                        "(not sent, not journaled; see PROVISIONAL_OPS)")
        for f in data["failures"][:20]:
            rows.append(f"  run {f['run']}: {f['phase']} at step {f['step']}: "
                        + "; ".join([*f["mismatch"], f["error"]] if f["error"] else f["mismatch"])
                        + (f" ({f['duplicates']} duplicate writes)" if f["duplicates"] else ""))
        return "\n".join(rows)


# -- staging control over HTTP ----------------------------------------------------------

def _http(url: str, path: str, body: dict[str, Any] | None = None) -> Any:
    import urllib.request

    req = urllib.request.Request(url + path, method="GET" if body is None else "POST",
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def seed_world(staging_url: str, plan: Plan) -> None:
    """A reset staging server with what the plan's steps act on: the Drive files it renames
    (under the supplier-sync demo's original names where the ids are the demo's)."""
    from tidemark.supplier_sync import seed_requests

    _http(staging_url, "/_staging/reset", {})
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
    from tidemark.tools.devstack import STAGING_CLIENTS

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

def choose_kills(plan: Plan, registry: Registry, writes: dict[int, list[tuple[str, str]]],
                 runs: int, seed: int) -> list[Kill]:
    """The interruption of each run, drawn from ``random.Random(seed)``: a phase uniformly
    among those the plan has, then a step uniformly among those it applies to."""
    rng = random.Random(seed)
    steps = [s.number for s in plan.steps]
    applies: dict[str, list[int]] = {p: steps for p in CRASH_PHASES}
    applies["after_stage"] = [s.number for s in plan.steps
                              if type(registry.bound(s.action)).stage is not Action.stage]
    applies["lost_response"] = [n for n in steps if writes.get(n)]
    applies["slow_provider"] = [s.number for s in plan.steps if writes.get(s.number)
                                and _timeout_env(registry.bound(s.action))]
    phases = [p for p in PHASES if applies[p]]
    kills = []
    for _ in range(runs):
        phase = rng.choice(phases)
        step = rng.choice(applies[phase])
        op = rng.choice(writes[step]) if phase in FAULT_PHASES else None
        kills.append(Kill(phase, step, op))
    return kills


def _timeout_env(action: Action) -> str | None:
    return TIMEOUT_ENVS.get(action.name) or getattr(action, "timeout_env", None)


def run_once(plan_doc: dict[str, Any], task_id: str, kill: Kill | None, *, db_url: str,
             staging_url: str, registry: Registry, store: JournalStore,
             extra: Sequence[str] = ()) -> tuple[Plan, str, Registry]:
    """Seeds the world, runs the plan in a subprocess interrupted by ``kill``, then resumes it
    here. Returns the plan, an error text ('' when every step completed) and the registry bound
    to the seeded world."""
    plan = load_plan({**plan_doc, "task_id": task_id}, registry)
    seed_world(staging_url, plan)
    # Bound afresh after the reset: an action may cache what it read of the target (Graph
    # reads the well-known folder ids once), and a reset target is a new one.
    registry = chaos_registry(staging_url, extra)
    store.persist_plan(plan)
    env = {**os.environ, **_passthrough_env()}
    env.pop(CRASH_ENV, None)
    cmd = [sys.executable, "-m", "tidemark.tools.chaos", "--run", db_url, task_id, staging_url]
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


def world(store: JournalStore, registry: Registry, plan: Plan, staging_url: str
          ) -> tuple[dict[str, Any], int, int]:
    """What an observer sees after a run, with keys and task ids factored out; the number of
    duplicate writes (a write applied again under the same key); and the number of left-over
    provisional handles (see PROVISIONAL_OPS).

    The state compared is each reversible step's snapshot (what compensation would restore,
    read now); an irreversible step's effect is compared through the effect log instead (its
    snapshot may be a cursor, such as a mailbox's history id, that moves with every write).
    """
    from tidemark.supplier_sync import effects_summary

    keys = {key_for(plan.task_id, s.number, s.action, s.args): s.number for s in plan.steps}
    provisional = {(key, op) for s in plan.steps
                   for key in [key_for(plan.task_id, s.number, s.action, s.args)]
                   for op in _provisional(registry.bound(s.action))}
    effects = _http(staging_url, "/_staging/effects")
    final = [e for e in effects if (e.get("key"), e["op"]) not in provisional]
    summary = effects_summary(final, set(keys))
    left_over = effects_summary([e for e in effects if (e.get("key"), e["op"]) in provisional],
                                set(keys))["duplicates"]

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
        try:
            state.append(plain(action.snapshot(ctx)))
        except Exception as e:
            state.append(f"snapshot failed: {type(e).__name__}")
    rows = {r.step: r.status for r in store.rows(plan.task_id) if r.phase == "do"}
    return ({"journal": [rows.get(s.number) for s in plan.steps], "state": state,
             "writes": summary["by_target"]}, summary["duplicates"], left_over)


def _provisional(action: Action) -> tuple[str, ...]:
    return PROVISIONAL_OPS.get(action.name) or tuple(getattr(action, "provisional_ops", ()))


def _diff(ref: dict[str, Any], got: dict[str, Any]) -> list[str]:
    out = []
    for i, (a, b) in enumerate(zip(ref["journal"], got["journal"], strict=True), 1):
        if a != b:
            out.append(f"step {i} is {b}, was {a}")
    for i, (a, b) in enumerate(zip(ref["state"], got["state"], strict=True), 1):
        if a != b:
            out.append(f"step {i} left {json.dumps(b)[:120]}, the reference {json.dumps(a)[:120]}")
    if ref["writes"] != got["writes"]:
        out.append(f"writes {got['writes']} != reference {ref['writes']}")
    return out


def run_chaos(plan_doc: dict[str, Any], runs: int, seed: int, *, db_url: str,
              staging_url: str, extra: Sequence[str] = (),
              progress: Callable[[int, int, str], None] | None = None) -> ChaosReport:
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
        plan, err, bound = run_once(plan_doc, f"{base}-ref", None, db_url=db_url,
                             staging_url=staging_url, registry=registry, store=store,
                             extra=extra)
        if err:
            raise TidemarkError(f"chaos: {err}")
        reference, report.reference_duplicates, _ = world(store, bound, plan, staging_url)
        keys = {key_for(plan.task_id, s.number, s.action, s.args): s.number for s in plan.steps}
        writes: dict[int, list[tuple[str, str]]] = {}
        for e in _http(staging_url, "/_staging/effects"):
            if e["key"] in keys and (e["target"], e["op"]) not in writes.get(keys[e["key"]], []):
                writes.setdefault(keys[e["key"]], []).append((e["target"], e["op"]))
        for n, kill in enumerate(choose_kills(plan, registry, writes, runs, seed), 1):
            if progress:
                progress(n - 1, runs, f"{kill.phase} at step {kill.step}")
            plan, err, bound = run_once(plan_doc, f"{base}-{n}", kill, db_url=db_url,
                                 staging_url=staging_url, registry=registry, store=store,
                                 extra=extra)
            got, dups, left_over = world(store, bound, plan, staging_url)
            report.runs.append(RunResult(n, kill, dups, [] if err else _diff(reference, got),
                                         err, left_over))
        if progress:
            progress(runs, runs, "done")
    return report


def progress_bar(done: int, total: int, what: str) -> None:
    width = 30
    filled = width * done // max(total, 1)
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {what:<32}")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()


# -- the subprocess ---------------------------------------------------------------------

def _run_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m tidemark.tools.chaos")
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

