"""StripeTarget: the emulated Stripe PaymentIntents API.

Its default keys, switches and routes, assembled from the accounts, the clock, idempotency and
the route groups."""

from __future__ import annotations

from collections.abc import Iterable

from aiohttp import web

from staging.core import Token
from staging.stripe.accounts import PERM_ACCOUNT_READ, PERM_READ, PERM_WRITE
from staging.stripe.control import ControlRoutes
from staging.stripe.intents import PaymentIntentRoutes
from staging.stripe.responses import stripe_error
from staging.stripe.switches import CLOCK_OFFSET, IDEMPOTENCY_TTL_SWITCH, RESTRICTED_METADATA
from staging.throttle import rate_switch
from tidemark import staging_tokens

DEFAULT_SECRET_KEY = staging_tokens.STRIPE_SECRET
DEFAULT_READ_KEY = staging_tokens.STRIPE_READ


class StripeTarget(PaymentIntentRoutes, ControlRoutes):
    """Stripe accounts in memory, each with its test-mode and live-mode data apart.

    A key reaches the data of its token's account in its own mode (``livemode``)."""

    name = "stripe"
    switches = (CLOCK_OFFSET, RESTRICTED_METADATA, IDEMPOTENCY_TTL_SWITCH,
                rate_switch("Stripe", "Stripe's Rate limits: rate and concurrency limiters "
                                      "answer 429 (25 reads and 25 writes a second in test "
                                      "mode)."))
    default_tokens = (
        Token(DEFAULT_SECRET_KEY, "stripe", [PERM_READ, PERM_WRITE, PERM_ACCOUNT_READ]),
        Token(DEFAULT_READ_KEY, "stripe", [PERM_READ, PERM_ACCOUNT_READ]),
    )

    def throttled(self, op: str) -> web.Response:
        """Stripe's 429 (stripe-python raises RateLimitError for it)."""
        return stripe_error(429, "invalid_request_error", "Too many requests hit the API too "
                            "quickly. We recommend an exponential backoff of your requests.",
                            code="rate_limit")

    def routes(self) -> Iterable[web.RouteDef]:
        dated = self._dated
        return (
            web.post("/v1/payment_intents", dated(self._h_create)),
            web.get("/v1/payment_intents", dated(self._h_list)),
            # Registered before the {id} route, which would otherwise take "search" for an id.
            web.get("/v1/payment_intents/search", dated(self._h_search)),
            web.get("/v1/payment_intents/{intent}", dated(self._h_retrieve)),
            web.post("/v1/payment_intents/{intent}", dated(self._h_update)),
            web.get("/v1/account", dated(self._h_account)),
            web.post("/_staging/stripe/execution_errors", self._h_execution_error),
            web.get("/_staging/stripe/search_lag", self._h_get_lag),
            web.post("/_staging/stripe/search_lag", self._h_set_lag),
            web.post("/_staging/stripe/customers", self._h_add_customer),
        )
