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

The package, by concern: ``store`` (messages, drafts, history), ``mime`` (raw and MIME
handling, message resources), ``search`` (``q``), ``params`` (request parameters), ``scopes``,
``mailboxes`` (state, settings, errors), ``messages`` and ``drafts`` (the routes), ``switches``
and ``target`` (GmailTarget).
"""

from staging.gmail.mailboxes import DRAFT_SEND_MODES, LIST_ORDERS
from staging.gmail.mime import KEY_HEADER, SNIPPET_CHARS
from staging.gmail.params import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE
from staging.gmail.scopes import (
    COMPOSE_SCOPE,
    DELETE_SCOPES,
    DRAFT_READ_SCOPES,
    DRAFT_WRITE_SCOPES,
    FULL_SCOPE,
    INSERT_SCOPE,
    INSERT_SCOPES,
    METADATA_SCOPE,
    MODIFY_SCOPE,
    PROFILE_SCOPES,
    READ_SCOPES,
    READONLY_SCOPE,
    SCOPE_PREFIX,
    SEND_SCOPE,
    SEND_SCOPES,
    TRASH_SCOPES,
)
from staging.gmail.store import (
    FIRST_HISTORY_ID,
    HISTORY_TYPES,
    MAIL_DOMAIN,
    MAILBOX,
    HistoryRecord,
    Mailbox,
    StoredMessage,
)
from staging.gmail.switches import CONCURRENT_DRAFT_SEND, GONE_DRAFT_STATUS
from staging.gmail.target import COMPOSE_TOKEN, METADATA_TOKEN, READ_TOKEN, SEND_TOKEN, GmailTarget

__all__ = [
    "COMPOSE_SCOPE", "COMPOSE_TOKEN", "CONCURRENT_DRAFT_SEND", "DEFAULT_PAGE_SIZE",
    "DELETE_SCOPES", "DRAFT_READ_SCOPES", "DRAFT_SEND_MODES", "DRAFT_WRITE_SCOPES",
    "FIRST_HISTORY_ID", "FULL_SCOPE", "GONE_DRAFT_STATUS", "HISTORY_TYPES", "INSERT_SCOPE",
    "INSERT_SCOPES", "KEY_HEADER", "LIST_ORDERS", "MAILBOX", "MAIL_DOMAIN", "MAX_PAGE_SIZE",
    "METADATA_SCOPE", "METADATA_TOKEN", "MODIFY_SCOPE", "PROFILE_SCOPES", "READONLY_SCOPE",
    "READ_SCOPES", "READ_TOKEN", "SCOPE_PREFIX", "SEND_SCOPE", "SEND_SCOPES", "SEND_TOKEN",
    "SNIPPET_CHARS", "TRASH_SCOPES", "GmailTarget", "HistoryRecord", "Mailbox", "StoredMessage",
]
