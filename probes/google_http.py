"""The Google API client as the Drive and Gmail code uses it, and what its errors mean.

google-api-python-client talks through an ``httplib2.Http``, and httplib2 silently sends a
request again, even a PATCH or a POST, when the connection closes before the status line
arrives (``RemoteDisconnected`` is a ``BadStatusLine``, which it retries "regardless of the
number of RETRIES", whatever the method). That is exactly the "committed, then the answer was
lost" case: the re-send turns one in-doubt write into two (a second rename, a second mail). So
every client here is built by :func:`google_service` over :class:`OneShotHttp`, which sends each
request once and lets the failure surface, and :func:`google_error` says what the failure means
for the step; the journal, not the library, decides what happens next.

This module lives in ``probes`` because probes and actions both build clients here, and
``activities`` may import ``probes`` but never the reverse.
"""

from __future__ import annotations

import gzip
import http.client
import json
import ssl
import urllib.parse
import weakref
import zlib
from typing import Any

import google_auth_httplib2
import httplib2
from google.oauth2.credentials import Credentials
from googleapiclient.discovery import Resource, build
from googleapiclient.errors import Error as ClientError
from googleapiclient.errors import HttpError

from tidemark.errors import ActionError, Refused, TargetUnavailable, Throttled, Unauthorized
from tidemark.reads import Transient, retried, retry_after_s
from tidemark.wire import at_wire

DEFAULT_TIMEOUT_S = 30.0  # seconds; a Drive metadata call or a Gmail send answers in well under
#                           a second, so 30 s only ever cuts off an answer that is lost, not slow

# Google answers rate and quota limits with 403 and one of these reasons: the credential is fine
# and a later attempt may pass, so they must not read as a rejected credential.
RATE_LIMIT_REASONS = frozenset({"rateLimitExceeded", "userRateLimitExceeded",
                                "dailyLimitExceeded", "quotaExceeded"})

# What a failed call through google_service raises: the API's answer (HttpError) or another
# client error, a timeout or a refused or dropped connection (OSError, HTTPException, httplib2's
# errors), an answer that cannot be read (ValueError). google_error maps each of them.
CLIENT_ERRORS: tuple[type[Exception], ...] = (
    ClientError, OSError, http.client.HTTPException, httplib2.HttpLib2Error, ValueError)


class OneShotHttp:
    """The part of ``httplib2.Http`` that the Google client calls, sending each request once.

    Every request goes out on a fresh connection that is closed after the answer, and any
    failure (a timeout, a connection closed before the answer) is raised to the caller, which
    leaves the step in doubt for the probe. Keeping no connection between requests also makes
    one instance safe to share between threads.

    Args:
        timeout: Seconds to wait for connecting and for each read.
    """

    def __init__(self, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.timeout = timeout
        # google_auth_httplib2.AuthorizedHttp forwards these to the wrapped http. Redirects are
        # never followed: following one would send the request a second time.
        self.follow_redirects = False
        self.redirect_codes: frozenset[int] = frozenset()
        self.connections: dict[str, Any] = {}

    def request(self, uri: str, method: str = "GET", body: bytes | str | None = None,
                headers: dict[str, str] | None = None, redirections: int = 0,
                connection_type: Any = None, **_: Any) -> tuple[httplib2.Response, bytes]:
        """Sends one request and returns httplib2's ``(response, content)``.

        Raises:
            TimeoutError: No connection or no answer within ``timeout``.
            OSError, http.client.HTTPException: The connection failed or closed early.
            httplib2.FailedToDecompressContent: The answer is not in its stated encoding.
        """
        url = urllib.parse.urlsplit(uri)
        conn: http.client.HTTPConnection
        if url.scheme == "https":
            conn = http.client.HTTPSConnection(url.hostname or "", url.port,
                                               timeout=self.timeout,
                                               context=ssl.create_default_context())
        else:
            conn = http.client.HTTPConnection(url.hostname or "", url.port,
                                              timeout=self.timeout)
        target = (url.path or "/") + (f"?{url.query}" if url.query else "")
        if isinstance(body, str):
            body = body.encode("utf-8")  # http.client would encode a str as Latin-1
        try:
            # Connected first, so that the moment the request is written is the next thing
            # (tidemark.wire: what a request that leaves must check just before it does).
            conn.connect()
            at_wire(method)
            conn.request(method, target, body=body, headers=dict(headers or {}))
            raw = conn.getresponse()
            content = raw.read()
            response = httplib2.Response(raw)
        finally:
            conn.close()
        return response, _decompress(response, content)

    def close(self) -> None:
        """Nothing to close: no connection outlives its request.

        ``Resource.close`` calls this."""


def _decompress(response: httplib2.Response, content: bytes) -> bytes:
    """Undoes a gzip or deflate content-encoding as httplib2 does.

    The client asks for both. As httplib2 does, it moves the header to ``-content-encoding``, so
    nothing decodes twice."""
    encoding = response.get("content-encoding")
    if encoding not in ("gzip", "deflate"):
        return content
    try:
        if encoding == "gzip":
            content = gzip.decompress(content)
        else:
            try:
                content = zlib.decompress(content)  # deflate as RFC 9110 has it: zlib-wrapped
            except zlib.error:
                content = zlib.decompress(content, -zlib.MAX_WBITS)  # a bare deflate stream
    except (OSError, EOFError, zlib.error) as e:
        raise httplib2.FailedToDecompressContent(
            f"content purported to be {encoding} but failed to decompress: {e}",
            response, content) from e
    response["content-length"] = str(len(content))
    response["-content-encoding"] = response.pop("content-encoding")
    return content


def google_service(api: str, version: str, base_url: str, token: str, *, endpoint: str,
                   timeout: float) -> Resource:
    """A google-api-python-client service that sends every request once, never refreshing.

    Args:
        api: The API's name in its discovery document, e.g. ``drive``.
        version: The API's version, e.g. ``v3``.
        base_url: The service root (``https://www.googleapis.com``,
            ``https://gmail.googleapis.com``) or a staging server's URL.
        token: The bearer token, sent as is. It is never refreshed (it is handed in; there is
            nothing to refresh with), so a rejected token surfaces as a 401.
        endpoint: The path under ``base_url`` that the discovery document's paths are relative
            to: ``/drive/v3/`` for Drive, ``/`` for Gmail (whose paths contain ``gmail/v1/``).
        timeout: Seconds to wait for connecting and for each read.

    Returns:
        The service. Call ``execute(num_retries=0)`` on its requests, so that the client does
        not retry either.
    """
    authed = google_auth_httplib2.AuthorizedHttp(Credentials(token), http=OneShotHttp(timeout),
                                                 refresh_status_codes=())
    # The discovery document bundled with the library: building a client needs no network.
    return build(api, version, http=authed, static_discovery=True, cache_discovery=False,
                 client_options={"api_endpoint": base_url.rstrip("/") + endpoint})


# Each service's files() resource and the HTTP object it was built with (see files_of).
_FILES: weakref.WeakKeyDictionary[Resource, tuple[Any, Resource]] = weakref.WeakKeyDictionary()


def files_of(service: Resource) -> Resource:
    """``service.files()``, built once per service.

    Building it makes every method of the resource anew from the discovery document
    (milliseconds of CPU a call). A built resource only builds requests, so one serves every
    call and thread.

    A built resource keeps the HTTP object it was built with. Per-task grants are put in the
    service's HTTP object after it was built (activities.granted): a resource built before that
    would send the worker's own token. So it is built again whenever the service's HTTP object
    is not the one it was built with."""
    http = service._http  # where googleapiclient keeps it (granted.py replaces it there)
    cached = _FILES.get(service)
    if cached is None or cached[0] is not http:
        cached = (http, service.files())
        _FILES[service] = cached
    return cached[1]


def google_error(e: BaseException, what: str) -> ActionError:
    """Maps an exception from a Google client call onto Tidemark's action errors.

    Args:
        e: What the call raised, one of ``CLIENT_ERRORS``.
        what: A short description of the call, for the message (no secrets).

    Returns:
        ``Throttled`` (a ``TargetUnavailable`` that applied nothing) for a rate-limited 403
        and 429; ``Unauthorized`` for 401 and for a 403 that is not a rate limit; ``Refused``
        for the other 4xx, which say the target changed nothing; ``TargetUnavailable`` for
        408, 5xx, any other status, timeouts, failed connections and unreadable answers,
        after which the call may or may not have been applied.

    Raises:
        TypeError: ``e`` is not a client error (a bug in the caller).
    """
    if isinstance(e, HttpError):
        status = e.status_code
        reasons = _reasons(e)
        text = f"{what}: HTTP {status} {e.reason} ({', '.join(sorted(reasons)) or 'no reason'})"
        # A rate limit only when every reason given is one: a 403 that also names anything
        # else (a missing scope, a revoked grant) is a credential problem a person must fix.
        if (status == 403 and reasons and reasons <= RATE_LIMIT_REASONS) or status == 429:
            # Turned away: Drive's and Gmail's pages tell a client to back off and try again.
            return Throttled(text, retry_after_s(e.resp.get("retry-after")))
        if status in (401, 403):
            return Unauthorized(text)
        if 400 <= status < 500 and status not in (408, 429):
            return Refused(text)
        # Timed out or throttled: nothing done yet; a 5xx may come after the commit; any other
        # status is no clear refusal. Either way the step stays in doubt and the next attempt
        # probes.
        return TargetUnavailable(text)
    if isinstance(e, TimeoutError):
        return TargetUnavailable(f"{what}: no answer in time ({e})")
    if isinstance(e, CLIENT_ERRORS):
        return TargetUnavailable(f"{what}: no usable answer ({type(e).__name__}: {e})")
    raise TypeError(f"not a client error: {e!r}") from e


def google_transient(e: BaseException) -> Transient | None:
    """Whether a failed Google read is a moment to wait out (tidemark.reads).

    Every failure ``google_error`` calls ``TargetUnavailable`` is one (a rate-limited 403, 408,
    429, 5xx, a timeout, a dropped connection). Returns it with the ``Retry-After`` Google sent,
    if any."""
    if not isinstance(e, CLIENT_ERRORS) or not isinstance(google_error(e, "read"),
                                                         TargetUnavailable):
        return None
    resp = getattr(e, "resp", None)
    return Transient(retry_after_s(resp.get("retry-after")) if resp is not None else None)


def read(request: Any) -> Any:
    """Executes a read request (an ``HttpRequest`` of a read method) once.

    It runs again after a transient failure while the probe's or gate's budget allows
    (tidemark.reads). Raises what ``execute`` raises once the read stands."""
    return retried(lambda: request.execute(num_retries=0), google_transient)


def _reasons(e: HttpError) -> set[str]:
    """The ``reason`` of each entry in Google's ``error.errors`` list."""
    try:
        items = json.loads(e.content)["error"]["errors"]
        return {str(i.get("reason")) for i in items if isinstance(i, dict)}
    except (ValueError, KeyError, TypeError):
        return set()
