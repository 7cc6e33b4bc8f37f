"""Microsoft Graph v1.0 mail emulation: ``sendMail`` and the folder listings a probe reads.

Routes (as on ``https://graph.microsoft.com/v1.0``):

* ``POST /v1.0/me/sendMail`` — ``{"message": {...}, "saveToSentItems": true}``; property names
  are matched without regard to case, as Graph does (msgraph-sdk sends ``Message`` and
  ``SaveToSentItems``). Answers **202 with no body**: accepted, not sent;
* ``GET /v1.0/me/mailFolders/{drafts|outbox|sentitems|deleteditems|inbox}/messages`` —
  ``$filter`` (only ``singleValueExtendedProperties/any(ep: ep/id eq '…' and ep/value eq
  '…')``), ``$expand`` (``singleValueExtendedProperties`` with an optional ``($filter=id eq
  '…')``), ``$select``, ``$top``, ``$skip`` and ``@odata.nextLink``;
* ``GET /v1.0/me/messages/{id}`` and ``GET /v1.0/me/mailFolders/{folder}/messages/{id}``.

What the real service does and this one copies: an accepted message waits in the Outbox (or
Drafts, see ``queue_folder``) and moves to Sent Items only later, and its ``id`` changes when it
moves; with ``saveToSentItems`` false it disappears instead. ``internetMessageHeaders`` must be
named ``x-…`` (else 400 ``InvalidInternetMessageHeader``) and at most five; they are returned
only on ``$select`` and, as on Exchange Online, not for the copy in Sent Items — which is why a
probe should look for the single-value extended property, which every copy keeps. Errors come
in Graph's ``{"error": {"code", "message", "innerError"}}`` shape.

Control endpoints besides the core's (all JSON):

* ``POST /_staging/graph/settings`` — ``{"send_delay": 0.2, "queue_folder": "outbox"}``: seconds
  an accepted message waits before it moves to Sent Items, and where it waits;
* ``POST /_staging/graph/deliver`` — moves every waiting message to Sent Items now;
* ``POST /_staging/graph/send_reply`` — ``{"status": 202, "retry_after": 5, "times": 1}``: the
  next sendMail commits and then answers with this status and a ``Retry-After`` header (a 202
  keeps its empty body; 429/503/504 carry Graph's error body), to show that a client that
  honours Retry-After on its own would send twice;
* ``POST /_staging/graph/messages/{id}/move`` — ``{"folder": "deleteditems"}``: moves a message
  to another well-known folder as a person, a rule or a retention policy would. As on the real
  service the message gets a new ``id`` (answered as ``{"id": …}``) and keeps its single-value
  extended properties; a message still waiting to be sent cannot be moved (409);
* ``GET /_staging/graph/mailbox`` — every folder's messages, with their hidden properties.

The core fault op for the write is ``sendMail``; reads are ``messages.list`` and ``messages.get``.
"""

from __future__ import annotations

import base64
import re
import secrets
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from staging.core import Reply, Target, Token

SEND_SCOPES = ("Mail.Send",)
READ_SCOPES = ("Mail.Read", "Mail.ReadWrite")

MAILBOX = "agent@staging.example"
MAILBOX_NAME = "Staging Agent"

SEND_TOKEN = "staging-graph-send"
READ_TOKEN = "staging-graph-read"

# Sub-second so that tests see both states quickly, non-zero so "queued" is observable at all.
DEFAULT_SEND_DELAY = 0.5
DEFAULT_PAGE_SIZE = 10  # Graph's default $top for messages
MAX_PAGE_SIZE = 1000  # Graph's upper bound for $top on messages
MAX_CUSTOM_HEADERS = 5  # Exchange Online refuses more internetMessageHeaders than this

WELL_KNOWN = ("drafts", "outbox", "sentitems", "deleteditems", "inbox")
KEY_HEADER = "x-tidemark-key"  # recorded as the effect's key when present
KEY_PROPERTY_NAME = "tidemark_key"  # ... or a named extended property of that name

MESSAGE_PROPERTIES = (
    "id", "createdDateTime", "lastModifiedDateTime", "changeKey", "categories",
    "receivedDateTime", "sentDateTime", "hasAttachments", "internetMessageId", "subject",
    "bodyPreview", "importance", "parentFolderId", "conversationId", "isDeliveryReceiptRequested",
    "isReadReceiptRequested", "isRead", "isDraft", "webLink", "inferenceClassification", "body",
    "sender", "from", "toRecipients", "ccRecipients", "bccRecipients", "replyTo", "flag",
)
SELECT_ONLY = ("internetMessageHeaders", "uniqueBody")  # returned only when $select names them

_PROP_ID = re.compile(
    r"(?i)^(string|integer|boolean|systemtime|long|double|binary|guid)\s+"
    r"(?:\{([0-9a-f-]{36})\}\s+(name\s+\S.*|id\s+0x[0-9a-f]+)|(0x[0-9a-f]{1,4}))$")
_ANY_FILTER = re.compile(
    r"(?is)^\s*singleValueExtendedProperties/any\(\s*(\w+)\s*:\s*(.*)\)\s*$")
_COMPARISON = re.compile(r"(?is)^\s*(\w+)/(id|value)\s+eq\s+'((?:[^']|'')*)'\s*$")
_EXPAND = re.compile(
    r"(?is)^\s*singleValueExtendedProperties(?:\(\s*\$filter\s*=\s*id\s+eq\s+"
    r"'((?:[^']|'')*)'\s*\))?\s*$")


def normalise_property_id(prop_id: str) -> str | None:
    """The canonical form of an extended property id (GUIDs lower case, single spaces), or None
    when it is not one. Exchange compares property ids this way, not as raw strings."""
    m = _PROP_ID.match(prop_id.strip())
    if m is None:
        return None
    kind = m.group(1).capitalize()
    if m.group(4):
        return f"{kind} {m.group(4).lower()}"
    word, _, rest = m.group(3).partition(" ")
    return f"{kind} {{{m.group(2).lower()}}} {word.capitalize()} {rest.strip()}"


@dataclass
class GraphMessage:
    """One message and the properties Graph returns only on request."""

    fields: dict[str, Any]
    headers: list[dict[str, str]]
    properties: list[dict[str, str]]
    save_to_sent: bool = True
    deliver_at: float | None = None  # set while it waits to be sent
    seq: int = 0  # order of acceptance: timestamps have one-second resolution

    @property
    def id(self) -> str:
        return str(self.fields["id"])


class GraphTarget(Target):
    """The emulated Microsoft Graph v1.0 mail API of one mailbox (:data:`MAILBOX`)."""

    name = "graph"
    default_tokens = (
        Token(SEND_TOKEN, "graph", list(SEND_SCOPES)),
        Token(READ_TOKEN, "graph", ["Mail.Read"]),
    )

    def __init__(self, address: str = MAILBOX) -> None:
        super().__init__()
        self.address = address
        self._lock = threading.Lock()
        self._folders: dict[str, dict[str, GraphMessage]] = {}
        self._folder_ids: dict[str, str] = {}
        self.send_delay = DEFAULT_SEND_DELAY
        self.queue_folder = "outbox"
        self._replies: list[dict[str, Any]] = []
        self._seq = 0

    def reset(self) -> None:
        with self._lock:
            self._folders = {name: {} for name in WELL_KNOWN}
            self._folder_ids = {name: _new_id("AQMkAD") for name in WELL_KNOWN}
            self.send_delay = DEFAULT_SEND_DELAY
            self.queue_folder = "outbox"
            self._replies = []

    # -- inspection and control from tests and the CLI ------------------------------------------

    def configure(self, send_delay: float | None = None, queue_folder: str | None = None) -> None:
        """Sets how long accepted messages wait and in which folder (outbox or drafts)."""
        if queue_folder is not None and queue_folder not in ("outbox", "drafts"):
            raise ValueError("queue_folder must be 'outbox' or 'drafts'")
        if send_delay is not None and send_delay < 0:
            raise ValueError("send_delay must not be negative")
        with self._lock:
            if send_delay is not None:
                self.send_delay = float(send_delay)
            if queue_folder is not None:
                self.queue_folder = queue_folder

    def deliver(self) -> int:
        """Moves every waiting message on now; returns how many moved."""
        return self._settle(force=True)

    def move(self, message_id: str, folder: str) -> str:
        """Moves a message to the well-known ``folder`` as a person would and returns its new
        id (Exchange gives a moved item a new id; its extended properties go with it).

        Raises:
            KeyError: no folder holds ``message_id``.
            ValueError: the message still waits to be sent; moving it would cancel the send,
                which no test needs and the real service does not promise.
        """
        self._settle()
        with self._lock:
            source = next((f for f in WELL_KNOWN if message_id in self._folders[f]), None)
            if source is None:
                raise KeyError(message_id)
            m = self._folders[source][message_id]
            if m.deliver_at is not None:
                raise ValueError("the message is still waiting to be sent; deliver it first")
            del self._folders[source][message_id]
            m.fields.update(id=_new_id("AAMkAD"), parentFolderId=self._folder_ids[folder],
                            lastModifiedDateTime=_iso(time.time()),
                            changeKey=_new_id("CQAAAB"))
            self._folders[folder][m.id] = m
            return m.id

    def messages_in(self, folder: str) -> list[GraphMessage]:
        """The messages of a well-known folder, newest first, as a client would see them now."""
        self._settle()
        with self._lock:
            return _newest_first(self._folders[folder].values())

    def all_messages(self) -> list[tuple[str, GraphMessage]]:
        self._settle()
        with self._lock:
            return [(f, m) for f in WELL_KNOWN for m in _newest_first(self._folders[f].values())]

    def _settle(self, force: bool = False) -> int:
        """Moves the messages whose delay is over to Sent Items, each under a new id (as
        Exchange does), or drops them when the sender asked not to keep a copy."""
        now = time.time()
        moved = 0
        with self._lock:
            for folder in ("drafts", "outbox"):
                for mid, m in list(self._folders[folder].items()):
                    if m.deliver_at is None or (m.deliver_at > now and not force):
                        continue
                    del self._folders[folder][mid]
                    moved += 1
                    if not m.save_to_sent:
                        continue
                    stamp = _iso(now)
                    m.deliver_at = None
                    m.fields.update(id=_new_id("AAMkAD"), parentFolderId=self._folder_ids[
                        "sentitems"], sentDateTime=stamp, lastModifiedDateTime=stamp,
                        changeKey=_new_id("CQAAAB"), isDraft=False)
                    self._folders["sentitems"][m.id] = m
        return moved

    # -- errors ---------------------------------------------------------------------------------

    def error(self, status: int, code: str, message: str) -> web.Response:
        """Graph's error body. ``code`` is Graph's own code or one of the core's generic ones,
        translated here."""
        headers: dict[str, str] = {}
        if code in ("unauthenticated", "revoked"):
            code = "InvalidAuthenticationToken"
            headers["WWW-Authenticate"] = (
                'Bearer realm="", authorization_uri="https://login.microsoftonline.com/common/'
                'oauth2/authorize", client_id="00000003-0000-0000-c000-000000000000"')
        elif code == "insufficient_scope":
            code = "ErrorAccessDenied"
            message = "Access is denied. Check credentials and try again."
        elif code == "backend_error":
            code = "serviceNotAvailable"
            message = "The service is temporarily unavailable. Please retry later."
        body = {"error": {"code": code, "message": message, "innerError": {
            "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S"),
            "request-id": str(uuid.uuid4()), "client-request-id": str(uuid.uuid4())}}}
        return web.json_response(body, status=status, headers=headers)

    # -- routes -------------------------------------------------------------------------------

    def routes(self) -> Iterable[web.RouteDef]:
        return [
            web.post("/v1.0/me/sendMail", self._h_send),
            web.get("/v1.0/me/mailFolders/{folder}/messages", self._h_list),
            web.get("/v1.0/me/mailFolders/{folder}/messages/{id}", self._h_get),
            web.get("/v1.0/me/messages/{id}", self._h_get),
            web.post("/_staging/graph/settings", self._h_settings),
            web.post("/_staging/graph/deliver", self._h_deliver),
            web.post("/_staging/graph/send_reply", self._h_send_reply),
            web.post("/_staging/graph/messages/{id}/move", self._h_move),
            web.get("/_staging/graph/mailbox", self._h_mailbox),
        ]

    async def _h_send(self, request: web.Request) -> web.Response:
        self.authorize(request, *SEND_SCOPES)
        try:
            body = await request.json()
        except ValueError:
            raise Reply(self.error(400, "BadRequest", "Unable to read JSON request payload. "
                                   "Please ensure Content-Type header is set and payload is of "
                                   "valid JSON format.")) from None
        if not isinstance(body, dict):
            raise Reply(self.error(400, "BadRequest", "Empty Payload. JSON content expected."))
        raw = _ci(body).get("message")
        if not isinstance(raw, dict):
            raise Reply(self.error(400, "ErrorInvalidParameter",
                                   "The value of the parameter 'Message' is empty."))
        save = _ci(body).get("savetosentitems", True)
        message = self._parse_message(raw, save is not False)
        fault = await self.before_write(request, "sendMail")
        with self._lock:
            folder = self.queue_folder
            message.fields["parentFolderId"] = self._folder_ids[folder]
            message.fields["isDraft"] = folder == "drafts"
            message.deliver_at = time.time() + self.send_delay
            self._seq += 1
            message.seq = self._seq
            self._folders[folder][message.id] = message
            reply = self._take_reply()
        self.record("sendMail", _effect_key(message), id=message.id, folder=folder,
                    to=[r["emailAddress"]["address"] for r in message.fields["toRecipients"]],
                    subject=message.fields["subject"])
        self.after_commit(request, fault)
        if reply is None:
            return web.Response(status=202)
        headers = {"Retry-After": str(reply["retry_after"])}
        if reply["status"] == 202:
            return web.Response(status=202, headers=headers)
        response = self.error(reply["status"], "ErrorServerBusy" if reply["status"] != 429
                              else "ApplicationThrottled", "The server cannot service this "
                              "request right now. Try again later.")
        response.headers.update(headers)
        return response

    def _take_reply(self) -> dict[str, Any] | None:
        if not self._replies:
            return None
        reply = self._replies[0]
        reply["times"] -= 1
        if reply["times"] <= 0:
            self._replies.pop(0)
        return reply

    def _parse_message(self, raw: dict[str, Any], save_to_sent: bool) -> GraphMessage:
        m = _ci(raw)
        to = self._recipients(m.get("torecipients"))
        cc = self._recipients(m.get("ccrecipients"))
        bcc = self._recipients(m.get("bccrecipients"))
        if not (to or cc or bcc):
            raise Reply(self.error(400, "ErrorInvalidRecipients",
                                   "At least one recipient isn't valid., A message can't be sent "
                                   "because it contains no recipients."))
        headers = self._headers(m.get("internetmessageheaders"))
        properties = self._properties(m.get("singlevalueextendedproperties"))
        body = _ci(m.get("body") or {})
        content_type = str(body.get("contenttype") or "text").lower()
        if content_type not in ("text", "html"):
            raise Reply(self.error(400, "RequestBodyRead",
                                   f"The value '{content_type}' is not valid for BodyType."))
        content = str(body.get("content") or "")
        now = _iso(time.time())
        me = {"emailAddress": {"name": MAILBOX_NAME, "address": self.address}}
        fields: dict[str, Any] = {
            "id": _new_id("AAMkAD"), "createdDateTime": now, "lastModifiedDateTime": now,
            "changeKey": _new_id("CQAAAB"), "categories": [], "receivedDateTime": now,
            "sentDateTime": None, "hasAttachments": False,
            "internetMessageId": f"<{secrets.token_hex(12).upper()}@STAGING.prod.outlook.com>",
            "subject": str(m.get("subject") or ""), "bodyPreview": " ".join(content.split())[:255],
            "importance": str(m.get("importance") or "normal").lower(), "parentFolderId": "",
            "conversationId": _new_id("AAQkAD"), "isDeliveryReceiptRequested": False,
            "isReadReceiptRequested": False, "isRead": True, "isDraft": False,
            "webLink": "https://outlook.office365.com/owa/?ItemID=staging&exvsurl=1",
            "inferenceClassification": "focused",
            "body": {"contentType": content_type, "content": content},
            "sender": me, "from": me, "toRecipients": to, "ccRecipients": cc,
            "bccRecipients": bcc, "replyTo": [], "flag": {"flagStatus": "notFlagged"},
        }
        return GraphMessage(fields, headers, properties, save_to_sent)

    def _recipients(self, raw: Any) -> list[dict[str, Any]]:
        out = []
        for r in raw or []:
            addr = _ci(_ci(r if isinstance(r, dict) else {}).get("emailaddress") or {})
            address = addr.get("address")
            if not isinstance(address, str) or not re.fullmatch(r"[^@\s]+@[^@\s]+", address):
                raise Reply(self.error(400, "ErrorInvalidRecipients",
                                       f"At least one recipient isn't valid., Recipient "
                                       f"'{address}' is not resolved. All recipients must be "
                                       "resolved before a message can be submitted."))
            out.append({"emailAddress": {"name": str(addr.get("name") or address),
                                         "address": address}})
        return out

    def _headers(self, raw: Any) -> list[dict[str, str]]:
        if raw is None:
            return []
        if not isinstance(raw, list) or not 0 < len(raw) <= MAX_CUSTOM_HEADERS:
            raise Reply(self.error(400, "InvalidInternetMessageHeaderCollection",
                                   f"Maximum number of headers in one message should be less "
                                   f"than or equal to {MAX_CUSTOM_HEADERS}."))
        out = []
        for h in raw:
            h = _ci(h if isinstance(h, dict) else {})
            name, value = str(h.get("name") or ""), str(h.get("value") or "")
            if not name.lower().startswith("x-"):
                raise Reply(self.error(400, "InvalidInternetMessageHeader",
                                       f"The internet message header name '{name}' should "
                                       "start with 'x-' or 'X-'."))
            out.append({"name": name, "value": value})
        return out

    def _properties(self, raw: Any) -> list[dict[str, str]]:
        out = []
        for p in raw or []:
            p = _ci(p if isinstance(p, dict) else {})
            prop_id = normalise_property_id(str(p.get("id") or ""))
            if prop_id is None or not isinstance(p.get("value"), str):
                raise Reply(self.error(400, "ErrorInvalidProperty",
                                       f"The extended property id '{p.get('id')}' is not valid."))
            out.append({"id": prop_id, "value": p["value"]})
        return out

    async def _h_list(self, request: web.Request) -> web.Response:
        self.authorize(request, *READ_SCOPES)
        folder = self._folder(request.match_info["folder"])
        q = request.query
        keep = _parse_filter(self, q.get("$filter"))
        expand = _parse_expand(self, q.get("$expand"))
        select = _parse_select(self, q.get("$select"))
        top = _int_option(self, q, "$top", DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        skip = _int_option(self, q, "$skip", 0, 1 << 31)
        fault = await self.before_write(request, "messages.list")
        found = [m for m in self.messages_in(folder) if keep(m)]
        page = found[skip:skip + top]
        out: dict[str, Any] = {
            "@odata.context": f"https://graph.microsoft.com/v1.0/$metadata#users('{self.address}')"
                              f"/mailFolders('{folder}')/messages",
            "value": [self._view(m, folder, select, expand) for m in page]}
        if skip + top < len(found):
            nxt = request.url.update_query({"$skip": str(skip + top)})
            out["@odata.nextLink"] = str(nxt)
        self.after_commit(request, fault)
        return web.json_response(out)

    async def _h_get(self, request: web.Request) -> web.Response:
        self.authorize(request, *READ_SCOPES)
        wanted = request.match_info.get("folder")
        folders = (self._folder(wanted),) if wanted else WELL_KNOWN
        select = _parse_select(self, request.query.get("$select"))
        expand = _parse_expand(self, request.query.get("$expand"))
        fault = await self.before_write(request, "messages.get")
        self._settle()
        with self._lock:
            hit = next(((f, self._folders[f][request.match_info["id"]]) for f in folders
                        if request.match_info["id"] in self._folders[f]), None)
        if hit is None:
            raise Reply(self.error(404, "ErrorItemNotFound",
                                   "The specified object was not found in the store."))
        out = self._view(hit[1], hit[0], select, expand)
        self.after_commit(request, fault)
        return web.json_response(out)

    def _folder(self, name: str) -> str:
        key = name.strip("'").lower()
        if key in self._folder_ids:
            return key
        for folder, fid in self._folder_ids.items():
            if fid == name:
                return folder
        raise Reply(self.error(400, "ErrorInvalidIdMalformed", "Id is malformed."))

    def _view(self, m: GraphMessage, folder: str, select: list[str] | None,
              expand: tuple[bool, str | None]) -> dict[str, Any]:
        out: dict[str, Any] = {"@odata.etag": f'W/"{m.fields["changeKey"]}"'}
        names = MESSAGE_PROPERTIES if select is None else ["id", *select]
        for name in names:
            if name == "internetMessageHeaders":
                # Exchange Online keeps no internet headers on the Sent Items copy, and that
                # copy stays without them when it is moved on (to Deleted Items, say).
                if m.fields["sentDateTime"] is None and m.headers:
                    out[name] = [dict(h) for h in m.headers]
            elif name in m.fields:
                out[name] = m.fields[name]
        wanted, prop_id = expand
        if wanted:
            props = [dict(p) for p in m.properties if prop_id is None or p["id"] == prop_id]
            if props:  # Graph leaves the collection out when nothing matches
                out["singleValueExtendedProperties"] = props
        return out

    # -- control ----------------------------------------------------------------------------------

    async def _h_settings(self, request: web.Request) -> web.Response:
        body = await request.json()
        try:
            self.configure(body.get("send_delay"), body.get("queue_folder"))
        except (TypeError, ValueError) as e:
            return web.json_response({"error": str(e)}, status=400)
        return web.json_response({"send_delay": self.send_delay,
                                  "queue_folder": self.queue_folder})

    async def _h_deliver(self, request: web.Request) -> web.Response:
        return web.json_response({"delivered": self.deliver()})

    async def _h_send_reply(self, request: web.Request) -> web.Response:
        body = await request.json()
        status, after, times = body.get("status", 202), body.get("retry_after", 1), \
            body.get("times", 1)
        if status not in (202, 429, 503, 504) or not isinstance(after, int) or after < 0 \
                or not isinstance(times, int) or times < 1:
            return web.json_response({"error": "status must be 202, 429, 503 or 504; "
                                               "retry_after and times non-negative integers"},
                                     status=400)
        with self._lock:
            self._replies.append({"status": status, "retry_after": after, "times": times})
        return web.json_response({"armed": body})

    async def _h_move(self, request: web.Request) -> web.Response:
        body = await request.json()
        wanted = body.get("folder") if isinstance(body, dict) else None
        if wanted not in WELL_KNOWN:
            return web.json_response({"error": f"folder must be one of {', '.join(WELL_KNOWN)}"},
                                     status=400)
        try:
            new_id = self.move(request.match_info["id"], wanted)
        except KeyError:
            return web.json_response({"error": "no such message"}, status=404)
        except ValueError as e:
            return web.json_response({"error": str(e)}, status=409)
        return web.json_response({"id": new_id, "folder": wanted})

    async def _h_mailbox(self, request: web.Request) -> web.Response:
        return web.json_response({folder: [{"fields": m.fields, "internetMessageHeaders":
                                            m.headers, "singleValueExtendedProperties":
                                            m.properties, "deliver_at": m.deliver_at}
                                           for m in self.messages_in(folder)]
                                  for folder in WELL_KNOWN})


# -- query options -----------------------------------------------------------------------------

def _odata_string(text: str) -> str:
    return text.replace("''", "'")


def _parse_filter(target: GraphTarget, text: str | None) -> Any:
    """A predicate for the one $filter form a probe needs; anything else is a clear 400."""
    if text is None:
        return lambda m: True
    wanted: dict[str, str] = {}
    m = _ANY_FILTER.match(text)
    if m is not None:
        for term in re.split(r"(?i)\s+and\s+", m.group(2)):
            c = _COMPARISON.match(term)
            if c is None or c.group(1) != m.group(1):
                wanted = {}
                break
            wanted[c.group(2).lower()] = _odata_string(c.group(3))
    if set(wanted) != {"id", "value"}:
        raise Reply(target.error(400, "ErrorInvalidUrlQueryFilter",
                                 f"The query filter contains one or more invalid nodes "
                                 f"(staging Graph supports only singleValueExtendedProperties/"
                                 f"any(ep: ep/id eq '...' and ep/value eq '...')): {text}"))
    prop_id = normalise_property_id(wanted["id"])
    if prop_id is None:
        raise Reply(target.error(400, "ErrorInvalidProperty",
                                 f"The extended property id '{wanted['id']}' is not valid."))
    return lambda msg: any(p["id"] == prop_id and p["value"] == wanted["value"]
                           for p in msg.properties)


def _parse_expand(target: GraphTarget, text: str | None) -> tuple[bool, str | None]:
    if text is None:
        return False, None
    m = _EXPAND.match(text)
    if m is None:
        raise Reply(target.error(400, "BadRequest",
                                 f"Parsing OData Select and Expand failed: staging Graph expands "
                                 f"only singleValueExtendedProperties, not {text!r}"))
    if m.group(1) is None:
        return True, None
    prop_id = normalise_property_id(_odata_string(m.group(1)))
    if prop_id is None:
        raise Reply(target.error(400, "ErrorInvalidProperty",
                                 f"The extended property id '{m.group(1)}' is not valid."))
    return True, prop_id


def _parse_select(target: GraphTarget, text: str | None) -> list[str] | None:
    if text is None:
        return None
    known = {p.lower(): p for p in (*MESSAGE_PROPERTIES, *SELECT_ONLY)}
    out = []
    for name in (n.strip() for n in text.split(",") if n.strip()):
        if name.lower() not in known:
            raise Reply(target.error(400, "RequestBroker--ParseUri",
                                     f"Could not find a property named '{name}' on type "
                                     "'microsoft.graph.message'."))
        out.append(known[name.lower()])
    return out


def _int_option(target: GraphTarget, query: Any, name: str, default: int, hi: int) -> int:
    value = query.get(name)
    if value is None:
        return default
    if not value.isdigit():
        raise Reply(target.error(400, "BadRequest",
                                 f"Invalid value '{value}' for query option '{name}'."))
    return min(int(value), hi)


# -- helpers -----------------------------------------------------------------------------------

def _ci(d: dict[str, Any]) -> dict[str, Any]:
    """The same object with lower-cased property names: Graph matches them without case."""
    return {str(k).lower(): v for k, v in d.items()}


def _new_id(prefix: str) -> str:
    return prefix + base64.urlsafe_b64encode(secrets.token_bytes(48)).decode()


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _newest_first(messages: Iterable[GraphMessage]) -> list[GraphMessage]:
    return sorted(messages, key=lambda m: m.seq, reverse=True)


def _effect_key(m: GraphMessage) -> str | None:
    for h in m.headers:
        if h["name"].lower() == KEY_HEADER:
            return h["value"]
    for p in m.properties:
        if p["id"].endswith(f" Name {KEY_PROPERTY_NAME}"):
            return p["value"]
    return None
