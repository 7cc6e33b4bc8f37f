"""Microsoft Graph v1.0 mail emulation.

It covers drafts and their sending, ``sendMail``, folders, moves, the mailbox-wide message
listing a probe reads, and ``/me``.

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
``/v1.0/me``. An app-only token (client credentials at staging/oauth, roles instead of delegated
scopes, ``User.Read.All`` for the profile) reaches any mailbox that way and gets 400 on ``/me``.
A delegated token reaches its own mailbox under either path and gets 403 ``ErrorAccessDenied``
for another user's.

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
  next send (a sendMail, or a draft's send) commits and then answers with this status and a
  ``Retry-After`` header (a 504: Graph's gateway gave up while the mailbox went on);
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

The package, by concern: ``store`` (messages, folders, mailboxes), ``mapi`` (extended
properties and PR_MESSAGE_FLAGS), ``payloads`` (request bodies), ``odata`` (query options and
the message view), ``mailboxes`` (state, control API, store mechanics, errors, who reaches
which mailbox), ``messages`` and ``send`` (the routes), ``control`` (``/_staging/graph``),
``switches`` and ``target`` (GraphTarget).
"""

from staging.graph.mailboxes import PROFILE_SCOPES, READ_SCOPES, SEND_SCOPES, WRITE_SCOPES
from staging.graph.mapi import (
    KEY_HEADER,
    KEY_PROPERTY_NAME,
    MESSAGE_FLAGS_ID,
    MSGFLAG_READ,
    MSGFLAG_SUBMIT,
    MSGFLAG_UNSENT,
    normalise_property_id,
)
from staging.graph.odata import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, MESSAGE_PROPERTIES, SELECT_ONLY
from staging.graph.payloads import MAX_CUSTOM_HEADERS
from staging.graph.store import (
    DEFAULT_SEND_DELAY,
    HIDDEN,
    MAILBOX,
    MAILBOX_NAME,
    WELL_KNOWN,
    Folder,
    GraphMessage,
    Mailbox,
)
from staging.graph.switches import SWITCHES
from staging.graph.target import READ_TOKEN, SEND_TOKEN, GraphTarget

__all__ = [
    "DEFAULT_PAGE_SIZE", "DEFAULT_SEND_DELAY", "HIDDEN", "KEY_HEADER", "KEY_PROPERTY_NAME",
    "MAILBOX", "MAILBOX_NAME", "MAX_CUSTOM_HEADERS", "MAX_PAGE_SIZE", "MESSAGE_FLAGS_ID",
    "MESSAGE_PROPERTIES", "MSGFLAG_READ", "MSGFLAG_SUBMIT", "MSGFLAG_UNSENT", "PROFILE_SCOPES",
    "READ_SCOPES", "READ_TOKEN", "SELECT_ONLY", "SEND_SCOPES", "SEND_TOKEN", "SWITCHES",
    "WELL_KNOWN", "WRITE_SCOPES", "Folder", "GraphMessage", "GraphTarget", "Mailbox",
    "normalise_property_id",
]
