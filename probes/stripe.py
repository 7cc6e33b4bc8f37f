"""Read-only side of ``stripe.payment_intent``: the amount gate, the snapshot and the probe.

The probe is a consistent read (it never uses search, which trails writes by up to about a
minute, and never creates anything; run it with a restricted read-only key). It rests on
nothing but what Stripe itself returns:

* **Stripe's clock, not ours.** ``created`` is set by Stripe's clock. The snapshot, taken
  before the intent, records Stripe's own time from the ``Date`` header of a read (RFC 9110:
  the origin server's clock), and the probe lists PaymentIntents created from then on, less a
  small margin. Postgres's clock, which stamps the intent, may be minutes off Stripe's; a
  window drawn from it misses our payment, and "absent" after Stripe forgot the
  Idempotency-Key (24 h) is a second payment.
* **Metadata only when it is visible.** Stripe documents metadata for secret keys and says
  nothing of restricted ones: a read key may get ``metadata: {}``. So besides the PaymentIntent
  stamped with our key, the probe looks for any that shows no key. Until the key is seen to get
  metadata, every such PaymentIntent of the step's customer in the window may be ours, whatever
  its amount or description says now (a person may have edited either in the Dashboard); one
  makes the probe *unknown*, never *absent*.
* A PaymentIntent stamped with our key but another amount, currency or customer is *unknown*
  (somebody else used our key; keys are predictable), never *done*.

Why there is no replay here: a create sent again with the step's Idempotency-Key and the same
parameters returns Stripe's saved answer and creates nothing, but only while Stripe remembers
the key, and only if the first request reached Stripe at all: a key never sent (the worker died
between the intent and the call) or already pruned makes that "replay" a payment. A probe must
not be able to pay, so the replay is done by ``execute`` after an *absent* (with the gates and
the stop state checked again), where it is the payment itself if none was made, and Stripe's
saved answer if one was.
"""

from __future__ import annotations

import email.utils
import functools
from typing import Any

import stripe
from stripe.params import PaymentIntentListParams

from tidemark.actions import GateRefused, ProbeResult, StepContext
from tidemark.errors import ActionError, Refused, TargetUnavailable, Unauthorized
from tidemark.payment_limits import DEFAULT_LIMITS, PaymentLimits
from tidemark.reads import Transient, retried, retry_after_s

STAMP = "tidemark_key"  # the metadata key that carries a step's idempotency key
# Seconds listed before Stripe's time at the snapshot: the Date header has whole seconds, and
# the server that answered it and the one that creates the payment need not agree to the second.
STRIPE_CLOCK_MARGIN = 120
# Without a Stripe time in before_state (an intent written before the snapshot recorded one),
# the window is drawn from the intent's start on Postgres's clock, which may be off Stripe's by
# any amount: a day back costs a longer listing, once, and covers any clock a person would run.
UNANCHORED_MARGIN = 24 * 3600
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


def stripe_transient(e: BaseException) -> Transient | None:
    """Whether a failed Stripe read is a moment to wait out (tidemark.reads).

    It is what ``stripe_failure`` calls ``TargetUnavailable`` (no connection, 409, 429, 5xx).
    Returns it with the ``Retry-After`` Stripe sent, if any."""
    if not isinstance(e, stripe.StripeError) or not isinstance(stripe_failure(e, "read"),
                                                                TargetUnavailable):
        return None
    headers = {k.lower(): v for k, v in (e.headers or {}).items()}
    return Transient(retry_after_s(headers.get("retry-after")))


def observed(pi: dict[str, Any]) -> dict[str, Any]:
    """What a step's outcome keeps of a PaymentIntent."""
    return {"id": pi["id"], "amount": pi["amount"], "currency": pi["currency"],
            "status": pi["status"], "customer": pi.get("customer")}


class PaymentIntentProbe:
    """The gate and probe of ``stripe.payment_intent``, over a read-only Stripe client.

    Args:
        reader: A ``stripe.StripeClient`` with a restricted read key.
        limits: The operator's payment limits; the gate refuses a payment over the per-step one
            (the plan gate refused it already; this holds for a step started any other way).
    """

    def __init__(self, reader: stripe.StripeClient, *,
                 limits: PaymentLimits = DEFAULT_LIMITS) -> None:
        self.reader = reader
        self.limits = limits

    def preconditions(self, ctx: StepContext) -> None:
        refused = self.limits.step_refusal(int(ctx.args["amount"]), str(ctx.args["currency"]))
        if refused is not None:
            raise GateRefused(refused)

    def snapshot(self) -> dict[str, Any]:
        """The before_state: Stripe's time now (``stripe_clock``, Unix seconds).

        It is read from the ``Date`` header of a one-item listing, so that the probe's window is
        on Stripe's clock.

        Raises:
            ActionError: the listing failed (nothing is written yet; the step can be retried).
        """
        try:
            page = retried(lambda: self.reader.v1.payment_intents.list(params={"limit": 1}),
                           stripe_transient)
        except stripe.StripeError as e:
            raise stripe_failure(e, "stripe payment_intents.list") from e
        date = page.last_response.headers.get("Date") if page.last_response else None
        at = _http_date(date)
        return {} if at is None else {"stripe_clock": at}

    def probe(self, ctx: StepContext) -> ProbeResult:
        """Tells whether the payment was made: done, absent or unknown.

        ``done`` when exactly one PaymentIntent in the window carries our key with our amount,
        currency and customer. ``absent`` when none carries it and none could be ours with its
        metadata hidden. ``unknown`` otherwise, or when the listing fails.

        Raises:
            Unauthorized: the read key was rejected; a person must restore it.
        """
        since = _window_start(ctx)
        if since is None:
            return ProbeResult.unknown("the step has no intent start time to list from")
        try:
            listed = self._list_since(since, ctx.args.get("customer"))
        except stripe.StripeError as e:
            failure = stripe_failure(e, "stripe payment_intents.list")
            if isinstance(failure, Unauthorized):
                raise failure from e
            return ProbeResult.unknown(f"could not list PaymentIntents: {failure}")
        if listed is None:
            return ProbeResult.unknown(f"more than {MAX_PAGES * PAGE_SIZE} PaymentIntents "
                                       "since the intent; gave up listing")
        return _judge(ctx, since, listed)

    def _list_since(self, since: int, customer: str | None) -> list[dict[str, Any]] | None:
        """Every PaymentIntent created at or after ``since`` (Stripe's clock).

        Only those of ``customer`` when given; None past MAX_PAGES."""
        params: PaymentIntentListParams = {"created": {"gte": since}, "limit": PAGE_SIZE}
        if customer:
            params["customer"] = customer
        listed: list[dict[str, Any]] = []
        for _ in range(MAX_PAGES):
            page = retried(functools.partial(self.reader.v1.payment_intents.list,
                                             params=params), stripe_transient)
            items = [pi.to_dict() for pi in page.data]
            listed += items
            if not page.has_more or not items:
                return listed
            params = {**params, "starting_after": items[-1]["id"]}
        return None


def _http_date(value: str | None) -> int | None:
    """Unix seconds of an HTTP ``Date`` header; None when absent or unreadable."""
    if not value:
        return None
    try:
        return int(email.utils.parsedate_to_datetime(value).timestamp())
    except (TypeError, ValueError):
        return None


def _window_start(ctx: StepContext) -> int | None:
    """The ``created`` (Stripe's clock) from which our PaymentIntent must be listed."""
    anchor = (ctx.before_state or {}).get("stripe_clock")
    if isinstance(anchor, int) and not isinstance(anchor, bool):
        return anchor - STRIPE_CLOCK_MARGIN
    if ctx.started_at is None:
        return None
    return int(ctx.started_at.timestamp()) - UNANCHORED_MARGIN


def _same_payment(pi: dict[str, Any], args: dict[str, Any]) -> bool:
    """Whether ``pi`` asks for what the step asked for (what Stripe returns to every key)."""
    return (pi.get("amount"), pi.get("currency"), pi.get("customer")) == (
        args["amount"], args["currency"], args.get("customer"))


def _metadata_shown(listed: list[dict[str, Any]]) -> bool:
    """Whether the read key is seen to get metadata.

    It is, if some PaymentIntent listed shows any. Stripe withholds metadata per key, not per
    object, so one that shows it proves the key sees it; when none does, the key may see none."""
    return any(pi.get("metadata") for pi in listed)


def _maybe_ours(ctx: StepContext, listed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The PaymentIntents without our key that may still be ours.

    While the read key may not see metadata, ours would show no key, and its amount and
    description are what they are now, not what we asked for: a person may have edited them in
    the Dashboard since. So every keyless PaymentIntent of the step's customer in the window
    may be ours. Once the key is seen to get metadata, one without our key may be ours only
    if it still asks for what we asked (its metadata edited as well is a person's doing)."""
    keyless = [pi for pi in listed if STAMP not in (pi.get("metadata") or {})]
    if not _metadata_shown(listed):
        return [pi for pi in keyless if pi.get("customer") == ctx.args.get("customer")]
    return [pi for pi in keyless if _same_payment(pi, ctx.args)
            and pi.get("description") == ctx.args.get("description")]


def _judge(ctx: StepContext, since: int, listed: list[dict[str, Any]]) -> ProbeResult:
    """The probe's answer from the PaymentIntents created since ``since``."""
    mine = [pi for pi in listed if (pi.get("metadata") or {}).get(STAMP) == ctx.key]
    if len(mine) > 1:
        ids = ", ".join(pi["id"] for pi in mine)
        return ProbeResult.unknown(f"{len(mine)} PaymentIntents carry our key ({ids}): "
                                   "a duplicate, a person must look", observed(mine[0]))
    if mine:
        pi = mine[0]
        if not _same_payment(pi, ctx.args):
            return ProbeResult.unknown(
                f"{pi['id']} carries our key but is for {pi['amount']} {pi['currency']} "
                f"(customer {pi.get('customer')}), not {ctx.args['amount']} "
                f"{ctx.args['currency']} (customer {ctx.args.get('customer')}): not ours, "
                "or not as asked", observed(pi))
        return ProbeResult.done(observed(pi), f"{pi['id']} carries our key")
    like = _maybe_ours(ctx, listed)
    if like:
        ids = ", ".join(pi["id"] for pi in like)
        return ProbeResult.unknown(
            f"no PaymentIntent since {since} shows our key, but {ids} (customer "
            f"{ctx.args.get('customer')}) show(s) no tidemark_key at all: their metadata may be "
            "hidden from the read key (give it a key that sees metadata), and an amount or "
            "description may have been edited since, so one may be ours",
            {"candidates": [pi["id"] for pi in like]})
    return ProbeResult.absent(f"no PaymentIntent created since {since} (Stripe's clock) "
                              "carries our key or could be ours")
