"""Read-only side of ``graph.send_mail``: the Graph client and the probe that finds our message.

The step creates a draft stamped with its key, journals the draft's id and internetMessageId,
then sends that draft by id (see activities/graph.py). Done means *submitted*: the message left
Drafts. After the send it waits in the Outbox, reaches Sent Items under a new id, and from there
a person, an inbox rule, the Archive button or a retention policy may move it anywhere, even
into Recoverable Items once Deleted Items is emptied. The key travels as a single-value extended
property (every copy keeps it; Exchange drops internet headers from the sent copy), so the probe
filters ``/me/messages`` (every folder of the mailbox) by that property, then Recoverable Items
(``recoverableitemsdeletions``), which ``/me/messages`` does not list.

Graph answers a send with ``202`` once the message is saved; transport picks it up later, and
only then does the store move it from Drafts to Sent Items ("Send mail by using the Microsoft
Graph API", steps 1-4, with no bound on the wait). Meanwhile the message is in Drafts under its
draft id and ``isDraft`` is still true: only PR_MESSAGE_FLAGS (``Integer 0x0E07``) tells it from
a plain draft, by its mfSubmitted bit (0x4, [MS-OXCMSG] 2.2.1.6). So the probe asks for that
property with our key's, and a copy carrying the bit is submitted wherever it is; a draft of
ours whose flags it cannot read is *unknown*, never *absent*. Nor is a draft whose send the
journal marked as requested (``StepContext.sent_at``): Microsoft documents that bit nowhere, and
"notify transport" comes after the 202, so a draft without it may be on its way out.

Only our own copy counts: keys are predictable from the plan, and anyone can mail the mailbox a
message carrying our header and property. A copy is ours when it is submitted (flagged
submitted, in the Outbox, or out of Drafts and no longer a draft) and carries the
internetMessageId of the draft we journaled, which Exchange assigned when the draft was created
and nobody outside the mailbox could know before we sent it. PR_MESSAGE_FLAGS is computed by
the store and not transmitted, so an inbound message cannot bring the bit with it.

The probe needs a token with ``Mail.Read`` and ``User.Read``. msgraph-sdk is async while actions
are called from worker threads; every call runs on a private event loop in its own thread
(:class:`EventLoopThread`), so it works whatever loop, if any, the calling thread or process runs.
A caller on an event loop of its own awaits the call instead (``GraphClient.call_async``): its
loop waits for the client loop's answer without a thread. The reads of the probe (and the send
sequence of activities/graph.py) are written once, as coroutines that reach Graph through a
:class:`Calls`: ``BLOCKING`` for the step threads, ``AWAITING`` for the caller's loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import threading
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

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
from msgraph.generated.models.message import Message
from msgraph.generated.models.o_data_errors.o_data_error import ODataError
from msgraph.generated.users.item.mail_folders.item.messages.messages_request_builder import (
    MessagesRequestBuilder as FolderMessagesRequestBuilder,
)
from msgraph.generated.users.item.messages.item.message_item_request_builder import (
    MessageItemRequestBuilder,
)
from msgraph.generated.users.item.messages.messages_request_builder import (
    MessagesRequestBuilder,
)
from msgraph_core import GraphClientFactory

from tidemark.actions import ProbeResult, StepContext
from tidemark.credentials import CredentialSource, StaticToken
from tidemark.errors import ConfigError
from tidemark.reads import Transient, blocking, retried_with, retry_after_s
from tidemark.wire import httpcore_trace

# The namespace of our named extended property. Fixed forever: a probe finds a key only in the
# namespace it was written in, so a new GUID would orphan every key already stamped into
# mailboxes. (Random once, when the property was introduced; it means nothing else.)
KEY_PROPERTY_GUID = "5b1f2c7e-8a43-4d0e-9f6b-2c71d3a9e804"
KEY_PROPERTY_ID = f"String {{{KEY_PROPERTY_GUID}}} Name tidemark_key"
KEY_HEADER = "x-tidemark-key"
# PR_MESSAGE_FLAGS (PidTagMessageFlags) as a Graph single-value extended property, and its
# mfSubmitted bit: "marked for sending as a result of a call to the RopSubmitMessage ROP"
# ([MS-OXCMSG] 2.2.1.6). Set from the send until transport takes the message out of Drafts.
MESSAGE_FLAGS_ID = "Integer 0x0E07"
MSGFLAG_SUBMIT = 0x4

# Well-known folders the probe names in what it observed; "drafts" and "outbox" also decide
# whether a copy was submitted. A mailbox without an Archive folder simply has none of them.
NAMED_FOLDERS = ("drafts", "outbox", "sentitems", "deleteditems", "inbox", "archive",
                 "recoverableitemsdeletions")
# Read after /me/messages: a copy only ever moves from Deleted Items into Recoverable Items, so
# one that moves between the two reads is seen by the first or by the second.
RECOVERABLE = "recoverableitemsdeletions"
PAGE_SIZE = 100  # forged copies can be many; every page is read
MAX_PAGES = 20  # beyond 2,000 messages with our key the probe gives up: unknown
TIMEOUT_ENV = "TIDEMARK_GRAPH_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 30.0  # generous for one mail; Graph itself gives up on requests after ~100 s
LOOP_MARGIN_S = 5.0  # beyond a call's own timeout, in case the loop thread itself is stuck

T = TypeVar("T")


class SourceTokenProvider(AccessTokenProvider):
    """Hands kiota the current token of a credential source (tidemark.credentials).

    It does so only for the hosts of ``base_url``; ``renew`` is asked after the provider refused
    a token.

    The token comes from our own source rather than azure-identity's kiota provider, for two
    reasons. The grant broker stands between the source and every request
    (activities/granted.py), and a static token (staging, tests) must work too."""

    def __init__(self, source: CredentialSource, hosts: list[str]) -> None:
        self._source = source
        self._validator = AllowedHostsValidator(hosts)

    async def get_authorization_token(self, uri: str,
                                      additional_authentication_context: dict[str, Any] | None
                                      = None) -> str:
        # Never hand the token to a host we were not configured for.
        if not self._validator.is_url_host_valid(uri):
            return ""
        return await asyncio.to_thread(self._source.token)

    async def renew(self, stale: str) -> str:
        """A fresh token after ``stale`` was refused (``stale`` itself if none can be had)."""
        return await asyncio.to_thread(self._source.renew, stale)

    def get_allowed_hosts_validator(self) -> AllowedHostsValidator:
        return self._validator


class StaticTokenProvider(SourceTokenProvider):
    """A fixed bearer token (staging, tests, a token kept fresh elsewhere)."""

    def __init__(self, token: str, hosts: list[str]) -> None:
        super().__init__(StaticToken(token), hosts)


class RenewOnUnauthorized(httpx.AsyncBaseTransport):
    """Sends a request once more after a 401, given a fresh token.

    That is when Graph answered 401 and the token provider has a fresh token for it. The token
    may be an access token that expired or was revoked early, or a per-task grant that was
    re-issued for a refreshed base. A provider that has nothing fresh leaves the 401 as it is,
    and the step's error handling takes it as ``Unauthorized``.

    Resending is safe for every method, writes included. Graph authenticates the bearer token
    before it routes the request, and a 401 means the request was not processed ("Required
    authentication information is either missing or not valid for the resource", Microsoft Graph
    error responses; RFC 6750 section 3.1, ``invalid_token``). kiota itself resends any request
    after a 401 carrying a claims challenge, and Google's transports after any 401."""

    def __init__(self, inner: httpx.AsyncBaseTransport,
                 auth: BaseBearerTokenAuthenticationProvider) -> None:
        self._inner = inner
        self._auth = auth  # its access_token_provider may be swapped later (granted_graph)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        # tidemark.wire.at_wire_async runs on the open connection, just before the request is
        # written to it (the resend after a 401 included).
        request.extensions = {**request.extensions, "trace": httpcore_trace(
            request.method, request.extensions.get("trace"))}
        response = await self._inner.handle_async_request(request)
        if response.status_code != 401:
            return response
        renew = getattr(self._auth.access_token_provider, "renew", None)
        presented = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if renew is None or not presented:
            return response
        fresh = await renew(presented)
        if not fresh or fresh == presented:
            return response
        await response.aclose()
        request.headers["Authorization"] = "Bearer " + fresh
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


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

    def _submit(self, coro: Awaitable[T], timeout: float) -> concurrent.futures.Future[T]:
        async def bounded() -> T:
            return await asyncio.wait_for(coro, timeout)
        return asyncio.run_coroutine_threadsafe(bounded(), self._loop)

    def run(self, coro: Awaitable[T], timeout: float) -> T:
        """Runs ``coro`` on the loop and waits for it; raises TimeoutError after ``timeout``."""
        # The loop enforces the timeout; the margin only guards against a loop that died.
        return self._submit(coro, timeout).result(timeout + LOOP_MARGIN_S)

    async def run_async(self, coro: Awaitable[T], timeout: float) -> T:
        """``run`` for a caller on an event loop of its own.

        That loop awaits the answer, with no thread waiting for it. Cancelling the caller (or
        the margin running out) cancels the coroutine on this loop too, so a call given up on is
        not left running."""
        future = asyncio.wrap_future(self._submit(coro, timeout))
        return await asyncio.wait_for(future, timeout + LOOP_MARGIN_S)

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

    async def call_async(self, request: Callable[[GraphServiceClient], Awaitable[T]]) -> T:
        """``call`` awaited from another event loop.

        The SDK call still runs on the client's loop (its httpx client belongs there), and the
        caller's loop waits without a thread."""
        return await self.loop.run_async(request(self.service), self.timeout)

    def close(self) -> None:
        """Closes the client's connections (the shared loop keeps running)."""
        self.loop.run(self.http.aclose(), self.timeout)


class Calls(Protocol):
    """How code written once for both paths reaches Graph and waits between reads."""

    async def call(self, client: GraphClient,
                   request: Callable[[GraphServiceClient], Awaitable[T]]) -> T: ...

    async def sleep(self, seconds: float) -> None: ...


class Blocking:
    """The calling thread blocks on every call and sleep (a worker's step thread).

    Nothing here suspends a coroutine, so ``blocking`` runs one to its end in that thread."""

    async def call(self, client: GraphClient,
                   request: Callable[[GraphServiceClient], Awaitable[T]]) -> T:
        return client.call(request)

    async def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class Awaiting:
    """The caller's event loop awaits every call and sleep: no thread waits."""

    async def call(self, client: GraphClient,
                   request: Callable[[GraphServiceClient], Awaitable[T]]) -> T:
        return await client.call_async(request)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


BLOCKING, AWAITING = Blocking(), Awaiting()


def client_timeout(env: dict[str, str] | os._Environ[str] | None = None) -> float:
    """The client timeout: ``TIDEMARK_GRAPH_TIMEOUT_S`` if set, else DEFAULT_TIMEOUT_S."""
    raw = (os.environ if env is None else env).get(TIMEOUT_ENV)
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ConfigError(f"{TIMEOUT_ENV} must be a positive number of seconds, got {raw!r}")
    return value


def graph_client(base_url: str, token: str | CredentialSource, *,
                 timeout: float | None = None, loop: EventLoopThread | None = None,
                 user: str | None = None) -> GraphClient:
    """A Graph v1.0 client for ``base_url`` (``https://graph.microsoft.com`` or a staging URL).

    ``token`` is a bearer token or a credential source (tidemark.credentials) asked on every
    request. ``user`` (an id or userPrincipalName) is for app-only credentials: every ``/me``
    path the SDK builds goes to ``/users/{user}`` instead, which is where an app-only token
    must address a mailbox. ``timeout`` is the client's timeout per request, in seconds
    (default: ``client_timeout()``).

    The SDK's retry handler is switched off: it resends a POST after 429/503/504, waiting as
    long as ``Retry-After`` says, and a 503 or 504 can arrive after the mail was accepted. A
    resent ``sendMail`` is a second mail; the step's probe decides instead. A 401 is resent
    once with a renewed token (``RenewOnUnauthorized``: a 401 was not processed).
    """
    timeout = client_timeout() if timeout is None else timeout
    base = base_url.rstrip("/")
    host = urllib.parse.urlsplit(base).hostname or ""
    me_path = "/users/" + urllib.parse.quote(user, safe="@") if user else "/me"
    options = {
        RetryHandlerOption.get_key(): RetryHandlerOption(max_retries=0, should_retry=False),
        # msgraph-sdk addresses /me as /users/me-token-to-replace and relies on this rewrite.
        UrlReplaceHandlerOption.get_key(): UrlReplaceHandlerOption(
            enabled=True, replacement_pairs={"/users/me-token-to-replace": me_path}),
    }
    source = StaticToken(token) if isinstance(token, str) else token
    auth = BaseBearerTokenAuthenticationProvider(SourceTokenProvider(source, [host]))
    transport = RenewOnUnauthorized(httpx.AsyncHTTPTransport(), auth)
    http = GraphClientFactory.create_with_default_middleware(
        client=httpx.AsyncClient(timeout=timeout, transport=transport), options=options)
    adapter = GraphRequestAdapter(auth, client=http)
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


READ_ERRORS = (APIError, httpx.HTTPError, TimeoutError, OSError)


def graph_transient(e: BaseException) -> Transient | None:
    """Whether a failed Graph read is a moment to wait out (tidemark.reads).

    It is for a 429 (throttled, the mailbox's four concurrent requests included), 408, 5xx, a
    timeout or a dropped connection. Returns it with the ``Retry-After`` Graph sent."""
    if isinstance(e, APIError):
        status = e.response_status_code or 0
        if status not in (408, 429) and status < 500:
            return None
        headers = {k.lower(): v for k, v in (e.response_headers or {}).items()}
        return Transient(retry_after_s(headers.get("retry-after")))
    return Transient() if isinstance(e, httpx.TransportError | TimeoutError | OSError) else None


async def read(io: Calls, client: GraphClient,
               request: Callable[[GraphServiceClient], Awaitable[T]]) -> T:
    """``io.call`` of a read, asked again after a transient failure.

    It is asked again while the probe's budget allows (tidemark.reads). Raises what the read
    raises once it stands."""
    return await retried_with(lambda: io.call(client, request), graph_transient, io.sleep)


@dataclass(frozen=True)
class Copy:
    """One message of the mailbox carrying our key."""

    id: str
    folder_id: str
    is_draft: bool
    internet_message_id: str | None
    sender: str | None
    flags: int | None = None  # PR_MESSAGE_FLAGS; None when Graph did not return it

    @property
    def flagged_submitted(self) -> bool:
        """mfSubmitted: sent, and not yet taken out of Drafts by transport."""
        return self.flags is not None and bool(self.flags & MSGFLAG_SUBMIT)

    def submitted(self, drafts_id: str | None, outbox_id: str | None) -> bool:
        """Whether this copy was sent.

        Sent means flagged submitted (still in Drafts, waiting for transport), waiting in the
        Outbox, or anywhere but Drafts and no longer a draft. A draft a person merely moved
        elsewhere is still a draft."""
        if self.flagged_submitted or self.folder_id == outbox_id:
            return True
        return self.folder_id != drafts_id and not self.is_draft


def me(client: GraphClient) -> dict[str, Any]:
    """``GET /me`` of a client's token: ``{"id", "userPrincipalName", "mail"}``.

    Raises what the SDK raises (a 403 when the token lacks ``User.Read``)."""
    return blocking(me_with(BLOCKING, client))


async def me_with(io: Calls, client: GraphClient) -> dict[str, Any]:
    """``me`` through ``io``."""
    user = await read(io, client, lambda g: as_json(g, g.me))
    if user is None or not user.get("id"):
        raise ValueError("GET /me answered without an id")
    return {"id": user["id"], "userPrincipalName": user.get("userPrincipalName"),
            "mail": user.get("mail")}


class Gettable(Protocol):
    """A request builder of the SDK that can GET (``g.me``, a folder's builder)."""

    def to_get_request_information(self) -> Any: ...


async def as_json(g: GraphServiceClient, builder: Gettable) -> dict[str, Any] | None:
    """``builder``'s GET, its answer read as JSON rather than as the SDK's model.

    The request, its middleware and its errors (ODataError) are the SDK's own. The models of a
    user or a folder are not used: their first use imports some 1,200 model modules, 1.5 s of
    CPU at every worker's start for a few fields (``check_identity``)."""
    send: Callable[..., Awaitable[bytes | None]] = g.request_adapter.send_primitive_async
    body = await send(builder.to_get_request_information(), "bytes", {"XXX": ODataError})
    answer = json.loads(body) if body else None
    return answer if isinstance(answer, dict) else None


class GraphSendMailProbe:
    """Finds the message a ``graph.send_mail`` step submitted, wherever it was moved."""

    def __init__(self, reader: GraphClient) -> None:
        self.reader = reader
        self._folder_ids: dict[str, str] | None = None  # well-known name -> id, read once
        self._address: str | None = None

    def probe(self, ctx: StepContext) -> ProbeResult:
        """``probe_with`` on the calling thread."""
        return blocking(self.probe_with(BLOCKING, ctx))

    async def probe_async(self, ctx: StepContext) -> ProbeResult:
        """``probe_with`` awaited on the caller's loop."""
        return await self.probe_with(AWAITING, ctx)

    async def probe_with(self, io: Calls, ctx: StepContext) -> ProbeResult:
        """Tells whether the mail was submitted: done, absent or unknown.

        ``done`` when our submitted copy exists anywhere in the mailbox (``state`` ``submitted``
        while it waits in Drafts or the Outbox, else ``sent``, with its folder and id).
        ``absent`` when nothing was submitted and sending is safe. ``unknown`` when the mailbox
        cannot be read, or the journaled draft is gone with no submitted copy to show for it, or
        its flags cannot be read."""
        try:
            names = await self.folder_ids_with(io)
            copies = await self.copies(io, ctx.key)
        except READ_ERRORS as e:
            return ProbeResult.unknown(f"cannot read the mailbox: {describe_error(e)}")
        except TooMany as e:
            return ProbeResult.unknown(str(e))
        submitted = [c for c in copies if c.submitted(names.get("drafts"), names.get("outbox"))]
        if ctx.staged is not None:
            return await self._probe_draft(io, ctx, copies, submitted, names)
        if (ctx.before_state or {}).get("fence") == "draft":
            # No draft was journaled, so this step's execute never ran (it runs only after the
            # draft's id is journaled): whatever carries our key was not sent by this step.
            return ProbeResult.absent(
                "no draft was journaled, so nothing was sent for this step" + _ignored(
                    len(submitted)), {"ignored": len(submitted)})
        return await self._probe_by_sender(io, ctx.key, submitted, names)

    async def _probe_draft(self, io: Calls, ctx: StepContext, copies: list[Copy],
                           submitted: list[Copy], names: dict[str, str]) -> ProbeResult:
        """Probes a step fenced by its journaled draft.

        Our copy is the one with its internetMessageId. A draft whose send was requested (the
        journal's mark) is never *absent*. Graph documents no submit bit readable through it
        after the 202, so a draft that shows none may still be on its way out, and a second send
        of it is undocumented."""
        staged = ctx.staged or {}
        imid, draft_id = staged.get("internetMessageId"), staged.get("id")
        ours = [c for c in submitted if imid and c.internet_message_id == imid]
        others = len(submitted) - len(ours)
        if ours:
            return await self._done(io, ours, names, others)
        waiting = [c for c in copies if c.id == draft_id and c.folder_id == names.get("drafts")
                   and c.is_draft]
        if waiting and waiting[0].flags is None:
            return ProbeResult.unknown(
                f"our draft {draft_id} is in Drafts but its PR_MESSAGE_FLAGS "
                f"({MESSAGE_FLAGS_ID}) did not come back, so whether it was submitted cannot be "
                f"told; a person decides" + _ignored(others),
                {"draft": draft_id, "ignored": others})
        if waiting and ctx.sent_at is not None:
            return ProbeResult.unknown(
                f"our draft {draft_id} is still in Drafts and shows no submit bit, but its send "
                f"was requested at {ctx.sent_at.isoformat()}: Graph documents no flag that "
                f"tells a submitted draft in the window after the 202, so it may be on its way "
                f"out; look at Sent Items later (a resume then finds it), or decide"
                + _ignored(others), {"draft": draft_id, "ignored": others})
        if waiting:
            return ProbeResult.absent(
                f"our draft {draft_id} is still in Drafts, not flagged submitted, and nothing "
                f"was submitted; sending that draft is safe" + _ignored(others),
                {"draft": draft_id, "ignored": others})
        return ProbeResult.unknown(
            f"our draft {draft_id} is no longer in Drafts and no submitted message "
            f"{imid} is in the mailbox or Recoverable Items: a person or a policy deleted it "
            f"(sent or not) or moved it unsent; a person decides" + _ignored(others),
            {"draft": draft_id, "internetMessageId": imid, "ignored": others})

    async def _probe_by_sender(self, io: Calls, key: str, submitted: list[Copy],
                               names: dict[str, str]) -> ProbeResult:
        """Probes an intent written before steps were fenced by a draft.

        Such a step was sent with sendMail: the best we can tell is a submitted copy sent from
        this mailbox."""
        try:
            address = await self.address(io)
        except READ_ERRORS as e:
            return ProbeResult.unknown(f"cannot read /me: {describe_error(e)}")
        ours = [c for c in submitted if (c.sender or "").lower() == address.lower()]
        if ours:
            return await self._done(io, ours, names, len(submitted) - len(ours))
        return ProbeResult.absent(
            f"no submitted message with {KEY_PROPERTY_ID} = {key} sent from {address}"
            + _ignored(len(submitted)), {"ignored": len(submitted)})

    async def unsent_draft(self, io: Calls, draft_id: str) -> str | None:
        """None when ``draft_id`` is a never-submitted draft in Drafts, else why not to send it.

        A draft in Drafts with mfSubmitted clear cannot make a second mail when sent. Raises
        what the SDK raises when the message cannot be read (404 when it is gone)."""
        query = MessageItemRequestBuilder.MessageItemRequestBuilderGetQueryParameters(
            select=["id", "isDraft", "parentFolderId"],
            expand=[f"singleValueExtendedProperties($filter=id eq '{MESSAGE_FLAGS_ID}')"])
        config = RequestConfiguration(query_parameters=query)
        m = await io.call(self.reader, lambda g: g.me.messages.by_message_id(draft_id).get(
            request_configuration=config))
        if m is None:
            return f"draft {draft_id} could not be read"
        flags = message_flags(m)
        if flags is None:
            return (f"the PR_MESSAGE_FLAGS ({MESSAGE_FLAGS_ID}) of draft {draft_id} did not "
                    f"come back, so whether it was submitted cannot be told")
        if flags & MSGFLAG_SUBMIT:
            return f"draft {draft_id} was already submitted and waits in Drafts for transport"
        if not m.is_draft or m.parent_folder_id != (await self.folder_ids_with(io)).get("drafts"):
            return f"message {draft_id} is no longer a draft in Drafts"
        return None

    async def _done(self, io: Calls, ours: list[Copy], names: dict[str, str],
                    others: int) -> ProbeResult:
        first = ours[0]
        by_id = {v: k for k, v in names.items()}
        folder = by_id.get(first.folder_id) or await self._folder_name(io, first.folder_id)
        waiting = first.flagged_submitted or by_id.get(first.folder_id) == "outbox"
        observed = {"state": "submitted" if waiting else "sent",
                    "folder": folder, "id": first.id,
                    "internetMessageId": first.internet_message_id, "copies": len(ours)}
        if others:
            observed["ignored"] = others
        return ProbeResult.done(observed, f"our submitted message is in {folder}"
                                + _ignored(others))

    async def _folder_name(self, io: Calls, folder_id: str) -> str:
        try:
            f = await read(io, self.reader,
                           lambda g: g.me.mail_folders.by_mail_folder_id(folder_id).get())
        except READ_ERRORS:
            return folder_id
        return (f.display_name if f is not None and f.display_name else folder_id)

    def folder_ids(self) -> dict[str, str]:
        """The ids of the well-known folders (those the mailbox has), read once."""
        return blocking(self.folder_ids_with(BLOCKING))

    async def folder_ids_with(self, io: Calls) -> dict[str, str]:
        """``folder_ids`` through ``io``."""
        if self._folder_ids is None:
            ids: dict[str, str] = {}
            for name in NAMED_FOLDERS:

                def folder(g: GraphServiceClient, n: str = name
                           ) -> Awaitable[dict[str, Any] | None]:
                    return as_json(g, g.me.mail_folders.by_mail_folder_id(n))
                try:
                    f = await read(io, self.reader, folder)
                except APIError as e:
                    if e.response_status_code == 404:
                        continue  # this mailbox has no such folder
                    raise
                if f is not None and f.get("id"):
                    ids[name] = str(f["id"])
            self._folder_ids = ids
        return self._folder_ids

    async def address(self, io: Calls) -> str:
        """The mailbox's address as the read token sees it (``GET /me``), read once."""
        if self._address is None:
            who = await me_with(io, self.reader)
            self._address = str(who.get("mail") or who.get("userPrincipalName") or "")
        return self._address

    async def copies(self, io: Calls, key: str) -> list[Copy]:
        """Every message with our key: the whole mailbox, then Recoverable Items."""
        escaped = key.replace("'", "''")
        flt = (f"singleValueExtendedProperties/any(ep: ep/id eq '{KEY_PROPERTY_ID}' "
               f"and ep/value eq '{escaped}')")
        expand = [f"singleValueExtendedProperties($filter=id eq '{KEY_PROPERTY_ID}' "
                  f"or id eq '{MESSAGE_FLAGS_ID}')"]
        select = ["id", "internetMessageId", "isDraft", "parentFolderId", "from", "sentDateTime"]
        everywhere = RequestConfiguration(query_parameters=(
            MessagesRequestBuilder.MessagesRequestBuilderGetQueryParameters(
                filter=flt, expand=expand, select=select, top=PAGE_SIZE)))
        found = await self._pages(
            io, key, lambda g: g.me.messages.get(request_configuration=everywhere),
            lambda g, url: g.me.messages.with_url(url).get())
        recoverable = RequestConfiguration(query_parameters=(
            FolderMessagesRequestBuilder.MessagesRequestBuilderGetQueryParameters(
                filter=flt, expand=expand, select=select, top=PAGE_SIZE)))
        try:
            found += await self._pages(
                io, key, lambda g: g.me.mail_folders.by_mail_folder_id(RECOVERABLE).messages.get(
                    request_configuration=recoverable),
                lambda g, url: g.me.mail_folders.by_mail_folder_id(RECOVERABLE).messages
                .with_url(url).get())
        except APIError as e:
            if e.response_status_code != 404:  # a mailbox without Recoverable Items
                raise
        return found

    async def _pages(self, io: Calls, key: str,
                     first: Callable[[GraphServiceClient], Awaitable[Any]],
                     more: Callable[[GraphServiceClient, str], Awaitable[Any]]) -> list[Copy]:
        found: list[Copy] = []
        page = await read(io, self.reader, first)
        for _ in range(MAX_PAGES):
            for m in (page.value if page is not None and page.value else []):
                if _has_key(m, key):
                    found.append(_copy(m))
            link = page.odata_next_link if page is not None else None
            if not link:
                return found

            def next_page(g: GraphServiceClient, u: str = link) -> Awaitable[Any]:
                return more(g, u)
            page = await read(io, self.reader, next_page)
        raise TooMany(f"more than {MAX_PAGES * PAGE_SIZE} messages carry {key}; a person looks")


class TooMany(Exception):
    """More messages with one key than a probe reads."""


def _has_key(m: Message, key: str) -> bool:
    # Check the value ourselves too: a service that ignored the filter must not make somebody
    # else's message count as ours.
    return any(p.value == key and (p.id or "").lower() == KEY_PROPERTY_ID.lower()
               for p in (m.single_value_extended_properties or []))


def _copy(m: Message) -> Copy:
    sender = m.from_.email_address.address if m.from_ and m.from_.email_address else None
    return Copy(id=str(m.id), folder_id=str(m.parent_folder_id or ""), is_draft=bool(m.is_draft),
                internet_message_id=m.internet_message_id, sender=sender,
                flags=message_flags(m))


def message_flags(m: Message) -> int | None:
    """PR_MESSAGE_FLAGS of ``m`` when Graph returned it, else None.

    Ids are compared as numbers: Graph may spell ``Integer 0x0E07`` as ``Integer 0xe07``."""
    for p in m.single_value_extended_properties or []:
        kind, _, tag = (p.id or "").strip().partition(" ")
        if kind.lower() != "integer" or not tag.lower().startswith("0x"):
            continue
        try:
            if int(tag, 16) == int(MESSAGE_FLAGS_ID.split()[1], 16):
                return int(p.value or "")
        except ValueError:
            return None  # a value we cannot read tells nothing
    return None


def _ignored(n: int) -> str:
    return f"; {n} other message(s) with our key ignored (not sent by this step)" if n else ""
