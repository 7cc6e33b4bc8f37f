"""``tidemark chaos PLAN --runs N --seed S``: interrupted runs, compared with an uninterrupted one.

It kills a plan at random steps and phases against the staging servers, resumes it, and compares
with an uninterrupted run.

One reference run first, uninterrupted. Then N runs, each on a reset staging server and under a
fresh task id (the plan's, suffixed), each interrupted once by one of:

* a SIGKILL of the running process at a crash point of one step (``before_intent``,
  ``after_intent``, ``after_stage`` for actions that stage, ``after_execute``,
  ``after_outcome``; see tidemark/faults.py);
* ``lost_response``: the target applies one step's write and drops the answer (the staging
  ``drop_after_commit`` fault);
* ``slow_provider``: the target takes longer over one step's write than the client waits (the
  ``delay`` fault, with the client timeout cut short through the action's timeout variable);

or, with ``--time-faults`` (tools/chaos/timing.py), by time:

* ``freeze``: the worker stands still (SIGSTOP) just before a step's effect request leaves,
  past its lease; the resume takes the step over and runs the plan on, then the worker wakes;
* ``clock_step``: the database's clock jumps 30 s ahead while a step's write is held at the
  provider, and the resume runs beside the worker (chaos's own Postgres, under libfaketime);

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

The plan's steps run in a subprocess (``python -m tools.chaos.run --run ...``) so that a crash
point can SIGKILL it; the resume runs here. Actions come from the worker's registry (built-ins
and installed plugins, bound against the staging server), plus ``--action MODULE:CLASS``.

Runs go side by side, one at a time on each staging server (``--jobs``, default 3, each with
servers of its own): a run resets its server, and most of its time is spent waiting for a killed
attempt's lease to lapse, not on the CPU.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import queue
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tidemark.actions import Registry
from tidemark.approval import unattended
from tidemark.errors import StepBusy, TargetUnavailable, TidemarkError
from tidemark.faults import CRASH_ENV
from tidemark.keys import key_for
from tidemark.plan import Plan, load_plan
from tidemark.run_step import run_step
from tidemark.store import JournalStore
from tools.chaos.judge import Observed, judge, world
from tools.chaos.kills import (
    CRASH_PHASES,
    FAULT_PHASES,
    PHASES,
    SLOW_CLIENT_TIMEOUT_S,
    SLOW_EXTRA_S,
    TIME_PHASES,
    Kill,
    action_timeout_env,
    choose_kills,
    plan_pairs,
)
from tools.chaos.report import ChaosReport, RunResult
from tools.chaos.stepped_clock import SteppedClock
from tools.chaos.timing import interrupt, worker_env, worker_fault
from tools.chaos.world import (
    HarnessError,
    chaos_registry,
    passthrough_env,
    seed_world,
    staging_http,
)

# What the tests and other callers take from here.
__all__ = ["CRASH_PHASES", "FAULT_PHASES", "PHASES", "ChaosReport", "HarnessError", "Kill",
           "Observed", "RunResult", "choose_kills", "judge", "plan_pairs", "progress_bar",
           "resume", "run_chaos", "run_once", "seed_world", "world"]

RESUME_PATIENCE_S = 60.0  # how long a resume retries a busy or unavailable step
# ... after a freeze: the frozen worker's lease is its action's whole deadline (Graph's, with
# the staging clients' settings, about 55 s), which the resume counts on its own clock from its
# first look, with room for a loaded machine.
FREEZE_PATIENCE_S = 180.0
LOCAL_ACTIONS = frozenset({"fs.rename"})  # no staging server to reset

# How a resume that stopped for a person reads in run_once's error (its RunPlan state).
NEEDS_PERSON = ": NeedsDecision: "


def run_once(plan_doc: dict[str, Any], task_id: str, kill: Kill | None, *, db_url: str,
             staging_url: str, registry: Registry, store: JournalStore,
             extra: Sequence[str] = (), worst_case: bool = False,
             clock: SteppedClock | None = None) -> tuple[Plan, str, Registry]:
    """Seeds the world, runs the plan interrupted by ``kill``, then resumes it here.

    The plan runs in a subprocess. Returns the plan, an error text ('' when every step
    completed) and the registry bound to the seeded world.

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
    env = {**os.environ, **passthrough_env()}
    env.pop(CRASH_ENV, None)
    cmd = [sys.executable, "-m", "tools.chaos.run", "--run", db_url, task_id, staging_url]
    for spec in extra:
        cmd += ["--action", spec]
    if kill is not None and kill.phase in TIME_PHASES:
        env.update(worker_env(kill))
        patience = FREEZE_PATIENCE_S if kill.phase == "freeze" else RESUME_PATIENCE_S
        held = worker_fault(kill)
        if held is not None:
            cmd += ["--fault", json.dumps(held)]
        worker = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        return plan, interrupt(worker, kill, lambda: resume(store, registry, plan, patience),
                               staging_url, clock), registry
    if kill is not None and kill.phase in CRASH_PHASES:
        env[CRASH_ENV] = f"{kill.phase}:{kill.step}"
    elif kill is not None:
        assert kill.op is not None
        fault: dict[str, object] = {"target": kill.op[0], "op": kill.op[1],
                                    "kind": "drop_after_commit"}
        if kill.phase == "slow_provider":
            timeout_env = action_timeout_env(registry.bound(plan.step(kill.step).action))
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


def resume(store: JournalStore, registry: Registry, plan: Plan,
           patience_s: float = RESUME_PATIENCE_S) -> str:
    """Runs the remaining steps in order, retrying a step that cannot go on yet.

    A step is retried when it is busy (a dead attempt's lease) or its target is momentarily
    unavailable. Returns '' or what stopped it."""
    deadline = time.monotonic() + patience_s
    step = store.progress(plan.task_id).next_step
    while step is not None and step <= len(plan.steps):
        try:
            run_step(store, registry, plan.task_id, step)
        except (StepBusy, TargetUnavailable) as e:
            if time.monotonic() > deadline:
                return f"step {step} still busy after {patience_s:.0f}s: {e}"
            time.sleep(0.05)
            continue
        except TidemarkError as e:
            return f"step {step}: {type(e).__name__}: {e}"
        step += 1
    return ""


def run_chaos(plan_doc: dict[str, Any], runs: int, seed: int, *, db_url: str,
              staging_urls: Sequence[str], extra: Sequence[str] = (),
              progress: Callable[[int, int, str], None] | None = None,
              worst_case: bool = False, clock: SteppedClock | None = None) -> ChaosReport:
    """The whole experiment; see the module docstring.

    One interrupted run at a time on each of ``staging_urls`` (a run resets its server, so two
    never share one); the reference run and the aiming are on the first. With ``clock`` (the
    clock of the Postgres at ``db_url``) the interruptions in time are drawn too
    (``--time-faults``)."""
    if not staging_urls:
        raise TidemarkError("chaos: no staging server to run on")
    registry = chaos_registry(staging_urls[0], extra)
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
        unattended(store, "tidemark chaos")  # a scratch journal: its runs pay unattended
        try:
            plan, err, bound = run_once(plan_doc, f"{base}-ref", None, db_url=db_url,
                                        staging_url=staging_urls[0], registry=registry,
                                        store=store, extra=extra, worst_case=worst_case)
            if err:
                raise TidemarkError(f"chaos: {err}")
            reference = world(store, bound, plan, staging_urls[0])
        except HarnessError as e:
            raise TidemarkError(f"chaos: the reference run could not be observed: {e}") from e
        report.reference_duplicates = reference.self_duplicates
        # Which writes each step makes, to aim the faults (lost_response, slow_provider) at
        # them: read once from the reference run's effect log. Only aiming uses the keys the
        # code computes; judging counts what reached the targets.
        keys = {key_for(plan.task_id, s.number, s.action, s.args): s.number for s in plan.steps}
        writes: dict[int, list[tuple[str, str]]] = {}
        for eff in staging_http(staging_urls[0], "/_staging/effects"):
            where = (eff["target"], eff["op"])
            if eff["key"] in keys and where not in writes.get(keys[eff["key"]], []):
                writes.setdefault(keys[eff["key"]], []).append(where)
        report.pairs = plan_pairs(plan, registry, writes, clock is not None)
        # A run takes a server no other run holds (it resets it), and gives it back. The
        # registry serves every server: a run binds its own against its server (run_once).
        free: queue.Queue[str] = queue.Queue()
        for url in staging_urls:
            free.put(url)
        finished = itertools.count(1)

        def on_a_free_server(n: int, kill: Kill) -> RunResult:
            url = free.get()
            try:
                return one_run(n, kill, plan_doc, f"{base}-{n}", reference, db_url=db_url,
                               staging_url=url, registry=registry, store=store, extra=extra,
                               worst_case=worst_case, clock=clock)
            finally:
                free.put(url)
                if progress:
                    progress(next(finished), runs, f"{kill.phase} at step {kill.step}")

        # The runs mostly wait (a killed attempt's lease lapsing, the subprocess starting), so
        # several at once cost little more CPU than one.
        kills = choose_kills(plan, registry, writes, runs, seed, clock is not None)
        with ThreadPoolExecutor(len(staging_urls)) as pool:
            report.runs = list(pool.map(on_a_free_server, range(1, len(kills) + 1), kills))
    return report


def one_run(n: int, kill: Kill, plan_doc: dict[str, Any], task_id: str, reference: Observed, *,
            db_url: str, staging_url: str, registry: Registry, store: JournalStore,
            extra: Sequence[str], worst_case: bool,
            clock: SteppedClock | None = None) -> RunResult:
    """One interrupted run, judged against the reference (or a harness error)."""
    action = str(plan_doc["steps"][kill.step - 1]["action"])
    try:
        plan, err, bound = run_once(plan_doc, task_id, kill, db_url=db_url,
                                    staging_url=staging_url, registry=registry, store=store,
                                    extra=extra, worst_case=worst_case, clock=clock)
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
    p = argparse.ArgumentParser(prog="python -m tools.chaos.run")
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
                staging_http(staging_url, "/_staging/faults",
                      {k: v for k, v in fault.items() if k != "step"})
            run_step(store, registry, task_id, step)
    return 0


if __name__ == "__main__":
    sys.exit(_run_main(sys.argv[1:]))
