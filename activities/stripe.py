"""``stripe.payment_intent`` {amount, currency, customer?, description?}: create a PaymentIntent.

Irreversible. The step's key is sent as the Idempotency-Key (stripe-python would otherwise invent
a random one per call, which makes a retry a second payment) and is also written into
``metadata[tidemark_key]``, which is what the probe looks for. Nothing here retries: the client
is built with ``max_network_retries=0`` and a timeout, so a lost answer surfaces as
``TargetUnavailable`` and the journal decides.

The action ``awaits``: ``execute_async`` sends the same create through stripe-python's
asynchronous path (``create_async``), which the client's ``RequestsClient`` hands to its
``async_fallback_client`` (stripe-python's own arrangement since 8.5: requests for the blocking
methods, "falling back" to an ``HTTPXClient`` for the asynchronous ones), built with the same
timeout and retried by the same ``max_network_retries=0``. A step waiting on Stripe then holds
no thread. httpx's asynchronous client keeps its connections for the event loop it opened them
on, so each loop that awaits the client gets an ``HTTPXClient`` of its own (``PerLoopHTTPX``).
"""

from __future__ import annotations

import asyncio
import re
import threading
import weakref
from collections.abc import Awaitable, Mapping
from typing import Any, ClassVar

import stripe
from stripe.params import PaymentIntentCreateParams

from probes.stripe import STAMP, PaymentIntentProbe, observed, stripe_failure
from tidemark.actions import (
    Action,
    Arg,
    ProbeResult,
    ProbeStatus,
    StepContext,
    nonempty_str,
)
from tidemark.errors import ConfigError, NeedsDecision
from tidemark.money import shown
from tidemark.needs import Act, command
from tidemark.payment_limits import DEFAULT_LIMITS, PaymentLimits
from tidemark.wire import at_wire, at_wire_async, effect

CREDENTIALS = "TIDEMARK_STRIPE_WRITE_TOKEN and TIDEMARK_STRIPE_READ_TOKEN"

DEFAULT_TIMEOUT = 30.0  # seconds; a create answers in well under a second, so 30 s only
#                         ever cuts off an answer that is lost, not one that is slow



class PerLoopHTTPX(stripe.HTTPClient):
    """stripe-python's asynchronous requests, through one ``stripe.HTTPXClient`` per loop.

    httpx keeps a pooled connection for the loop that opened it. A client awaited from a later
    loop (a loop that ended, a test's) would otherwise fail that connection's request before it
    leaves, in doubt for nothing. Only the ``*_async`` methods are used (it is a
    ``RequestsClient``'s ``async_fallback_client``)."""

    name = "httpx"

    def __init__(self, timeout: float) -> None:
        super().__init__()
        self._timeout = timeout
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop,
                                                 stripe.HTTPXClient] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def _client(self) -> stripe.HTTPXClient:
        loop = asyncio.get_running_loop()
        with self._lock:
            client = self._by_loop.get(loop)
            if client is None:
                client = self._by_loop[loop] = stripe.HTTPXClient(timeout=self._timeout)
            return client

    async def request_async(self, method: str, url: str, headers: Mapping[str, str],
                            post_data: Any = None) -> tuple[bytes, int, Mapping[str, str]]:
        await at_wire_async(method)  # tidemark.wire: the lease covers it
        return await self._client().request_async(method, url, headers, post_data)

    async def request_stream_async(self, method: str, url: str, headers: Mapping[str, str],
                                   post_data: Any = None) -> Any:
        return await self._client().request_stream_async(method, url, headers, post_data)

    def sleep_async(self, secs: float) -> Awaitable[None]:
        return asyncio.sleep(secs)  # never asked: max_network_retries is 0

    async def close_async(self) -> None:
        await self._client().close_async()

    def close(self) -> None:
        """Nothing to close without a loop: each loop's client closes on it (close_async)."""


class WiredRequests(stripe.RequestsClient):
    """stripe-python's blocking requests, each checked at the wire (tidemark.wire).

    The check runs just before the client hands the request to requests: the lowest point the
    Stripe client offers a hook at."""

    def __init__(self, timeout: float, async_fallback_client: stripe.HTTPClient) -> None:
        super().__init__(timeout=timeout, async_fallback_client=async_fallback_client)

    # RequestsClient's own signature (stripe's stubs give its base class another).
    def request(self, method: str, url: str,  # type: ignore[override]
                headers: Mapping[str, str] | None,
                post_data: Any = None) -> tuple[bytes, int, Mapping[str, str]]:
        at_wire(method)
        return super().request(method, url, headers, post_data)


def stripe_client(base_url: str, api_key: str, *,
                  timeout: float = DEFAULT_TIMEOUT) -> stripe.StripeClient:
    """A Stripe client for ``base_url`` that never retries on its own.

    ``base_url`` is a staging server's URL, or ``https://api.stripe.com``. No retries in its
    blocking calls (requests) nor in its ``*_async`` ones (httpx, the same timeout):
    ``max_network_retries`` is the client's, whichever HTTP client sends."""
    return stripe.StripeClient(
        api_key, base_addresses={"api": base_url.rstrip("/")}, max_network_retries=0,
        http_client=WiredRequests(timeout, PerLoopHTTPX(timeout)))


CREATE = "stripe payment_intents.create"


def create_request(ctx: StepContext) -> tuple[PaymentIntentCreateParams, stripe.RequestOptions]:
    """The create of a step, with its key as the Idempotency-Key.

    Its arguments are stamped with its key in the metadata."""
    params: PaymentIntentCreateParams = {
        "amount": ctx.args["amount"], "currency": ctx.args["currency"],
        "metadata": {STAMP: ctx.key}}
    if "customer" in ctx.args:
        params["customer"] = ctx.args["customer"]
    if "description" in ctx.args:
        params["description"] = ctx.args["description"]
    return params, {"idempotency_key": ctx.key}


def saved_failure(e: stripe.StripeError) -> bool:
    """Whether Stripe answered with a 5xx it saved under the key earlier (a replay)."""
    return bool((e.http_status or 0) >= 500 and (e.headers or {}).get(
        "Idempotent-Replayed") == "true")


def created(pi: stripe.PaymentIntent) -> dict[str, Any]:
    """The outcome of a create: the PaymentIntent, and whether Stripe replayed it."""
    replayed = pi.last_response is not None and (
        pi.last_response.headers.get("Idempotent-Replayed") == "true")
    return {**observed(pi.to_dict()), "idempotent_replayed": replayed}


def key_mode(key: str) -> str | None:
    """``live`` or ``test`` for a secret or restricted key, as its prefix says.

    Secret keys start ``sk_``, restricted ones ``rk_``. None for a key of another shape."""
    m = re.match(r"(?:sk|rk)_(live|test)_", key)
    return m.group(1) if m else None


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
        limits: The largest amount one step may ask for and the largest total of one task
            per currency (minor units, tidemark.payment_limits): the plan gate refuses a plan
            over either before anything of it runs, the step's gate a payment over the first.
        modes: The mode (``key_mode``) of the write key and of the read key, for
            ``check_identity``; the clients do not say which keys they hold.
    """

    name = "stripe.payment_intent"
    irreversible = True
    awaits: ClassVar[bool] = True  # execute_async: stripe-python's asynchronous create
    args: ClassVar[dict[str, Arg]] = {
        "amount": Arg(int, check=_positive),
        "currency": Arg(str, check=_currency),
        "customer": Arg(str, required=False, check=nonempty_str),
        "description": Arg(str, required=False),
    }

    def __init__(self, writer: stripe.StripeClient, reader: stripe.StripeClient, *,
                 limits: PaymentLimits = DEFAULT_LIMITS,
                 modes: tuple[str | None, str | None] = (None, None),
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        self.writer = writer
        self.reader = reader
        self.reads = PaymentIntentProbe(reader, limits=limits)
        # Connecting and the answer can each take the client's full timeout, then the listing
        # after a replayed 5xx does the same; a margin for the rest. The horizon stays 0: the
        # Idempotency-Key fences a late request (a second one gets 409 or the saved answer).
        self.deadline_s = 4 * timeout + 5.0
        self.limits = limits
        self.modes = modes

    def check_identity(self) -> dict[str, Any]:
        """Proves that both keys reach the same Stripe account in the same mode.

        The account is read with ``GET /v1/account``, the mode from the key prefixes
        (``sk_test_``/``rk_test_`` against ``sk_live_``/``rk_live_``). So the probe lists the
        PaymentIntents the action creates. Test and live data are apart on Stripe: a test read
        key never sees a live payment.

        The restricted read key needs read access to the account for this (Stripe's 403 names
        the permission, ``rak_accounts_kyc_basic_read``), besides PaymentIntents read.

        Returns:
            ``{"account": <acct id>, "mode": "test" | "live"}``.

        Raises:
            ConfigError: a key is rejected or cannot read the account, a mode cannot be told,
                or the two keys differ in account or mode.
        """
        write_mode, read_mode = self.modes
        for which, mode in (("write", write_mode), ("read", read_mode)):
            if mode is None:
                raise ConfigError(f"stripe: cannot tell whether the {which} key is a test or a "
                                  "live key; use a key as Stripe issues it (sk_test_, sk_live_, "
                                  f"rk_test_ or rk_live_) in {CREDENTIALS}")
        write, read = self._account(self.writer, "write"), self._account(self.reader, "read")
        if (write, write_mode) != (read, read_mode):
            raise ConfigError(
                f"stripe: the write key creates in account {write} ({write_mode} mode) but the "
                f"read key reads account {read} ({read_mode} mode); the probe would list "
                "another account's or mode's payments and find nothing of ours. Use a write "
                f"key and a restricted read key of the same account and mode ({CREDENTIALS})")
        return {"account": write, "mode": write_mode}

    @staticmethod
    def _account(client: stripe.StripeClient, which: str) -> str:
        try:
            return str(client.v1.accounts.retrieve_current().id)
        except stripe.StripeError as e:
            failure = stripe_failure(e, "stripe GET /v1/account")
            hint = (" (a restricted read key needs the Account read permission, "
                    "rak_accounts_kyc_basic_read, besides PaymentIntents read)"
                    if e.http_status == 403 else "")
            raise ConfigError(f"stripe: cannot tell which account the {which} key reaches: "
                              f"{failure}{hint}") from None

    @classmethod
    def describe(cls, args: dict[str, Any]) -> str:
        line = shown(int(args.get("amount", 0)), str(args.get("currency", "")))
        if args.get("customer"):
            line += f" from {args['customer']}"
        return line

    def preconditions(self, ctx: StepContext) -> None:
        self.reads.preconditions(ctx)

    def plan_gate(self, task_id: str, steps: list[tuple[int, dict[str, Any]]]) -> None:
        """Refuses a plan whose payments pass the limits, before anything of it runs.

        That is a payment over the per-step limit, or payments that add up to more than the
        per-task limit in a currency."""
        self.limits.check(task_id, steps)

    def snapshot(self, ctx: StepContext) -> dict[str, Any]:
        # Nothing to restore from (a payment is not undone by writing old state back); what is
        # kept is Stripe's time before the intent, which the probe lists from.
        return self.reads.snapshot()

    def probe(self, ctx: StepContext) -> ProbeResult:
        return self.reads.probe(ctx)

    def execute(self, ctx: StepContext) -> dict[str, Any]:
        params, options = create_request(ctx)
        try:
            with effect():
                pi = self.writer.v1.payment_intents.create(params=params, options=options)
        except stripe.StripeError as e:
            if not saved_failure(e):
                raise stripe_failure(e, CREATE) from e
            return self._after_saved_failure(ctx, e)
        return created(pi)

    async def execute_async(self, ctx: StepContext) -> dict[str, Any]:
        """``execute`` awaiting stripe-python's asynchronous create.

        The listing after a saved 5xx is a blocking read, so it runs in a thread."""
        params, options = create_request(ctx)
        try:
            with effect():
                pi = await self.writer.v1.payment_intents.create_async(params=params,
                                                                       options=options)
        except stripe.StripeError as e:
            if not saved_failure(e):
                raise stripe_failure(e, CREATE) from e
            return await asyncio.to_thread(self._after_saved_failure, ctx, e)
        return created(pi)

    def _after_saved_failure(self, ctx: StepContext, e: stripe.StripeError) -> dict[str, Any]:
        """Settles a step whose Idempotency-Key got a saved 5xx, or leaves it to a person.

        Stripe saves the first answer under a key once the endpoint began executing, 500s
        included. It replays it for every later request with that key until it prunes the key
        (at least 24 hours). So retrying with this key cannot succeed meanwhile, and retrying
        with a new key may be a second payment. A 5xx says the outcome is unknown, not that
        nothing happened: a PaymentIntent made before the error counts. So the listing decides
        only *done*; anything else is for a person, with the facts, never closed as failed.

        Raises:
            NeedsDecision: the listing does not show our payment, or cannot tell.
        """
        probed = self.reads.probe(ctx)
        if probed.status is ProbeStatus.DONE:
            return {**probed.observed, "idempotent_replayed": True}
        headers = e.headers or {}
        facts = (f"Stripe saved a {e.http_status} under this step's Idempotency-Key {ctx.key} "
                 f"and replays it (Idempotent-Replayed: true, original request "
                 f"{headers.get('Original-Request') or 'unknown'}); the listing says: "
                 f"{probed.reason}. A 5xx leaves the outcome unknown. Look in the Dashboard for "
                 "a payment of this amount: "
                 f"`{command(Act.RESOLVE, ctx.task_id, step=ctx.step, verdict='done')}` if it "
                 "is there; "
                 "`--as absent` runs it under the same key, which Stripe answers with the saved "
                 "error until it prunes the key (24 h after the first request) and then pays "
                 "once; `--as never` on a stopped task if it must not happen")
        raise NeedsDecision(ctx.step, ctx.action, facts) from e
