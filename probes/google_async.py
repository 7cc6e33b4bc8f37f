"""A Google API client request awaited on the running event loop instead of a thread.

google-api-python-client builds each request (``service.files().update(...)`` is an
``HttpRequest``: URI, method, body, headers, and ``postproc``, which reads the answer) before
anything is sent, and ``HttpRequest.execute`` hands it to a blocking transport. While a provider
takes its time that transport holds a thread. :func:`execute_async` keeps everything of the
library but the transport: the library's own ``execute`` prepares the request (the
content-length it adds, a long GET turned into a POST), the credentials authorize it as
``AuthorizedHttp`` does, and :func:`send` sends it on the event loop with httpx, as
:class:`probes.google_http.OneShotHttp` would: once, on a connection of its own closed after
the answer, no redirect followed, ``timeout`` seconds for connecting and for each read or write,
gzip and deflate decoded as httplib2 decodes them. A wait then costs a coroutine, not a thread.

What can block runs on a worker thread (``asyncio.to_thread``, which carries the context, so
``acting_for`` holds there): applying the credentials, which for a per-task grant reads the
journal. The failures are the sync path's, so ``google_error`` maps them alike: an error status
is an ``HttpError``, no answer in time a ``TimeoutError``, a refused or dropped connection a
``ConnectionError``. A cancelled call raises ``CancelledError`` wherever it was (the request may
have left: the caller holds the step in doubt).
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from typing import Any, Protocol, runtime_checkable

import google_auth_httplib2
import httplib2
import httpx
from googleapiclient.errors import HttpError
from googleapiclient.http import HttpRequest

from probes.google_http import OneShotHttp, _decompress
from tidemark.wire import httpcore_trace

Answer = tuple[httplib2.Response, bytes]


@runtime_checkable
class AwaitsRequests(Protocol):
    """An ``AuthorizedHttp`` that authorizes and sends a request itself when awaited.

    An example is one that renews its credential after a 401 and sends again:
    activities.granted.RenewingHttp."""

    async def request_async(self, uri: str, method: str, body: bytes | str | None,
                            headers: dict[str, str]) -> Answer: ...


class _Prepared(Exception):  # not an error: the library's hand-off, caught below
    """Carries the request ``HttpRequest.execute`` hands to its transport out of ``execute``."""

    def __init__(self, uri: str, method: str, body: bytes | str | None,
                 headers: dict[str, str]) -> None:
        super().__init__(method, uri)
        self.uri, self.method, self.body, self.headers = uri, method, body, headers


class _Capture:
    """A transport that sends nothing.

    It raises what it was asked to send as ``_Prepared`` (no exception class ``_retry_request``
    would catch)."""

    def request(self, uri: str, method: str = "GET", body: bytes | str | None = None,
                headers: dict[str, str] | None = None, **_: Any) -> Answer:
        raise _Prepared(uri, method, body, dict(headers or {}))


def prepared(request: HttpRequest) -> _Prepared:
    """What ``request.execute(num_retries=0)`` would hand to its transport.

    It is prepared by the library itself, without sending anything."""
    if request.resumable:
        raise TypeError("a resumable upload is sent in chunks; it is not awaited")
    try:
        request.execute(http=_Capture(), num_retries=0)
    except _Prepared as p:
        return p
    raise AssertionError("HttpRequest.execute returned without asking its transport")


async def execute_async(request: HttpRequest) -> Any:
    """``request.execute(num_retries=0)``, its one request awaited on the running loop.

    Returns:
        What ``postproc`` makes of a 2xx answer (for JSON APIs the decoded body).

    Raises:
        HttpError: the answer's status is 300 or more (redirects are not followed).
        TimeoutError, ConnectionError, httplib2.FailedToDecompressContent: no usable answer.
    """
    p = prepared(request)
    http = request.http
    if isinstance(http, AwaitsRequests):
        response, content = await http.request_async(p.uri, p.method, p.body, p.headers)
    else:
        response, content = await authorized_send(http, p.uri, p.method, p.body, p.headers)
    # What HttpRequest.execute does with the answer.
    for callback in request.response_callbacks:
        callback(response)
    if response.status >= 300:
        raise HttpError(response, content, uri=request.uri)
    return request.postproc(response, content)


async def authorized_send(authed: google_auth_httplib2.AuthorizedHttp, uri: str, method: str,
                          body: bytes | str | None, headers: dict[str, str]) -> Answer:
    """``AuthorizedHttp.request`` as ``google_service`` builds it, awaited.

    There is no refresh after a 401: the token is handed in. The credentials run on a worker
    thread: in general they may refresh over the network."""
    request_headers = dict(headers)
    await asyncio.to_thread(authed.credentials.before_request, authed._request, method, uri,
                            request_headers)
    return await send(authed.http, uri, method, body, request_headers)


async def send(transport: OneShotHttp, uri: str, method: str = "GET",
               body: bytes | str | None = None, headers: dict[str, str] | None = None) -> Answer:
    """``transport.request`` (OneShotHttp), awaited.

    One request on a connection of its own, with the transport's timeout, no redirect followed,
    and httplib2's ``(response, content)``.

    Raises:
        TimeoutError: No connection, or no answer, within the timeout.
        ConnectionError: The connection was refused, or closed before the answer.
        httplib2.FailedToDecompressContent: The answer is not in its stated encoding.
    """
    if not isinstance(transport, OneShotHttp):
        raise TypeError(f"awaited requests go out as OneShotHttp sends them, not through "
                        f"{type(transport).__name__}")
    if isinstance(body, str):
        body = body.encode("utf-8")  # as OneShotHttp: UTF-8, not http.client's Latin-1
    # A client (and its pool) per request: a connection is never kept for the next one, as
    # OneShotHttp does. retries=0: httpx's transport would otherwise connect again.
    client = httpx.AsyncClient(
        transport=httpx.AsyncHTTPTransport(verify=_tls(), retries=0),
        timeout=httpx.Timeout(transport.timeout), follow_redirects=False,
        trust_env=False)  # no proxy from the environment: http.client uses none either
    try:
        async with client:
            # httpx.Request, not client.build_request: no default headers of httpx's (Accept,
            # User-Agent, Accept-Encoding) beside the library's own, as http.client adds none.
            # The trace calls tidemark.wire.at_wire_async on the open connection, just before
            # the request is written to it.
            request = httpx.Request(method, uri, headers=headers, content=body,
                                    extensions={"trace": httpcore_trace(method)})
            answer = await client.send(request, stream=True)
            try:
                # The bytes as sent: decoded below exactly as OneShotHttp decodes them.
                raw = b"".join([chunk async for chunk in answer.aiter_raw()])
            finally:
                await answer.aclose()
    except httpx.TimeoutException as e:
        raise TimeoutError(f"{type(e).__name__}: {e}") from e
    except httpx.TransportError as e:  # refused, reset, closed before or during the answer
        raise ConnectionError(f"{type(e).__name__}: {e}") from e
    response = _response(answer)
    return response, _decompress(response, raw)


def _response(answer: httpx.Response) -> httplib2.Response:
    """httplib2's Response for an httpx answer, as httplib2 builds it from http.client's.

    Lower-case names, a repeated header's values joined with ", ", status, reason, version."""
    info: dict[str, str] = {}
    for name, value in answer.headers.multi_items():
        name = name.lower()
        info[name] = f"{info[name]}, {value}" if name in info else value
    info["status"] = str(answer.status_code)
    response = httplib2.Response(info)
    response.reason = answer.reason_phrase
    response.version = 10 if answer.http_version == "HTTP/1.0" else 11
    return response


@functools.cache
def _tls() -> ssl.SSLContext:
    """The TLS settings OneShotHttp uses (the system's trust store, hostname checked).

    One context serves every request: it holds settings only, and building it reads the trust
    store."""
    return ssl.create_default_context()
