"""Per-task credentials on the wire: while an activity acts for a task (``acting_for``), every
request of a granted client presents that task's grant from the broker (tidemark.grants)
instead of the worker's own credential.

Outside ``acting_for`` (binding a worker, identity checks) a client presents its base
credential. Wired for the Google clients (Drive, Gmail: their credentials object is asked on
every request), the Stripe client (its HTTP client's ``request`` sets the header) and the Graph
client (its token provider; the coroutine submitted to the client's loop thread carries the
submitting thread's context, ``acting_for`` included).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

from google.oauth2.credentials import Credentials

from tidemark.grants import GrantBroker, Minter

_ACTING: contextvars.ContextVar[tuple[GrantBroker, str] | None] = contextvars.ContextVar(
    "tidemark_acting_for", default=None)


@contextlib.contextmanager
def acting_for(broker: GrantBroker | None, task_id: str) -> Iterator[None]:
    """Every granted call made in this block (this thread) presents ``task_id``'s grant."""
    if broker is None:
        yield
        return
    reset = _ACTING.set((broker, task_id))
    try:
        yield
    finally:
        _ACTING.reset(reset)


class GrantedCredentials(Credentials):
    """google-auth credentials that ask the broker for the acting task's token per request."""

    def __init__(self, base: str, target: str, scope: str, minter: Minter) -> None:
        super().__init__(base)
        self._base, self._target, self._scope, self._minter = base, target, scope, minter

    def apply(self, headers: dict[str, str], token: str | None = None) -> None:
        acting = _ACTING.get()
        if acting is not None and token is None:
            broker, task_id = acting
            token = broker.token(task_id, self._target, self._scope, self._base, self._minter)
        super().apply(headers, token)


def granted_google(service: Any, target: str, scope: str, minter: Minter) -> Any:
    """Makes a google_service Resource present per-task grants (its base token stays the
    worker's)."""
    http = service._http  # google_auth_httplib2.AuthorizedHttp
    http.credentials = GrantedCredentials(http.credentials.token, target, scope, minter)
    return service


def granted_stripe(client: Any, target: str, scope: str, minter: Minter) -> Any:
    """Makes a stripe.StripeClient present per-task grants: every request's bearer key is the
    acting task's grant (the key the client was built with stays the worker's base)."""
    http = client._requestor._client  # the stripe.RequestsClient every request goes through
    send = http.request

    def request(method: str, url: str, headers: Any, post_data: Any = None) -> Any:
        acting = _ACTING.get()
        if acting is not None:
            broker, task_id = acting
            headers = dict(headers or {})
            base = str(headers.get("Authorization", "")).removeprefix("Bearer ").strip()
            headers["Authorization"] = "Bearer " + broker.token(task_id, target, scope, base,
                                                                minter)
        return send(method, url, headers, post_data)

    http.request = request
    return client


class GrantedTokenProvider:
    """A kiota AccessTokenProvider that hands out the acting task's grant, for the hosts the
    wrapped provider would serve."""

    def __init__(self, inner: Any, target: str, scope: str, minter: Minter) -> None:
        self._inner, self._target, self._scope, self._minter = inner, target, scope, minter

    async def get_authorization_token(self, uri: str,
                                      additional_authentication_context: dict[str, Any] | None
                                      = None) -> str:
        base = await self._inner.get_authorization_token(uri, additional_authentication_context)
        acting = _ACTING.get()
        if not base or acting is None:
            return str(base)
        broker, task_id = acting
        return await asyncio.to_thread(broker.token, task_id, self._target, self._scope, base,
                                       self._minter)

    def get_allowed_hosts_validator(self) -> Any:
        return self._inner.get_allowed_hosts_validator()


def granted_graph(client: Any, target: str, scope: str, minter: Minter) -> Any:
    """Makes a probes.graph.GraphClient present per-task grants."""
    auth = client.service.request_adapter._authentication_provider
    auth.access_token_provider = GrantedTokenProvider(auth.access_token_provider, target, scope,
                                                      minter)
    return client
