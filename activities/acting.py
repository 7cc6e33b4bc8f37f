"""Per-task credentials on the wire, without a provider's library.

``acting_for`` marks the task a thread acts for. The Stripe and Microsoft Graph clients are made
to present that task's grant from the broker (tidemark.grants) on every request. The Google
clients' side, built on google-auth's classes, is activities/granted.py.

The worker's activities import this module whatever is installed: a worker of a base install
(no provider's extra, docs/install.md) runs fs.rename with it. The clients are handed in, never
imported here.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Iterator
from typing import Any

from tidemark.grants import GrantBroker, Minter
from tidemark.words import GrantPurpose, GrantScope

_ACTING: contextvars.ContextVar[tuple[GrantBroker, str, GrantPurpose] | None] = \
    contextvars.ContextVar("tidemark_acting_for", default=None)


@contextlib.contextmanager
def acting_for(broker: GrantBroker | None, task_id: str,
               purpose: GrantPurpose = GrantPurpose.RUN) -> Iterator[None]:
    """Makes every granted call in this block present ``task_id``'s grant.

    The block is this thread's. The grant is for ``purpose`` (``run``: its steps; ``undo``: the
    compensations of a person's unwind)."""
    if broker is None:
        yield
        return
    reset = _ACTING.set((broker, task_id, purpose))
    try:
        yield
    finally:
        _ACTING.reset(reset)


def granted_stripe(client: Any, target: str, scope: GrantScope, minter: Minter) -> Any:
    """Makes a stripe.StripeClient present per-task grants.

    Every request's bearer key is the acting task's grant (the key the client was built with
    stays the worker's base). This holds in its blocking calls (``request``) and in its
    ``*_async`` ones (``request_async``, which reads the grant in a thread: the broker reads
    Postgres)."""
    http = client._requestor._client  # the stripe.RequestsClient every request goes through
    send, send_async = http.request, http.request_async

    def present(headers: Any) -> Any:
        acting = _ACTING.get()
        if acting is None:
            return headers
        broker, task_id, purpose = acting
        headers = dict(headers or {})
        base = str(headers.get("Authorization", "")).removeprefix("Bearer ").strip()
        headers["Authorization"] = "Bearer " + broker.token(task_id, target, scope, base,
                                                            minter, purpose)
        return headers

    def request(method: str, url: str, headers: Any, post_data: Any = None) -> Any:
        return send(method, url, present(headers), post_data)

    async def request_async(method: str, url: str, headers: Any, post_data: Any = None) -> Any:
        if _ACTING.get() is not None:  # to_thread copies the context, and with it _ACTING
            headers = await asyncio.to_thread(present, headers)
        return await send_async(method, url, headers, post_data)

    http.request, http.request_async = request, request_async
    return client


class GrantedTokenProvider:
    """A kiota AccessTokenProvider that hands out the acting task's grant.

    It does so for the hosts the wrapped provider would serve. ``renew`` (asked by
    probes.graph.RenewOnUnauthorized after a 401) renews the base token the refused grant was
    issued for and asks the broker again."""

    def __init__(self, inner: Any, target: str, scope: GrantScope, minter: Minter) -> None:
        self._inner, self._target, self._scope, self._minter = inner, target, scope, minter
        self._base_of: dict[str, str] = {}  # recent presented token -> its base
        self._lock = threading.Lock()

    async def get_authorization_token(self, uri: str,
                                      additional_authentication_context: dict[str, Any] | None
                                      = None) -> str:
        base = await self._inner.get_authorization_token(uri, additional_authentication_context)
        if not base:
            return str(base)
        return await self._present(str(base))

    async def _present(self, base: str) -> str:
        acting = _ACTING.get()
        if acting is None:
            return base
        broker, task_id, purpose = acting
        token = await asyncio.to_thread(broker.token, task_id, self._target, self._scope, base,
                                        self._minter, purpose)
        with self._lock:
            if len(self._base_of) > 256:
                self._base_of.clear()
            self._base_of[token] = base
        return str(token)

    async def renew(self, stale: str) -> str:
        with self._lock:
            base = self._base_of.get(stale, stale)
        renew = getattr(self._inner, "renew", None)
        fresh_base = await renew(base) if renew is not None else base
        return await self._present(str(fresh_base))

    def get_allowed_hosts_validator(self) -> Any:
        return self._inner.get_allowed_hosts_validator()


def granted_graph(client: Any, target: str, scope: GrantScope, minter: Minter) -> Any:
    """Makes a probes.graph.GraphClient present per-task grants."""
    auth = client.service.request_adapter._authentication_provider
    auth.access_token_provider = GrantedTokenProvider(auth.access_token_provider, target, scope,
                                                      minter)
    return client
