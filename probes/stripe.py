"""Read-only side of ``stripe.payment_intent``: the amount gate and the probe.

The probe is a consistent read: it lists PaymentIntents created since the intent was written and
looks for the one whose metadata carries this step's key. It never uses search (Stripe's search
trails writes by up to about a minute, so "not found" there proves nothing) and never creates
anything. Run it with a restricted read-only key.
"""

from __future__ import annotations

from typing import Any

import stripe
from stripe.params import PaymentIntentListParams

from tidemark.actions import GateRefused, ProbeResult, StepContext
from tidemark.errors import ActionError, Refused, TargetUnavailable, Unauthorized

STAMP = "tidemark_key"  # the metadata key that carries a step's idempotency key
CLOCK_SKEW = 300  # seconds subtracted from the intent's start: Stripe's `created` comes from
#                   Stripe's clock, ours from our host's; five minutes covers any sane drift and
#                   costs only a few more listed objects
PAGE_SIZE = 100  # Stripe's maximum page size: fewest round trips
MAX_PAGES = 1000  # 100,000 PaymentIntents in the window; past that, answer unknown, not absent


def stripe_failure(e: stripe.StripeError, what: str) -> ActionError:
    """Maps an exception from stripe-python onto Tidemark's action errors.

    Args:
        e: What the client raised.
        what: A short description of the call, for the message (no secrets).

    Returns:
        ``TargetUnavailable`` for connection failures and timeouts, 409 (the same key is still
        executing: retry later), 429 and 5xx; ``Unauthorized`` for 401 and 403; ``Refused``
        for other 4xx, among them a 400 ``idempotency_error`` (the key was used with other
        parameters).
    """
    status = e.http_status
    text = f"{what}: {type(e).__name__}"
    if status is not None:
        text += f" HTTP {status}"
    body = e.json_body if isinstance(e.json_body, dict) else {}
    code = e.code or (body.get("error") or {}).get("code")
    if code:
        text += f" {code}"
    text += f": {e.user_message or e}"
    if isinstance(e, stripe.APIConnectionError) or status is None:
        return TargetUnavailable(text)
    if isinstance(e, stripe.AuthenticationError | stripe.PermissionError) or status in (401,
                                                                                      403):
        return Unauthorized(text)
    if isinstance(e, stripe.RateLimitError) or status in (409, 429) or status >= 500:
        return TargetUnavailable(text)
    return Refused(text)


def observed(pi: dict[str, Any]) -> dict[str, Any]:
    """What a step's outcome keeps of a PaymentIntent."""
    return {"id": pi["id"], "amount": pi["amount"], "currency": pi["currency"],
            "status": pi["status"], "customer": pi.get("customer")}


class PaymentIntentProbe:
    """The gate and probe of ``stripe.payment_intent``, over a read-only Stripe client.

    Args:
        reader: A ``stripe.StripeClient`` with a restricted read key.
        max_amount: The largest amount one step may ask for, in the currency's minor units.
    """

    def __init__(self, reader: stripe.StripeClient, *, max_amount: int) -> None:
        self.reader = reader
        self.max_amount = max_amount

    def preconditions(self, ctx: StepContext) -> None:
        amount = ctx.args["amount"]
        if amount > self.max_amount:
            raise GateRefused(f"amount {amount} {ctx.args['currency']} exceeds the per-task "
                              f"limit of {self.max_amount} (minor units)")

    def probe(self, ctx: StepContext) -> ProbeResult:
        """``done`` when exactly one PaymentIntent since the intent carries our key (and our
        amount and currency); ``absent`` when none does; ``unknown`` when the listing fails or
        shows something that cannot be ours alone.

        Raises:
            Unauthorized: the read key was rejected; a person must restore it.
        """
        if ctx.started_at is None:
            return ProbeResult.unknown("the step has no intent start time to list from")
        since = int(ctx.started_at.timestamp()) - CLOCK_SKEW
        params: PaymentIntentListParams = {"created": {"gte": since}, "limit": PAGE_SIZE}
        if ctx.args.get("customer"):
            params["customer"] = ctx.args["customer"]
        mine: list[dict[str, Any]] = []
        try:
            for _ in range(MAX_PAGES):
                page = self.reader.v1.payment_intents.list(params=params)
                items = [pi.to_dict() for pi in page.data]
                mine += [pi for pi in items if (pi.get("metadata") or {}).get(STAMP) == ctx.key]
                if not page.has_more or not items:
                    break
                params = {**params, "starting_after": items[-1]["id"]}
            else:
                return ProbeResult.unknown(f"more than {MAX_PAGES * PAGE_SIZE} PaymentIntents "
                                           "since the intent; gave up listing")
        except stripe.StripeError as e:
            failure = stripe_failure(e, "stripe payment_intents.list")
            if isinstance(failure, Unauthorized):
                raise failure from e
            return ProbeResult.unknown(f"could not list PaymentIntents: {failure}")
        if not mine:
            return ProbeResult.absent(f"no PaymentIntent created since {since} carries our key")
        if len(mine) > 1:
            ids = ", ".join(pi["id"] for pi in mine)
            return ProbeResult.unknown(f"{len(mine)} PaymentIntents carry our key ({ids}): "
                                       "a duplicate, a person must look", observed(mine[0]))
        pi = mine[0]
        if (pi["amount"], pi["currency"]) != (ctx.args["amount"], ctx.args["currency"]):
            return ProbeResult.unknown(
                f"{pi['id']} carries our key but is for {pi['amount']} {pi['currency']}, not "
                f"{ctx.args['amount']} {ctx.args['currency']}", observed(pi))
        return ProbeResult.done(observed(pi), f"{pi['id']} carries our key")
