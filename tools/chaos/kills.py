"""Where `tidemark chaos` interrupts a run (see tools/chaos/run.py).

It holds the phases, the steps each applies to, and the schedule of kills drawn from the
seed."""

from __future__ import annotations

import random
from dataclasses import dataclass

from tidemark.actions import Action, Registry
from tidemark.errors import TidemarkError
from tidemark.plan import Plan

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


@dataclass(frozen=True)
class Kill:
    """How one run is interrupted."""

    phase: str
    step: int
    op: tuple[str, str] | None = None  # (target, op) of the write a fault hits


# The interruptions in time (tools/chaos/timing.py), with --time-faults.
TIME_PHASES = ("freeze", "clock_step")
# The built-in actions whose effect request goes through tidemark.wire (a plugin's may not:
# its worker would never reach the freeze point).
FREEZABLE = frozenset({"drive.rename", "gmail.send", "graph.send_mail",
                       "stripe.payment_intent"})


def phases_of(time_faults: bool) -> tuple[str, ...]:
    return PHASES + TIME_PHASES if time_faults else PHASES


def phase_steps(plan: Plan, registry: Registry, writes: dict[int, list[tuple[str, str]]]
                ) -> dict[str, list[int]]:
    """The steps each phase applies to.

    A crash point applies to every step (``after_stage`` to those whose action stages), a lost
    answer to steps that write, a slow provider to those whose client timeout can be cut short.
    A freeze applies to steps that write with an action whose effect goes through the wire, a
    clock step to steps that write."""
    steps = [s.number for s in plan.steps]
    applies: dict[str, list[int]] = {p: steps for p in CRASH_PHASES}
    applies["after_stage"] = [s.number for s in plan.steps
                              if type(registry.bound(s.action)).stage is not Action.stage]
    applies["lost_response"] = [n for n in steps if writes.get(n)]
    applies["slow_provider"] = [s.number for s in plan.steps if writes.get(s.number)
                                and action_timeout_env(registry.bound(s.action))]
    applies["freeze"] = [s.number for s in plan.steps
                         if writes.get(s.number) and s.action in FREEZABLE]
    applies["clock_step"] = [n for n in steps if writes.get(n)]
    return applies


def plan_pairs(plan: Plan, registry: Registry, writes: dict[int, list[tuple[str, str]]],
               time_faults: bool = False) -> list[tuple[str, str]]:
    """Every (action, phase) pair the plan has, in plan order."""
    applies = phase_steps(plan, registry, writes)
    actions = list(dict.fromkeys(s.action for s in plan.steps))
    return [(a, p) for a in actions for p in phases_of(time_faults)
            if any(plan.step(n).action == a for n in applies[p])]


def choose_kills(plan: Plan, registry: Registry, writes: dict[int, list[tuple[str, str]]],
                 runs: int, seed: int, time_faults: bool = False) -> list[Kill]:
    """The interruption of each run.

    First one run per (action, phase) pair of the plan, so every pair is covered whatever the
    seed (the order, the step of that action and the write a fault hits drawn from
    ``random.Random(seed)``). Then random draws: a phase uniformly among those the plan has,
    then a step uniformly among those it applies to.

    Raises:
        TidemarkError: ``runs`` is smaller than the number of pairs.
    """
    rng = random.Random(seed)
    applies = phase_steps(plan, registry, writes)
    pairs = plan_pairs(plan, registry, writes, time_faults)
    if runs < len(pairs):
        raise TidemarkError(f"chaos: --runs {runs} cannot cover the plan's {len(pairs)} (action, "
                            f"phase) pairs; give --runs {len(pairs)} or more")

    def kill(phase: str, step: int) -> Kill:
        aimed = phase in FAULT_PHASES or phase == "clock_step"
        return Kill(phase, step, rng.choice(writes[step]) if aimed else None)

    kills = [kill(p, rng.choice([n for n in applies[p] if plan.step(n).action == a]))
             for a, p in pairs]
    rng.shuffle(kills)
    phases = [p for p in phases_of(time_faults) if applies[p]]
    for _ in range(runs - len(kills)):
        phase = rng.choice(phases)
        kills.append(kill(phase, rng.choice(applies[phase])))
    return kills


def action_timeout_env(action: Action) -> str | None:
    return TIMEOUT_ENVS.get(action.name) or getattr(action, "timeout_env", None)
