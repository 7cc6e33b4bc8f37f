"""How much a task may pay: the operator's limits, checked on a whole plan.

The limits the operator sets on a worker are checked on a plan as a whole before anything of it
runs (`tidemark plan check`, and the plan gate of every start).

Pure (tidemark.money and the gate's error only): the plan check reads it without Stripe's
client library. The per-step limit is checked again by the step's own gate before the call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tidemark.actions import GateRefused
from tidemark.errors import ConfigError
from tidemark.money import shown

ENV_MAX_AMOUNT = "TIDEMARK_STRIPE_MAX_AMOUNT"
ENV_MAX_TASK_AMOUNT = "TIDEMARK_STRIPE_MAX_TASK_AMOUNT"
# The largest PaymentIntent one step may create unless TIDEMARK_STRIPE_MAX_AMOUNT says
# otherwise, in minor units (500.00 in a two-decimal currency): a gate, not a business rule.
DEFAULT_MAX_AMOUNT = 50_000
# The largest total one task may ask for per currency, unless TIDEMARK_STRIPE_MAX_TASK_AMOUNT
# says otherwise: four payments at the per-step limit.
DEFAULT_MAX_TASK_AMOUNT = 200_000


@dataclass(frozen=True)
class PaymentLimits:
    """The per-step and per-task limits, in minor units of any currency (None: no limit)."""

    per_step: int = DEFAULT_MAX_AMOUNT
    per_task: int | None = DEFAULT_MAX_TASK_AMOUNT

    def step_refusal(self, amount: int, currency: str) -> str | None:
        """Why one payment is refused, naming the limit and its setting; None if it is not."""
        if amount > self.per_step:
            return (f"{shown(amount, currency)} is over the per-step limit of "
                    f"{shown(self.per_step, currency)} ({ENV_MAX_AMOUNT}={self.per_step})")
        return None

    def check(self, task_id: str, steps: Iterable[tuple[int, Mapping[str, Any]]]) -> None:
        """Refuses a plan whose payments pass the per-step or per-task limit.

        Refuses (GateRefused) a plan with a payment over the per-step limit, or whose
        payments in a currency add up to more than the per-task limit: an agent that splits one
        large payment into many small ones stays within the first, not within the second."""
        totals: dict[str, int] = {}
        for number, args in steps:
            amount, currency = int(args["amount"]), str(args["currency"])
            refused = self.step_refusal(amount, currency)
            if refused is not None:
                raise GateRefused(f"task {task_id} step {number}: {refused}")
            totals[currency] = totals.get(currency, 0) + amount
        for currency, total in sorted(totals.items()):
            if self.per_task is not None and total > self.per_task:
                raise GateRefused(
                    f"task {task_id}: payments in {currency.upper()} add up to "
                    f"{shown(total, currency)}, over the per-task limit of "
                    f"{shown(self.per_task, currency)} ({ENV_MAX_TASK_AMOUNT}={self.per_task})")


def limits_from_env(env: Mapping[str, str]) -> PaymentLimits:
    """The limits a worker with this environment applies (ConfigError for a bad value)."""
    return PaymentLimits(per_step=_amount(env, ENV_MAX_AMOUNT, DEFAULT_MAX_AMOUNT),
                         per_task=_amount(env, ENV_MAX_TASK_AMOUNT, DEFAULT_MAX_TASK_AMOUNT))


def _amount(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None


# The limits of a worker whose environment sets none.
DEFAULT_LIMITS = PaymentLimits()
