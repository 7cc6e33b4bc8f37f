"""The PaymentIntents routes.

Create (validated, then executed under the idempotency rules), retrieve, list (a consistent
read) and search (eventually consistent: ``search_lag``)."""

from __future__ import annotations

import base64
import json
import re
import time
from typing import Any

from aiohttp import web

from staging.core import Reply
from staging.stripe.accounts import PERM_READ, PERM_WRITE, key_of, livemode
from staging.stripe.clocks import StripeClock
from staging.stripe.idempotency import IdempotencyReplay, Remembered
from staging.stripe.objects import (
    AccountData,
    ExecutionError,
    Intent,
    payment_intent_object,
    random_id,
)
from staging.stripe.params import (
    CREATE_PARAMS,
    LIST_PARAMS,
    SEARCH_PARAMS,
    UPDATE_PARAMS,
    created_filter,
    decode_params,
    integer,
    no_unknown,
    page_limit,
)
from staging.stripe.responses import no_such, stripe_error, stripe_json
from staging.stripe.search import parse_search

MAX_AMOUNT = 99_999_999  # Stripe's ceiling: eight digits in minor units
# Stripe's minimum charge amounts for a few common currencies, in minor units; others need >= 1.
MIN_AMOUNT = {"usd": 50, "eur": 50, "gbp": 30, "cad": 50, "aud": 50, "chf": 50, "jpy": 50}
METADATA_LIMITS = (50, 40, 500)  # keys per object, characters per key, characters per value


class PaymentIntentRoutes(IdempotencyReplay, StripeClock):
    """The handlers of ``/v1/payment_intents``."""

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
                state.keys[key] = Remembered(fingerprint, time.time())
        try:
            fault = await self.before_write(request, "payment_intents.create")
        except BaseException:
            self._forget(state, key)  # failed in front of the endpoint: nothing to remember
            raise
        failure = self._take_execution_error()
        if failure is None or failure.commit:
            try:
                response = self._create(state, create, key, live=livemode(key_of(request)))
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
        no_unknown(params, CREATE_PARAMS)
        for required in ("amount", "currency"):
            if required not in params:
                raise Reply(stripe_error(400, "invalid_request_error",
                                         f"Missing required param: {required}.",
                                         code="parameter_missing", param=required))
        amount = integer(params["amount"], "amount")
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

    def _create(self, state: AccountData, p: dict[str, Any], key: str | None, *,
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
        pi_id = "pi_" + random_id(24)
        obj = payment_intent_object(pi_id, p, created=int(self.now()), livemode=live)
        with self.staging.lock:
            state.seq += 1
            state.intents[pi_id] = Intent(obj, now, state.seq)
        self.record("payment_intents.create", key, id=pi_id, amount=amount, currency=currency,
                    customer=customer, metadata=dict(obj["metadata"]))
        return stripe_json(obj)

    async def _h_update(self, request: web.Request) -> web.Response:
        """``POST /v1/payment_intents/{id}``: what a person's edit in the Dashboard does too.

        Metadata is merged, a key set to "" is removed (Stripe's rule for metadata)."""
        state = self._state_for(request, self.authorize(request, PERM_WRITE))
        params = decode_params((k, v) for k, v in (await request.post()).items()
                               if isinstance(v, str))
        no_unknown(params, UPDATE_PARAMS)
        fault = await self.before_write(request, "payment_intents.update")
        with self.staging.lock:
            intent = state.intents.get(request.match_info["intent"])
            if intent is None:
                raise Reply(no_such(request.match_info["intent"], "intent", 404))
            obj = intent.obj
            if "amount" in params:
                obj["amount"] = integer(params["amount"], "amount")
            for name in ("currency", "description", "receipt_email"):
                if name in params:
                    obj[name] = str(params[name]).lower() if name == "currency" else params[name]
            metadata = params.get("metadata")
            if isinstance(metadata, dict):
                merged = {**obj["metadata"], **metadata}
                obj["metadata"] = {k: v for k, v in merged.items() if v != ""}
        self.record("payment_intents.update", request.headers.get("Idempotency-Key"),
                    id=obj["id"], changed=sorted(params))
        response = stripe_json(obj)
        self.after_commit(request, fault)
        return response

    async def _h_retrieve(self, request: web.Request) -> web.Response:
        state = self._state_for(request, self.authorize(request, PERM_READ, PERM_WRITE))
        await self.before_write(request, "payment_intents.retrieve")
        no_unknown(decode_params(request.query.items()), {"client_secret", "expand"})
        intent = state.intents.get(request.match_info["intent"])
        if intent is None:
            raise Reply(no_such(request.match_info["intent"], "intent", 404))
        return stripe_json(intent.obj)

    async def _h_list(self, request: web.Request) -> web.Response:
        state = self._state_for(request, self.authorize(request, PERM_READ, PERM_WRITE))
        await self.before_write(request, "payment_intents.list")
        params = decode_params(request.query.items())
        no_unknown(params, LIST_PARAMS)
        limit = page_limit(params)
        created = created_filter(params.get("created"))
        customer = params.get("customer")
        with self.staging.lock:
            ordered = sorted(state.intents.values(), key=lambda i: (-i.obj["created"],
                                                                         -i.seq))
        ids = [i.obj["id"] for i in ordered]
        if "starting_after" in params or "ending_before" in params:
            cursor_param = "starting_after" if "starting_after" in params else "ending_before"
            cursor = params[cursor_param]
            if cursor not in ids:
                raise Reply(no_such(cursor, cursor_param, 400))
            at = ids.index(cursor)
            window = ordered[at + 1:] if cursor_param == "starting_after" else ordered[:at]
        else:
            cursor_param, window = "", ordered
        hits = [i.obj for i in window
                if created(i.obj["created"]) and (customer is None or
                                                  i.obj["customer"] == customer)]
        page = hits[-limit:] if cursor_param == "ending_before" else hits[:limit]
        return stripe_json({"object": "list", "data": page, "has_more": len(hits) > limit,
                      "url": "/v1/payment_intents"})

    async def _h_search(self, request: web.Request) -> web.Response:
        state = self._state_for(request, self.authorize(request, PERM_READ, PERM_WRITE))
        await self.before_write(request, "payment_intents.search")
        params = decode_params(request.query.items())
        no_unknown(params, SEARCH_PARAMS)
        if "query" not in params:
            raise Reply(stripe_error(400, "invalid_request_error",
                                     "Missing required param: query.",
                                     code="parameter_missing", param="query"))
        try:
            match = parse_search(str(params["query"]))
        except ValueError as e:
            raise Reply(stripe_error(400, "invalid_request_error", str(e),
                                     param="query")) from None
        limit = page_limit(params)
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
        return stripe_json({"object": "search_result", "data": page, "has_more": more,
                      "next_page": base64.urlsafe_b64encode(str(start + limit).encode()).decode()
                      if more else None,
                      "url": "/v1/payment_intents/search"})
