"""The emulated Gmail's mailboxes and settings.

It holds which mailbox a token reaches, Google's clock, the inspection and settings API of tests
and the CLI, filing a message with its history record, and Google's error body."""

from __future__ import annotations

import threading
import time
from email.message import Message
from typing import Any

from aiohttp import web

from staging.core import DEFAULT_ACCOUNT, Reply, Target, Token
from staging.gmail.store import MAIL_DOMAIN, MAILBOX, Mailbox, StoredMessage, newest_first

LIST_ORDERS = ("newest_first", "oldest_first")
# What drafts.send does with the draft's message: stores the sent copy as a new message (and
# deletes the draft's), or relabels the draft's own message DRAFT -> SENT. Gmail documents
# neither; a probe must find the sent copy either way.
DRAFT_SEND_MODES = ("new_message", "relabel")

_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
           404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}
_UNAUTHENTICATED = ("Request had invalid authentication credentials. Expected OAuth 2 access "
                    "token, login cookie or other valid authentication credential. See "
                    "https://developers.google.com/identity/sign-in/web/devconsole-project.")
_NOT_FOUND = "Requested entity was not found."


class GmailMailboxes(Target):
    """The state of the emulated Gmail and the mechanics every route shares.

    The state is its mailboxes and settings. The routes themselves are mixed in by GmailTarget."""

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
            return newest_first(box.messages.values())

    def drafts(self, address: str | None = None) -> dict[str, str]:
        """The drafts of a mailbox: draft id -> message id."""
        box = self.mailbox(address)
        with self._lock:
            return dict(box.drafts)

    def configure(self, search_lag: float | None = None, list_order: str | None = None,
                  clock_offset: float | None = None, expire_history: bool = False,
                  draft_send: str | None = None) -> None:
        """Sets the search lag, the list order, the clock and how drafts are sent.

        Sets the search index's lag (seconds), the list order, Google's clock offset (seconds),
        and what ``drafts.send`` does with the draft's message. Forgets the history so far when
        ``expire_history``."""
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
        """Google's error body.

        ``code`` is Google's ``reason`` (``notFound``, ``invalidArgument`` …) or one of the
        core's generic codes, translated here."""
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

    def _find(self, box: Mailbox, mid: str) -> StoredMessage:
        with self._lock:
            stored = box.messages.get(mid)
        if stored is None:
            raise self.not_found()
        return stored
