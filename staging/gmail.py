"""Gmail v1 emulation: the part of ``users`` that sending, probing and checking identity use.

Routes (as on ``https://gmail.googleapis.com/``; ``{userId}`` is ``me`` or the mailbox address):

* ``GET gmail/v1/users/{userId}/profile`` — ``emailAddress``, ``historyId`` …;
* ``POST gmail/v1/users/{userId}/drafts`` — JSON ``{"message": {"raw": …}}``; ``GET`` lists;
  ``GET``/``DELETE gmail/v1/users/{userId}/drafts/{id}``;
* ``POST gmail/v1/users/{userId}/drafts/send`` — JSON ``{"id": <draft id>}``: sends the draft
  and consumes it in one step; the sent message gets the SENT label (and a new id unless the
  ``draft_send`` setting says otherwise), and a second send of the same draft id is Gmail's 404
  (switches: ``concurrent_draft_send`` ``both`` lets overlapping sends of one draft all go out,
  ``gone_draft_send_status`` sets what the send of a consumed draft gets: 404, 400 or 500);
* ``POST gmail/v1/users/{userId}/messages/send`` — JSON ``{"raw": <base64url RFC 822>,
  "threadId"?}``; also ``POST upload/gmail/v1/users/{userId}/messages/send`` with
  ``uploadType=media`` (a ``message/rfc822`` body) or ``uploadType=multipart``;
* ``POST gmail/v1/users/{userId}/messages`` — ``messages.insert`` ``{"raw", "labelIds"?}``: a
  message put straight into the mailbox (as delivered mail arrives), its Message-ID kept;
* ``GET gmail/v1/users/{userId}/messages`` — ``q``, ``labelIds``, ``maxResults``, ``pageToken``,
  ``includeSpamTrash``;
* ``GET gmail/v1/users/{userId}/messages/{id}`` — ``format`` (full, metadata, minimal, raw) and
  repeated ``metadataHeaders``; ``DELETE`` deletes it for good (``https://mail.google.com/``
  only, as documented);
* ``POST gmail/v1/users/{userId}/messages/{id}/trash``;
* ``GET gmail/v1/users/{userId}/history`` — ``startHistoryId`` (required), ``labelId``,
  repeated ``historyTypes``, ``maxResults``, ``pageToken``: the mailbox's changes after that
  id, oldest first, each with a larger id; a start older than the kept history is a 404.

Mailboxes: every token is bound to one (``Token.account``; the default account is
:data:`MAILBOX`, any other account is a mailbox of its own, ``name@staging.example`` when it
has no ``@``), with its own messages, drafts and history. A ``userId`` other than ``me`` or
the token's own address is refused with 403.

What the real service does and this one copies: the Message-ID a client sets is replaced by
Gmail's own (``<CA…@mail.gmail.com>``) when a message is sent, while custom ``X-`` headers are
kept; a sent message is labelled SENT (and INBOX/UNREAD too when it is addressed to the mailbox
itself); the list carries ids only; a token that holds ``gmail.metadata`` may not use ``q`` nor
fetch ``format=full|raw``, even when it holds broader scopes as well; errors come in Google's
``{"error": {"code", "message", "errors": [...], "status"}}`` shape.

Search (``q``) understands ``in:``/``label:``, ``rfc822msgid:``, ``after:``/``before:`` with epoch
seconds, all joined by spaces (AND). Anything else is answered with a 400 naming the term, so a
probe that relies on an unsupported operator fails loudly here instead of silently matching
nothing. Faults: arm an operation by its method name (``messages.send``, ``drafts.create``,
``drafts.send``, ``messages.list``, ``messages.get``, ``history.list``, ``users.getProfile``,
``drafts.get`` …): ``fail_before_commit`` answers 503, ``delay`` delays before the work (a
delayed ``drafts.send`` looks the draft up only after the delay, as a slow provider would),
``drop_after_commit`` closes the connection after the work is done.

Control endpoint besides the core's: ``POST /_staging/gmail/settings`` with any of
``{"search_lag": 5}`` — seconds a new message stays invisible to searches (any list call with
``q``) while listing by label already shows it, as Gmail's search index trails the mailbox;
``{"list_order": "newest_first" | "oldest_first"}`` — the order of ``messages.list`` (Gmail
documents none); ``{"clock_offset": -600}`` — seconds Google's clock is ahead of (or behind)
this host's, for ``internalDate`` and searches by date; ``{"expire_history": true}`` — forget
every mailbox's history so far, as Gmail does after about a week; ``{"draft_send": "new_message"
| "relabel"}`` — whether a sent draft becomes a new message (the default) or keeps its message
id, relabelled DRAFT -> SENT.
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

from staging.core import DEFAULT_ACCOUNT, Reply, Switch, Target, Token
from tidemark import staging_tokens

SCOPE_PREFIX = "https://www.googleapis.com/auth/"
FULL_SCOPE = "https://mail.google.com/"
SEND_SCOPE = SCOPE_PREFIX + "gmail.send"
COMPOSE_SCOPE = SCOPE_PREFIX + "gmail.compose"
MODIFY_SCOPE = SCOPE_PREFIX + "gmail.modify"
READONLY_SCOPE = SCOPE_PREFIX + "gmail.readonly"
METADATA_SCOPE = SCOPE_PREFIX + "gmail.metadata"
INSERT_SCOPE = SCOPE_PREFIX + "gmail.insert"

# The scopes Google's discovery document lists for each method.
SEND_SCOPES = (FULL_SCOPE, MODIFY_SCOPE, COMPOSE_SCOPE, SEND_SCOPE)
DRAFT_WRITE_SCOPES = (FULL_SCOPE, MODIFY_SCOPE, COMPOSE_SCOPE)  # drafts.create/send/delete
DRAFT_READ_SCOPES = (FULL_SCOPE, MODIFY_SCOPE, COMPOSE_SCOPE, READONLY_SCOPE)  # drafts.get/list
PROFILE_SCOPES = (FULL_SCOPE, MODIFY_SCOPE, COMPOSE_SCOPE, READONLY_SCOPE, METADATA_SCOPE)
READ_SCOPES = (FULL_SCOPE, MODIFY_SCOPE, READONLY_SCOPE, METADATA_SCOPE)  # list, get, history
TRASH_SCOPES = (FULL_SCOPE, MODIFY_SCOPE)
INSERT_SCOPES = (FULL_SCOPE, MODIFY_SCOPE, INSERT_SCOPE)
DELETE_SCOPES = (FULL_SCOPE,)

MAILBOX = "agent@staging.example"  # the address of the default account's mailbox
MAIL_DOMAIN = "staging.example"  # the domain of the other accounts' mailboxes

COMPOSE_TOKEN = staging_tokens.GMAIL_COMPOSE  # what gmail.send writes with: drafts need compose
SEND_TOKEN = staging_tokens.GMAIL_SEND  # gmail.send only: messages.send, no drafts
READ_TOKEN = staging_tokens.GMAIL_READ
METADATA_TOKEN = staging_tokens.GMAIL_METADATA

DEFAULT_PAGE_SIZE = 100  # Gmail's default maxResults
MAX_PAGE_SIZE = 500  # Gmail's upper bound for maxResults
LIST_ORDERS = ("newest_first", "oldest_first")
# What drafts.send does with the draft's message: stores the sent copy as a new message (and
# deletes the draft's), or relabels the draft's own message DRAFT -> SENT. Gmail documents
# neither; a probe must find the sent copy either way.
DRAFT_SEND_MODES = ("new_message", "relabel")
HISTORY_TYPES = ("messageAdded", "messageDeleted", "labelAdded", "labelRemoved")
FIRST_HISTORY_ID = 1_000_000  # real history ids are large and grow; clients must not assume small

KEY_HEADER = "X-Tidemark-Key"  # recorded as the effect's key when present

_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
           404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}
_UNAUTHENTICATED = ("Request had invalid authentication credentials. Expected OAuth 2 access "
                    "token, login cookie or other valid authentication credential. See "
                    "https://developers.google.com/identity/sign-in/web/devconsole-project.")
_NOT_FOUND = "Requested entity was not found."


@dataclass
class StoredMessage:
    """One message in a mailbox, as Gmail keeps it after its own edits."""

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

    def ref(self) -> dict[str, Any]:
        """The message as a history record or a draft names it."""
        return {"id": self.id, "threadId": self.thread_id, "labelIds": list(self.label_ids)}


@dataclass
class HistoryRecord:
    """One change of a mailbox: ``kind`` is one of HISTORY_TYPES; ``message`` the message as it
    was then (its labels at that moment decide what a ``labelId`` filter matches)."""

    id: int
    kind: str
    message: dict[str, Any]
    labels: list[str] = field(default_factory=list)  # for labelAdded / labelRemoved


@dataclass
class Mailbox:
    """One account's mail: messages, drafts (draft id -> message id) and history."""

    address: str
    messages: dict[str, StoredMessage] = field(default_factory=dict)
    drafts: dict[str, str] = field(default_factory=dict)
    history: list[HistoryRecord] = field(default_factory=list)
    history_id: int = FIRST_HISTORY_ID
    history_floor: int = FIRST_HISTORY_ID  # a startHistoryId below this is no longer kept

    def note(self, kind: str, message: StoredMessage, labels: list[str] | None = None) -> int:
        """Appends a history record (caller holds the target's lock); returns its id."""
        # Gmail's ids grow with gaps between them; a step of a few keeps clients honest.
        self.history_id += 1 + secrets.randbelow(3)
        self.history.append(HistoryRecord(self.history_id, kind, message.ref(), labels or []))
        message.history_id = self.history_id
        return self.history_id


# Google's reference for users.drafts.send says only "Sends the specified, existing draft to the
# recipients in the To, Cc, and Bcc headers" (developers.google.com/workspace/gmail/api/
# reference/rest/v1/users.drafts/send). That a sent draft is gone, that two sends of one draft
# send it once, and what the second one gets, are all undocumented: the switches below show the
# worst of each.
CONCURRENT_DRAFT_SEND = Switch(
    "concurrent_draft_send", default="once", worst="both", choices=("once", "both"),
    doc="What two drafts.send of one draft that overlap in time do. Undocumented: the "
        "reference (users.drafts/send) says only that it sends the specified, existing draft. "
        "'once': the draft is looked up and consumed in one step when the send does its work, "
        "so the later one finds nothing. 'both': each send takes the draft as it was when the "
        "request arrived, and every one that arrived while the draft existed goes out.")
GONE_DRAFT_STATUS = Switch(
    "gone_draft_send_status", default=404, worst=400, choices=(404, 400, 500),
    doc="The status drafts.send answers for a draft that a send already consumed. "
        "Undocumented (users.drafts/send lists no errors); 404 NOT_FOUND is what Google's "
        "error model suggests for a missing resource (cloud.google.com/apis/design/errors), "
        "400 FAILED_PRECONDITION or INVALID_ARGUMENT, or a 500, are as plausible.")


class GmailTarget(Target):
    """The emulated Gmail v1 API: one mailbox per account, the default one :data:`MAILBOX`."""

    name = "gmail"
    switches = (CONCURRENT_DRAFT_SEND, GONE_DRAFT_STATUS)
    default_tokens = (
        Token(COMPOSE_TOKEN, "gmail", [COMPOSE_SCOPE]),
        Token(SEND_TOKEN, "gmail", [SEND_SCOPE]),
        Token(READ_TOKEN, "gmail", [READONLY_SCOPE]),
        Token(METADATA_TOKEN, "gmail", [METADATA_SCOPE]),
    )

    def __init__(self, address: str = MAILBOX) -> None:
        super().__init__()
        self.address = address
        self._lock = threading.Lock()
        self._mailboxes: dict[str, Mailbox] = {}
        self._seq = 0
        self.search_lag = 0.0
        self.list_order = "newest_first"
        self.clock_offset = 0.0
        self.draft_send = "new_message"

    def reset(self) -> None:
        with self._lock:
            self._mailboxes = {}
            self._seq = 0
            self.search_lag = 0.0
            self.list_order = "newest_first"
            self.clock_offset = 0.0
            self.draft_send = "new_message"

    # -- mailboxes ------------------------------------------------------------------------------

    def address_of(self, account: str) -> str:
        """The mailbox address of a token's account."""
        if account == DEFAULT_ACCOUNT:
            return self.address
        return account if "@" in account else f"{account}@{MAIL_DOMAIN}"

    def mailbox(self, address: str | None = None) -> Mailbox:
        """The mailbox at ``address`` (the default one when None), created when first used."""
        key = (address or self.address).lower()
        with self._lock:
            return self._mailbox_locked(key)

    def _mailbox_locked(self, key: str) -> Mailbox:
        box = self._mailboxes.get(key)
        if box is None:
            box = self._mailboxes[key] = Mailbox(key)
        return box

    def _mailbox_of(self, request: web.Request, token: Token) -> Mailbox:
        """The token's mailbox; a ``userId`` naming another one is refused as Gmail does."""
        address = self.address_of(token.account)
        user = request.match_info["userId"]
        if user != "me" and user.lower() != address.lower():
            raise Reply(self.error(403, "forbidden", f"Delegation denied for {address}"))
        return self.mailbox(address)

    def now_ms(self) -> int:
        """Google's clock, in milliseconds (this host's plus ``clock_offset``)."""
        return int((time.time() + self.clock_offset) * 1000)

    # -- inspection from tests and the CLI ----------------------------------------------------

    def messages(self, address: str | None = None) -> list[StoredMessage]:
        """Every stored message of a mailbox (the default one when None), newest first."""
        box = self.mailbox(address)
        with self._lock:
            return _newest_first(box.messages.values())

    def drafts(self, address: str | None = None) -> dict[str, str]:
        """The drafts of a mailbox: draft id -> message id."""
        box = self.mailbox(address)
        with self._lock:
            return dict(box.drafts)

    def configure(self, search_lag: float | None = None, list_order: str | None = None,
                  clock_offset: float | None = None, expire_history: bool = False,
                  draft_send: str | None = None) -> None:
        """Sets the search index's lag (seconds), the list order, Google's clock offset
        (seconds), what ``drafts.send`` does with the draft's message, and forgets the history
        so far when ``expire_history``."""
        if draft_send is not None and draft_send not in DRAFT_SEND_MODES:
            raise ValueError(f"draft_send must be one of {', '.join(DRAFT_SEND_MODES)}")
        if search_lag is not None and (not isinstance(search_lag, int | float) or search_lag < 0):
            raise ValueError("search_lag must be a number of seconds, not negative")
        if list_order is not None and list_order not in LIST_ORDERS:
            raise ValueError(f"list_order must be one of {', '.join(LIST_ORDERS)}")
        if clock_offset is not None and not isinstance(clock_offset, int | float):
            raise ValueError("clock_offset must be a number of seconds")
        with self._lock:
            if search_lag is not None:
                self.search_lag = float(search_lag)
            if list_order is not None:
                self.list_order = list_order
            if clock_offset is not None:
                self.clock_offset = float(clock_offset)
            if draft_send is not None:
                self.draft_send = draft_send
            if expire_history:
                for box in self._mailboxes.values():
                    box.history.clear()
                    box.history_floor = box.history_id + 1

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

    def not_found(self) -> Reply:
        return Reply(self.error(404, "notFound", _NOT_FOUND))

    # -- routes -------------------------------------------------------------------------------

    def routes(self) -> Iterable[web.RouteDef]:
        user = "/gmail/v1/users/{userId}"
        base = user + "/messages"
        return [
            web.get(user + "/profile", self._h_profile),
            web.get(user + "/history", self._h_history),
            web.post(user + "/drafts", self._h_draft_create),
            web.get(user + "/drafts", self._h_draft_list),
            web.post(user + "/drafts/send", self._h_draft_send),
            web.get(user + "/drafts/{id}", self._h_draft_get),
            web.delete(user + "/drafts/{id}", self._h_draft_delete),
            web.post(base + "/send", self._h_send),
            web.post("/upload" + base + "/send", self._h_send_upload),
            web.post(base, self._h_insert),
            web.get(base, self._h_list),
            web.get(base + "/{id}", self._h_get),
            web.delete(base + "/{id}", self._h_delete),
            web.post(base + "/{id}/trash", self._h_trash),
            web.post("/_staging/gmail/settings", self._h_settings),
        ]

    # -- profile and history --------------------------------------------------------------------

    async def _h_profile(self, request: web.Request) -> web.Response:
        box = self._mailbox_of(request, self.authorize(request, *PROFILE_SCOPES))
        fault = await self.before_write(request, "users.getProfile")
        with self._lock:
            out = {"emailAddress": box.address, "messagesTotal": len(box.messages),
                   "threadsTotal": len({m.thread_id for m in box.messages.values()}),
                   "historyId": str(box.history_id)}
        self.after_commit(request, fault)
        return web.json_response(out)

    async def _h_history(self, request: web.Request) -> web.Response:
        box = self._mailbox_of(request, self.authorize(request, *READ_SCOPES))
        raw_start = request.query.get("startHistoryId")
        if not raw_start:
            raise Reply(self.error(400, "invalidArgument", "startHistoryId is required"))
        try:
            start = int(raw_start)
        except ValueError:
            raise Reply(self.error(400, "invalidArgument",
                                   f"Invalid value at 'start_history_id' (TYPE_UINT64), "
                                   f"\"{raw_start}\"")) from None
        types = request.query.getall("historyTypes", [])
        bad = [t for t in types if t not in HISTORY_TYPES]
        if bad:
            raise Reply(self.error(400, "invalidArgument",
                                   f"Invalid value at 'history_types', \"{bad[0]}\""))
        label = request.query.get("labelId")
        size = _int_param(self, request, "maxResults", DEFAULT_PAGE_SIZE, 1, MAX_PAGE_SIZE)
        offset = _page_offset(self, request.query.get("pageToken"))
        fault = await self.before_write(request, "history.list")
        with self._lock:
            if start < box.history_floor - 1:
                raise self.not_found()  # documented: an out-of-date startHistoryId is a 404
            found = [r for r in box.history if r.id > start
                     and (not types or r.kind in types)
                     and (label is None or label in r.message["labelIds"])]
            current = box.history_id
        page = found[offset:offset + size]
        out: dict[str, Any] = {"historyId": str(current)}
        if page:
            out["history"] = [_history_json(r) for r in page]
        if offset + size < len(found):
            out["nextPageToken"] = _page_token(offset + size)
        self.after_commit(request, fault)
        return web.json_response(out)

    # -- drafts -----------------------------------------------------------------------------------

    async def _h_draft_create(self, request: web.Request) -> web.Response:
        box = self._mailbox_of(request, self.authorize(request, *DRAFT_WRITE_SCOPES))
        body = await _json_body(self, request)
        message = body.get("message")
        raw = message.get("raw") if isinstance(message, dict) else None
        if not isinstance(raw, str) or not raw:
            raise Reply(self.error(400, "invalidArgument",
                                   "Missing draft message: 'message.raw' is required"))
        msg = email.message_from_bytes(_b64url_decode(self, raw), policy=email.policy.default)
        fault = await self.before_write(request, "drafts.create")
        with self._lock:
            stored = self._add_locked(box, msg, ["DRAFT"], None)
            self._seq += 1
            draft_id = f"r{self.now_ms()}{self._seq:06d}"
            box.drafts[draft_id] = stored.id
        self.record("drafts.create", stored.header(KEY_HEADER), mailbox=box.address,
                    draft_id=draft_id, id=stored.id)
        self.after_commit(request, fault)
        return web.json_response({"id": draft_id, "message": stored.ref()})

    async def _h_draft_list(self, request: web.Request) -> web.Response:
        box = self._mailbox_of(request, self.authorize(request, *DRAFT_READ_SCOPES))
        fault = await self.before_write(request, "drafts.list")
        with self._lock:
            drafts = [{"id": d, "message": {"id": m, "threadId": box.messages[m].thread_id}}
                      for d, m in box.drafts.items()]
        self.after_commit(request, fault)
        return web.json_response({"drafts": drafts, "resultSizeEstimate": len(drafts)}
                                 if drafts else {"resultSizeEstimate": 0})

    async def _h_draft_get(self, request: web.Request) -> web.Response:
        token = self.authorize(request, *DRAFT_READ_SCOPES)
        box = self._mailbox_of(request, token)
        fmt = _format(self, request, token)
        fault = await self.before_write(request, "drafts.get")
        with self._lock:
            mid = box.drafts.get(request.match_info["id"])
            stored = box.messages.get(mid) if mid is not None else None
        if stored is None:
            raise self.not_found()
        out = {"id": request.match_info["id"],
               "message": _resource(stored, fmt, request.query.getall("metadataHeaders", []))}
        self.after_commit(request, fault)
        return web.json_response(out)

    async def _h_draft_delete(self, request: web.Request) -> web.Response:
        box = self._mailbox_of(request, self.authorize(request, *DRAFT_WRITE_SCOPES))
        fault = await self.before_write(request, "drafts.delete")
        with self._lock:
            mid = box.drafts.pop(request.match_info["id"], None)
            stored = box.messages.pop(mid, None) if mid is not None else None
            if stored is not None:
                box.note("messageDeleted", stored)
        if stored is None:
            raise self.not_found()
        self.record("drafts.delete", stored.header(KEY_HEADER), mailbox=box.address,
                    draft_id=request.match_info["id"])
        self.after_commit(request, fault)
        return web.Response(status=204)

    async def _h_draft_send(self, request: web.Request) -> web.Response:
        box = self._mailbox_of(request, self.authorize(request, *DRAFT_WRITE_SCOPES))
        body = await _json_body(self, request)
        draft_id = body.get("id")
        if not isinstance(draft_id, str) or not draft_id:
            raise Reply(self.error(400, "invalidArgument", "Missing draft id"))
        # Under concurrent_draft_send=both the send takes the draft as it is on arrival: a twin
        # that arrives before this one has consumed it sends it as well.
        taken: StoredMessage | None = None
        if self.switch("concurrent_draft_send") == "both":
            with self._lock:
                mid = box.drafts.get(draft_id)
                taken = box.messages.get(mid) if mid is not None else None
        # The delay comes first: a slow provider looks the draft up when it gets to the work,
        # so a late send of a draft another send consumed meanwhile finds nothing.
        fault = await self.before_write(request, "drafts.send")
        with self._lock:  # consume the draft and store the sent message in one step
            mid = box.drafts.get(draft_id)
            draft = box.messages.get(mid) if mid is not None else None
            if draft is None and taken is None:
                raise self._gone_draft()
            source = draft if draft is not None else taken
            assert source is not None
            recipients = _recipients(self, source.parsed)
            msg = _as_sent(email.message_from_bytes(source.raw, policy=email.policy.default),
                           box.address)
            labels = _sent_labels(box.address, recipients)
            if draft is None:  # consumed by a twin meanwhile: this send goes out all the same
                stored = self._add_locked(box, msg, labels, source.thread_id)
            elif self.draft_send == "relabel":  # the draft's own message becomes the sent one
                del box.drafts[draft_id]
                draft.raw, draft.parsed = msg.as_bytes(), msg
                draft.label_ids = labels
                draft.internal_ms = self.now_ms()
                box.note("labelRemoved", draft, ["DRAFT"])
                box.note("labelAdded", draft, labels)
                stored = draft
            else:
                del box.drafts[draft_id]
                del box.messages[draft.id]
                box.note("messageDeleted", draft)
                stored = self._add_locked(box, msg, labels, draft.thread_id)
        self.record("drafts.send", stored.header(KEY_HEADER), mailbox=box.address,
                    draft_id=draft_id, id=stored.id, threadId=stored.thread_id,
                    message_id=stored.header("Message-ID"), to=recipients,
                    subject=stored.header("Subject"))
        self.after_commit(request, fault)
        return web.json_response(stored.ref())

    def _gone_draft(self) -> Reply:
        """What a send of a draft that is no longer there gets (``gone_draft_send_status``)."""
        status = self.switch("gone_draft_send_status")
        if status == 400:
            return Reply(self.error(400, "failedPrecondition", "Invalid draft"))
        if status == 500:
            return Reply(self.error(500, "backendError", "Backend Error"))
        return self.not_found()

    # -- messages -------------------------------------------------------------------------------

    async def _h_send(self, request: web.Request) -> web.Response:
        box = self._mailbox_of(request, self.authorize(request, *SEND_SCOPES))
        body = await _json_body(self, request)
        raw = body.get("raw")
        if not isinstance(raw, str) or not raw:
            raise Reply(self.error(400, "invalidArgument",
                                   "'raw' RFC822 payload message string or uploading message "
                                   "via /upload/* URL required"))
        return await self._send(request, box, _b64url_decode(self, raw), body.get("threadId"))

    async def _h_send_upload(self, request: web.Request) -> web.Response:
        box = self._mailbox_of(request, self.authorize(request, *SEND_SCOPES))
        kind = request.query.get("uploadType", "")
        if kind == "media":
            return await self._send(request, box, await request.read(), None)
        if kind == "multipart":
            meta, media = await _read_related(self, request)
            return await self._send(request, box, media, meta.get("threadId"))
        raise Reply(self.error(400, "invalidArgument",
                               f"Invalid value for uploadType: {kind!r} (media or multipart)"))

    async def _send(self, request: web.Request, box: Mailbox, raw: bytes,
                    thread_id: Any) -> web.Response:
        msg = email.message_from_bytes(raw, policy=email.policy.default)
        recipients = _recipients(self, msg)
        fault = await self.before_write(request, "messages.send")
        with self._lock:
            stored = self._add_locked(box, _as_sent(msg, box.address),
                                      _sent_labels(box.address, recipients), thread_id)
        self.record("messages.send", stored.header(KEY_HEADER), mailbox=box.address,
                    id=stored.id, threadId=stored.thread_id,
                    message_id=stored.header("Message-ID"), to=recipients,
                    subject=stored.header("Subject"))
        self.after_commit(request, fault)
        return web.json_response(stored.ref())

    async def _h_insert(self, request: web.Request) -> web.Response:
        box = self._mailbox_of(request, self.authorize(request, *INSERT_SCOPES))
        body = await _json_body(self, request)
        raw = body.get("raw")
        if not isinstance(raw, str) or not raw:
            raise Reply(self.error(400, "invalidArgument", "'raw' RFC822 payload required"))
        labels = body.get("labelIds", [])
        if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
            raise Reply(self.error(400, "invalidArgument", "labelIds must be a list of ids"))
        msg = email.message_from_bytes(_b64url_decode(self, raw), policy=email.policy.default)
        fault = await self.before_write(request, "messages.insert")
        with self._lock:  # inserted as given: its Message-ID and headers stay
            stored = self._add_locked(box, msg, list(labels), body.get("threadId"))
        self.record("messages.insert", stored.header(KEY_HEADER), mailbox=box.address,
                    id=stored.id, labelIds=list(labels))
        self.after_commit(request, fault)
        return web.json_response(stored.ref())

    def _add_locked(self, box: Mailbox, msg: Message, labels: list[str],
                    thread_id: Any) -> StoredMessage:
        """Stores a message in ``box`` with a messageAdded record (caller holds the lock)."""
        now_ms = self.now_ms()
        self._seq += 1
        # Gmail ids are 16 hex digits that grow with time; this keeps that look.
        mid = format((now_ms << 20) | (self._seq & 0xFFFFF), "016x")
        thread = thread_id if isinstance(thread_id, str) and any(
            m.thread_id == thread_id for m in box.messages.values()) else mid
        stored = StoredMessage(mid, thread, labels, now_ms, 0, msg.as_bytes(), msg)
        box.messages[mid] = stored
        box.note("messageAdded", stored)
        return stored

    async def _h_list(self, request: web.Request) -> web.Response:
        token = self.authorize(request, *READ_SCOPES)
        box = self._mailbox_of(request, token)
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
        indexed_before = self.now_ms() - self.search_lag * 1000 if q is not None else None
        messages = self.messages(box.address)
        if self.list_order == "oldest_first":
            messages.reverse()
        found = [m for m in messages
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
        box = self._mailbox_of(request, token)
        fmt = _format(self, request, token)
        fault = await self.before_write(request, "messages.get")
        stored = self._find(box, request.match_info["id"])
        out = _resource(stored, fmt, request.query.getall("metadataHeaders", []))
        self.after_commit(request, fault)
        return web.json_response(out)

    async def _h_delete(self, request: web.Request) -> web.Response:
        box = self._mailbox_of(request, self.authorize(request, *DELETE_SCOPES))
        fault = await self.before_write(request, "messages.delete")
        with self._lock:  # for good: no trash, no way back
            stored = box.messages.pop(request.match_info["id"], None)
            if stored is not None:
                box.drafts = {d: m for d, m in box.drafts.items() if m != stored.id}
                box.note("messageDeleted", stored)
        if stored is None:
            raise self.not_found()
        self.record("messages.delete", stored.header(KEY_HEADER), mailbox=box.address,
                    id=stored.id)
        self.after_commit(request, fault)
        return web.Response(status=204)

    async def _h_trash(self, request: web.Request) -> web.Response:
        box = self._mailbox_of(request, self.authorize(request, *TRASH_SCOPES))
        fault = await self.before_write(request, "messages.trash")
        stored = self._find(box, request.match_info["id"])
        with self._lock:
            if "TRASH" not in stored.label_ids:
                stored.label_ids = [x for x in stored.label_ids if x != "INBOX"] + ["TRASH"]
                box.note("labelAdded", stored, ["TRASH"])
        self.record("messages.trash", stored.header(KEY_HEADER), mailbox=box.address,
                    id=stored.id)
        self.after_commit(request, fault)
        return web.json_response(_resource(stored, "minimal", []))

    async def _h_settings(self, request: web.Request) -> web.Response:
        body = await request.json()
        try:
            if not isinstance(body, dict):
                raise ValueError("the settings are a JSON object")
            unknown = set(body) - {"search_lag", "list_order", "clock_offset", "expire_history",
                                   "draft_send"}
            if unknown:
                raise ValueError(f"unknown setting {sorted(unknown)[0]!r}")
            self.configure(body.get("search_lag"), body.get("list_order"),
                           body.get("clock_offset"), bool(body.get("expire_history", False)),
                           body.get("draft_send"))
        except (TypeError, ValueError) as e:
            return web.json_response({"error": str(e)}, status=400)
        return web.json_response({"search_lag": self.search_lag, "list_order": self.list_order,
                                  "clock_offset": self.clock_offset,
                                  "draft_send": self.draft_send})

    def _find(self, box: Mailbox, mid: str) -> StoredMessage:
        with self._lock:
            stored = box.messages.get(mid)
        if stored is None:
            raise self.not_found()
        return stored


def _recipients(target: GmailTarget, msg: Message) -> list[str]:
    """The To, Cc and Bcc addresses of a message to be sent; a 400 when there are none."""
    recipients = [a for h in ("To", "Cc", "Bcc") for _, a in
                  email.utils.getaddresses([str(v) for v in msg.get_all(h, [])]) if a]
    if not recipients:
        raise Reply(target.error(400, "invalidArgument", "Recipient address required"))
    if any("@" not in a for a in recipients):
        raise Reply(target.error(400, "invalidArgument", "Invalid To header"))
    return recipients


def _as_sent(msg: Message, address: str) -> Message:
    """What Gmail does to an outgoing message: its own Message-ID replaces the client's, the
    account becomes the sender when none is given, and a Date is added."""
    local = "CA" + base64.urlsafe_b64encode(secrets.token_bytes(30)).decode().rstrip("=")
    del msg["Message-ID"]
    msg["Message-ID"] = f"<{local}@mail.gmail.com>"
    if msg["From"] is None:
        msg["From"] = address
    if msg["Date"] is None:
        msg["Date"] = email.utils.formatdate(usegmt=True)
    return msg


def _sent_labels(address: str, recipients: list[str]) -> list[str]:
    if address.lower() in (a.lower() for a in recipients):
        return ["UNREAD", "SENT", "INBOX"]
    return ["SENT"]


def _format(target: GmailTarget, request: web.Request, token: Token) -> str:
    fmt = request.query.get("format", "full").lower()
    if fmt not in ("full", "metadata", "minimal", "raw"):
        raise Reply(target.error(400, "invalidArgument", f"Invalid value at 'format', \"{fmt}\""))
    if fmt in ("full", "raw") and METADATA_SCOPE in token.scopes:
        raise Reply(target.error(403, "forbidden",
                                 f"Metadata scope doesn't allow format {fmt.upper()}"))
    return fmt


def _history_json(r: HistoryRecord) -> dict[str, Any]:
    ref = {"id": r.message["id"], "threadId": r.message["threadId"]}
    out: dict[str, Any] = {"id": str(r.id), "messages": [ref]}
    if r.kind == "messageAdded":
        out["messagesAdded"] = [{"message": dict(r.message)}]
    elif r.kind == "messageDeleted":
        out["messagesDeleted"] = [{"message": dict(r.message)}]
    else:
        out["labelsAdded" if r.kind == "labelAdded" else "labelsRemoved"] = [
            {"message": dict(r.message), "labelIds": list(r.labels)}]
    return out


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
