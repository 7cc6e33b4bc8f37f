"""The emulated Graph's mailboxes and what happens to them outside a request.

It holds the inspection and control API of tests and the CLI, the store's mechanics (filing,
moving under a new id, transport taking waiting messages to Sent Items), Graph's error body, and
which mailbox a token reaches."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from staging.core import DEFAULT_ACCOUNT, Reply, Target
from staging.graph.payloads import parse_message
from staging.graph.store import (
    MAILBOX,
    MAILBOX_NAME,
    Folder,
    GraphMessage,
    Mailbox,
    iso,
    new_id,
    newest_first,
)
from staging.oauth import APP_ONLY

SEND_SCOPES = ("Mail.Send",)
READ_SCOPES = ("Mail.Read", "Mail.ReadWrite")
WRITE_SCOPES = ("Mail.ReadWrite",)  # creating a draft or moving a message
PROFILE_SCOPES = ("User.Read", "User.Read.All")  # User.Read.All: an app reading a user


class MailboxTarget(Target):
    """The state of the emulated Graph and the mechanics every route shares.

    The state is its mailboxes and armed replies. The routes themselves are mixed in by
    GraphTarget."""

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
        """Sets how submitted messages wait, stall and are filed.

        Sets how long submitted messages wait, where sendMail queues them (outbox or drafts),
        how many next submissions stall in Drafts, and a rule for sent copies."""
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
            f = Folder(new_id("AAMkAD"), display_name, display_name)
            box.folders[f.id] = f
            return f

    def deliver(self, account: str = DEFAULT_ACCOUNT) -> int:
        """Moves every waiting message on now; returns how many moved."""
        return self._settle(self.box(account), force=True)

    def move(self, message_id: str, folder: str, account: str = DEFAULT_ACCOUNT) -> str:
        """Moves a message to ``folder`` (a name or id) as a person would.

        Returns its new id (Exchange gives a moved item a new id; its extended properties go
        with it).

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
        """Empties Deleted Items into Recoverable Items.

        It does so as a person or a retention policy would; returns how many messages moved."""
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
        m = parse_message(self, raw, box, save_to_sent=False, need_recipients=True)
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
            return newest_first(found.messages.values())

    def all_messages(self, account: str = DEFAULT_ACCOUNT) -> list[tuple[str, GraphMessage]]:
        box = self.box(account)
        self._settle(box)
        with self._lock:
            return [(f.name, m) for f in box.folders.values()
                    for m in newest_first(f.messages.values())]

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
        m.fields.update(id=new_id("AAMkAD"), parentFolderId=target.id,
                        lastModifiedDateTime=iso(time.time()), changeKey=new_id("CQAAAB"))
        target.messages[m.id] = m
        return m.id

    def _settle(self, box: Mailbox, force: bool = False) -> int:
        """Moves the messages whose delay is over to Sent Items.

        Each moves under a new id (as Exchange does), or is dropped when the sender asked not to
        keep a copy. Then the mailbox's rule for sent copies applies. A message waits in the
        Outbox, or in Drafts while ``submitted_stays_in_drafts_s`` lasts."""
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
                    stamp = iso(now)
                    m.fields.update(id=new_id("AAMkAD"), sentDateTime=stamp,
                                    lastModifiedDateTime=stamp, changeKey=new_id("CQAAAB"),
                                    isDraft=False)
                    sent.messages[m.id] = m
                    m.fields["parentFolderId"] = sent.id
                    rule = box.folders.get(box.sent_rule or "")
                    if rule is not None and rule is not sent:
                        self._move(box, sent, m, rule)
        return moved

    # -- errors ---------------------------------------------------------------------------------

    def error(self, status: int, code: str, message: str) -> web.Response:
        """Graph's error body.

        ``code`` is Graph's own code or one of the core's generic ones, translated here."""
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
        """The mailbox a request addresses, once the token is checked for ``scopes``.

        ``/me`` addresses the token's own; ``/users/{user}`` that user's, by id or
        userPrincipalName.

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
