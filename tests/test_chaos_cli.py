"""`tidemark chaos` on the ledger plugin and on Stripe passes and fails as it must.

The ledger plugin is installed from examples/ledger-plugin. Chaos passes twenty interrupted runs
covering every (action, phase) pair, and it fails a probe that matches on the name alone and a
Stripe probe that always answers absent, judging by what reached the staging servers.

The wrong probes come in through chaos's own ``--action MODULE:CLASS`` (tests/helpers): the
action is the real one, bound by the worker's wiring, with only its probe replaced. Nothing of
chaos, run_step or the journal is touched, so what fails is chaos's judgement of a wrong probe,
the thing it exists to catch. (The other honest way, a copy of the tree with the probe broken as
dev/mutation_check.py makes one, shows the same and costs a tree copy per case.)"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from activities.catalog import spec_registry
from activities.wiring import worker_registry
from helpers.ledger import LedgerRecord
from staging.core import Staging, StagingServer, Switch, Target
from staging.targets import build_staging
from tidemark.plan import load_plan
from tools.chaos import run as chaos
from tools.cli.main import build_parser

ROOT = Path(__file__).parent.parent
LEDGER_PLAN = ROOT / "examples" / "ledger-invoices.json"
KEYS = {"runs", "duplicates", "misses", "absorbed", "mismatches", "harness_errors",
        "needs_person", "phases", "requests", "coverage", "seed", "failures"}
LEDGER_PHASES = {"before_intent", "after_intent", "after_execute", "after_outcome",
                 "lost_response", "slow_provider"}


def tidemark_chaos(db_url: str, server: StagingServer, *args: str, plan: Path = LEDGER_PLAN,
                   second: StagingServer | None = None) -> tuple[int, dict[str, Any]]:
    """Runs ``tidemark chaos`` over ``server`` and two more staging servers.

    The second is a fresh one unless given, the third always is. One run at a time on each,
    three at a time, as CI's runs go."""
    env = {**os.environ, "DATABASE_URL": db_url,
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    with contextlib.ExitStack() as stack:
        if second is None:
            second = stack.enter_context(StagingServer(build_staging()))
        third = stack.enter_context(StagingServer(build_staging()))
        proc = subprocess.run([sys.executable, "-m", "tools.cli.main", "chaos", str(plan),
                               "--staging-url", server.url, "--staging-url", second.url,
                               "--staging-url", third.url, "--json", *args],
                              env=env, capture_output=True, text=True, timeout=280)
    assert proc.stdout, proc.stderr[-2000:]
    assert "] " in proc.stderr  # the progress bar went to stderr
    return proc.returncode, json.loads(proc.stdout)


def test_the_ledger_plugin_passes_twenty_interrupted_runs(db_url: str,
                                                          server: StagingServer) -> None:
    # Over three staging servers, one run at a time on each: these two must take runs, and a run's
    # judgement reads its own server (a run judged on the other would miss its writes).
    with StagingServer(build_staging()) as second:
        code, out = tidemark_chaos(db_url, server, "--runs", "20", "--seed", "5",
                                   second=second)
        ran_on_second = second.staging.requests_of()
    assert set(out) == KEYS
    assert (out["runs"], out["duplicates"], out["misses"], out["mismatches"], out["failures"],
            out["harness_errors"]) == (20, 0, 0, 0, [], []), out
    assert ran_on_second and server.staging.requests_of()
    assert sum(out["phases"].values()) == 20 and out["seed"] == 5
    # Every (action, phase) pair of the plan, whatever the seed.
    assert set(out["coverage"]["pairs"]) == {"ledger.post_invoice"}
    assert set(out["coverage"]["pairs"]["ledger.post_invoice"]) == LEDGER_PHASES
    assert out["coverage"]["missing"] == []
    # What reached the ledger's staging server: at least the reference's four posts per run.
    # The ledger declares no horizon (its Idempotency-Key fences a late request), so in a
    # slow_provider run the probe may look before the late post lands and the step posts again
    # under the same key, which the ledger answers from the key: absorbed, never applied twice.
    # At most once per such run; every other step in doubt is settled by the probe.
    [(route, counts)] = out["requests"]["ledger"].items()
    assert route.startswith("POST ") and counts["sent"] >= 4 * 20, out["requests"]
    assert out["absorbed"] == counts["absorbed"] <= out["phases"]["slow_provider"]
    assert code == 0


def seed_hitting(plan_file: Path, server: StagingServer, runs: int,
                 want: set[tuple[str, int]]) -> int:
    """A seed whose first ``runs`` kills include one of ``want`` (phase, step).

    It is found with chaos's own schedule, so that the test says which kill it relies on."""
    registry = worker_registry({"TIDEMARK_STAGING_URL": server.url})
    plan = load_plan(json.loads(plan_file.read_text()), registry)
    writes = {s.number: [("ledger", "invoices.post")] for s in plan.steps}
    for seed in range(100):
        if want & {(k.phase, k.step) for k in chaos.choose_kills(plan, registry, writes, runs,
                                                                  seed)}:
            return seed
    raise AssertionError(f"no seed below 100 kills at {want}")


def test_chaos_catches_a_probe_that_matches_on_the_name_alone(db_url: str,
                                                             server: StagingServer) -> None:
    # Killed after the intent of step 2 (or 4), an invoice with the same customer and
    # reference as step 1's: the name-only probe takes step 1's invoice for its own, and the
    # step is never posted. Seen from outside: one post missing, and a step settled by the
    # probe that never acted.
    seed = seed_hitting(LEDGER_PLAN, server, 6, {("after_intent", 2), ("after_intent", 4)})
    code, out = tidemark_chaos(db_url, server, "--runs", "6", "--seed", str(seed),
                               "--action", "helpers.wrong_ledger:ByReference")
    assert code == 1
    assert out["mismatches"] >= 1 and out["misses"] >= 1, out
    [first] = [f for f in out["failures"] if f["phase"] == "after_intent"]
    assert first["step"] in (2, 4) and first["misses"] == 1, first
    assert any("missing ledger invoices.post" in m for m in first["mismatch"]), first
    assert any(f"step {first['step']} resolved_by 'probe'" in m for m in first["mismatch"])
    code, out = tidemark_chaos(db_url, server, "--runs", "6", "--seed", str(seed))  # real probe
    assert (code, out["mismatches"], out["duplicates"], out["misses"]) == (0, 0, 0, 0), out


def test_chaos_fails_a_stripe_probe_that_always_answers_absent(
        db_url: str, server: StagingServer, tmp_path: Path) -> None:
    """Chaos fails a Stripe probe that always answers absent.

    Stripe's Idempotency-Key absorbs the second payment request, so the effect log alone
    shows no duplicate; chaos must still fail the run: the request log shows the retry the key
    absorbed, and a kill after the payment was settled by executing again, not by the probe."""
    plan = tmp_path / "pay.json"
    plan.write_text(json.dumps({"task_id": "blind-pay", "steps": [
        {"action": "stripe.payment_intent",
         "args": {"amount": 4200, "currency": "eur", "description": "blind"}}]}))
    # Stripe's pairs: four crash points (it does not stage) and a lost answer: five runs,
    # two of them after the payment committed, on every seed.
    code, out = tidemark_chaos(db_url, server, "--runs", "5", "--action",
                               "helpers.blind_stripe:AlwaysAbsent", plan=plan)
    assert code == 1, out
    assert out["coverage"]["pairs"] == {"stripe.payment_intent": {
        "after_execute": 1, "after_intent": 1, "after_outcome": 1, "before_intent": 1,
        "lost_response": 1}}
    assert out["duplicates"] == 0 and out["absorbed"] == 2, out  # the key held, twice
    failed = {f["phase"]: f for f in out["failures"]}
    assert set(failed) == {"after_execute", "lost_response"}, out["failures"]
    for f in failed.values():
        assert any("step 1 resolved_by 'execute'" in m and "expected probe" in m
                   for m in f["mismatch"]), f
    [(route, counts)] = out["requests"]["stripe"].items()
    assert route == "POST /v1/payment_intents" and counts["absorbed"] == 2, out["requests"]
    # The real probe passes the same runs, and nothing is absorbed: no request was sent twice.
    code, out = tidemark_chaos(db_url, server, "--runs", "5", plan=plan)
    assert (code, out["mismatches"], out["duplicates"], out["misses"], out["absorbed"]) == (
        0, 0, 0, 0, 0), out


def test_too_few_runs_to_cover_every_pair_are_refused(db_url: str, server: StagingServer
                                                      ) -> None:
    env = {**os.environ, "DATABASE_URL": db_url}
    proc = subprocess.run([sys.executable, "-m", "tools.cli.main", "chaos", str(LEDGER_PLAN),
                           "--staging-url", server.url, "--runs", "3"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "--runs 3 cannot cover the plan's 6 (action, phase) pairs" in proc.stderr
    assert proc.stderr.strip().count("\n") == 0, proc.stderr  # one line


def test_jobs_below_one_are_refused_in_one_line(db_url: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "tools.cli.main", "chaos", str(LEDGER_PLAN),
                           "--jobs", "0"], env={**os.environ, "DATABASE_URL": db_url},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip() == "tidemark chaos: --jobs must be at least 1, not 0", proc.stderr


def test_the_same_seed_gives_the_same_kills_and_every_seed_covers_every_pair(
        server: StagingServer) -> None:
    registry = worker_registry({"TIDEMARK_STAGING_URL": server.url})
    plan = load_plan(json.loads(LEDGER_PLAN.read_text()), registry)
    writes = {n: [("ledger", "invoices.post")] for n in range(1, 5)}
    a = chaos.choose_kills(plan, registry, writes, 30, seed=9)
    assert a == chaos.choose_kills(plan, registry, writes, 30, seed=9)
    assert a != chaos.choose_kills(plan, registry, writes, 30, seed=10)
    assert "after_stage" not in {k.phase for k in a}  # the ledger action does not stage
    for seed in range(50):
        first = chaos.choose_kills(plan, registry, writes, 6, seed)
        assert {k.phase for k in first} == LEDGER_PHASES, (seed, first)


def test_a_plan_on_the_local_filesystem_is_refused_with_a_reason(db_url: str,
                                                                server: StagingServer,
                                                                tmp_path: Path) -> None:
    plan = tmp_path / "local.json"
    plan.write_text(json.dumps({"task_id": "local", "steps": [
        {"action": "fs.rename", "args": {"path": str(tmp_path / "a.txt"), "name": "b.txt"}}]}))
    proc = subprocess.run([sys.executable, "-m", "tools.cli.main", "chaos", str(plan),
                           "--staging-url", server.url, "--runs", "1"],
                          env={**os.environ, "DATABASE_URL": db_url}, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1
    assert "fs.rename acts on this machine" in proc.stderr


class Switched(Target):
    """A target with one switch, to see what chaos's --worst-case does to every switch."""

    name = "switched"
    switches = (Switch("lag_s", default=0, worst=30, doc="a provider documents up to 30 s"),)


def test_worst_case_sets_every_switch_to_its_worst_after_each_reset(
        tmp_path: Path) -> None:
    plan = load_plan({"task_id": "switches", "steps": [
        {"action": "ledger.record", "args": {"ledger": str(tmp_path / "l"), "entry": "e"}}]},
        spec_registry(LedgerRecord))
    with StagingServer(Staging([Switched()])) as server:
        target = server.staging.targets["switched"]
        chaos.seed_world(server.url, plan, worst_case=True)
        assert target.switch("lag_s") == 30
        chaos.seed_world(server.url, plan)  # a reset returns to this server's baseline
        assert target.switch("lag_s") == 0
    with StagingServer(Staging([Switched()], worst_case=True)) as server:  # build_staging's
        chaos.seed_world(server.url, plan)
        assert server.staging.targets["switched"].switch("lag_s") == 30
    args = build_parser().parse_args(["chaos", "plan.json", "--worst-case"])
    assert args.worst_case is True


def test_under_the_worst_case_a_resume_that_stops_for_a_person_is_listed_not_failed() -> None:
    stopped = "step 42: NeedsDecision: step 42 stripe.payment_intent is in doubt"
    kill = chaos.Kill("after_execute", 42)

    def report(worst: bool, duplicates: int = 0) -> chaos.ChaosReport:
        r = chaos.ChaosReport(seed=1)
        person, err = (stopped, "") if worst else ("", stopped)
        r.runs.append(chaos.RunResult(1, kill, "stripe.payment_intent", duplicates, [], err,
                                      needs_person=person))
        return r

    worst = report(True)
    assert worst.ok and worst.as_json()["needs_person"] == [
        {"run": 1, "phase": "after_execute", "step": 42, "action": "stripe.payment_intent",
         "reason": stopped}]
    assert "stopped for a person, nothing duplicated" in worst.table()
    assert not report(False).ok  # in the default world every probe can tell
    assert not report(True, duplicates=1).ok  # and a duplicate fails whatever the world
