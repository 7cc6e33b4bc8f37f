"""``stripe.payment_intent`` {amount, currency, customer?, description?}: create a PaymentIntent.

Irreversible. The step's key is sent as the Idempotency-Key (stripe-python would otherwise invent
a random one per call, which makes a retry a second payment) and is also written into
``metadata[tidemark_key]``, which is what the probe looks for. Nothing here retries: the client
is built with ``max_network_retries=0`` and a timeout, so a lost answer surfaces as
``TargetUnavailable`` and the journal decides.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import stripe

from probes.stripe import STAMP, PaymentIntentProbe, observed, stripe_failure
from tidemark.actions import Action, Arg, GateRefused, ProbeResult, StepContext, nonempty_str

DEFAULT_TIMEOUT = 30.0  # seconds; a create answers in well under a second, so 30 s only
#                         ever cuts off an answer that is lost, not one that is slow

# Currencies whose amounts have no minor unit, or three decimals (Stripe's lists), for describe.
ZERO_DECIMAL = frozenset({"bif", "clp", "djf", "gnf", "jpy", "kmf", "krw", "mga", "pyg", "rwf",
                          "ugx", "vnd", "vuv", "xaf", "xof", "xpf"})
THREE_DECIMAL = frozenset({"bhd", "jod", "kwd", "omr", "tnd"})


def stripe_client(base_url: str, api_key: str, *,
                  timeout: float = DEFAULT_TIMEOUT) -> stripe.StripeClient:
    """A Stripe client for ``base_url`` (a staging server's URL, or
    ``https://api.stripe.com``) that never retries on its own."""
    return stripe.StripeClient(api_key, base_addresses={"api": base_url.rstrip("/")},
                               max_network_retries=0,
                               http_client=stripe.RequestsClient(timeout=timeout))


def _positive(value: int) -> int:
    if value <= 0:
        raise ValueError("must be a positive amount in the currency's minor units")
    return value


def _currency(value: str) -> str:
    if not re.fullmatch(r"[a-z]{3}", value):
        raise ValueError("must be a three-letter ISO currency code in lower case, e.g. 'usd'")
    return value


class StripePaymentIntent(Action):
    """Creates one PaymentIntent, exactly once per step.

    Args:
        writer: ``stripe.StripeClient`` with a key that may create PaymentIntents.
        reader: ``stripe.StripeClient`` with a restricted read-only key, for the probe.
        max_amount: The largest amount one step may ask for (minor units); the gate refuses
            anything above it.
        max_task_amount: The largest total one task may ask for, per currency (minor units);
            the plan-level gate refuses a plan whose payments add up to more. None: no limit.
    """

    name = "stripe.payment_intent"
    irreversible = True
    args: ClassVar[dict[str, Arg]] = {
        "amount": Arg(int, check=_positive),
        "currency": Arg(str, check=_currency),
        "customer": Arg(str, required=False, check=nonempty_str),
        "description": Arg(str, required=False),
    }

    def __init__(self, writer: stripe.StripeClient, reader: stripe.StripeClient, *,
                 max_amount: int, max_task_amount: int | None = None) -> None:
        self.writer = writer
        self.reads = PaymentIntentProbe(reader, max_amount=max_amount)
        self.max_task_amount = max_task_amount

    @classmethod
    def describe(cls, args: dict[str, Any]) -> str:
        amount, currency = args.get("amount", 0), str(args.get("currency", ""))
        if currency in ZERO_DECIMAL:
            money = f"{amount}"
        elif currency in THREE_DECIMAL:
            money = f"{amount / 1000:.3f}"
        else:
            money = f"{amount / 100:.2f}"
        line = f"{money} {currency.upper()}"
        if args.get("customer"):
            line += f" from {args['customer']}"
        return line

    def preconditions(self, ctx: StepContext) -> None:
        self.reads.preconditions(ctx)

    def plan_gate(self, task_id: str, steps: list[tuple[int, dict[str, Any]]]) -> None:
        """Refuses a task whose payments add up to more than ``max_task_amount`` in a currency
        (an agent splitting one large payment into many small ones stays within the per-step
        gate, not within this one)."""
        if self.max_task_amount is None:
            return
        totals: dict[str, int] = {}
        for _, args in steps:
            totals[args["currency"]] = totals.get(args["currency"], 0) + args["amount"]
        for currency, total in sorted(totals.items()):
            if total > self.max_task_amount:
                raise GateRefused(
                    f"task {task_id}: payments in {currency} add up to {total}, over the "
                    f"per-task limit of {self.max_task_amount} (minor units)")

    def snapshot(self, ctx: StepContext) -> dict[str, Any]:
        # Nothing to restore from: a payment is not undone by writing old state back.
        return {}

    def probe(self, ctx: StepContext) -> ProbeResult:
        return self.reads.probe(ctx)

    def execute(self, ctx: StepContext) -> dict[str, Any]:
        params: dict[str, Any] = {"amount": ctx.args["amount"], "currency": ctx.args["currency"],
                                  "metadata": {STAMP: ctx.key}}
        for optional in ("customer", "description"):
            if optional in ctx.args:
                params[optional] = ctx.args[optional]
        try:
            pi = self.writer.v1.payment_intents.create(params=params,
                                                       options={"idempotency_key": ctx.key})
        except stripe.StripeError as e:
            raise stripe_failure(e, "stripe payment_intents.create") from e
        replayed = pi.last_response is not None and (
            pi.last_response.headers.get("Idempotent-Replayed") == "true")
        return {**observed(pi.to_dict()), "idempotent_replayed": replayed}
