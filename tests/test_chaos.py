"""The recovery path, exercised at every crash point, then at random ones.

Every crash point of every action kind on every run, then random ones, then the providers
misbehaving — and an oracle that trusts nothing it checks.

Each round runs a seven-step plan (two local renames, two Drive renames, a Gmail and a Graph
mail, a Stripe PaymentIntent) in a separate process, which kills itself at one named crash point
of one step (or meets a slow provider, or loses its journal sessions), then resumes the plan in
this process as a worker would and compares the outcome with an uninterrupted run:

* every (action kind, phase) pair is a round of its own on every run, at a step of that kind
  chosen by the seed; RANDOM_ROUNDS random pairs follow. The process must really have been
  killed at its point; a pair whose point is never reached (``after_stage`` of an action that
  does not stage) is reported as unreachable — and fails the run if the action does stage;
* the counts come from the staging servers' request log and effect log, never from the
  journal: every write request the targets received (a request answered by an idempotency
  replay or refused as a duplicate counts too, and requests without a key of ours too) must
  equal the uninterrupted run's. A retry that Stripe absorbed by its Idempotency-Key fails the
  round: the probe was wrong, and Stripe keeps keys for a day only;
* ``resolved_by`` of every step is checked against what the crash point implies;
* "provider slower than the client timeout": the action's write is delayed past a client timeout
  made short through ``TIDEMARK_<T>_TIMEOUT_S``; the request lands after the client gave up.
  Here a second request is allowed only if the provider absorbed it (a fence or a key): the
  first was still in flight when the probe looked, so nothing the probe could read was wrong;
  the effects must still equal the uninterrupted run's;
* "locks lost at full load": the runner's journal pool has one connection, held by the step,
  and its Postgres backends are terminated while the action's request is in flight; a worker
  retrying at once must not act before the first attempt's request could have landed.

The seed is printed; TIDEMARK_CHAOS_SEED=<seed> replays a run.
"""

from __future__ import annotations

import contextlib
import copy
import os
import queue
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from activities.drive import drive_client
from activities.wiring import TARGETS, worker_registry
from helpers.fs_roots import FS_ROOTS
from helpers.ledger import LedgerRecord
from helpers.run_plan_local import STAGING_DEFAULTS
from helpers.staging_fixtures import post
from staging.core import Fault, StagingServer
from staging.drive import DEFAULT_READ_TOKEN
from staging.targets import build_staging
from tidemark.actions import Action, ProbeResult, Registry, StepContext
from tidemark.errors import StepBusy, StoreUnavailable, TargetUnavailable
from tidemark.faults import CRASH_ENV
from tidemark.plan import Plan, load_plan
from tidemark.run_step import run_step
from tidemark.store import JournalStore

ACTIONS = ("fs.rename", "drive.rename", "gmail.send", "graph.send_mail",
           "stripe.payment_intent")
PHASES = ("before_intent", "after_intent", "after_stage", "after_execute", "after_outcome")
RANDOM_ROUNDS = 8
RUNNER = str(Path(__file__).parent / "helpers" / "run_plan_local.py")
SEED = int(os.environ.get("TIDEMARK_CHAOS_SEED", time.time_ns() % 2**32))
# The staging target and write op of each remote action, where a slow provider is staged.
WRITE_OPS = {"drive.rename": ("drive", "files.update"), "gmail.send": ("gmail", "drafts.send"),
             "graph.send_mail": ("graph", "message.send"),
             "stripe.payment_intent": ("stripe", "payment_intents.create")}
SLOW_CLIENT_TIMEOUT_S = 1.5  # the runner's clients only; the resume uses the defaults
SLOW_DELAY_S = 3.5  # the provider commits this long after the request arrived
SESSIONS_LOST_DELAY_S = 3.0  # shorter than the client timeout: the attempt is alive and acting
SESSIONS_LOST_TIMEOUT_S = 5.0  # the runner's clients there: a deadline that covers the delay
RESUME_DEADLINE_S = 90.0  # a worker retries StepBusy/TargetUnavailable this long at most
# With a blind probe a resume may retry without end (a fenced send of a consumed draft answers
# 404, the blind probe says absent again); its killed attempt's lease is TEST_DEADLINE_S.
BLIND_RESUME_S = 15.0
# Rounds at once, each on a staging server of its own (Chaos.run_all): three, as CI's `tidemark
# chaos` runs go, since a round mostly waits for a lease to lapse or a provider to answer.
LANES = 3


def step_numbers(action: str) -> list[int]:
    """The steps of make_plan's plan that run ``action``."""
    return {"fs.rename": [1, 2], "drive.rename": [3, 4], "gmail.send": [5],
            "graph.send_mail": [6], "stripe.payment_intent": [7]}[action]


def make_plan(server: StagingServer, work: Path, task_id: str) -> dict[str, Any]:
    work.mkdir()
    steps: list[dict[str, Any]] = []
    for i in range(2):
        (work / f"draft-{i}.txt").write_text(str(i))
        steps.append({"action": "fs.rename", "args": {"path": str(work / f"draft-{i}.txt"),
                                                       "name": f"final-{i}.txt"}})
    for i in range(2):
        f = post(server, "/_staging/drive/files", {"name": f"{task_id}-scan-{i}.pdf"})
        steps.append({"action": "drive.rename",
                      "args": {"file_id": f["id"], "name": f"{task_id} invoice {i}.pdf"}})
    mail = {"to": ["ap@supplier.example"], "subject": f"{task_id} filed", "body": "Filed."}
    steps.append({"action": "gmail.send", "args": mail})
    steps.append({"action": "graph.send_mail", "args": mail})
    steps.append({"action": "stripe.payment_intent",
                  "args": {"amount": 4200, "currency": "eur", "description": task_id}})
    return {"task_id": task_id, "steps": steps}


@dataclass(frozen=True)
class Round:
    """One round: ``phase`` is a crash point, "slow", "sessions_lost", or None (no fault)."""

    name: str
    action: str | None = None
    step: int | None = None
    phase: str | None = None

    def __str__(self) -> str:
        return f"{self.name}: {self.phase} at step {self.step} ({self.action}), seed {SEED}"


@dataclass
class Observed:
    files: list[str]
    drive: list[str]
    effects: Counter[tuple[str, str]]
    requests: Counter[tuple[str, str, str]]
    absorbed: int  # write requests that changed nothing: replays and refusals
    resolved_by: list[str | None]
    statuses: list[str | None]
    in_flight: int
    killed: bool
    unreachable: bool = False
    problems: list[str] = field(default_factory=list)


def stages(registry: Registry, action: str) -> bool:
    return type(registry.bound(action)).stage is not Action.stage


def expected_resolved_by(r: Round, step: int, unreachable: bool) -> set[str]:
    if r.step != step or unreachable or r.phase is None:
        return {"execute"}
    if r.phase == "after_execute":
        return {"probe"}  # the effect landed; only the probe may settle it
    if r.phase == "slow":
        return {"probe", "execute"}  # the late commit seen, or absorbed by a fence or key
    return {"execute"}


def runner_name(r: Round) -> str:
    """The application_name of a round's runner sessions (Postgres keeps 63 bytes of it)."""
    return f"chaos-runner-{r.name}"[:63]


@dataclass(frozen=True)
class Lane:
    """A staging server and the registry bound to it: one round at a time runs on a lane."""

    server: StagingServer
    registry: Registry


def lane_on(server: StagingServer) -> Lane:
    registry = worker_registry({"TIDEMARK_STAGING_URL": server.url,
                                "TIDEMARK_FS_ROOTS": FS_ROOTS, **STAGING_DEFAULTS})
    registry.register(LedgerRecord())
    return Lane(server, registry)


class Chaos:
    """Runs rounds against staging servers (lanes) and one journal database.

    A round resets its lane's staging server and counts what that server received, so two
    rounds never share a lane; rounds on different lanes run at once (``run_all``). A round
    mostly waits (a killed attempt's lease, a slow provider), so LANES of them share the
    test's share of two cores well."""

    def __init__(self, lanes: list[Lane], store: JournalStore, db_url: str, tmp: Path) -> None:
        self.lanes, self.store, self.db_url, self.tmp = lanes, store, db_url, tmp
        self.server, self.registry = lanes[0].server, lanes[0].registry
        self.unreachable: set[tuple[str, str]] = set()

    def run_all(self, rounds: list[Round],
                resume_with: Callable[[Round, Lane], Registry] | None = None,
                patience: float = RESUME_DEADLINE_S) -> list[Observed]:
        """Runs ``rounds``, one at a time on each lane, and returns what each one showed.

        ``resume_with`` gives the registry a round's resume uses on its lane (default: the
        lane's own)."""
        free: queue.Queue[Lane] = queue.Queue()
        for lane in self.lanes:
            free.put(lane)

        def on_a_lane(r: Round) -> Observed:
            lane = free.get()
            try:
                resume = resume_with(r, lane) if resume_with else None
                return self.run(r, resume_registry=resume, patience=patience, lane=lane)
            finally:
                free.put(lane)

        with ThreadPoolExecutor(len(self.lanes)) as pool:
            return list(pool.map(on_a_lane, rounds))

    def run(self, r: Round, resume_registry: Registry | None = None,
            patience: float = RESUME_DEADLINE_S, lane: Lane | None = None) -> Observed:
        lane = lane or self.lanes[0]
        server, registry = lane.server, lane.registry
        staging = server.staging
        staging.reset()  # this round's requests only: every request counts, keyed or not
        doc = make_plan(server, self.tmp / r.name, r.name)
        plan = load_plan(doc, registry)
        self.store.persist_plan(plan)
        env = dict(os.environ)
        args = [sys.executable, RUNNER, self.db_url, r.name, server.url]
        problems: list[str] = []
        if r.phase in PHASES:
            env[CRASH_ENV] = f"{r.phase}:{r.step}"
        elif r.phase in ("slow", "sessions_lost"):
            assert r.action is not None
            target, op = WRITE_OPS[r.action]
            delay = SLOW_DELAY_S if r.phase == "slow" else SESSIONS_LOST_DELAY_S
            staging.arm(Fault(target, op, "delay", seconds=delay))
            timeout = SLOW_CLIENT_TIMEOUT_S if r.phase == "slow" else SESSIONS_LOST_TIMEOUT_S
            env[f"TIDEMARK_{TARGETS[target].prefix}_TIMEOUT_S"] = str(timeout)
            if r.phase == "slow":
                # Drive has no key and no fence: its horizon (how long it may still apply a
                # request we gave up on) is what keeps the probe from answering too early.
                env["TIDEMARK_DRIVE_HORIZON_S"] = str(SLOW_DELAY_S + 1.0)
                # Gmail's draft fence holds only if two sends of one draft send once, which
                # Google does not document: its horizon keeps a retry from sending meanwhile.
                env["TIDEMARK_GMAIL_HORIZON_S"] = str(SLOW_DELAY_S + 1.0)
                # Graph's send watches a send it got no answer to (TIDEMARK_GRAPH_LATE_S): past
                # the delay, it sees this one land. A draft whose send was requested is never
                # sent again without a person (tests/test_graph_late.py), so a watch shorter
                # than the delay would leave the round to one.
                env["TIDEMARK_GRAPH_LATE_S"] = str(SLOW_DELAY_S + 1.0)
            if r.phase == "sessions_lost":
                # Named by its round: another lane's round loses its own sessions meanwhile.
                args[2] = psycopg.conninfo.make_conninfo(self.db_url,
                                                         application_name=runner_name(r))
                args.append("1")  # a pool of one connection: lost, the step must get another
        proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        if r.phase == "sessions_lost":
            # A worker retrying at once (Temporal's next attempt, another worker) while the
            # first attempt, its sessions gone, is still acting; the first then records its
            # outcome on a new connection (it held none across its call).
            problems += self.lose_sessions(r, server) or self.resume(
                plan, resume_registry or registry, patience)
        _, err = proc.communicate(timeout=120)
        killed = proc.returncode == -signal.SIGKILL
        unreachable = False
        if r.phase in PHASES:
            assert r.action is not None and r.step is not None
            if not killed:
                assert proc.returncode == 0, (str(r), err[-2000:])
                if r.phase == "after_stage" and not stages(registry, r.action):
                    unreachable = True
                    self.unreachable.add((r.action, r.phase))
                else:
                    problems.append(f"the runner was never killed at {r.phase} (exit "
                                    f"{proc.returncode})")
        elif r.phase == "slow":
            # Graph's send waits its late send out (TIDEMARK_GRAPH_LATE_S, past the delay) and
            # completes the step; every other action's step is left in doubt.
            watched = r.action == "graph.send_mail" and proc.returncode == 0
            if "TargetUnavailable" not in err and not watched:
                problems.append("the slow provider did not time the client out: "
                                + err[-500:])
        elif r.phase == "sessions_lost":
            # The runner goes on after its step, racing the resume for the steps after it: it
            # ends done, or StepBusy where the resume's attempt owned a step first.
            last = (err.strip().splitlines() or [""])[-1]
            if proc.returncode != 0 and not last.startswith("tidemark.errors.StepBusy"):
                problems.append("the runner did not finish after its journal sessions were "
                                f"lost: {err[-500:]}")
        else:
            assert proc.returncode == 0, (str(r), err[-2000:])
        if staging.faults:
            problems.append(f"armed faults never fired: {staging.faults} (the action's write "
                            "op is not the one WRITE_OPS names)")
        problems += self.resume(plan, resume_registry or registry,  # whatever is left
                                patience)
        seen = self.observe(plan, killed, unreachable, server)
        seen.problems = problems + seen.problems
        return seen

    def lose_sessions(self, r: Round, server: StagingServer) -> list[str]:
        """Terminates the runner's journal backends once the round's write request is in flight.

        Those are its pool's idle connection and its lease keeper's: what a Postgres restart or
        failover does while its action is still acting."""
        assert r.action is not None
        target, _ = WRITE_OPS[r.action]
        deadline = time.monotonic() + 60
        staging = server.staging
        # The armed delay is taken when the write op itself arrives; another request of the
        # target in flight (the draft being created) is not yet the write.
        while staging.faults or not any(q.status is None for q in staging.requests_of(target)):
            if time.monotonic() > deadline:
                return ["the write request never arrived; no session was lost mid-step"]
            time.sleep(0.01)
        with psycopg.connect(self.db_url, autocommit=True) as admin:
            ended = admin.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(a.pid))"
                " FROM pg_stat_activity a WHERE a.datname = current_database()"
                " AND a.application_name = %s", (runner_name(r),)).fetchone()
        assert ended is not None
        if ended[0] < 1:
            return ["the runner had no journal session to lose"]
        return []

    def resume(self, plan: Plan, registry: Registry,
               patience: float = RESUME_DEADLINE_S) -> list[str]:
        """Runs the plan to its end as a worker would.

        StepBusy, TargetUnavailable and StoreUnavailable are retried, anything else ends the
        round."""
        deadline = time.monotonic() + patience
        while (step := self.store.progress(plan.task_id).next_step) is not None:
            try:
                run_step(self.store, registry, plan.task_id, step)
            except (StepBusy, TargetUnavailable, StoreUnavailable) as e:
                if time.monotonic() > deadline:
                    return [f"step {step} still {type(e).__name__} after {patience}s"]
                time.sleep(0.1)
            except Exception as e:
                return [f"resuming step {step} failed: {type(e).__name__}: {e}"]
        return []

    def observe(self, plan: Plan, killed: bool, unreachable: bool,
                server: StagingServer) -> Observed:
        """What an observer sees afterwards, from the staging servers' own logs."""
        staging = server.staging
        deadline = time.monotonic() + 30  # a late commit lands before anything is counted
        while (in_flight := sum(q.status is None for q in staging.requests_of())) > 0:
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        task_id = plan.task_id
        work = self.tmp / task_id
        reader = drive_client(server.url, DEFAULT_READ_TOKEN)
        drive = [reader.files().get(fileId=s.args["file_id"]).execute()["name"]
                 .replace(task_id, "T") for s in plan.steps if s.action == "drive.rename"]
        requests = staging.requests_of()
        rows = {r.step: r for r in self.store.rows(task_id) if r.phase == "do"}
        numbers = [s.number for s in plan.steps]
        return Observed(
            files=sorted(p.name for p in work.iterdir()), drive=drive,
            effects=Counter((e.target, e.op) for e in staging.effects_of()),
            requests=Counter((q.target, q.method, q.route) for q in requests),
            absorbed=sum(1 for q in requests
                         if q.replayed or (q.status is not None and not 200 <= q.status < 300)),
            resolved_by=[rows[n].resolved_by if n in rows else None for n in numbers],
            statuses=[rows[n].status if n in rows else None for n in numbers],
            in_flight=in_flight, killed=killed, unreachable=unreachable)


def violations(r: Round, got: Observed, base: Observed) -> list[str]:
    """Everything in which the round's outcome differs from an uninterrupted run's."""
    found = list(got.problems)
    if got.in_flight:
        found.append(f"{got.in_flight} write requests still in flight at the end")
    if got.files != base.files:
        found.append(f"files {got.files} != {base.files}")
    if got.drive != base.drive:
        found.append(f"drive names {got.drive} != {base.drive}")
    if got.statuses != base.statuses:
        found.append(f"journal statuses {got.statuses} != {base.statuses}")
    if got.effects != base.effects:
        found.append(f"duplicate or missing effects: {dict(got.effects)} != {dict(base.effects)}")
    if got.requests != base.requests:
        missing, extra = base.requests - got.requests, got.requests - base.requests
        # Only a slow provider excuses an extra request, and only one it absorbed.
        excused = r.phase == "slow" and not missing and got.absorbed >= sum(extra.values())
        if not excused:
            found.append(f"duplicate or missing write requests (replays and refusals count): "
                         f"{dict(got.requests)} != {dict(base.requests)}")
    for i, by in enumerate(got.resolved_by, start=1):
        want = expected_resolved_by(r, i, got.unreachable)
        if by not in want:
            found.append(f"step {i} resolved_by {by!r}, expected {' or '.join(sorted(want))}")
    return found


@pytest.fixture
def chaos(server: StagingServer, store: JournalStore, db_url: str,
          tmp_path: Path) -> Iterator[Chaos]:
    print(f"chaos seed {SEED} (TIDEMARK_CHAOS_SEED={SEED} replays it)")
    with contextlib.ExitStack() as more:
        others = [more.enter_context(StagingServer(build_staging())) for _ in range(LANES - 1)]
        yield Chaos([lane_on(s) for s in (server, *others)], store, db_url, tmp_path)


def baseline_of(chaos: Chaos) -> Observed:
    base = chaos.run(Round("chaos-base"))
    assert not base.problems and not base.in_flight, base
    assert base.statuses == ["done"] * 7 and base.resolved_by == ["execute"] * 7, base
    assert {t for t, _ in base.effects} == {"drive", "gmail", "graph", "stripe"}, base.effects
    assert base.absorbed == 0, base.requests
    return base


def test_every_crash_point_of_every_action_then_random_ones(chaos: Chaos) -> None:
    rng = random.Random(SEED)
    base = baseline_of(chaos)
    rounds = [Round(f"chaos-{a.replace('.', '-')}-{p}", a, rng.choice(step_numbers(a)), p)
              for a in ACTIONS for p in PHASES]
    for n in range(RANDOM_ROUNDS):
        a = rng.choice(ACTIONS)
        rounds.append(Round(f"chaos-random-{n}", a, rng.choice(step_numbers(a)),
                            rng.choice(PHASES)))
    failures = []
    for r, seen in zip(rounds, chaos.run_all(rounds), strict=True):
        found = violations(r, seen, base)
        if found:
            failures.append(f"{r}: " + "; ".join(found))
    print(f"unreachable crash points (the action does not stage): {sorted(chaos.unreachable)}")
    assert not failures, f"seed {SEED}:\n" + "\n".join(failures)
    # A pair may be unreachable only at after_stage, and only for actions that do not stage.
    assert all(p == "after_stage" and not stages(chaos.registry, a)
               for a, p in chaos.unreachable), chaos.unreachable


def test_slow_providers_and_lost_locks_duplicate_nothing(chaos: Chaos) -> None:
    base = baseline_of(chaos)
    # The first step of the kind: the fault meets the action's first write.
    rounds = [Round(f"chaos-{phase}-{a.replace('.', '-')}", a, step_numbers(a)[0], phase)
              for phase in ("slow", "sessions_lost") for a in WRITE_OPS]
    failures = []
    for r, seen in zip(rounds, chaos.run_all(rounds), strict=True):
        found = violations(r, seen, base)
        if found:
            failures.append(f"{r}: " + "; ".join(found))
    assert not failures, f"seed {SEED}:\n" + "\n".join(failures)


def blind(action: Action) -> Action:
    """``action`` with a probe that always answers absent: a probe that is wrong."""
    wrong = copy.copy(action)

    def probe(ctx: StepContext) -> ProbeResult:
        return ProbeResult.absent("this probe is blind on purpose")

    wrong.probe = probe  # type: ignore[method-assign]
    return wrong


def test_the_oracle_fails_a_probe_that_always_answers_absent(chaos: Chaos) -> None:
    """The oracle fails a probe that always answers absent.

    For each action in turn the resume's probe of that action always answers absent; a crash
    after its effect must then be caught by the oracle, on every seed."""
    base = baseline_of(chaos)
    rng = random.Random(SEED)

    def blind_on(r: Round, lane: Lane) -> Registry:
        assert r.action is not None
        wrong = lane_on(lane.server).registry
        wrong.register(blind(wrong.bound(r.action)))
        return wrong

    rounds = [Round(f"chaos-blind-{a.replace('.', '-')}", a, rng.choice(step_numbers(a)),
                    "after_execute") for a in ACTIONS]
    caught: dict[str, list[str]] = {}
    for r, got in zip(rounds, chaos.run_all(rounds, blind_on, BLIND_RESUME_S), strict=True):
        assert got.killed, r
        assert r.action is not None
        caught[r.action] = violations(r, got, base)
    for a, found in caught.items():
        assert found, f"a blind {a} probe went unnoticed (seed {SEED})"
        if a != "fs.rename":  # a local rename cannot happen twice: its gate refuses instead
            assert any(f.startswith("duplicate") for f in found), (a, found)

