"""Stripe accounts and keys.

The data of each account in each mode, which account and mode a key reaches, the ``/v1/account``
route, and Stripe's own 401/403 answers."""

from __future__ import annotations

import re

from aiohttp import web

from staging.core import DEFAULT_ACCOUNT, Reply, Target, Token
from staging.stripe.objects import AccountData, ExecutionError
from staging.stripe.responses import mask_key, stripe_error, stripe_json

PERM_READ = "rak_payment_intent_read"
PERM_WRITE = "rak_payment_intent_write"
# What Stripe's 403 names for GET /v1/account with a restricted key lacking it.
PERM_ACCOUNT_READ = "rak_accounts_kyc_basic_read"
ACCOUNT = "acct_1TidemarkStaging"  # the Stripe account of tokens bound to the default account

DEFAULT_SEARCH_LAG = 5.0  # seconds; Stripe's search trails writes by up to about a minute.
#                           A few seconds makes the lag visible in a rehearsal without
#                           stalling it; tests set their own through the control endpoint.


def account_id(tok: Token) -> str:
    """The Stripe account a key belongs to.

    ``ACCOUNT`` for the default account, else the token's account as given (``acct_…``)."""
    return ACCOUNT if tok.account == DEFAULT_ACCOUNT else tok.account


def livemode(key: str) -> bool:
    """Whether a key is a live-mode key (``sk_live_``, ``rk_live_``); anything else is test."""
    return bool(re.match(r"(?:sk|rk|pk)_live_", key))


def key_of(request: web.Request) -> str:
    header = request.headers.get("Authorization", "")
    return header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else ""


class StripeAccounts(Target):
    """The state of the emulated Stripe and what every route shares.

    That is accounts, keys and errors. The routes themselves are mixed in by StripeTarget."""

    def __init__(self) -> None:
        super().__init__()
        self.states: dict[tuple[str, bool], AccountData] = {}
        self.search_lag = DEFAULT_SEARCH_LAG
        self.execution_errors: list[ExecutionError] = []

    def reset(self) -> None:
        self.states = {}
        self.search_lag = DEFAULT_SEARCH_LAG
        self.execution_errors = []

    @property
    def state(self) -> AccountData:
        """The default account's test-mode data."""
        return self.state_of(ACCOUNT, False)

    def state_of(self, account: str, live: bool) -> AccountData:
        return self.states.setdefault((account, live), AccountData())

    def _state_for(self, request: web.Request, tok: Token) -> AccountData:
        return self.state_of(account_id(tok), livemode(key_of(request)))

    # Stripe's error shapes --------------------------------------------------------------------

    def error(self, status: int, code: str, message: str) -> web.Response:
        if status >= 500:
            return stripe_error(status, "api_error", "An unknown error occurred")
        return stripe_error(status, "invalid_request_error", message)

    def authorize(self, request: web.Request, *scopes: str) -> Token:
        """Stripe's own answers to a key: 401 or 403.

        401 for a missing, unknown or rolled key; 403 for a restricted key without the
        permission (naming the permission that would allow the request)."""
        try:
            return super().authorize(request, *scopes)
        except Reply as r:
            raise Reply(self._auth_error(request, r.response.status, scopes)) from None

    def _auth_error(self, request: web.Request, status: int,
                    scopes: tuple[str, ...]) -> web.Response:
        key = key_of(request)
        basic = {"WWW-Authenticate": 'Basic realm="Stripe"'}
        if status == 403:
            with self.staging.lock:
                tok = self.staging.tokens.get(key)
            acct = account_id(tok) if tok is not None else ACCOUNT
            return stripe_error(
                403, "invalid_request_error",
                f"The provided key '{mask_key(key)}' does not have the required permissions "
                f"for this endpoint on account '{acct}'. Having the '{scopes[-1]}' "
                "permission would allow this request to continue.",
                code="more_permissions_required")
        if not key:
            return stripe_error(
                401, "invalid_request_error",
                "You did not provide an API key. You need to provide your API key in the "
                "Authorization header, using Bearer auth (e.g. 'Authorization: Bearer "
                "YOUR_SECRET_KEY'). See https://stripe.com/docs/api#authentication for details, "
                "or we can help at https://support.stripe.com/.", headers=basic)
        with self.staging.lock:
            tok = self.staging.tokens.get(key)
        if tok is not None and tok.revoked:
            return stripe_error(401, "invalid_request_error",
                                f"Expired API Key provided: {mask_key(key)}",
                                code="api_key_expired", headers=basic)
        return stripe_error(401, "invalid_request_error",
                            f"Invalid API Key provided: {mask_key(key)}", headers=basic)

    # the account ------------------------------------------------------------------------------

    async def _h_account(self, request: web.Request) -> web.Response:
        tok = self.authorize(request, PERM_ACCOUNT_READ)
        acct = account_id(tok)
        return stripe_json({"id": acct, "object": "account", "type": "standard", "country": "US",
                      "default_currency": "usd", "email": f"{acct}@stripe.staging.example",
                      "charges_enabled": True, "payouts_enabled": True,
                      "details_submitted": True,
                      "settings": {"dashboard": {"display_name": acct}}})
