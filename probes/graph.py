"""Read-only side of ``graph.send_mail``: the Graph client and the probe that finds our message.

``sendMail`` answers 202: the message is accepted and queued, not yet sent. It waits in Drafts
or the Outbox and later moves to Sent Items under a new id; a person, a rule or a retention
policy may move the sent copy on to Deleted Items before a late resume probes. The key travels
as a single-value extended property (which every copy keeps; Exchange drops internet headers
from the Sent Items copy), so the probe filters each folder by that property. Finding the
message anywhere means we submitted it, and that is what decides whether sending again would
duplicate it.

The probe needs a ``Mail.Read`` token. msgraph-sdk is async while actions are called from worker
threads; every call runs on a private event loop in its own thread (:class:`EventLoopThread`), so
it works whatever loop, if any, the calling thread or process runs.
"""

from __future__ import annotations

import asyncio
import threading
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
from kiota_abstractions.api_error import APIError
from kiota_abstractions.authentication import (
    AccessTokenProvider,
    AllowedHostsValidator,
    BaseBearerTokenAuthenticationProvider,
)
from kiota_abstractions.base_request_configuration import RequestConfiguration
from kiota_http.middleware.options import RetryHandlerOption, UrlReplaceHandlerOption
from msgraph import GraphRequestAdapter, GraphServiceClient
from msgraph.generated.users.item.mail_folders.item.messages.messages_request_builder import (
    MessagesRequestBuilder,
)
from msgraph_core import GraphClientFactory

from tidemark.actions import ProbeResult, StepContext

# The namespace of our named extended property. Fixed forever: a probe finds a key only in the
# namespace it was written in, so a new GUID would orphan every key already stamped into
# mailboxes. (Random once, when the property was introduced; it means nothing else.)
KEY_PROPERTY_GUID = "5b1f2c7e-8a43-4d0e-9f6b-2c71d3a9e804"
KEY_PROPERTY_ID = f"String {{{KEY_PROPERTY_GUID}}} Name tidemark_key"
KEY_HEADER = "x-tidemark-key"

# Along the path a message takes, so that one moving on between two reads is read again in
# the later folder: reading Sent Items first could miss a message that leaves the Outbox after
# Sent Items was read and before the Outbox is. Deleted Items comes last: a sent copy can be
# moved there, and a probe that did not look would answer "absent" and send the mail again.
FOLDERS = ("drafts", "outbox", "sentitems", "deleteditems")
SUBMITTED_FOLDERS = ("drafts", "outbox")
PAGE_SIZE = 10  # a key matches one message; more than one is a duplicate already, 10 shows it
DEFAULT_TIMEOUT_S = 30.0  # generous for one mail; Graph itself gives up on requests after ~100 s
LOOP_MARGIN_S = 5.0  # beyond a call's own timeout, in case the loop thread itself is stuck

T = TypeVar("T")


class StaticTokenProvider(AccessTokenProvider):
    """Hands kiota a fixed bearer token, and only for the hosts of ``base_url``.

    azure-identity's credentials refuse plain http except on localhost; a static token works
    against staging and in production alike (the token comes from configuration).
    """

    def __init__(self, token: str, hosts: list[str]) -> None:
        self._token = token
        self._validator = AllowedHostsValidator(hosts)

    async def get_authorization_token(self, uri: str,
                                      additional_authentication_context: dict[str, Any] | None
                                      = None) -> str:
        # Never hand the token to a host we were not configured for.
        return self._token if self._validator.is_url_host_valid(uri) else ""

    def get_allowed_hosts_validator(self) -> AllowedHostsValidator:
        return self._validator


class EventLoopThread:
    """One event loop running in a daemon thread; coroutines are submitted from any thread.

    httpx's async client belongs to the loop it first ran on, so a client must always be used on
    the same loop; ``asyncio.run`` per call would need a new client per call and fails outright
    in a thread that already runs a loop.
    """

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="graph-client-loop")
        self._thread.start()

    def run(self, coro: Awaitable[T], timeout: float) -> T:
        """Runs ``coro`` on the loop and waits for it; raises TimeoutError after ``timeout``."""
        async def bounded() -> T:
            return await asyncio.wait_for(coro, timeout)
        future = asyncio.run_coroutine_threadsafe(bounded(), self._loop)
        # The loop enforces the timeout; the margin only guards against a loop that died.
        return future.result(timeout + LOOP_MARGIN_S)

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)


_shared_loop: EventLoopThread | None = None
_shared_lock = threading.Lock()


def shared_loop() -> EventLoopThread:
    """The process's one Graph client loop, started on first use."""
    global _shared_loop
    with _shared_lock:
        if _shared_loop is None:
            _shared_loop = EventLoopThread()
        return _shared_loop


@dataclass
class GraphClient:
    """A GraphServiceClient bound to the loop its coroutines run on."""

    service: GraphServiceClient
    http: httpx.AsyncClient
    loop: EventLoopThread
    timeout: float

    def call(self, request: Callable[[GraphServiceClient], Awaitable[T]]) -> T:
        """Runs one SDK call, e.g. ``client.call(lambda g: g.me.send_mail.post(body))``."""
        return self.loop.run(request(self.service), self.timeout)

    def close(self) -> None:
        """Closes the client's connections (the shared loop keeps running)."""
        self.loop.run(self.http.aclose(), self.timeout)


def graph_client(base_url: str, token: str, *, timeout: float = DEFAULT_TIMEOUT_S,
                 loop: EventLoopThread | None = None) -> GraphClient:
    """A Graph v1.0 client for ``base_url`` (``https://graph.microsoft.com`` or a staging URL).

    The SDK's retry handler is switched off: it resends a POST after 429/503/504, waiting as
    long as ``Retry-After`` says, and a 503 or 504 can arrive after the mail was accepted. A
    resent ``sendMail`` is a second mail; the step's probe decides instead.
    """
    base = base_url.rstrip("/")
    host = urllib.parse.urlsplit(base).hostname or ""
    options = {
        RetryHandlerOption.get_key(): RetryHandlerOption(max_retries=0, should_retry=False),
        # msgraph-sdk addresses /me as /users/me-token-to-replace and relies on this rewrite.
        UrlReplaceHandlerOption.get_key(): UrlReplaceHandlerOption(
            enabled=True, replacement_pairs={"/users/me-token-to-replace": "/me"}),
    }
    http = GraphClientFactory.create_with_default_middleware(
        client=httpx.AsyncClient(timeout=timeout), options=options)
    adapter = GraphRequestAdapter(
        BaseBearerTokenAuthenticationProvider(StaticTokenProvider(token, [host])), client=http)
    adapter.base_url = base + "/v1.0"
    return GraphClient(GraphServiceClient(request_adapter=adapter), http,
                       loop or shared_loop(), timeout)


def describe_error(e: BaseException) -> str:
    """A one-line account of a failed Graph call (never the token)."""
    if isinstance(e, APIError):
        error = getattr(e, "error", None)
        code = getattr(error, "code", None)
        message = getattr(error, "message", None) or e.message
        return f"Graph answered {e.response_status_code} {code or ''}: {message or ''}".strip()
    return f"{type(e).__name__}: {e}"


class GraphSendMailProbe:
    """Finds the message a ``graph.send_mail`` step submitted, by its extended property."""

    def __init__(self, reader: GraphClient) -> None:
        self.reader = reader

    def probe(self, ctx: StepContext) -> ProbeResult:
        """``done`` with ``state`` ``submitted`` (still in Drafts or the Outbox) or ``sent``
        (in Sent Items, or moved on to Deleted Items), the folder and the id; ``absent`` when
        no folder holds it; ``unknown`` when any folder could not be read."""
        for folder in FOLDERS:
            try:
                found = self._find(folder, ctx.key)
            except (APIError, httpx.HTTPError, TimeoutError, OSError) as e:
                return ProbeResult.unknown(f"cannot read {folder}: {describe_error(e)}")
            if found:
                first = found[0]
                observed = {"state": "submitted" if folder in SUBMITTED_FOLDERS else "sent",
                            "folder": folder, "id": first["id"],
                            "internetMessageId": first.get("internetMessageId"),
                            "copies": len(found)}
                return ProbeResult.done(observed, f"message with our key is in {folder}")
        return ProbeResult.absent(f"no message with {KEY_PROPERTY_ID} = {ctx.key} in "
                                  f"{', '.join(FOLDERS)}")

    def _find(self, folder: str, key: str) -> list[dict[str, Any]]:
        escaped = key.replace("'", "''")
        params = MessagesRequestBuilder.MessagesRequestBuilderGetQueryParameters(
            filter=(f"singleValueExtendedProperties/any(ep: ep/id eq '{KEY_PROPERTY_ID}' "
                    f"and ep/value eq '{escaped}')"),
            expand=[f"singleValueExtendedProperties($filter=id eq '{KEY_PROPERTY_ID}')"],
            select=["id", "subject", "internetMessageId", "sentDateTime", "parentFolderId"],
            top=PAGE_SIZE)
        config = RequestConfiguration(query_parameters=params)
        page = self.reader.call(lambda g: g.me.mail_folders.by_mail_folder_id(folder)
                                .messages.get(request_configuration=config))
        found = []
        for m in (page.value if page is not None and page.value else []):
            # Check the value ourselves too: a service that ignored the filter must not make
            # somebody else's message count as ours.
            props = m.single_value_extended_properties or []
            if any(p.value == key and (p.id or "").lower() == KEY_PROPERTY_ID.lower()
                   for p in props):
                found.append({"id": m.id, "internetMessageId": m.internet_message_id})
        return found
