"""The probe conformance kit: the contract every action must meet, as a pytest plugin.

Installed with Tidemark (entry point ``pytest11``), it gives a test suite two fixtures and one
base class:

* ``tidemark_staging``: a staging server (every built-in target and every plugin's, see
  ``tidemark.staging`` entry points) for the session; ``tidemark_target``: the same, reset.
* ``ActionContract``: subclass it, define a ``case`` fixture returning a ``ContractCase`` (the
  action bound against the staging server, how to make a step's arguments, and what a third
  party can do to the target), and pytest runs these checks on it:

  1. the probe says *absent* before execute and *done* after it;
  2. a third party changing the target makes the probe say unknown or absent, never done:
     both when somebody else produced the look-alike before we acted (``mimic``: the same
     name, subject or reference without our key) and when somebody changed our effect after
     it (``tamper``);
  3. execute twice under one key leaves one effect (the staging effect log under the key does
     not grow) or is refused;
  4. probe, snapshot and preconditions get only the read-only client: the kit hands them a
     copy of the action whose write clients (``Action.write_attrs``) raise and record any use,
     and checks that no other attribute reaches a write client;
  5. a lost answer to the write (staging ``drop_after_commit``) leaves the step in doubt
     (TargetUnavailable), applied as often as normally, and the probe then says done;
  6. compensate restores before_state (reversible actions);
  7. no secret (``ContractCase.secrets``: the tokens and keys) appears in an outcome, a
     before_state, a probe's answer or an error's text;
  8. the declared deadline and horizon hold: with the target holding the last write longer
     than ``deadline_s`` (staging ``delay``), the call ends within ``deadline_s`` (the lease
     written before it covers no more), and an action that declares ``horizon_s = 0`` (it
     fences) applies once when it executes again under the key while that request is still
     held and then lands.

The checks are also plain functions (``check_*``) for use outside pytest.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import pytest

from tidemark.actions import Action, GateRefused, ProbeResult, ProbeStatus, StepContext
from tidemark.errors import ActionError, TargetUnavailable
from tidemark.keys import key_for


@dataclass
class ContractCase:
    """One action under the contract, against its staging target.

    Attributes:
        build: returns the action bound to the staging server (write and read clients).
        args: returns fresh, valid arguments for one step; may create what the step acts on
            (a file to rename). Called once per check.
        staging_url: the staging server the action talks to.
        write_ops: the (target, op) pairs of the staging effect log the action's writes make,
            e.g. ``[("ledger", "invoices.post")]``.
        secrets: every credential the action holds; none may appear in what it returns.
        same_args_other_key: also run another step with the same arguments under another key
            first, and require the probe not to take its effect for ours.
        mimic: a third party makes the target look as the step would leave it, without our
            key (same name, same subject, same reference), before the step runs.
        tamper: a third party changes what the step did, after it did it.
        effects: how many effects the target applied under a key; by default the number of
            staging effects of ``write_ops`` carrying it.
    """

    build: Callable[[], Action]
    args: Callable[[], dict[str, Any]]
    staging_url: str
    write_ops: Sequence[tuple[str, str]]
    secrets: Sequence[str] = ()
    mimic: Callable[[StepContext], None] | None = None
    tamper: Callable[[StepContext], None] | None = None
    effects: Callable[[str], int] | None = None
    task_id: str = field(default="contract")
    # Also check the look-alike another step with the same arguments makes (True for every
    # target that records who acted; see docs/writing-an-action.md).
    same_args_other_key: bool = True

    def count(self, key: str) -> int:
        if self.effects is not None:
            return self.effects(key)
        return sum(1 for e in staging_get(self.staging_url, "/_staging/effects")
                   if e["key"] == key and (e["target"], e["op"]) in set(map(tuple,
                                                                             self.write_ops)))


_steps = iter(range(1, 10**9))


def context(action: Action, args: dict[str, Any], task_id: str = "contract") -> StepContext:
    """A fresh step of ``action`` (a new step number, so a new key), as run_step builds it."""
    step = next(_steps)
    return StepContext(task_id=task_id, step=step, action=action.name, args=args,
                       key=key_for(task_id, step, action.name, args))


def staging_get(url: str, path: str) -> Any:
    with urllib.request.urlopen(url + path, timeout=10) as resp:
        return json.loads(resp.read())


def staging_post(url: str, path: str, body: dict[str, Any] | None = None) -> Any:
    req = urllib.request.Request(url + path, data=json.dumps(body or {}).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


# -- the read-only side, enforced -----------------------------------------------------------

class WriteClientUsed(BaseException):
    """A write client was used where only the read client may be.

    A BaseException, so that an action's own ``except Exception`` (a probe answering unknown on
    any error) cannot hide it; the kit also records every use, caught or not."""


class ForbiddenWriter:
    """Stands in for a write client while the read-only parts run.

    Any use raises and is recorded."""

    def __init__(self, attr: str, uses: list[str]) -> None:
        object.__setattr__(self, "_attr", attr)
        object.__setattr__(self, "_uses", uses)

    def _used(self, what: str) -> WriteClientUsed:
        message = f"the write client {self._attr!r} was used ({what}) by a read-only part"
        self._uses.append(message)
        return WriteClientUsed(message)

    def __getattr__(self, name: str) -> Any:
        raise self._used(f".{name}")

    def __call__(self, *a: Any, **kw: Any) -> Any:
        raise self._used("called")

    def __setattr__(self, name: str, value: Any) -> None:
        raise self._used(f"set .{name}")


def _reaches(obj: Any, targets: dict[int, str], roots: set[str], path: str, depth: int,
             seen: set[int]) -> str | None:
    """The path by which ``obj`` reaches one of ``targets`` (ids), through our own objects."""
    if id(obj) in targets:
        return path
    if depth == 0 or id(obj) in seen:
        return None
    seen.add(id(obj))
    children: list[tuple[str, Any]] = []
    if isinstance(obj, dict):
        children = [(f"{path}[{k!r}]", v) for k, v in obj.items()]
    elif isinstance(obj, list | tuple | set | frozenset):
        children = [(f"{path}[{i}]", v) for i, v in enumerate(obj)]
    elif type(obj).__module__.split(".")[0] in roots and hasattr(obj, "__dict__"):
        children = [(f"{path}.{k}", v) for k, v in vars(obj).items()]
    for p, child in children:
        found = _reaches(child, targets, roots, p, depth - 1, seen)
        if found:
            return found
    return None


def read_only_view(action: Action) -> tuple[Action, list[str]]:
    """A copy of ``action`` whose write clients are ForbiddenWriter stand-ins.

    Also returns the list in which they record their use. Fails when a write client is reachable
    otherwise (a helper built around it), because then the stand-in would not cover it."""
    uses: list[str] = []
    view = copy.copy(action)
    writers = {id(getattr(action, a)): a for a in action.write_attrs if hasattr(action, a)}
    for attr in action.write_attrs:
        if hasattr(action, attr):
            setattr(view, attr, ForbiddenWriter(attr, uses))
    roots = {type(action).__module__.split(".")[0], "tidemark", "probes", "activities"}
    seen: set[int] = set()
    path = next((p for k, v in vars(view).items()
                 if (p := _reaches(v, writers, roots, f"action.{k}", 4, seen))), None)
    if path is not None:
        raise AssertionError(f"{action.name}: {path} reaches a write client; keep write "
                             f"clients only in {type(action).__name__}.write_attrs "
                             f"{action.write_attrs}")
    return view, uses


def read_parts(action: Action, ctx: StepContext, *, preconditions: bool = True,
               snapshot: bool = True) -> tuple[ProbeResult, dict[str, Any] | None]:
    """Runs preconditions, snapshot and probe on the read-only view of ``action``."""
    view, uses = read_only_view(action)
    before = None
    try:
        if preconditions:
            with contextlib.suppress(GateRefused):
                view.preconditions(ctx)
        if snapshot:
            before = view.snapshot(ctx)
        probed = view.probe(ctx)
    except WriteClientUsed as e:
        raise AssertionError(f"{action.name}: {e}") from None
    assert not uses, f"{action.name}: {uses[0]} (the read-only part swallowed the error)"
    return probed, before


# -- running a step's effect ----------------------------------------------------------------

def act(action: Action, ctx: StepContext) -> tuple[StepContext, dict[str, Any]]:
    """Stage (if the action fences) then execute, as run_step does.

    Returns the context with the staged handle, and the outcome."""
    if ctx.started_at is None:
        ctx = replace(ctx, started_at=datetime.now(UTC))
    if ctx.staged is None:
        staged = action.stage(ctx)
        if staged is not None:
            ctx = replace(ctx, staged=staged)
    return ctx, action.execute(ctx)


def _begin(case: ContractCase, action: Action) -> tuple[StepContext, dict[str, Any]]:
    """A fresh step: gates and snapshot (read-only view), then the intent's context."""
    ctx = context(action, action.validate_args(case.args(), "args"), case.task_id)
    _, before = read_parts(action, ctx)
    return replace(ctx, started_at=datetime.now(UTC), before_state=before), before or {}


# -- the checks -----------------------------------------------------------------------------

def check_probe_absent_then_done(case: ContractCase) -> None:
    action = case.build()
    ctx, _ = _begin(case, action)
    probed, _ = read_parts(action, ctx)
    assert probed.status is ProbeStatus.ABSENT, f"before execute the probe said {probed}"
    ctx, _ = act(action, ctx)
    probed, _ = read_parts(action, ctx, snapshot=False)
    assert probed.status is ProbeStatus.DONE, f"after execute the probe said {probed}"


def check_third_party_is_never_done(case: ContractCase) -> None:
    if case.same_args_other_key:
        action = case.build()
        ctx, _ = _begin(case, action)
        # Another step with the same arguments (another key) acts first: our look-alike.
        other = context(action, ctx.args, case.task_id + "-other")
        act(case.build(), other)
        probed, _ = read_parts(action, ctx, preconditions=False, snapshot=False)
        assert probed.status is not ProbeStatus.DONE, (
            f"another step's identical effect (another key) made the probe say done: {probed}")
    if case.mimic is not None:
        action = case.build()
        ctx, _ = _begin(case, action)
        case.mimic(ctx)
        probed, _ = read_parts(action, ctx)
        assert probed.status is not ProbeStatus.DONE, (
            f"a third party's look-alike without our key made the probe say done: {probed}")
    if case.tamper is not None:
        action = case.build()
        ctx, _ = _begin(case, action)
        ctx, _ = act(action, ctx)
        case.tamper(ctx)
        probed, _ = read_parts(action, ctx, snapshot=False)
        assert probed.status is not ProbeStatus.DONE, (
            f"after a third party changed our effect the probe still said done: {probed}")


def check_execute_twice_is_one_effect(case: ContractCase) -> None:
    action = case.build()
    ctx, _ = _begin(case, action)
    ctx, _ = act(action, ctx)
    once = case.count(ctx.key)
    assert once >= 1, f"execute left no effect under the key in {list(case.write_ops)}"
    # Refused (or an error that leaves the step in doubt) is fine: the count decides.
    with contextlib.suppress(ActionError):
        action.execute(ctx)
    twice = case.count(ctx.key)
    assert twice == once, f"a second execute under one key applied again: {once} -> {twice}"


def check_lost_answer_then_done(case: ContractCase) -> None:
    """The target applies the last write and the answer is lost: the probe says done.

    The loss is staging's ``drop_after_commit``. Execute raises TargetUnavailable (the step stays
    in doubt), and the write was applied as often as in a normal run."""
    action = case.build()
    ctx, _ = _begin(case, action)
    ctx, _ = act(action, ctx)
    normal = case.count(ctx.key)
    action = case.build()
    ctx, _ = _begin(case, action)
    staged = action.stage(ctx)  # journaled by run_step before execute; kept here
    ctx = replace(ctx, staged=staged)
    target, op = case.write_ops[-1]
    staging_post(case.staging_url, "/_staging/faults",
                 {"target": target, "op": op, "kind": "drop_after_commit"})
    try:
        action.execute(ctx)
    except TargetUnavailable:
        pass
    else:
        raise AssertionError(f"a lost answer to {target} {op} did not raise TargetUnavailable")
    assert case.count(ctx.key) == normal, (
        f"a lost answer changed how often the write applied: {case.count(ctx.key)}, "
        f"normally {normal}")
    probed, _ = read_parts(action, ctx, snapshot=False)
    assert probed.status is ProbeStatus.DONE, f"after a lost answer the probe said {probed}"


def check_read_only_parts(case: ContractCase) -> None:
    action = case.build()
    ctx, _ = _begin(case, action)  # gates and snapshot on the view
    read_parts(action, ctx)  # probe before
    ctx, _ = act(action, ctx)
    read_parts(action, ctx, snapshot=False)  # probe after; gates again, as on a resume


def check_compensate_restores(case: ContractCase) -> None:
    action = case.build()
    assert not action.irreversible, f"{action.name} is irreversible: nothing to compensate"
    ctx, before = _begin(case, action)
    ctx, outcome = act(action, ctx)
    action.compensate(replace(ctx, outcome=outcome))
    _, after = read_parts(action, ctx, preconditions=False)
    assert after == before, f"compensate left {after}, before_state was {before}"


def check_no_secrets(case: ContractCase) -> None:
    assert case.secrets, "the case names no secrets to look for"
    action = case.build()
    ctx, before = _begin(case, action)
    seen = [json.dumps(before, default=str)]
    target, op = case.write_ops[0]  # the first write fails: its error text is checked
    staging_post(case.staging_url, "/_staging/faults",
                 {"target": target, "op": op, "kind": "fail_before_commit"})
    try:
        act(action, ctx)
    except Exception as e:
        seen += [str(e), repr(e)]
    else:
        raise AssertionError(f"a failing {list(case.write_ops)} did not raise")
    ctx = context(action, ctx.args, case.task_id)  # a fresh step: no fault armed now
    ctx, outcome = act(action, ctx)
    probed, _ = read_parts(action, ctx, snapshot=False)
    seen += [json.dumps(outcome, default=str), json.dumps(probed.as_json(), default=str)]
    for text in seen:
        for s in case.secrets:
            assert s not in text, f"a secret appears in {text[:200]!r}"


# How much longer than the action's deadline the target holds the write in the deadline check,
# and how much later than its deadline a call may end (thread scheduling on a loaded machine).
HELD_PAST_DEADLINE_S = 1.0
DEADLINE_SLACK_S = 0.5


def check_deadline_and_horizon(case: ContractCase) -> None:
    """A slow target: the call ends within its deadline, and a fence holds.

    The target holds the last write ``deadline_s + HELD_PAST_DEADLINE_S`` before applying it
    (staging ``delay``), as a provider that is slow to answer does. The call must end (with an
    error that leaves the step in doubt) within ``deadline_s``: run_step writes the lease to
    cover the call for its declared deadline, and a call that outlives it is covered only by
    renewals, so a worker that cannot renew ends itself. With ``horizon_s == 0`` the action
    claims a fence; so it executes again under the same key while the first request is still
    held, and once that one lands, the key's effects are what one normal run makes."""
    action = case.build()
    deadline, horizon = float(action.deadline_s), float(action.horizon_s)
    assert math.isfinite(deadline) and deadline > 0, f"deadline_s must be > 0, is {deadline}"
    assert math.isfinite(horizon) and horizon >= 0, f"horizon_s must be >= 0, is {horizon}"
    ctx, _ = _begin(case, action)
    ctx, _ = act(action, ctx)
    normal = case.count(ctx.key)
    action = case.build()
    ctx, _ = _begin(case, action)
    ctx = replace(ctx, staged=action.stage(ctx))
    target, op = case.write_ops[-1]
    staging_post(case.staging_url, "/_staging/faults",
                 {"target": target, "op": op, "kind": "delay",
                  "seconds": deadline + HELD_PAST_DEADLINE_S})
    ended: list[BaseException | dict[str, Any]] = []

    def call() -> None:
        try:
            ended.append(action.execute(ctx))
        except BaseException as e:  # reported below, whatever it is
            ended.append(e)

    started = time.monotonic()
    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    caller.join(deadline + DEADLINE_SLACK_S)
    took = time.monotonic() - started
    assert not caller.is_alive(), (
        f"{action.name}: the call still runs {took:.1f}s after it began, past its declared "
        f"deadline_s {deadline}: its clients' timeouts must end it within the deadline")
    assert not isinstance(ended[0], dict), (
        f"{action.name}: the call returned an outcome although the target held the write")
    assert isinstance(ended[0], ActionError), (
        f"{action.name}: a write the target held ended in {ended[0]!r}, not an ActionError")
    if horizon == 0:
        with contextlib.suppress(ActionError):
            action.execute(ctx)
    # The held request lands now (an action with a horizon waits that long before a retry).
    landed = started + deadline + HELD_PAST_DEADLINE_S + DEADLINE_SLACK_S
    time.sleep(max(0.0, landed - time.monotonic()))
    _settled(case.staging_url, target)
    if horizon == 0:
        assert case.count(ctx.key) <= normal, (
            f"{action.name} declares horizon_s = 0 (a fence), but a request the target held "
            f"and a second execute under the same key applied {case.count(ctx.key)} times, "
            f"normally {normal}: declare how long the target may still apply a request")


def _settled(url: str, target: str, timeout: float = 10.0) -> None:
    """Waits until the target has no write request still in its handler."""
    give_up = time.monotonic() + timeout
    while any(r.get("status") is None
              for r in staging_get(url, f"/_staging/requests?target={target}")):
        assert time.monotonic() < give_up, f"a {target} request is still held after {timeout}s"
        time.sleep(0.05)


CHECKS: dict[str, Callable[[ContractCase], None]] = {
    "probe_absent_then_done": check_probe_absent_then_done,
    "third_party_is_never_done": check_third_party_is_never_done,
    "execute_twice_is_one_effect": check_execute_twice_is_one_effect,
    "lost_answer_then_done": check_lost_answer_then_done,
    "read_only_parts": check_read_only_parts,
    "compensate_restores": check_compensate_restores,
    "no_secrets": check_no_secrets,
    "deadline_and_horizon": check_deadline_and_horizon,
}


class ActionContract:
    """The base class of an action's conformance tests.

    Subclass with a ``case`` fixture returning a ContractCase; set ``reversible = False`` for an
    irreversible action (its compensate check is then not collected)."""

    reversible = True
    # Checks that cannot apply, with the reason in a comment where set: "no_secrets" for an
    # action that holds no credential, "lost_answer" and "deadline" for one with no remote
    # target to lose an answer or hold a request (all three: a local rename).
    not_applicable: tuple[str, ...] = ()

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if not cls.reversible:
            cls.test_compensate_restores_before_state = None  # type: ignore[assignment]
        if "no_secrets" in cls.not_applicable:
            cls.test_no_secret_in_outcome_before_state_or_errors = None  # type: ignore
        if "lost_answer" in cls.not_applicable:
            cls.test_a_lost_answer_is_in_doubt_and_the_probe_finds_it_done = None  # type: ignore
        if "deadline" in cls.not_applicable:
            cls.test_a_held_write_ends_within_the_deadline_and_horizon = None  # type: ignore

    def test_probe_absent_before_execute_and_done_after(self, case: ContractCase) -> None:
        check_probe_absent_then_done(case)

    def test_third_party_change_is_never_done(self, case: ContractCase) -> None:
        check_third_party_is_never_done(case)

    def test_execute_twice_under_one_key_is_one_effect(self, case: ContractCase) -> None:
        check_execute_twice_is_one_effect(case)

    def test_a_lost_answer_is_in_doubt_and_the_probe_finds_it_done(self,
                                                                   case: ContractCase) -> None:
        check_lost_answer_then_done(case)

    def test_probe_snapshot_and_gates_use_only_the_read_client(self,
                                                              case: ContractCase) -> None:
        check_read_only_parts(case)

    def test_compensate_restores_before_state(self, case: ContractCase) -> None:
        check_compensate_restores(case)

    def test_no_secret_in_outcome_before_state_or_errors(self, case: ContractCase) -> None:
        check_no_secrets(case)

    def test_a_held_write_ends_within_the_deadline_and_horizon(self,
                                                              case: ContractCase) -> None:
        check_deadline_and_horizon(case)


# -- fixtures -------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def tidemark_staging() -> Iterator[Any]:
    """A staging server with every built-in and plugin target, for the session."""
    from staging.core import StagingServer
    from staging.targets import build_staging

    with StagingServer(build_staging()) as server:
        yield server


@pytest.fixture
def tidemark_target(tidemark_staging: Any) -> Any:
    """The session's staging server, reset: no state, faults or extra tokens."""
    tidemark_staging.staging.reset()
    return tidemark_staging
