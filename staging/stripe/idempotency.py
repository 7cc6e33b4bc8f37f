"""Stripe's idempotency for v1 POSTs.

A key is remembered with the endpoint, the parameters and the answer once execution begins. The
same key replays that answer (errors included), other parameters get 400, and a twin of a
request still executing gets 409. A key older than the ``idempotency_ttl_s`` switch is
forgotten."""

from __future__ import annotations

import time
from dataclasses import dataclass

from aiohttp import web

from staging.core import Reply
from staging.stripe.accounts import StripeAccounts
from staging.stripe.objects import AccountData
from staging.stripe.responses import request_id, stripe_error

MAX_IDEMPOTENCY_KEY = 255  # characters, Stripe's documented limit


@dataclass
class Remembered:
    """What Stripe keeps for one idempotency key."""

    fingerprint: str
    at: float
    status: int | None = None  # None while the first request is still executing
    body: bytes = b""
    request_id: str = ""


class IdempotencyReplay(StripeAccounts):
    """Remembers, replays and forgets the answers of requests with an Idempotency-Key."""

    def _remembered(self, state: AccountData, key: str, fingerprint: str) -> web.Response | None:
        """The answer for a key seen before.

        A replay, a 400 for other parameters, or a 409 while the first request runs. None for a
        new (or pruned) key."""
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
                                     "Request-Id": request_id()})

    def _remember(self, state: AccountData, key: str | None, response: web.Response) -> None:
        if key is None:
            return
        response.headers["Idempotency-Key"] = key
        body = response.body if isinstance(response.body, bytes) else b""
        with self.staging.lock:
            seen = state.keys.get(key)
            if seen is not None:
                seen.status, seen.body = response.status, body
                seen.request_id = response.headers.get("Request-Id", "")

    def _forget(self, state: AccountData, key: str | None) -> None:
        if key is not None:
            with self.staging.lock:
                state.keys.pop(key, None)
