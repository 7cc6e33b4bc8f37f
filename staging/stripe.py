"""Stripe PaymentIntents (API v1): create, retrieve, list and search, with Stripe's idempotency.

Routes (stripe-python reaches them with ``base_addresses={"api": <base>}``):

* ``POST /v1/payment_intents`` — form-encoded (``metadata[k]=v``): ``amount``, ``currency``,
  ``customer``, ``description``, ``metadata``, ``receipt_email``, ``payment_method_types``,
  ``automatic_payment_methods``, ``capture_method``, ``statement_descriptor_suffix``;
  anything else is ``parameter_unknown``. Objects start in ``requires_payment_method``.
* ``GET /v1/payment_intents/{id}``;
* ``GET /v1/payment_intents`` — ``created`` (a timestamp or ``created[gt|gte|lt|lte]``),
  ``customer``, ``limit`` (1 to 100, default 10), ``starting_after``, ``ending_before``; newest
  first. A consistent read: an object is listed as soon as it was created.
* ``GET /v1/payment_intents/search`` — ``query`` clauses joined by ``AND`` or ``OR``:
  ``metadata['k']:'v'``, ``status:'…'``, ``currency:'…'``, ``customer:'…'``,
  ``amount>100`` (``:``, ``<``, ``>``, ``<=``, ``>=``; also ``created``); ``limit``, ``page``.
  Eventually consistent, like Stripe's: an object becomes searchable only ``search_lag``
  seconds after its creation;
* ``GET /v1/account`` — the key's own account (``id``, ``object: "account"``, …); a restricted
  key needs ``rak_accounts_kyc_basic_read`` for it, the permission Stripe's 403 names.

Accounts and modes: a key belongs to the account of its token (``staging.core.Token.account``:
:data:`ACCOUNT` for the default one, else the token's account as given, e.g. ``acct_other``)
and to a mode by its prefix (``sk_live_``/``rk_live_`` live, anything else test). Each account
keeps its test and live data apart (PaymentIntents, customers, idempotency keys), as on
Stripe; objects carry ``livemode``. A key sees only its own account's data in its own mode.

Idempotency, as Stripe documents it for v1: a POST's ``Idempotency-Key`` is remembered with the
endpoint, the parameters and the response once execution begins (24 hours). The same key with the
same parameters replays that response — errors included — with ``Idempotent-Replayed: true``;
with other parameters or another endpoint it is a 400 ``idempotency_error``; while the first
request is still executing a twin gets 409 ``idempotency_key_in_use``. Requests that fail
validation (unknown or malformed parameters) or never reach execution (an armed
``fail_before_commit``, like an outage in front of the API) are not remembered, so a retry runs.
An error during execution is remembered and replayed like any other answer: arm one with
``POST /_staging/stripe/execution_errors`` ``{"status": 500, "commit"?: false, "times"?: 1}``
(``commit``: the PaymentIntent was created before the error).

Auth, as Stripe: ``Authorization: Bearer <key>``. Default keys (``/_staging/reset`` keeps them):
``sk_test_tidemark_staging`` (a secret key: everything) and ``rk_test_tidemark_staging_read``
(a restricted key with read permission on PaymentIntents and on the account, which gets
Stripe's 403 on create).
Keys added over ``/_staging/tokens`` take the permissions ``rak_payment_intent_read``,
``rak_payment_intent_write`` and ``rak_accounts_kyc_basic_read`` as scopes.

Switches (``/_staging/switches``, see staging.core): ``clock_offset_s`` (Stripe's clock against
this host's: ``created`` and the ``Date`` header every answer carries), ``restricted_key_metadata``
(``hidden``: objects read with an ``rk_`` key come with ``metadata: {}``) and
``idempotency_ttl_s`` (how long a key is remembered).

Control endpoints:

* ``GET|POST /_staging/stripe/search_lag`` ``{"seconds": 60}`` — how far search trails;
* ``POST /_staging/stripe/customers`` ``{"id"?, "email"?, "name"?}`` — a customer that
  ``customer=`` may name; an unknown customer is ``resource_missing``, as on Stripe.

Every created PaymentIntent is recorded as an effect with the Idempotency-Key its request carried.
Faults can be armed on ``payment_intents.create``, ``.retrieve``, ``.list`` and ``.search``.
"""

from __future__ import annotations

import base64
import email.utils
import json
import re
import secrets
import string
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from aiohttp import web

from staging.core import DEFAULT_ACCOUNT, Reply, Switch, Target, Token
from tidemark import staging_tokens

PERM_READ = "rak_payment_intent_read"
PERM_WRITE = "rak_payment_intent_write"
# What Stripe's 403 names for GET /v1/account with a restricted key lacking it.
PERM_ACCOUNT_READ = "rak_accounts_kyc_basic_read"
DEFAULT_SECRET_KEY = staging_tokens.STRIPE_SECRET
DEFAULT_READ_KEY = staging_tokens.STRIPE_READ
ACCOUNT = "acct_1TidemarkStaging"  # the Stripe account of tokens bound to the default account

DEFAULT_SEARCH_LAG = 5.0  # seconds; Stripe's search trails writes by up to about a minute.
#                           A few seconds makes the lag visible in a rehearsal without
#                           stalling it; tests set their own through the control endpoint.
IDEMPOTENCY_TTL = 24 * 3600  # seconds; Stripe prunes keys once they are at least 24 hours old
MAX_IDEMPOTENCY_KEY = 255  # characters, Stripe's documented limit
DEFAULT_LIMIT = 10  # Stripe's default page size for list and search
MAX_LIMIT = 100  # Stripe's maximum page size
MAX_AMOUNT = 99_999_999  # Stripe's ceiling: eight digits in minor units
# Stripe's minimum charge amounts for a few common currencies, in minor units; others need >= 1.
MIN_AMOUNT = {"usd": 50, "eur": 50, "gbp": 30, "cad": 50, "aud": 50, "chf": 50, "jpy": 50}
METADATA_LIMITS = (50, 40, 500)  # keys per object, characters per key, characters per value

CREATE_PARAMS = frozenset({
    "amount", "currency", "customer", "description", "metadata", "receipt_email",
    "payment_method_types", "automatic_payment_methods", "capture_method",
    "statement_descriptor_suffix", "expand",
})
LIST_PARAMS = frozenset({"created", "customer", "limit", "starting_after", "ending_before",
                         "expand"})
SEARCH_PARAMS = frozenset({"query", "limit", "page", "expand"})


@dataclass
class _Remembered:
    """What Stripe keeps for one idempotency key."""

    fingerprint: str
    at: float
    status: int | None = None  # None while the first request is still executing
    body: bytes = b""
    request_id: str = ""


@dataclass
class _Intent:
    obj: dict[str, Any]
    at: float  # creation time with sub-second precision, for the search lag
    seq: int  # creation order, to order objects created within the same second


@dataclass
class _State:
    """One account's data in one mode (test and live data are apart, as on Stripe)."""

    intents: dict[str, _Intent] = field(default_factory=dict)
    customers: dict[str, dict[str, Any]] = field(default_factory=dict)
    keys: dict[str, _Remembered] = field(default_factory=dict)
    seq: int = 0


@dataclass
class ExecutionError:
    """An error the create endpoint meets after execution began (so Stripe saves it under the
    Idempotency-Key and replays it); ``commit``: the PaymentIntent was created before it."""

    status: int = 500
    commit: bool = False
    times: int = 1


def account_id(tok: Token) -> str:
    """The Stripe account a key belongs to: ``ACCOUNT`` for the default account, else the
    token's account as given (``acct_…``)."""
    return ACCOUNT if tok.account == DEFAULT_ACCOUNT else tok.account


def livemode(key: str) -> bool:
    """Whether a key is a live-mode key (``sk_live_``, ``rk_live_``); anything else is test."""
    return bool(re.match(r"(?:sk|rk|pk)_live_", key))


CLOCK_OFFSET = Switch(
    "clock_offset_s", default=0, worst=-600,
    doc="Seconds Stripe's clock is ahead of this host's (negative: behind). A PaymentIntent's "
        "`created` is a Unix timestamp set by Stripe (API reference, The PaymentIntent object, "
        "and List all PaymentIntents: `created` filters on that field), and Stripe's HTTP "
        "`Date` header comes from the same clock (RFC 9110 section 6.6.1); nothing ties either "
        "to the caller's clock, nor to Postgres's. -600: Postgres ten minutes ahead of Stripe.")
RESTRICTED_METADATA = Switch(
    "restricted_key_metadata", default="shown", worst="hidden", choices=("shown", "hidden"),
    doc="Whether objects read with a restricted key (rk_) carry their metadata. Stripe's "
        "metadata page (docs.stripe.com/metadata) says metadata is not shown to publishable "
        "keys and is returned to requests made with the secret key; it says nothing of "
        "restricted keys, so the worst case is that they see `metadata: {}`.")
IDEMPOTENCY_TTL_SWITCH = Switch(
    "idempotency_ttl_s", default=IDEMPOTENCY_TTL, worst=IDEMPOTENCY_TTL,
    doc="Seconds Stripe remembers an Idempotency-Key. Stripe (docs.stripe.com/api/"
        "idempotent_requests) may remove keys once they are at least 24 hours old and then "
        "runs a reused key as a new request; 24 h is thus both the usual and the worst case. "
        "A test sets it lower to make a key forgotten without waiting a day.")


class StripeTarget(Target):
    """Stripe accounts in memory, each with its test-mode and live-mode data apart. A key
    reaches the data of its token's account in its own mode (``livemode``)."""

    name = "stripe"
    switches = (CLOCK_OFFSET, RESTRICTED_METADATA, IDEMPOTENCY_TTL_SWITCH)
    default_tokens = (
        Token(DEFAULT_SECRET_KEY, "stripe", [PERM_READ, PERM_WRITE, PERM_ACCOUNT_READ]),
        Token(DEFAULT_READ_KEY, "stripe", [PERM_READ, PERM_ACCOUNT_READ]),
    )

    def __init__(self) -> None:
        super().__init__()
        self.states: dict[tuple[str, bool], _State] = {}
        self.search_lag = DEFAULT_SEARCH_LAG
        self.execution_errors: list[ExecutionError] = []

    def reset(self) -> None:
        self.states = {}
        self.search_lag = DEFAULT_SEARCH_LAG
        self.execution_errors = []

    @property
    def state(self) -> _State:
        """The default account's test-mode data."""
        return self.state_of(ACCOUNT, False)

    def state_of(self, account: str, live: bool) -> _State:
        return self.states.setdefault((account, live), _State())

    def _state_for(self, request: web.Request, tok: Token) -> _State:
        return self.state_of(account_id(tok), livemode(_key_of(request)))

    def now(self) -> float:
        """Stripe's clock: this host's plus the ``clock_offset_s`` switch."""
        return time.time() + float(self.switch("clock_offset_s"))

    def routes(self) -> Iterable[web.RouteDef]:
        dated = self._dated
        return (
            web.post("/v1/payment_intents", dated(self._h_create)),
            web.get("/v1/payment_intents", dated(self._h_list)),
            # Registered before the {id} route, which would otherwise take "search" for an id.
            web.get("/v1/payment_intents/search", dated(self._h_search)),
            web.get("/v1/payment_intents/{intent}", dated(self._h_retrieve)),
            web.get("/v1/account", dated(self._h_account)),
            web.post("/_staging/stripe/execution_errors", self._h_execution_error),
            web.get("/_staging/stripe/search_lag", self._h_get_lag),
            web.post("/_staging/stripe/search_lag", self._h_set_lag),
            web.post("/_staging/stripe/customers", self._h_add_customer),
        )

    def _dated(self, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
               ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """``handler`` with Stripe's ``Date`` header (Stripe's clock, not this host's) on every
        answer, errors and replays included, and with metadata hidden from a restricted key
        when the ``restricted_key_metadata`` switch says so."""

        async def wrapped(request: web.Request) -> web.StreamResponse:
            try:
                response = await handler(request)
            except Reply as r:
                response = r.response
            if (isinstance(response, web.Response) and response.status == 200
                    and _key_of(request).startswith("rk_")
                    and self.switch("restricted_key_metadata") == "hidden"):
                response = _without_metadata(response)
            response.headers["Date"] = email.utils.formatdate(self.now(), usegmt=True)
            return response

        return wrapped

    # Stripe's error shapes --------------------------------------------------------------------

    def error(self, status: int, code: str, message: str) -> web.Response:
        if status >= 500:
            return stripe_error(status, "api_error", "An unknown error occurred")
        return stripe_error(status, "invalid_request_error", message)

    def authorize(self, request: web.Request, *scopes: str) -> Token:
        """Stripe's own answers: 401 for a missing, unknown or rolled key, 403 for a restricted
        key without the permission (naming the permission that would allow the request)."""
        try:
            return super().authorize(request, *scopes)
        except Reply as r:
            raise Reply(self._auth_error(request, r.response.status, scopes)) from None

    def _auth_error(self, request: web.Request, status: int,
                    scopes: tuple[str, ...]) -> web.Response:
        key = _key_of(request)
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

    # PaymentIntents ---------------------------------------------------------------------------

    async def _h_create(self, request: web.Request) -> web.StreamResponse:
        tok = self.authorize(request, PERM_WRITE)
        state = self._state_for(request, tok)
        params = decode_params((k, v) for k, v in (await request.post()).items()
                               if isinstance(v, str))  # a form post: no file fields
        key = request.headers.get("Idempotency-Key")
        fingerprint = json.dumps(["POST", request.path, params], sort_keys=True)
        if key is not None:
            replay = self._remembered(state, key, fingerprint)
            if replay is not None:
                return replay
        create = self._validate_create(params)  # a validation error is not remembered
        if key is not None:
            with self.staging.lock:
                state.keys[key] = _Remembered(fingerprint, time.time())
        try:
            fault = await self.before_write(request, "payment_intents.create")
        except BaseException:
            self._forget(state, key)  # failed in front of the endpoint: nothing to remember
            raise
        failure = self._take_execution_error()
        if failure is None or failure.commit:
            try:
                response = self._create(state, create, key, live=livemode(_key_of(request)))
            except Reply as r:
                response = r.response  # an error of the execution itself: saved and replayed
        if failure is not None:  # failed during execution (after creating, if ``commit``)
            response = stripe_error(failure.status, "api_error", "An unknown error occurred")
        self._remember(state, key, response)
        self.after_commit(request, fault)
        return response

    def _take_execution_error(self) -> ExecutionError | None:
        with self.staging.lock:
            if not self.execution_errors:
                return None
            failure = self.execution_errors[0]
            failure.times -= 1
            if failure.times <= 0:
                self.execution_errors.pop(0)
            return failure

    def _validate_create(self, params: dict[str, Any]) -> dict[str, Any]:
        _no_unknown(params, CREATE_PARAMS)
        for required in ("amount", "currency"):
            if required not in params:
                raise Reply(stripe_error(400, "invalid_request_error",
                                         f"Missing required param: {required}.",
                                         code="parameter_missing", param=required))
        amount = _integer(params["amount"], "amount")
        currency = str(params["currency"]).lower()
        if not re.fullmatch(r"[a-z]{3}", currency):
            raise Reply(stripe_error(400, "invalid_request_error",
                                     f"Invalid currency: {params['currency']}.",
                                     param="currency"))
        metadata = params.get("metadata", {})
        if not isinstance(metadata, dict):
            raise Reply(stripe_error(400, "invalid_request_error",
                                     "Invalid object", param="metadata"))
        max_keys, max_key, max_value = METADATA_LIMITS
        for k, v in metadata.items():
            if len(k) > max_key or not isinstance(v, str) or len(v) > max_value:
                raise Reply(stripe_error(400, "invalid_request_error",
                                         f"Metadata key {k!r} or its value is too long or not "
                                         "a string.", param=f"metadata[{k}]"))
        if len(metadata) > max_keys:
            raise Reply(stripe_error(400, "invalid_request_error",
                                     f"You can specify up to {max_keys} metadata keys.",
                                     param="metadata"))
        return {**params, "amount": amount, "currency": currency,
                "metadata": {k: v for k, v in metadata.items() if v != ""}}

    def _create(self, state: _State, p: dict[str, Any], key: str | None, *,
                live: bool) -> web.Response:
        amount, currency = p["amount"], p["currency"]
        minimum = MIN_AMOUNT.get(currency, 1)
        if amount < minimum:
            raise Reply(stripe_error(400, "invalid_request_error",
                                     f"Amount must be at least {minimum} {currency} (in the "
                                     "currency's smallest unit)",
                                     code="amount_too_small", param="amount"))
        if amount > MAX_AMOUNT:
            raise Reply(stripe_error(400, "invalid_request_error",
                                     f"Amount must be no more than {MAX_AMOUNT}",
                                     code="amount_too_large", param="amount"))
        customer = p.get("customer")
        if customer is not None and customer not in state.customers:
            raise Reply(stripe_error(400, "invalid_request_error",
                                     f"No such customer: '{customer}'",
                                     code="resource_missing", param="customer"))
        now = time.time()
        pi_id = "pi_" + _random_id(24)
        obj = payment_intent_object(pi_id, p, created=int(self.now()), livemode=live)
        with self.staging.lock:
            state.seq += 1
            state.intents[pi_id] = _Intent(obj, now, state.seq)
        self.record("payment_intents.create", key, id=pi_id, amount=amount, currency=currency,
                    customer=customer, metadata=dict(obj["metadata"]))
        return _json(obj)

    async def _h_retrieve(self, request: web.Request) -> web.Response:
        state = self._state_for(request, self.authorize(request, PERM_READ, PERM_WRITE))
        await self.before_write(request, "payment_intents.retrieve")
        _no_unknown(decode_params(request.query.items()), {"client_secret", "expand"})
        intent = state.intents.get(request.match_info["intent"])
        if intent is None:
            raise Reply(_no_such(request.match_info["intent"], "intent", 404))
        return _json(intent.obj)

    async def _h_list(self, request: web.Request) -> web.Response:
        state = self._state_for(request, self.authorize(request, PERM_READ, PERM_WRITE))
        await self.before_write(request, "payment_intents.list")
        params = decode_params(request.query.items())
        _no_unknown(params, LIST_PARAMS)
        limit = _limit(params)
        created = _created_filter(params.get("created"))
        customer = params.get("customer")
        with self.staging.lock:
            ordered = sorted(state.intents.values(), key=lambda i: (-i.obj["created"],
                                                                         -i.seq))
        ids = [i.obj["id"] for i in ordered]
        if "starting_after" in params or "ending_before" in params:
            cursor_param = "starting_after" if "starting_after" in params else "ending_before"
            cursor = params[cursor_param]
            if cursor not in ids:
                raise Reply(_no_such(cursor, cursor_param, 400))
            at = ids.index(cursor)
            window = ordered[at + 1:] if cursor_param == "starting_after" else ordered[:at]
        else:
            cursor_param, window = "", ordered
        hits = [i.obj for i in window
                if created(i.obj["created"]) and (customer is None or
                                                  i.obj["customer"] == customer)]
        page = hits[-limit:] if cursor_param == "ending_before" else hits[:limit]
        return _json({"object": "list", "data": page, "has_more": len(hits) > limit,
                      "url": "/v1/payment_intents"})

    async def _h_search(self, request: web.Request) -> web.Response:
        state = self._state_for(request, self.authorize(request, PERM_READ, PERM_WRITE))
        await self.before_write(request, "payment_intents.search")
        params = decode_params(request.query.items())
        _no_unknown(params, SEARCH_PARAMS)
        if "query" not in params:
            raise Reply(stripe_error(400, "invalid_request_error",
                                     "Missing required param: query.",
                                     code="parameter_missing", param="query"))
        try:
            match = parse_search(str(params["query"]))
        except ValueError as e:
            raise Reply(stripe_error(400, "invalid_request_error", str(e),
                                     param="query")) from None
        limit = _limit(params)
        try:
            start = int(base64.urlsafe_b64decode(params["page"]).decode()) if params.get(
                "page") else 0
        except ValueError:
            raise Reply(stripe_error(400, "invalid_request_error", "Invalid page token.",
                                     param="page")) from None
        now = time.time()
        with self.staging.lock:
            visible = [i for i in state.intents.values() if now - i.at >= self.search_lag]
        visible.sort(key=lambda i: (-i.obj["created"], -i.seq))
        hits = [i.obj for i in visible if match(i.obj)]
        page = hits[start:start + limit]
        more = start + limit < len(hits)
        return _json({"object": "search_result", "data": page, "has_more": more,
                      "next_page": base64.urlsafe_b64encode(str(start + limit).encode()).decode()
                      if more else None,
                      "url": "/v1/payment_intents/search"})

    # idempotency -------------------------------------------------------------------------------

    def _remembered(self, state: _State, key: str, fingerprint: str) -> web.Response | None:
        """The answer for a key seen before: a replay, a 400 for other parameters, or a 409
        while the first request runs. None for a new (or pruned) key."""
        if len(key) > MAX_IDEMPOTENCY_KEY:
            raise Reply(stripe_error(400, "invalid_request_error",
                                     f"Keys for idempotent requests can be no longer than "
                                     f"{MAX_IDEMPOTENCY_KEY} characters."))
        with self.staging.lock:
            seen = state.keys.get(key)
            ttl = float(self.switch("idempotency_ttl_s"))
            if seen is not None and time.time() - seen.at > ttl:
                del state.keys[key]
                seen = None
        if seen is None:
            return None
        if seen.fingerprint != fingerprint:
            return stripe_error(
                400, "idempotency_error",
                "Keys for idempotent requests can only be used with the same parameters they "
                f"were first used with. Try using a key other than '{key}' if you meant to "
                "execute a different request.")
        if seen.status is None:
            return stripe_error(
                409, "idempotency_error",
                "There is currently another in-progress request using this Idempotent Key "
                "(that probably means you submitted twice, and the other request is still "
                f"going through): {key}. Please try again later.",
                code="idempotency_key_in_use")
        return web.Response(status=seen.status, body=seen.body, content_type="application/json",
                            headers={"Idempotent-Replayed": "true", "Idempotency-Key": key,
                                     "Original-Request": seen.request_id,
                                     "Request-Id": _request_id()})

    def _remember(self, state: _State, key: str | None, response: web.Response) -> None:
        if key is None:
            return
        response.headers["Idempotency-Key"] = key
        body = response.body if isinstance(response.body, bytes) else b""
        with self.staging.lock:
            seen = state.keys.get(key)
            if seen is not None:
                seen.status, seen.body = response.status, body
                seen.request_id = response.headers.get("Request-Id", "")

    def _forget(self, state: _State, key: str | None) -> None:
        if key is not None:
            with self.staging.lock:
                state.keys.pop(key, None)

    # the account ------------------------------------------------------------------------------

    async def _h_account(self, request: web.Request) -> web.Response:
        tok = self.authorize(request, PERM_ACCOUNT_READ)
        acct = account_id(tok)
        return _json({"id": acct, "object": "account", "type": "standard", "country": "US",
                      "default_currency": "usd", "email": f"{acct}@stripe.staging.example",
                      "charges_enabled": True, "payouts_enabled": True,
                      "details_submitted": True,
                      "settings": {"dashboard": {"display_name": acct}}})

    # control ---------------------------------------------------------------------------------

    async def _h_get_lag(self, request: web.Request) -> web.Response:
        return web.json_response({"seconds": self.search_lag})

    async def _h_set_lag(self, request: web.Request) -> web.Response:
        body = await request.json()
        try:
            seconds = float(body["seconds"])
        except (KeyError, TypeError, ValueError):
            return web.json_response({"error": "give {\"seconds\": <number>}"}, status=400)
        self.search_lag = seconds
        return web.json_response({"seconds": seconds})

    async def _h_execution_error(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else {}
        try:
            failure = ExecutionError(**body)
        except TypeError as e:
            return web.json_response({"error": str(e)}, status=400)
        with self.staging.lock:
            self.execution_errors.append(failure)
        return web.json_response({"armed": asdict(failure)})

    async def _h_add_customer(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else {}
        return web.json_response(self.add_customer(**{k: body[k] for k in ("id", "email", "name")
                                                      if k in body}))

    def add_customer(self, id: str | None = None, email: str | None = None,
                     name: str | None = None) -> dict[str, Any]:
        """Adds a customer that PaymentIntents may name, and returns it."""
        customer: dict[str, Any] = {
            "id": id or "cus_" + _random_id(14), "object": "customer", "email": email,
            "name": name, "created": int(self.now()), "livemode": False}
        with self.staging.lock:
            self.state.customers[customer["id"]] = customer
        return customer


# -- objects and errors -----------------------------------------------------------------------

def payment_intent_object(pi_id: str, p: Mapping[str, Any], *, created: int,
                          livemode: bool = False) -> dict[str, Any]:
    """A PaymentIntent as the API returns it, fresh from create."""
    types = _as_list(p.get("payment_method_types")) or ["card"]
    return {
        "id": pi_id, "object": "payment_intent", "amount": p["amount"],
        "amount_capturable": 0, "amount_received": 0, "application": None,
        "application_fee_amount": None,
        "automatic_payment_methods": p.get("automatic_payment_methods"),
        "canceled_at": None, "cancellation_reason": None,
        "capture_method": p.get("capture_method", "automatic_async"),
        "client_secret": f"{pi_id}_secret_{_random_id(24)}", "confirmation_method": "automatic",
        "created": created, "currency": p["currency"], "customer": p.get("customer"),
        "description": p.get("description"), "last_payment_error": None,
        "latest_charge": None, "livemode": livemode, "metadata": dict(p.get("metadata") or {}),
        "next_action": None, "on_behalf_of": None, "payment_method": None,
        "payment_method_options": {}, "payment_method_types": types, "processing": None,
        "receipt_email": p.get("receipt_email"), "review": None, "setup_future_usage": None,
        "shipping": None, "statement_descriptor": None,
        "statement_descriptor_suffix": p.get("statement_descriptor_suffix"),
        "status": "requires_payment_method", "transfer_data": None, "transfer_group": None,
    }


def stripe_error(status: int, type_: str, message: str, *, code: str | None = None,
                 param: str | None = None,
                 headers: dict[str, str] | None = None) -> web.Response:
    """Stripe's error body: ``{"error": {"type", "message", "code"?, "param"?, "doc_url"?}}``."""
    err: dict[str, Any] = {"message": message, "type": type_}
    if code is not None:
        err["code"] = code
        err["doc_url"] = f"https://stripe.com/docs/error-codes/{code.replace('_', '-')}"
    if param is not None:
        err["param"] = param
    return _json({"error": err}, status=status, headers=headers)


def mask_key(key: str) -> str:
    """Shows a key the way Stripe's messages do: its prefix and last four characters."""
    m = re.match(r"(?:sk|rk|pk)_(?:test|live)_", key)
    prefix = m.group(0) if m else ""
    rest = key[len(prefix):]
    return prefix + "*" * max(len(rest) - 4, 0) + rest[-4:]


def _without_metadata(response: web.Response) -> web.Response:
    """The same answer with every PaymentIntent's metadata emptied, as a key that may not see
    metadata would get it (one object, or a list or search page of them)."""
    body = json.loads(response.body) if isinstance(response.body, bytes) else {}
    for obj in body.get("data", [body]) if isinstance(body, dict) else []:
        if isinstance(obj, dict) and "metadata" in obj:
            obj["metadata"] = {}
    hidden = web.json_response(body, status=response.status)
    for name, value in response.headers.items():
        if name.lower() not in ("content-length", "content-type"):
            hidden.headers[name] = value
    return hidden


def _key_of(request: web.Request) -> str:
    header = request.headers.get("Authorization", "")
    return header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else ""


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(body, status=status,
                             headers={"Request-Id": _request_id(), **(headers or {})})


def _no_such(obj_id: str, param: str, status: int) -> web.Response:
    return stripe_error(status, "invalid_request_error", f"No such payment_intent: '{obj_id}'",
                        code="resource_missing", param=param)


def _no_unknown(params: Mapping[str, Any], allowed: Iterable[str]) -> None:
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise Reply(stripe_error(400, "invalid_request_error",
                                 f"Received unknown parameter: {unknown[0]}",
                                 code="parameter_unknown", param=unknown[0]))


def _integer(value: Any, param: str) -> int:
    try:
        return int(str(value))
    except ValueError:
        raise Reply(stripe_error(400, "invalid_request_error", f"Invalid integer: {value}",
                                 code="parameter_invalid_integer", param=param)) from None


def _limit(params: Mapping[str, Any]) -> int:
    limit = _integer(params.get("limit", DEFAULT_LIMIT), "limit")
    if not 1 <= limit <= MAX_LIMIT:
        raise Reply(stripe_error(400, "invalid_request_error",
                                 f"This value must be between 1 and {MAX_LIMIT}.",
                                 code="parameter_invalid_integer", param="limit"))
    return limit


def _created_filter(value: Any) -> Callable[[int], bool]:
    if value is None:
        return lambda c: True
    if not isinstance(value, dict):
        at = _integer(value, "created")
        return lambda c: c == at
    ops: dict[str, Callable[[int, int], bool]] = {
        "gt": lambda c, v: c > v, "gte": lambda c, v: c >= v,
        "lt": lambda c, v: c < v, "lte": lambda c, v: c <= v}
    bounds = []
    for k, v in value.items():
        if k not in ops:
            raise Reply(stripe_error(400, "invalid_request_error",
                                     f"Received unknown parameter: created[{k}]",
                                     code="parameter_unknown", param=f"created[{k}]"))
        bounds.append((ops[k], _integer(v, f"created[{k}]")))
    return lambda c: all(op(c, v) for op, v in bounds)


def decode_params(items: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """Decodes Stripe's form/query encoding (``a[b]=v``, ``a[0]=v``) into nested dicts.

    Lists stay dicts keyed by index here (``metadata`` keys may be digits too); the few list
    parameters are turned into lists where they are used.
    """
    out: dict[str, Any] = {}
    for raw, value in items:
        m = re.fullmatch(r"([^\[\]]+)((?:\[[^\[\]]*\])*)", raw)
        if m is None:
            raise Reply(stripe_error(400, "invalid_request_error",
                                     f"Invalid parameter name: {raw}"))
        path = [m.group(1), *re.findall(r"\[([^\[\]]*)\]", m.group(2))]
        cur = out
        for part in path[:-1]:
            nxt = cur.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise Reply(stripe_error(400, "invalid_request_error",
                                         f"Invalid object: {raw}", param=path[0]))
            cur = nxt
        cur[path[-1]] = value
    return out


def _as_list(value: Any) -> list[Any] | None:
    if value is None:
        return None
    if isinstance(value, dict):
        return [value[k] for k in sorted(value, key=lambda k: int(k) if k.isdigit() else 0)]
    return [value]


# -- the search query language, the subset we emulate ------------------------------------------

_CLAUSE = re.compile(r"""\s*(?:
    metadata\[(?P<mq>['"])(?P<mkey>.+?)(?P=mq)\]\s*:\s*(?P<mvq>['"])(?P<mval>.*?)(?P=mvq)
  | (?P<field>status|currency|customer|description)\s*:\s*(?P<fq>['"])(?P<fval>.*?)(?P=fq)
  | (?P<num>amount|created)\s*(?P<op>>=|<=|:|>|<)\s*(?P<nval>-?\d+)
)\s*""", re.VERBOSE)


def parse_search(query: str) -> Callable[[dict[str, Any]], bool]:
    """Compiles a search ``query`` into a predicate over PaymentIntent objects.

    Raises:
        ValueError: outside the emulated subset (the message is Stripe-like).
    """
    joiners = re.findall(r"\s(AND|OR)\s", query)
    if len(set(joiners)) > 1:
        raise ValueError("Queries may combine clauses with AND or with OR, not both.")
    parts = re.split(r"\s(?:AND|OR)\s", query) if joiners else [query]
    preds: list[Callable[[dict[str, Any]], bool]] = []
    for part in parts:
        m = _CLAUSE.fullmatch(part)
        if m is None:
            raise ValueError(f"Invalid query: could not parse {part.strip()!r}.")
        preds.append(_clause(m))
    if joiners and joiners[0] == "OR":
        return lambda o: any(p(o) for p in preds)
    return lambda o: all(p(o) for p in preds)


_COMPARE: dict[str, Callable[[int, int], bool]] = {
    ":": lambda x, v: x == v, ">": lambda x, v: x > v, "<": lambda x, v: x < v,
    ">=": lambda x, v: x >= v, "<=": lambda x, v: x <= v}


def _clause(m: re.Match[str]) -> Callable[[dict[str, Any]], bool]:
    if m.group("mkey") is not None:
        key, value = m.group("mkey"), m.group("mval")
        return lambda o: o["metadata"].get(key) == value
    if m.group("field") is not None:
        name, text = m.group("field"), m.group("fval")
        return lambda o: o.get(name) == text
    num, compare, bound = m.group("num"), _COMPARE[m.group("op")], int(m.group("nval"))
    return lambda o: compare(o[num], bound)


def _random_id(n: int) -> str:
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(n))


def _request_id() -> str:
    return "req_" + _random_id(14)
