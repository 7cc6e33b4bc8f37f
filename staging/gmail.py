"""Gmail v1 emulation: the part of ``users.messages`` that sending and probing use.

Routes (as on ``https://gmail.googleapis.com/``; ``{userId}`` is ``me`` or the mailbox address):

* ``POST gmail/v1/users/{userId}/messages/send`` — JSON ``{"raw": <base64url RFC 822>,
  "threadId"?}``; also ``POST upload/gmail/v1/users/{userId}/messages/send`` with
  ``uploadType=media`` (a ``message/rfc822`` body) or ``uploadType=multipart``;
* ``GET gmail/v1/users/{userId}/messages`` — ``q``, ``labelIds``, ``maxResults``, ``pageToken``,
  ``includeSpamTrash``;
* ``GET gmail/v1/users/{userId}/messages/{id}`` — ``format`` (full, metadata, minimal, raw) and
  repeated ``metadataHeaders``;
* ``POST gmail/v1/users/{userId}/messages/{id}/trash``.

What the real service does and this one copies: the Message-ID a client sets is replaced by
Gmail's own (``<CA…@mail.gmail.com>``) while custom ``X-`` headers are kept; a sent message is
labelled SENT (and INBOX/UNREAD too when it is addressed to the mailbox itself); the list is
newest first and carries ids only; a token that holds ``gmail.metadata`` may not use ``q`` nor
fetch ``format=full|raw``, even when it holds broader scopes as well; errors come in Google's
``{"error": {"code", "message", "errors": [...], "status"}}`` shape.

Search (``q``) understands ``in:``/``label:``, ``rfc822msgid:``, ``after:``/``before:`` with epoch
seconds, all joined by spaces (AND). Anything else is answered with a 400 naming the term, so a
probe that relies on an unsupported operator fails loudly here instead of silently matching
nothing. Faults: arm ``messages.send`` for the write and ``messages.list`` / ``messages.get`` for
the reads (``fail_before_commit`` answers 503 — "search unavailable" — ``delay`` delays,
``drop_after_commit`` closes the connection after the work is done).

Control endpoint besides the core's: ``POST /_staging/gmail/settings`` ``{"search_lag": 5}`` —
seconds a new message stays invisible to searches (any list call with ``q``) while listing by
label already shows it, as Gmail's search index trails the mailbox.
"""

from __future__ import annotations

import base64
import binascii
import email
import email.policy
import email.utils
import json
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from email.message import EmailMessage, Message
from typing import Any

from aiohttp import BodyPartReader, web

from staging.core import Reply, Target, Token

SCOPE_PREFIX = "https://www.googleapis.com/auth/"
FULL_SCOPE = "https://mail.google.com/"
SEND_SCOPE = SCOPE_PREFIX + "gmail.send"
COMPOSE_SCOPE = SCOPE_PREFIX + "gmail.compose"
MODIFY_SCOPE = SCOPE_PREFIX + "gmail.modify"
READONLY_SCOPE = SCOPE_PREFIX + "gmail.readonly"
METADATA_SCOPE = SCOPE_PREFIX + "gmail.metadata"

# The scopes Google's discovery document lists for each method.
SEND_SCOPES = (FULL_SCOPE, MODIFY_SCOPE, COMPOSE_SCOPE, SEND_SCOPE)
READ_SCOPES = (FULL_SCOPE, MODIFY_SCOPE, READONLY_SCOPE, METADATA_SCOPE)
TRASH_SCOPES = (FULL_SCOPE, MODIFY_SCOPE)

MAILBOX = "agent@staging.example"  # the address of the one emulated account

SEND_TOKEN = "staging-gmail-send"
READ_TOKEN = "staging-gmail-readonly"
METADATA_TOKEN = "staging-gmail-metadata"

DEFAULT_PAGE_SIZE = 100  # Gmail's default maxResults
MAX_PAGE_SIZE = 500  # Gmail's upper bound for maxResults

KEY_HEADER = "X-Tidemark-Key"  # recorded as the effect's key when present

_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
           404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}
_UNAUTHENTICATED = ("Request had invalid authentication credentials. Expected OAuth 2 access "
                    "token, login cookie or other valid authentication credential. See "
                    "https://developers.google.com/identity/sign-in/web/devconsole-project.")


@dataclass
class StoredMessage:
    """One message in the mailbox, as Gmail keeps it after its own edits."""

    id: str
    thread_id: str
    label_ids: list[str]
    internal_ms: int
    history_id: int
    raw: bytes
    parsed: Message = field(repr=False)

    def header(self, name: str) -> str | None:
        value = self.parsed.get(name)
        return None if value is None else str(value)


class GmailTarget(Target):
    """The emulated Gmail v1 API of one mailbox (:data:`MAILBOX`)."""

    name = "gmail"
    default_tokens = (
        Token(SEND_TOKEN, "gmail", [SEND_SCOPE]),
        Token(READ_TOKEN, "gmail", [READONLY_SCOPE]),
        Token(METADATA_TOKEN, "gmail", [METADATA_SCOPE]),
    )

    def __init__(self, address: str = MAILBOX) -> None:
        super().__init__()
        self.address = address
        self._lock = threading.Lock()
        self._messages: dict[str, StoredMessage] = {}
        self._seq = 0
        self._history = 0
        self.search_lag = 0.0

    def reset(self) -> None:
        with self._lock:
            self._messages = {}
            self._seq = 0
            self.search_lag = 0.0
            # Real history ids are large and grow; starting high keeps clients from assuming small.
            self._history = 1_000_000

    # -- inspection from tests and the CLI ----------------------------------------------------

    def messages(self) -> list[StoredMessage]:
        """Every stored message, newest first."""
        with self._lock:
            return _newest_first(self._messages.values())

    def configure(self, search_lag: float | None = None) -> None:
        """Sets how many seconds a new message stays invisible to searches (``q``)."""
        if search_lag is not None:
            if search_lag < 0:
                raise ValueError("search_lag must not be negative")
            with self._lock:
                self.search_lag = float(search_lag)

    # -- errors ---------------------------------------------------------------------------------

    def error(self, status: int, code: str, message: str) -> web.Response:
        """Google's error body. ``code`` is Google's ``reason`` (``notFound``,
        ``invalidArgument`` …) or one of the core's generic codes, translated here."""
        headers: dict[str, str] = {}
        reason = code
        if code in ("unauthenticated", "revoked"):
            reason, detail, message = "authError", "Invalid Credentials", _UNAUTHENTICATED
            headers["WWW-Authenticate"] = ('Bearer realm="https://accounts.google.com/", '
                                           'error="invalid_token"')
        elif code == "insufficient_scope":
            reason, detail = "insufficientPermissions", "Insufficient Permission"
            message = "Request had insufficient authentication scopes."
            headers["WWW-Authenticate"] = ('Bearer realm="https://accounts.google.com/", '
                                           'error="insufficient_scope"')
        elif code == "backend_error":
            reason, detail = "backendError", "The service is currently unavailable."
            message = detail
        else:
            detail = message
        body = {"error": {"code": status, "message": message,
                          "errors": [{"message": detail, "domain": "global", "reason": reason}],
                          "status": _STATUS.get(status, "UNKNOWN")}}
        return web.json_response(body, status=status, headers=headers)

    # -- routes -------------------------------------------------------------------------------

    def routes(self) -> Iterable[web.RouteDef]:
        base = "/gmail/v1/users/{userId}/messages"
        return [
            web.post(base + "/send", self._h_send),
            web.post("/upload" + base + "/send", self._h_send_upload),
            web.get(base, self._h_list),
            web.get(base + "/{id}", self._h_get),
            web.post(base + "/{id}/trash", self._h_trash),
            web.post("/_staging/gmail/settings", self._h_settings),
        ]

    def _check_user(self, request: web.Request) -> None:
        user = request.match_info["userId"]
        if user != "me" and user.lower() != self.address.lower():
            raise Reply(self.error(403, "forbidden", f"Delegation denied for {self.address}"))

    async def _h_send(self, request: web.Request) -> web.Response:
        self.authorize(request, *SEND_SCOPES)
        self._check_user(request)
        body = await _json_body(self, request)
        raw = body.get("raw")
        if not isinstance(raw, str) or not raw:
            raise Reply(self.error(400, "invalidArgument",
                                   "'raw' RFC822 payload message string or uploading message "
                                   "via /upload/* URL required"))
        return await self._send(request, _b64url_decode(self, raw), body.get("threadId"))

    async def _h_send_upload(self, request: web.Request) -> web.Response:
        self.authorize(request, *SEND_SCOPES)
        self._check_user(request)
        kind = request.query.get("uploadType", "")
        if kind == "media":
            return await self._send(request, await request.read(), None)
        if kind == "multipart":
            meta, media = await _read_related(self, request)
            return await self._send(request, media, meta.get("threadId"))
        raise Reply(self.error(400, "invalidArgument",
                               f"Invalid value for uploadType: {kind!r} (media or multipart)"))

    async def _send(self, request: web.Request, raw: bytes, thread_id: Any) -> web.Response:
        msg = email.message_from_bytes(raw, policy=email.policy.default)
        recipients = [a for h in ("To", "Cc", "Bcc") for _, a in
                      email.utils.getaddresses([str(v) for v in msg.get_all(h, [])]) if a]
        if not recipients:
            raise Reply(self.error(400, "invalidArgument", "Recipient address required"))
        if any("@" not in a for a in recipients):
            raise Reply(self.error(400, "invalidArgument", "Invalid To header"))
        fault = await self.before_write(request, "messages.send")
        stored = self._store(msg, recipients, thread_id)
        self.record("messages.send", stored.header(KEY_HEADER), id=stored.id,
                    threadId=stored.thread_id, message_id=stored.header("Message-ID"),
                    to=recipients, subject=stored.header("Subject"))
        self.after_commit(request, fault)
        return web.json_response({"id": stored.id, "threadId": stored.thread_id,
                                  "labelIds": list(stored.label_ids)})

    def _store(self, msg: Message, recipients: list[str], thread_id: Any) -> StoredMessage:
        # What Gmail does to an outgoing message: its own Message-ID replaces the client's,
        # the account becomes the sender when none is given, and a Date is added.
        local = "CA" + base64.urlsafe_b64encode(secrets.token_bytes(30)).decode().rstrip("=")
        del msg["Message-ID"]
        msg["Message-ID"] = f"<{local}@mail.gmail.com>"
        if msg["From"] is None:
            msg["From"] = self.address
        if msg["Date"] is None:
            msg["Date"] = email.utils.formatdate(usegmt=True)
        labels = ["SENT"]
        if self.address.lower() in (a.lower() for a in recipients):
            labels = ["UNREAD", "SENT", "INBOX"]
        now_ms = int(time.time() * 1000)
        with self._lock:
            self._seq += 1
            self._history += 1
            # Gmail ids are 16 hex digits that grow with time; this keeps that look.
            mid = format((now_ms << 20) | (self._seq & 0xFFFFF), "016x")
            thread = thread_id if isinstance(thread_id, str) and any(
                m.thread_id == thread_id for m in self._messages.values()) else mid
            stored = StoredMessage(mid, thread, labels, now_ms, self._history, msg.as_bytes(),
                                   msg)
            self._messages[mid] = stored
        return stored

    async def _h_list(self, request: web.Request) -> web.Response:
        token = self.authorize(request, *READ_SCOPES)
        self._check_user(request)
        q = request.query.get("q")
        if q is not None and METADATA_SCOPE in token.scopes:
            # Real Gmail refuses q for any token that carries gmail.metadata, even together
            # with broader scopes.
            raise Reply(self.error(403, "forbidden",
                                   "Metadata scope does not support 'q' parameter"))
        fault = await self.before_write(request, "messages.list")
        match = _Query.parse(self, q or "")
        include_trash = request.query.get("includeSpamTrash", "false").lower() == "true"
        wanted = set(request.query.getall("labelIds", []))
        size = _int_param(self, request, "maxResults", DEFAULT_PAGE_SIZE, 1, MAX_PAGE_SIZE)
        offset = _page_offset(self, request.query.get("pageToken"))
        # Searches read an index that lags behind the mailbox; listing by label does not.
        indexed_before = (time.time() - self.search_lag) * 1000 if q is not None else None
        found = [m for m in self.messages()
                 if wanted <= set(m.label_ids) and match(m, include_trash)
                 and (indexed_before is None or m.internal_ms <= indexed_before)]
        page = found[offset:offset + size]
        out: dict[str, Any] = {"resultSizeEstimate": len(found)}
        if page:
            out["messages"] = [{"id": m.id, "threadId": m.thread_id} for m in page]
        if offset + size < len(found):
            out["nextPageToken"] = _page_token(offset + size)
        self.after_commit(request, fault)
        return web.json_response(out)

    async def _h_get(self, request: web.Request) -> web.Response:
        token = self.authorize(request, *READ_SCOPES)
        self._check_user(request)
        fmt = request.query.get("format", "full").lower()
        if fmt not in ("full", "metadata", "minimal", "raw"):
            raise Reply(self.error(400, "invalidArgument",
                                   f"Invalid value at 'format', \"{fmt}\""))
        if fmt in ("full", "raw") and METADATA_SCOPE in token.scopes:
            raise Reply(self.error(403, "forbidden",
                                   f"Metadata scope doesn't allow format {fmt.upper()}"))
        fault = await self.before_write(request, "messages.get")
        stored = self._find(request.match_info["id"])
        out = _resource(stored, fmt, request.query.getall("metadataHeaders", []))
        self.after_commit(request, fault)
        return web.json_response(out)

    async def _h_trash(self, request: web.Request) -> web.Response:
        self.authorize(request, *TRASH_SCOPES)
        self._check_user(request)
        fault = await self.before_write(request, "messages.trash")
        stored = self._find(request.match_info["id"])
        with self._lock:
            if "TRASH" not in stored.label_ids:
                stored.label_ids = [x for x in stored.label_ids if x != "INBOX"] + ["TRASH"]
                self._history += 1
                stored.history_id = self._history
        self.record("messages.trash", stored.header(KEY_HEADER), id=stored.id)
        self.after_commit(request, fault)
        return web.json_response(_resource(stored, "minimal", []))

    async def _h_settings(self, request: web.Request) -> web.Response:
        body = await request.json()
        try:
            self.configure(body.get("search_lag"))
        except (TypeError, ValueError) as e:
            return web.json_response({"error": str(e)}, status=400)
        return web.json_response({"search_lag": self.search_lag})

    def _find(self, mid: str) -> StoredMessage:
        with self._lock:
            stored = self._messages.get(mid)
        if stored is None:
            raise Reply(self.error(404, "notFound", "Requested entity was not found."))
        return stored


# -- search -----------------------------------------------------------------------------------

@dataclass
class _Query:
    """A parsed ``q``: every term must hold (Gmail joins space-separated terms with AND)."""

    labels: list[str] = field(default_factory=list)
    msgids: list[str] = field(default_factory=list)
    after_s: list[int] = field(default_factory=list)
    before_s: list[int] = field(default_factory=list)
    anywhere: bool = False

    @classmethod
    def parse(cls, target: GmailTarget, q: str) -> _Query:
        query = cls()
        for term in q.split():
            op, sep, value = term.partition(":")
            op = op.lower()
            if not sep or not value:
                raise Reply(target.error(400, "invalidArgument",
                                         f"staging Gmail supports only operator terms in q "
                                         f"(in:, label:, rfc822msgid:, after:, before:), "
                                         f"not {term!r}"))
            if op in ("in", "label"):
                if value.lower() == "anywhere":
                    query.anywhere = True
                else:
                    query.labels.append(value.upper())
            elif op == "rfc822msgid":
                query.msgids.append(value.strip("<>"))
            elif op in ("after", "before"):
                if not value.isdigit():
                    raise Reply(target.error(400, "invalidArgument",
                                             f"staging Gmail supports {op}: with epoch seconds "
                                             f"only, not {value!r}"))
                (query.after_s if op == "after" else query.before_s).append(int(value))
            else:
                raise Reply(target.error(400, "invalidArgument",
                                         f"staging Gmail does not support the operator {op}:"))
        return query

    def __call__(self, m: StoredMessage, include_spam_trash: bool) -> bool:
        labels = set(m.label_ids)
        explicit = {"TRASH", "SPAM"} & set(self.labels)
        if not (include_spam_trash or self.anywhere or explicit) and labels & {"TRASH", "SPAM"}:
            return False
        if any(label not in labels for label in self.labels):
            return False
        msgid = (m.header("Message-ID") or "").strip().strip("<>")
        if any(msgid != want for want in self.msgids):
            return False
        seconds = m.internal_ms / 1000
        return all(seconds >= a for a in self.after_s) and all(seconds < b for b in self.before_s)


# -- resources ---------------------------------------------------------------------------------

def _resource(m: StoredMessage, fmt: str, metadata_headers: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"id": m.id, "threadId": m.thread_id, "labelIds": list(m.label_ids),
                           "snippet": _snippet(m.parsed), "sizeEstimate": len(m.raw),
                           "historyId": str(m.history_id), "internalDate": str(m.internal_ms)}
    if fmt == "raw":
        out["raw"] = base64.urlsafe_b64encode(m.raw).decode()
    elif fmt == "metadata":
        wanted = {h.lower() for h in metadata_headers}
        out["payload"] = {"mimeType": m.parsed.get_content_type(),
                          "headers": [h for h in _headers(m.parsed)
                                      if not wanted or h["name"].lower() in wanted]}
    elif fmt == "full":
        out["payload"] = _part(m.parsed, "")
    return out


def _headers(part: Message) -> list[dict[str, str]]:
    return [{"name": k, "value": str(v)} for k, v in part.items()]


def _part(part: Message, part_id: str) -> dict[str, Any]:
    out: dict[str, Any] = {"partId": part_id, "mimeType": part.get_content_type(),
                           "filename": part.get_filename() or "", "headers": _headers(part)}
    if part.is_multipart():
        out["body"] = {"size": 0}
        children = part.get_payload()
        assert isinstance(children, list)
        prefix = f"{part_id}." if part_id else ""
        out["parts"] = [_part(p, f"{prefix}{i}") for i, p in enumerate(children)]
    else:
        data = part.get_payload(decode=True)
        data = data if isinstance(data, bytes) else b""
        out["body"] = {"size": len(data),
                       "data": base64.urlsafe_b64encode(data).decode()} if data else {"size": 0}
    return out


SNIPPET_CHARS = 200  # about what Gmail shows; enough for a person to recognise the message


def _snippet(msg: Message) -> str:
    if isinstance(msg, EmailMessage):
        body = msg.get_body(preferencelist=("plain", "html"))
        if body is not None and isinstance(body, EmailMessage):
            text = body.get_content()
            if isinstance(text, str):
                return " ".join(text.split())[:SNIPPET_CHARS]
    return ""


def _newest_first(messages: Iterable[StoredMessage]) -> list[StoredMessage]:
    return sorted(messages, key=lambda m: (m.internal_ms, m.id), reverse=True)


# -- request parsing ---------------------------------------------------------------------------

async def _json_body(target: GmailTarget, request: web.Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.read() or b"{}")
    except ValueError:
        raise Reply(target.error(400, "parseError", "Invalid JSON payload received.")) from None
    if not isinstance(body, dict):
        raise Reply(target.error(400, "invalidArgument", "Invalid JSON payload received."))
    return body


def _b64url_decode(target: GmailTarget, raw: str) -> bytes:
    try:
        # Gmail takes URL-safe base64 with or without padding; '+' and '/' are refused.
        if "+" in raw or "/" in raw:
            raise binascii.Error("not URL-safe")
        return base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))
    except (binascii.Error, ValueError):
        raise Reply(target.error(400, "invalidArgument",
                                 "Invalid value at 'message.raw' (TYPE_BYTES), Base64 decoding "
                                 "failed")) from None


async def _read_related(target: GmailTarget, request: web.Request) -> tuple[dict[str, Any], bytes]:
    """The two parts of an ``uploadType=multipart`` body: JSON metadata, then the message."""
    try:
        reader = await request.multipart()
        parts = []
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader):
                raise ValueError("nested multipart")
            parts.append(bytes(await part.read(decode=True)))
        if len(parts) != 2:
            raise ValueError(f"{len(parts)} parts")
        meta = json.loads(parts[0] or b"{}")
    except (ValueError, AssertionError, KeyError) as e:
        raise Reply(target.error(400, "invalidArgument",
                                 f"a multipart upload needs a JSON metadata part and a message "
                                 f"part: {e}")) from None
    return (meta if isinstance(meta, dict) else {}), parts[1]


def _int_param(target: GmailTarget, request: web.Request, name: str, default: int, lo: int,
               hi: int) -> int:
    value = request.query.get(name)
    if value is None:
        return default
    try:
        n = int(value)
    except ValueError:
        raise Reply(target.error(400, "invalidArgument",
                                 f"Invalid value at '{name}' (TYPE_UINT32), \"{value}\"")) from None
    return min(max(n, lo), hi)


def _page_token(offset: int) -> str:
    return base64.urlsafe_b64encode(f"o{offset}".encode()).decode()


def _page_offset(target: GmailTarget, token: str | None) -> int:
    if not token:
        return 0
    try:
        text = base64.urlsafe_b64decode(token).decode()
        if not text.startswith("o"):
            raise ValueError(text)
        return int(text[1:])
    except (ValueError, binascii.Error):
        raise Reply(target.error(400, "invalidArgument", "Invalid pageToken")) from None
