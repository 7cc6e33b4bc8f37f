"""Microsoft Graph v1.0 mail emulation: drafts and their sending, ``sendMail``, folders, moves,
the mailbox-wide message listing a probe reads, and ``/me``.

Several mailboxes can exist; a token reaches the mailbox of its ``account`` (``Token.account``
in staging/core; the default tokens reach :data:`DEFAULT_ACCOUNT`, the mailbox
:data:`MAILBOX`). Routes (as on ``https://graph.microsoft.com/v1.0``):

* ``GET /v1.0/me`` (``User.Read``) — ``{id, userPrincipalName, mail, displayName}``;
* ``POST /v1.0/me/messages`` (``Mail.ReadWrite``) — creates a draft in Drafts (``isDraft``
  true, an ``internetMessageId`` already assigned) and answers 201 with it;
* ``POST /v1.0/me/messages/{id}/send`` (``Mail.Send``) — sends a draft: 202 with no body; the
  draft leaves Drafts for the Outbox under a NEW id and later reaches Sent Items under another
  one, keeping its single-value extended properties. An id that is no longer a draft (sent
  already, moved, deleted) answers 404 ``ErrorItemNotFound``. With the switch
  ``submitted_stays_in_drafts_s`` on, the sent draft instead stays in Drafts under its id,
  ``isDraft`` true, for that many seconds, with mfSubmitted (0x4) set in PR_MESSAGE_FLAGS
  (``Integer 0x0E07``, computed, as every message's), then moves to Sent Items; a send of it
  meanwhile does what the switch ``second_send`` says (refused, ignored, sent again);
* ``POST /v1.0/me/sendMail`` (``Mail.Send``) — ``{"message": {...}, "saveToSentItems": true}``
  (property names matched without regard to case, as Graph does): 202, accepted not sent;
* ``POST /v1.0/me/messages/{id}/move`` (``Mail.ReadWrite``) — ``{"destinationId": …}`` (a
  folder id or a well-known name): 201 with the message under its new id;
* ``GET/POST /v1.0/me/mailFolders`` and ``GET /v1.0/me/mailFolders/{id}`` — folders; a POST
  ``{"displayName"}`` creates a user folder;
* ``GET /v1.0/me/messages`` — every message of the mailbox's folder tree (Recoverable Items is
  not part of it, as on Exchange), and ``GET /v1.0/me/mailFolders/{folder}/messages`` — one
  folder; both with ``$filter`` (only ``singleValueExtendedProperties/any(ep: ep/id eq '…' and
  ep/value eq '…')``), ``$expand`` (``singleValueExtendedProperties`` with an optional
  ``($filter=id eq '…' [or id eq '…']…)``), ``$select``, ``$top``, ``$skip`` and
  ``@odata.nextLink``;
* ``GET /v1.0/me/messages/{id}`` and ``GET /v1.0/me/mailFolders/{folder}/messages/{id}``.

Every route also answers under ``/v1.0/users/{user}`` (an id or userPrincipalName) instead of
``/v1.0/me``: an app-only token (client credentials at staging/oauth, roles instead of
delegated scopes, ``User.Read.All`` for the profile) reaches any mailbox that way and gets 400
on ``/me``; a delegated token reaches its own mailbox under either path and gets 403
``ErrorAccessDenied`` for another user's.

Well-known folder names: drafts, outbox, sentitems, deleteditems, inbox, archive and
recoverableitemsdeletions (where Deleted Items goes when it is emptied). What the real service
does and this one copies: a message's ``id`` changes whenever it moves; with
``saveToSentItems`` false it disappears once sent; ``internetMessageHeaders`` must be named
``x-…`` and at most five, are returned only on ``$select`` and not for a sent copy (so a probe
looks for the single-value extended property, which every copy keeps). Errors come in Graph's
``{"error": {"code", "message", "innerError"}}`` shape.

Control endpoints besides the core's (all JSON; ``account`` picks the mailbox, default
:data:`DEFAULT_ACCOUNT`):

* ``POST /_staging/graph/mailboxes`` — ``{"account", "address", "name"?}`` adds a mailbox;
* ``POST /_staging/graph/settings`` — ``{"send_delay": 0.2, "queue_folder": "outbox",
  "stall": 1, "sent_rule": "archive"}``: seconds a submitted message waits before it reaches
  Sent Items and where ``sendMail`` queues it; ``stall`` makes the next N submissions answer
  202 yet leave the message a draft in Drafts for good (as a submission that never reached the
  transport: sendMail's own draft, or a sent draft that stayed); ``sent_rule`` moves every copy
  that reaches Sent Items on to that folder, as an Outlook rule would (null: no rule);
* ``POST /_staging/graph/deliver`` — moves every waiting message to Sent Items now;
* ``POST /_staging/graph/send_reply`` — ``{"status": 202, "retry_after": 5, "times": 1}``: the
  next sendMail commits and then answers with this status and a ``Retry-After`` header;
* ``POST /_staging/graph/messages/{id}/move`` — ``{"folder": …}`` (a name or id): moves a
  message as a person, a rule or a retention policy would; answers ``{"id": new id}``; a
  message still waiting to be sent cannot be moved (409);
* ``POST /_staging/graph/folders`` — ``{"displayName"}`` creates a user folder;
* ``POST /_staging/graph/empty_deleted`` — empties Deleted Items into Recoverable Items
  (recoverableitemsdeletions), each message under a new id;
* ``POST /_staging/graph/inbound`` — ``{"from", "subject"?, "internetMessageHeaders"?,
  "singleValueExtendedProperties"?, "folder"?}`` delivers a message from outside into the
  Inbox (or ``folder``), carrying whatever headers and properties the sender chose (but not
  PR_MESSAGE_FLAGS, which the store computes);
* ``GET /_staging/graph/mailbox`` — every folder's messages, with their hidden properties, and
  the sends refused because the id was no longer a draft (``refused_sends``).

Fault ops: ``messages.create``, ``message.send``, ``sendMail`` (writes), ``messages.list``,
``messages.get``, ``me.get`` (reads). Effects: ``messages.create`` (a draft), ``message.send``
and ``sendMail`` (a mail submitted; ``stalled`` true in the detail when it stayed a draft;
``again`` true for the second mail of a submitted draft sent again under ``second_send``).
"""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from staging.core import DEFAULT_ACCOUNT, Reply, Switch, Target, Token
from staging.oauth import APP_ONLY
from tidemark import staging_tokens

SEND_SCOPES = ("Mail.Send",)
READ_SCOPES = ("Mail.Read", "Mail.ReadWrite")
WRITE_SCOPES = ("Mail.ReadWrite",)  # creating a draft or moving a message
PROFILE_SCOPES = ("User.Read", "User.Read.All")  # User.Read.All: an app reading a user

MAILBOX = "agent@staging.example"
MAILBOX_NAME = "Staging Agent"

# The write token may create drafts (Mail.ReadWrite), send them (Mail.Send) and read its own
# profile (User.Read); the read token reads mail and its profile.
SEND_TOKEN = staging_tokens.GRAPH_SEND
READ_TOKEN = staging_tokens.GRAPH_READ

# Sub-second so that tests see both states quickly, non-zero so "queued" is observable at all.
DEFAULT_SEND_DELAY = 0.5
DEFAULT_PAGE_SIZE = 10  # Graph's default $top for messages
MAX_PAGE_SIZE = 1000  # Graph's upper bound for $top on messages
MAX_CUSTOM_HEADERS = 5  # Exchange Online refuses more internetMessageHeaders than this

WELL_KNOWN = {"drafts": "Drafts", "outbox": "Outbox", "sentitems": "Sent Items",
              "deleteditems": "Deleted Items", "inbox": "Inbox", "archive": "Archive",
              "recoverableitemsdeletions": "Deletions"}
# Outside the folder tree /me/messages lists (Recoverable Items is, on Exchange, too).
HIDDEN = ("recoverableitemsdeletions",)
KEY_HEADER = "x-tidemark-key"  # recorded as the effect's key when present
KEY_PROPERTY_NAME = "tidemark_key"  # ... or a named extended property of that name

# PR_MESSAGE_FLAGS (PidTagMessageFlags), a PT_LONG every message has; Graph reads it as the
# single-value extended property "Integer 0x0E07". Exchange computes it: a client cannot set it
# once the message is saved, so a value sent with a message is dropped. Bits per [MS-OXCMSG]
# 2.2.1.6 (PidTagMessageFlags): mfRead 0x1, mfSubmitted 0x4 ("marked for sending as a result of
# a call to the RopSubmitMessage ROP"), mfUnsent 0x8 (still being composed, a draft).
MESSAGE_FLAGS_ID = "Integer 0x0e07"
MSGFLAG_READ = 0x1
MSGFLAG_SUBMIT = 0x4
MSGFLAG_UNSENT = 0x8

SWITCHES = (
    # "Send mail by using the Microsoft Graph API" (learn.microsoft.com/graph/
    # outlook-things-to-know-about-send-mail): the 202 comes once the message is saved in
    # Drafts (step 1); transport picks it up later (steps 2-3), and only then does the store
    # move it "from the Drafts folder to the Sent Items folder" (step 4). No bound is given
    # for that wait. While it lasts the message is in Drafts under its draft id, isDraft still
    # true, with mfSubmitted set in PR_MESSAGE_FLAGS. 0: the message leaves Drafts during the
    # request (for the Outbox, as before). The worst case is longer than Tidemark's confirm
    # wait (TIDEMARK_GRAPH_CONFIRM_S, 10 s by default).
    Switch("submitted_stays_in_drafts_s", default=0, worst=120,
           doc="Graph 'Send mail by using the Microsoft Graph API', steps 1-4: after the 202 "
               "a sent message stays in Drafts until transport moves it to Sent Items; "
               "no bound is documented. Seconds it stays (0: it leaves during the request)."),
    # What POST /messages/{id}/send does with a draft that was already submitted and still
    # waits in Drafts is not documented: microsoftgraph/microsoft-graph-docs-contrib issue
    # #921 ("Please add info about possible idempotency", message-send) asks and is open.
    # "refused": an error (400 ErrorInvalidRequest here, the code being unknown); "ignored":
    # 202 and nothing more goes out; "sent_again": 202 and a second copy goes out.
    Switch("second_send", default="refused", worst="sent_again",
           choices=("refused", "ignored", "sent_again"),
           doc="Graph message-send on a draft already submitted (still in Drafts) is "
               "undocumented (microsoft-graph-docs-contrib issue #921, open): refused with "
               "an error, ignored (202), or sent again (202 and a second mail)."),
)

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
    r"(?is)^\s*singleValueExtendedProperties(?:\(\s*\$filter\s*=\s*(.*)\))?\s*$")
_EXPAND_ID = re.compile(r"(?is)^\s*id\s+eq\s+'((?:[^']|'')*)'\s*$")


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
    submitted: bool = False  # mfSubmitted: sent, and still in Drafts waiting for transport
    seq: int = 0  # order of arrival: timestamps have one-second resolution

    @property
    def id(self) -> str:
        return str(self.fields["id"])


@dataclass
class Folder:
    id: str
    name: str  # the well-known name, or the display name of a user folder
    display_name: str
    messages: dict[str, GraphMessage] = field(default_factory=dict)


@dataclass
class Mailbox:
    """One user's mailbox: its profile, folders and send behaviour."""

    account: str
    address: str
    display_name: str
    user_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    folders: dict[str, Folder] = field(default_factory=dict)  # by folder id
    send_delay: float = DEFAULT_SEND_DELAY
    queue_folder: str = "outbox"
    stall: int = 0
    sent_rule: str | None = None  # folder id
    refused_sends: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name, display in WELL_KNOWN.items():
            # A mailbox's well-known folders keep their ids for its life, as Exchange's do
            # (a worker reads them once); derived from the account, they survive a reset too.
            f = Folder(_stable_id("AQMkAD", f"{self.account}/{name}"), name, display)
            self.folders[f.id] = f

    def folder(self, name_or_id: str) -> Folder | None:
        key = name_or_id.strip("'")
        if key in self.folders:
            return self.folders[key]
        return next((f for f in self.folders.values()
                     if f.name.lower() == key.lower() and f.name in WELL_KNOWN), None)

    def lookup(self, name_or_id: str) -> Folder | None:
        """Like ``folder``, and also a user folder by its display name (for control calls)."""
        return self.folder(name_or_id) or next(
            (f for f in self.folders.values()
             if f.name not in WELL_KNOWN and f.display_name == name_or_id), None)

    def well_known(self, name: str) -> Folder:
        found = self.folder(name)
        assert found is not None, name
        return found

    def find(self, message_id: str) -> tuple[Folder, GraphMessage] | None:
        for f in self.folders.values():
            if message_id in f.messages:
                return f, f.messages[message_id]
        return None

    def me(self) -> dict[str, Any]:
        return {"id": self.user_id, "userPrincipalName": self.address, "mail": self.address,
                "displayName": self.display_name}


class GraphTarget(Target):
    """The emulated Microsoft Graph v1.0 mail API of one or more mailboxes."""

    name = "graph"
    default_tokens = (
        Token(SEND_TOKEN, "graph", ["Mail.Send", "Mail.ReadWrite", "User.Read"]),
        Token(READ_TOKEN, "graph", ["Mail.Read", "User.Read"]),
    )
    switches = SWITCHES

    def __init__(self, address: str = MAILBOX) -> None:
        super().__init__()
        self.address = address
        self._lock = threading.Lock()
        self._boxes: dict[str, Mailbox] = {}
        self._replies: list[dict[str, Any]] = []
        self._seq = 0

    def reset(self) -> None:
        with self._lock:
            self._boxes = {DEFAULT_ACCOUNT: Mailbox(DEFAULT_ACCOUNT, self.address, MAILBOX_NAME)}
            self._replies = []

    # -- inspection and control from tests and the CLI ------------------------------------------

    def add_mailbox(self, account: str, address: str, name: str | None = None) -> Mailbox:
        with self._lock:
            box = Mailbox(account, address, name or address)
            self._boxes[account] = box
            return box

    def box(self, account: str = DEFAULT_ACCOUNT) -> Mailbox:
        with self._lock:
            try:
                return self._boxes[account]
            except KeyError:
                raise KeyError(f"no mailbox for account {account!r}") from None

    def configure(self, send_delay: float | None = None, queue_folder: str | None = None, *,
                  stall: int | None = None, sent_rule: str | None = None,
                  clear_rule: bool = False, account: str = DEFAULT_ACCOUNT) -> None:
        """Sets how long submitted messages wait, where sendMail queues them (outbox or
        drafts), how many next submissions stall in Drafts, and a rule for sent copies."""
        if queue_folder is not None and queue_folder not in ("outbox", "drafts"):
            raise ValueError("queue_folder must be 'outbox' or 'drafts'")
        if send_delay is not None and send_delay < 0:
            raise ValueError("send_delay must not be negative")
        if stall is not None and (not isinstance(stall, int) or stall < 0):
            raise ValueError("stall must be a non-negative integer")
        box = self.box(account)
        with self._lock:
            if sent_rule is not None:
                target = box.lookup(sent_rule)
                if target is None:
                    raise ValueError(f"no folder {sent_rule!r}")
                box.sent_rule = target.id
            if clear_rule:
                box.sent_rule = None
            if send_delay is not None:
                box.send_delay = float(send_delay)
            if queue_folder is not None:
                box.queue_folder = queue_folder
            if stall is not None:
                box.stall = stall

    def create_folder(self, display_name: str, account: str = DEFAULT_ACCOUNT) -> Folder:
        box = self.box(account)
        with self._lock:
            if any(f.display_name.lower() == display_name.lower()
                   for f in box.folders.values()):
                raise ValueError(f"a folder named {display_name!r} exists")
            f = Folder(_new_id("AAMkAD"), display_name, display_name)
            box.folders[f.id] = f
            return f

    def deliver(self, account: str = DEFAULT_ACCOUNT) -> int:
        """Moves every waiting message on now; returns how many moved."""
        return self._settle(self.box(account), force=True)

    def move(self, message_id: str, folder: str, account: str = DEFAULT_ACCOUNT) -> str:
        """Moves a message to ``folder`` (a name or id) as a person would and returns its new
        id (Exchange gives a moved item a new id; its extended properties go with it).

        Raises:
            KeyError: no folder holds ``message_id``, or there is no such folder.
            ValueError: the message still waits to be sent.
        """
        box = self.box(account)
        self._settle(box)
        with self._lock:
            hit = box.find(message_id)
            target = box.lookup(folder)
            if hit is None or target is None:
                raise KeyError(message_id if hit is None else folder)
            if hit[1].deliver_at is not None:
                raise ValueError("the message is still waiting to be sent; deliver it first")
            return self._move(box, hit[0], hit[1], target)

    def empty_deleted(self, account: str = DEFAULT_ACCOUNT) -> int:
        """Empties Deleted Items into Recoverable Items, as a person or a retention policy
        would; returns how many messages moved."""
        box = self.box(account)
        self._settle(box)
        with self._lock:
            source = box.well_known("deleteditems")
            target = box.well_known("recoverableitemsdeletions")
            moved = list(source.messages.values())
            for m in moved:
                self._move(box, source, m, target)
            return len(moved)

    def inbound(self, sender: str, subject: str, headers: list[dict[str, str]],
                properties: list[dict[str, str]], folder: str = "inbox",
                account: str = DEFAULT_ACCOUNT) -> str:
        """Delivers a message from outside (anyone can mail the mailbox, with any headers)."""
        box = self.box(account)
        raw = {"subject": subject, "body": {"contentType": "text", "content": "inbound"},
               "toRecipients": [{"emailAddress": {"address": box.address}}],
               "internetMessageHeaders": headers or None,
               "singleValueExtendedProperties": properties}
        m = self._parse_message(raw, box, save_to_sent=False, need_recipients=True)
        who = {"emailAddress": {"name": sender, "address": sender}}
        with self._lock:
            target = box.lookup(folder)
            if target is None:
                raise KeyError(folder)
            m.fields.update(sender=who, isDraft=False, isRead=False, parentFolderId=target.id,
                            sentDateTime=m.fields["createdDateTime"], **{"from": who})
            self._add(target, m)
        return m.id

    def messages_in(self, folder: str, account: str = DEFAULT_ACCOUNT) -> list[GraphMessage]:
        """The messages of a folder (name or id), newest first, as a client would see them."""
        box = self.box(account)
        self._settle(box)
        with self._lock:
            found = box.lookup(folder)
            if found is None:
                raise KeyError(folder)
            return _newest_first(found.messages.values())

    def all_messages(self, account: str = DEFAULT_ACCOUNT) -> list[tuple[str, GraphMessage]]:
        box = self.box(account)
        self._settle(box)
        with self._lock:
            return [(f.name, m) for f in box.folders.values()
                    for m in _newest_first(f.messages.values())]

    # -- mailbox mechanics (callers hold no lock unless said) -------------------------------------

    def _add(self, folder: Folder, m: GraphMessage) -> None:
        """Files ``m`` in ``folder`` (lock held)."""
        self._seq += 1
        m.seq = self._seq
        m.fields["parentFolderId"] = folder.id
        folder.messages[m.id] = m

    def _move(self, box: Mailbox, source: Folder, m: GraphMessage, target: Folder) -> str:
        """Moves ``m`` under a new id (lock held); returns the new id."""
        del source.messages[m.id]
        m.fields.update(id=_new_id("AAMkAD"), parentFolderId=target.id,
                        lastModifiedDateTime=_iso(time.time()), changeKey=_new_id("CQAAAB"))
        target.messages[m.id] = m
        return m.id

    def _settle(self, box: Mailbox, force: bool = False) -> int:
        """Moves the messages whose delay is over to Sent Items, each under a new id (as
        Exchange does), or drops them when the sender asked not to keep a copy; then applies
        the mailbox's rule for sent copies. A message waits in the Outbox, or in Drafts while
        ``submitted_stays_in_drafts_s`` lasts."""
        now = time.time()
        moved = 0
        with self._lock:
            sent = box.well_known("sentitems")
            for folder in list(box.folders.values()):
                for m in list(folder.messages.values()):
                    if m.deliver_at is None or (m.deliver_at > now and not force):
                        continue
                    del folder.messages[m.id]
                    moved += 1
                    m.deliver_at, m.submitted = None, False
                    if not m.save_to_sent:
                        continue
                    stamp = _iso(now)
                    m.fields.update(id=_new_id("AAMkAD"), sentDateTime=stamp,
                                    lastModifiedDateTime=stamp, changeKey=_new_id("CQAAAB"),
                                    isDraft=False)
                    sent.messages[m.id] = m
                    m.fields["parentFolderId"] = sent.id
                    rule = box.folders.get(box.sent_rule or "")
                    if rule is not None and rule is not sent:
                        self._move(box, sent, m, rule)
        return moved

    def _submit(self, box: Mailbox, m: GraphMessage, source: Folder | None) -> bool:
        """Submits ``m`` (lock held): it leaves ``source`` (Drafts) for the queue folder under
        a new id and waits there ``send_delay``, or, while the ``submitted_stays_in_drafts_s``
        switch is on, stays a draft in Drafts under its id, flagged submitted, that long.
        Returns False when a stall fault keeps it a draft in Drafts, unsubmitted, instead."""
        if box.stall > 0:
            box.stall -= 1
            if source is None:  # sendMail saves a draft first; here it stays one
                m.fields["isDraft"] = True
                self._add(box.well_known("drafts"), m)
            return False
        window = float(self.switch("submitted_stays_in_drafts_s"))
        if window > 0:  # Graph's documented sequence: saved in Drafts, moved by transport
            if source is None:
                self._add(box.well_known("drafts"), m)
            m.fields["isDraft"] = True
            m.submitted = True
            m.deliver_at = time.time() + window
            return True
        if source is not None:
            del source.messages[m.id]
            m.fields.update(id=_new_id("AAMkAD"), changeKey=_new_id("CQAAAB"))
        queue = box.well_known(box.queue_folder if source is None else "outbox")
        m.fields["isDraft"] = queue.name == "drafts"
        m.deliver_at = time.time() + box.send_delay
        self._add(queue, m)
        return True

    def _send_again(self, box: Mailbox, m: GraphMessage, draft_id: str) -> bool:
        """A send of a draft already submitted (lock held), as the ``second_send`` switch
        says: raises the refusal, or returns whether a second copy went out."""
        behaviour = self.switch("second_send")
        if behaviour == "refused":
            box.refused_sends.append(draft_id)
            raise Reply(self.error(400, "ErrorInvalidRequest",
                                   "The message has already been submitted for delivery."))
        if behaviour == "ignored":
            return False
        copy = GraphMessage(dict(m.fields), [dict(h) for h in m.headers],
                            [dict(p) for p in m.properties], m.save_to_sent)
        stamp = _iso(time.time())
        copy.fields.update(id=_new_id("AAMkAD"), changeKey=_new_id("CQAAAB"), isDraft=False,
                           sentDateTime=stamp, lastModifiedDateTime=stamp)
        if copy.save_to_sent:
            self._add(box.well_known("sentitems"), copy)
        return True

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

    def _not_found(self) -> Reply:
        return Reply(self.error(404, "ErrorItemNotFound",
                                "The specified object was not found in the store."))

    def _caller(self, request: web.Request, *scopes: str) -> Mailbox:
        """The mailbox a request addresses (``/me``: the token's own; ``/users/{user}``: that
        user's, by id or userPrincipalName), once the token is checked for ``scopes``.

        An app-only token (client credentials, staging/oauth) reaches every mailbox through
        ``/users/{user}`` and has no ``/me``; a delegated token reaches only its own mailbox,
        under either path, as on Graph."""
        tok = self.authorize(request, *scopes)
        user = request.match_info.get("user")
        if tok.account == APP_ONLY:
            if user is None:
                raise Reply(self.error(400, "BadRequest", "/me request is only valid with "
                                       "delegated authentication flow."))
            with self._lock:
                box = next((b for b in self._boxes.values()
                            if user.lower() in (b.user_id.lower(), b.address.lower())), None)
            if box is None:
                raise Reply(self.error(404, "ErrorInvalidUser",
                                       f"The requested user '{user}' is invalid."))
            return box
        with self._lock:
            box = self._boxes.get(tok.account)
        if box is None:
            raise Reply(self.error(404, "MailboxNotEnabledForRESTAPI",
                                   "The mailbox is either inactive, soft-deleted, or is hosted "
                                   "on-premise."))
        if user is not None and user.lower() not in (box.user_id.lower(), box.address.lower()):
            raise Reply(self.error(403, "ErrorAccessDenied",
                                   "Access is denied. Check credentials and try again."))
        return box

    # -- routes -------------------------------------------------------------------------------

    def routes(self) -> Iterable[web.RouteDef]:
        mine = [
            (web.get, "", self._h_me),
            (web.post, "/sendMail", self._h_send_mail),
            (web.post, "/messages", self._h_create),
            (web.get, "/messages", self._h_list),
            (web.get, "/messages/{id}", self._h_get),
            (web.post, "/messages/{id}/send", self._h_send),
            (web.post, "/messages/{id}/move", self._h_api_move),
            (web.get, "/mailFolders", self._h_folders),
            (web.post, "/mailFolders", self._h_create_folder),
            (web.get, "/mailFolders/{folder}", self._h_folder),
            (web.get, "/mailFolders/{folder}/messages", self._h_list),
            (web.get, "/mailFolders/{folder}/messages/{id}", self._h_get),
        ]
        return [
            *(route(prefix + path, handler) for prefix in ("/v1.0/me", "/v1.0/users/{user}")
              for route, path, handler in mine),
            web.post("/_staging/graph/mailboxes", self._h_add_mailbox),
            web.post("/_staging/graph/settings", self._h_settings),
            web.post("/_staging/graph/deliver", self._h_deliver),
            web.post("/_staging/graph/send_reply", self._h_send_reply),
            web.post("/_staging/graph/messages/{id}/move", self._h_move),
            web.post("/_staging/graph/folders", self._h_control_folder),
            web.post("/_staging/graph/empty_deleted", self._h_empty_deleted),
            web.post("/_staging/graph/inbound", self._h_inbound),
            web.get("/_staging/graph/mailbox", self._h_mailbox),
        ]

    async def _h_me(self, request: web.Request) -> web.Response:
        box = self._caller(request, *PROFILE_SCOPES)
        fault = await self.before_write(request, "me.get")
        out = {"@odata.context": "https://graph.microsoft.com/v1.0/$metadata#users/$entity",
               **box.me()}
        self.after_commit(request, fault)
        return web.json_response(out)

    async def _json_body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except ValueError:
            raise Reply(self.error(400, "BadRequest", "Unable to read JSON request payload. "
                                   "Please ensure Content-Type header is set and payload is of "
                                   "valid JSON format.")) from None
        if not isinstance(body, dict):
            raise Reply(self.error(400, "BadRequest", "Empty Payload. JSON content expected."))
        return body

    async def _h_create(self, request: web.Request) -> web.Response:
        box = self._caller(request, *WRITE_SCOPES)
        message = self._parse_message(await self._json_body(request), box, save_to_sent=True,
                                      need_recipients=False)
        fault = await self.before_write(request, "messages.create")
        with self._lock:
            message.fields["isDraft"] = True
            self._add(box.well_known("drafts"), message)
            out = self._view(message, None, (True, None))
        self.record("messages.create", _effect_key(message), id=message.id,
                    account=box.account, subject=message.fields["subject"])
        self.after_commit(request, fault)
        return web.json_response(out, status=201)

    async def _h_send(self, request: web.Request) -> web.Response:
        box = self._caller(request, *SEND_SCOPES)
        draft_id = request.match_info["id"]
        # The fault's delay comes before the lookup: a late request finds what the mailbox
        # holds when it is finally worked on, as on the real service.
        fault = await self.before_write(request, "message.send")
        with self._lock:
            hit = box.find(draft_id)
            if hit is None or not hit[1].fields.get("isDraft"):
                # Sent already (the draft left Drafts under a new id), moved or deleted.
                box.refused_sends.append(draft_id)
                raise self._not_found()
            source, m = hit
            if not (m.fields["toRecipients"] or m.fields["ccRecipients"]
                    or m.fields["bccRecipients"]):
                raise Reply(self.error(400, "ErrorInvalidRecipients", "At least one recipient "
                                       "isn't valid., A message can't be sent because it "
                                       "contains no recipients."))
            again = m.submitted
            submitted = self._send_again(box, m, draft_id) if again \
                else self._submit(box, m, source)
            detail = {"id": m.id, "draft": draft_id,
                      "folder": box.folders[m.fields["parentFolderId"]].name,
                      "account": box.account, "stalled": not submitted, "again": again,
                      "internetMessageId": m.fields["internetMessageId"],
                      "to": [r["emailAddress"]["address"] for r in m.fields["toRecipients"]],
                      "subject": m.fields["subject"]}
        if again and not submitted:  # ignored: 202, and nothing more went out
            self.after_commit(request, fault)
            return web.Response(status=202)
        self.record("message.send", _effect_key(m), **detail)
        self.after_commit(request, fault)
        return web.Response(status=202)

    async def _h_send_mail(self, request: web.Request) -> web.Response:
        box = self._caller(request, *SEND_SCOPES)
        body = await self._json_body(request)
        raw = _ci(body).get("message")
        if not isinstance(raw, dict):
            raise Reply(self.error(400, "ErrorInvalidParameter",
                                   "The value of the parameter 'Message' is empty."))
        save = _ci(body).get("savetosentitems", True)
        message = self._parse_message(raw, box, save is not False, need_recipients=True)
        fault = await self.before_write(request, "sendMail")
        with self._lock:
            submitted = self._submit(box, message, None)
            reply = self._take_reply()
            folder = box.folders[message.fields["parentFolderId"]].name
        self.record("sendMail", _effect_key(message), id=message.id, folder=folder,
                    account=box.account, stalled=not submitted,
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

    async def _h_api_move(self, request: web.Request) -> web.Response:
        box = self._caller(request, *WRITE_SCOPES)
        body = await self._json_body(request)
        destination = _ci(body).get("destinationid")
        if not isinstance(destination, str) or box.folder(destination) is None:
            raise Reply(self.error(400, "ErrorInvalidIdMalformed", "Id is malformed."))
        try:
            new_id = self.move(request.match_info["id"], destination, box.account)
        except KeyError:
            raise self._not_found() from None
        except ValueError:
            raise Reply(self.error(400, "ErrorMoveCopyFailed",
                                   "The item cannot be moved while it is being sent.")) from None
        with self._lock:
            hit = box.find(new_id)
            assert hit is not None
            out = self._view(hit[1], None, (False, None))
        return web.json_response(out, status=201)

    def _folder_view(self, f: Folder) -> dict[str, Any]:
        return {"id": f.id, "displayName": f.display_name, "parentFolderId": None,
                "childFolderCount": 0, "unreadItemCount": 0,
                "totalItemCount": len(f.messages), "isHidden": f.name in HIDDEN}

    async def _h_folders(self, request: web.Request) -> web.Response:
        box = self._caller(request, *READ_SCOPES)
        with self._lock:
            value = [self._folder_view(f) for f in box.folders.values() if f.name not in HIDDEN]
        return web.json_response({"value": value})

    async def _h_folder(self, request: web.Request) -> web.Response:
        box = self._caller(request, *READ_SCOPES)
        with self._lock:
            f = box.folder(request.match_info["folder"])
            if f is None:
                raise Reply(self.error(404, "ErrorFolderNotFound",
                                       "The specified folder could not be found in the store."))
            return web.json_response(self._folder_view(f))

    async def _h_create_folder(self, request: web.Request) -> web.Response:
        box = self._caller(request, *WRITE_SCOPES)
        name = _ci(await self._json_body(request)).get("displayname")
        if not isinstance(name, str) or not name.strip():
            raise Reply(self.error(400, "ErrorInvalidRequest", "displayName is required."))
        try:
            f = self.create_folder(name, box.account)
        except ValueError:
            raise Reply(self.error(409, "ErrorFolderExists",
                                   "A folder with the specified name already exists.")) from None
        return web.json_response(self._folder_view(f), status=201)

    def _parse_message(self, raw: dict[str, Any], box: Mailbox, save_to_sent: bool, *,
                       need_recipients: bool) -> GraphMessage:
        m = _ci(raw)
        to = self._recipients(m.get("torecipients"))
        cc = self._recipients(m.get("ccrecipients"))
        bcc = self._recipients(m.get("bccrecipients"))
        if need_recipients and not (to or cc or bcc):
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
        me = {"emailAddress": {"name": box.display_name, "address": box.address}}
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
            if prop_id != MESSAGE_FLAGS_ID:  # computed by the store, never taken from a client
                out.append({"id": prop_id, "value": p["value"]})
        return out

    async def _h_list(self, request: web.Request) -> web.Response:
        box = self._caller(request, *READ_SCOPES)
        wanted = request.match_info.get("folder")
        folder = self._folder_of(box, wanted) if wanted else None
        q = request.query
        keep = _parse_filter(self, q.get("$filter"))
        expand = _parse_expand(self, q.get("$expand"))
        select = _parse_select(self, q.get("$select"))
        top = _int_option(self, q, "$top", DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        skip = _int_option(self, q, "$skip", 0, 1 << 31)
        fault = await self.before_write(request, "messages.list")
        self._settle(box)
        with self._lock:
            folders = [folder] if folder is not None else [
                f for f in box.folders.values() if f.name not in HIDDEN]
            found = [m for m in _newest_first(m for f in folders for m in f.messages.values())
                     if keep(m)]
            page = found[skip:skip + top]
            value = [self._view(m, select, expand) for m in page]
        where = f"/mailFolders('{wanted}')" if wanted else ""
        out: dict[str, Any] = {
            "@odata.context": f"https://graph.microsoft.com/v1.0/$metadata#users('{box.address}')"
                              f"{where}/messages",
            "value": value}
        if skip + top < len(found):
            nxt = request.url.update_query({"$skip": str(skip + top)})
            out["@odata.nextLink"] = str(nxt)
        self.after_commit(request, fault)
        return web.json_response(out)

    async def _h_get(self, request: web.Request) -> web.Response:
        box = self._caller(request, *READ_SCOPES)
        wanted = request.match_info.get("folder")
        folder = self._folder_of(box, wanted) if wanted else None
        select = _parse_select(self, request.query.get("$select"))
        expand = _parse_expand(self, request.query.get("$expand"))
        fault = await self.before_write(request, "messages.get")
        self._settle(box)
        with self._lock:
            hit = box.find(request.match_info["id"])
            if hit is None or (folder is not None and hit[0] is not folder):
                raise self._not_found()
            out = self._view(hit[1], select, expand)
        self.after_commit(request, fault)
        return web.json_response(out)

    def _folder_of(self, box: Mailbox, name: str) -> Folder:
        f = box.folder(name)
        if f is None:
            raise Reply(self.error(400, "ErrorInvalidIdMalformed", "Id is malformed."))
        return f

    def _view(self, m: GraphMessage, select: list[str] | None,
              expand: tuple[bool, tuple[str, ...] | None]) -> dict[str, Any]:
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
        wanted, prop_ids = expand
        if wanted:
            props = [dict(p) for p in m.properties if prop_ids is None or p["id"] in prop_ids]
            if prop_ids is not None and MESSAGE_FLAGS_ID in prop_ids:
                props.append({"id": "Integer 0xe07", "value": str(_message_flags(m))})
            if props:  # Graph leaves the collection out when nothing matches
                out["singleValueExtendedProperties"] = props
        return out

    # -- control ----------------------------------------------------------------------------------

    @staticmethod
    async def _control_body(request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except ValueError:
            body = {}
        return body if isinstance(body, dict) else {}

    async def _h_add_mailbox(self, request: web.Request) -> web.Response:
        body = await self._control_body(request)
        if not isinstance(body.get("account"), str) or not isinstance(body.get("address"), str):
            return web.json_response({"error": "account and address are required"}, status=400)
        box = self.add_mailbox(body["account"], body["address"], body.get("name"))
        return web.json_response(box.me())

    async def _h_settings(self, request: web.Request) -> web.Response:
        body = await self._control_body(request)
        account = body.get("account", DEFAULT_ACCOUNT)
        try:
            self.configure(body.get("send_delay"), body.get("queue_folder"),
                           stall=body.get("stall"), sent_rule=body.get("sent_rule"),
                           clear_rule="sent_rule" in body and body["sent_rule"] is None,
                           account=account)
            box = self.box(account)
        except (TypeError, ValueError, KeyError) as e:
            return web.json_response({"error": str(e)}, status=400)
        return web.json_response({"send_delay": box.send_delay, "queue_folder": box.queue_folder,
                                  "stall": box.stall, "sent_rule": box.sent_rule})

    async def _h_deliver(self, request: web.Request) -> web.Response:
        body = await self._control_body(request)
        return web.json_response({"delivered": self.deliver(
            body.get("account", DEFAULT_ACCOUNT))})

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
        body = await self._control_body(request)
        wanted = body.get("folder")
        if not isinstance(wanted, str):
            return web.json_response({"error": "folder (a name or an id) is required"},
                                     status=400)
        try:
            new_id = self.move(request.match_info["id"], wanted,
                               body.get("account", DEFAULT_ACCOUNT))
        except KeyError as e:
            return web.json_response({"error": f"no such message or folder: {e}"}, status=404)
        except ValueError as e:
            return web.json_response({"error": str(e)}, status=409)
        return web.json_response({"id": new_id, "folder": wanted})

    async def _h_control_folder(self, request: web.Request) -> web.Response:
        body = await self._control_body(request)
        try:
            f = self.create_folder(str(body.get("displayName") or ""),
                                   body.get("account", DEFAULT_ACCOUNT))
        except (ValueError, KeyError) as e:
            return web.json_response({"error": str(e)}, status=400)
        return web.json_response(self._folder_view(f))

    async def _h_empty_deleted(self, request: web.Request) -> web.Response:
        body = await self._control_body(request)
        return web.json_response({"moved": self.empty_deleted(
            body.get("account", DEFAULT_ACCOUNT))})

    async def _h_inbound(self, request: web.Request) -> web.Response:
        body = await self._control_body(request)
        if not isinstance(body.get("from"), str):
            return web.json_response({"error": "from is required"}, status=400)
        try:
            new_id = self.inbound(body["from"], str(body.get("subject") or ""),
                                  body.get("internetMessageHeaders") or [],
                                  body.get("singleValueExtendedProperties") or [],
                                  str(body.get("folder") or "inbox"),
                                  body.get("account", DEFAULT_ACCOUNT))
        except Reply as r:
            return r.response
        except KeyError as e:
            return web.json_response({"error": f"no such folder or mailbox: {e}"}, status=400)
        return web.json_response({"id": new_id})

    async def _h_mailbox(self, request: web.Request) -> web.Response:
        account = request.query.get("account", DEFAULT_ACCOUNT)
        box = self.box(account)
        self._settle(box)
        with self._lock:
            return web.json_response({
                "folders": {f.name: [{"fields": m.fields, "internetMessageHeaders": m.headers,
                                      "singleValueExtendedProperties": m.properties,
                                      "deliver_at": m.deliver_at, "submitted": m.submitted}
                                     for m in _newest_first(f.messages.values())]
                            for f in box.folders.values()},
                "refused_sends": list(box.refused_sends)})


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


def _parse_expand(target: GraphTarget, text: str | None
                  ) -> tuple[bool, tuple[str, ...] | None]:
    """Whether to expand singleValueExtendedProperties, and which ids (None: all of them);
    the filter is ``id eq '…'`` or several of those joined by ``or``."""
    if text is None:
        return False, None
    m = _EXPAND.match(text)
    if m is None:
        raise Reply(target.error(400, "BadRequest",
                                 f"Parsing OData Select and Expand failed: staging Graph expands "
                                 f"only singleValueExtendedProperties, not {text!r}"))
    if m.group(1) is None:
        return True, None
    ids = []
    for term in re.split(r"(?i)\s+or\s+", m.group(1)):
        c = _EXPAND_ID.match(term)
        prop_id = normalise_property_id(_odata_string(c.group(1))) if c else None
        if prop_id is None:
            raise Reply(target.error(400, "ErrorInvalidProperty",
                                     f"The extended property id in '{term.strip()}' is not "
                                     f"valid."))
        ids.append(prop_id)
    return True, tuple(ids)


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


def _stable_id(prefix: str, seed: str) -> str:
    digest = hashlib.sha384(seed.encode()).digest()  # 48 bytes, like _new_id's
    return prefix + base64.urlsafe_b64encode(digest).decode()


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _newest_first(messages: Iterable[GraphMessage]) -> list[GraphMessage]:
    return sorted(messages, key=lambda m: m.seq, reverse=True)


def _message_flags(m: GraphMessage) -> int:
    """PR_MESSAGE_FLAGS as the store computes it: read, unsent while a draft, submitted while
    a sent draft waits in Drafts for transport."""
    flags = MSGFLAG_READ if m.fields.get("isRead") else 0
    if m.fields.get("isDraft"):
        flags |= MSGFLAG_UNSENT
    if m.submitted:
        flags |= MSGFLAG_SUBMIT
    return flags


def _effect_key(m: GraphMessage) -> str | None:
    for h in m.headers:
        if h["name"].lower() == KEY_HEADER:
            return h["value"]
    for p in m.properties:
        if p["id"].endswith(f" Name {KEY_PROPERTY_NAME}"):
            return p["value"]
    return None
