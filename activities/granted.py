"""Per-task credentials on the wire, for the Google clients.

While an activity acts for a task (``acting_for``), every request of a granted client presents
that task's grant from the broker (tidemark.grants) instead of the worker's own credential.

Outside ``acting_for`` (binding a worker, identity checks) a client presents its base
credential. The base credential comes from a credential source (tidemark.credentials) that
refreshes it before it expires. After a 401 each client renews it once and resends (see
``GrantedCredentials`` and probes.graph.RenewOnUnauthorized for why that is safe for writes). An
awaited request (``RenewingHttp.request_async``, probes.google_async) does the same with the
wait on the event loop and the grant's reads and renewal on worker threads. Wired here for the
Google clients (Drive, Gmail: their credentials object is asked on every request), on
google-auth's classes: this module needs the ``google`` extra. ``acting_for`` and the Stripe and
Graph clients' side live in activities/acting.py, which a worker imports whatever is installed
(docs/install.md).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import google_auth_httplib2
from google.oauth2.credentials import Credentials

from activities.acting import _ACTING, acting_for
from probes.google_async import send
from tidemark.credentials import CredentialSource, StaticToken
from tidemark.grants import Minter
from tidemark.words import GrantScope

__all__ = ["GrantedCredentials", "RenewingHttp", "acting_for", "granted_google"]


class GrantedCredentials(Credentials):
    """google-auth credentials that present the acting task's grant, per request.

    The grant comes from the broker, issued for the source's current base token. Outside
    ``acting_for`` they present that base token.

    After a 401, ``RenewingHttp`` asks ``renew``, which renews the base token (unless another
    request did) and asks the broker again; it then resends once with what is fresh. A revoked
    grant makes the broker raise ``Unauthorized`` there (the task stops). With nothing fresh to
    offer (a static token, a grant the provider refused for its own reasons) the 401 stands, and
    the client maps it as before, without a second request. Resending is safe for writes too:
    Google checks the bearer token before it processes a request, and a 401 says the request was
    not processed (Google API errors: 401 ``authError``, "Invalid Credentials … refresh the
    access token"; RFC 6750 section 3.1). google-auth's own transports resend any request after
    a 401 by default (``DEFAULT_REFRESH_STATUS_CODES``)."""

    def __init__(self, source: CredentialSource, target: str, scope: GrantScope,
                 minter: Minter) -> None:
        super().__init__(None)
        self._source, self._target, self._scope, self._minter = source, target, scope, minter
        self._sent = threading.local()  # what this thread's last request presented

    def before_request(self, request: Any, method: str, url: str,
                       headers: dict[str, str]) -> None:
        self.apply(headers)

    def _present(self, base: str) -> str:
        acting = _ACTING.get()
        if acting is None:
            return base
        broker, task_id, purpose = acting
        return broker.token(task_id, self._target, self._scope, base, self._minter, purpose)

    def apply(self, headers: dict[str, str], token: str | None = None) -> None:
        if token is None:
            base = self._source.token()
            token = self._present(base)
            self._sent.base, self._sent.token = base, token
        super().apply(headers, token)

    def sent(self) -> tuple[str, str] | None:
        """(base token, token presented) of this thread's last request; None before any."""
        base = getattr(self._sent, "base", None)
        return None if base is None else (base, self._sent.token)

    def renew(self) -> bool:
        """After a 401, renews the base token this thread presented and asks the broker again.

        True when there is a fresh token to resend with. Raises ``Unauthorized`` when the task's
        grant was revoked."""
        sent = self.sent()
        return sent is not None and self.renew_from(*sent)

    def renew_from(self, stale_base: str, presented: str) -> bool:
        """``renew`` for a request that presented ``presented``, issued for ``stale_base``.

        It serves an awaited request, whose authorizing and renewing may run on different
        threads."""
        return self._present(self._source.renew(stale_base)) != presented


class RenewingHttp(google_auth_httplib2.AuthorizedHttp):
    """An AuthorizedHttp that resends once after a 401, given a fresh token.

    The fresh token comes from its GrantedCredentials. Without one it returns the 401 as it came
    (the caller maps it)."""

    credentials: GrantedCredentials

    def request(self, uri: str, method: str = "GET", body: Any = None, headers: Any = None,
                **kwargs: Any) -> Any:
        response, content = super().request(uri, method, body, headers, **kwargs)
        if response.status != 401 or not self.credentials.renew():
            return response, content
        # Safe for writes: a 401 was not processed (see GrantedCredentials).
        return super().request(uri, method, body, headers, **kwargs)

    async def request_async(self, uri: str, method: str, body: bytes | str | None,
                            headers: dict[str, str]) -> tuple[Any, bytes]:
        """``request``, awaited (probes.google_async).

        The request waits on the event loop. Presenting and renewing the grant read the journal,
        so they run on worker threads."""
        response, content, sent = await self._send_async(uri, method, body, headers)
        if response.status != 401 or not await asyncio.to_thread(self.credentials.renew_from,
                                                                  *sent):
            return response, content
        # Safe for writes: a 401 was not processed (see GrantedCredentials).
        response, content, _ = await self._send_async(uri, method, body, headers)
        return response, content

    async def _send_async(self, uri: str, method: str, body: bytes | str | None,
                          headers: dict[str, str]) -> tuple[Any, bytes, tuple[str, str]]:
        request_headers = dict(headers)
        sent = await asyncio.to_thread(self._authorize, method, uri, request_headers)
        response, content = await send(self.http, uri, method, body, request_headers)
        return response, content, sent

    def _authorize(self, method: str, uri: str, headers: dict[str, str]) -> tuple[str, str]:
        """Applies the credentials to ``headers``; returns what they presented.

        What they presented is read on the thread that applied them (the credentials remember it
        per thread)."""
        self.credentials.before_request(self._request, method, uri, headers)
        sent = self.credentials.sent()
        assert sent is not None  # apply() without a token records what it presented
        return sent


def granted_google(service: Any, target: str, scope: GrantScope, minter: Minter,
                   source: CredentialSource | None = None) -> Any:
    """Makes a google_service Resource present per-task grants.

    The grants are for the base tokens of ``source`` (default: the static token the service was
    built with). After a 401 it resends once with a renewed token."""
    old = service._http  # google_auth_httplib2.AuthorizedHttp
    credentials = GrantedCredentials(source or StaticToken(old.credentials.token), target, scope,
                                     minter)
    service._http = RenewingHttp(credentials, http=old.http, refresh_status_codes=())
    return service
