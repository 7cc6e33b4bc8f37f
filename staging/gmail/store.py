"""The data of the emulated Gmail.

Stored messages (as Gmail keeps them after its own edits), each mailbox's drafts and its history
of changes, with ids that grow as Gmail's do."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from email.message import Message
from typing import Any

MAILBOX = "agent@staging.example"  # the address of the default account's mailbox
MAIL_DOMAIN = "staging.example"  # the domain of the other accounts' mailboxes

HISTORY_TYPES = ("messageAdded", "messageDeleted", "labelAdded", "labelRemoved")
FIRST_HISTORY_ID = 1_000_000  # real history ids are large and grow; clients must not assume small


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
    """One change of a mailbox.

    ``kind`` is one of HISTORY_TYPES; ``message`` the message as it was then (its labels at that
    moment decide what a ``labelId`` filter matches)."""

    id: int
    kind: str
    message: dict[str, Any]
    labels: list[str] = field(default_factory=list)  # for labelAdded / labelRemoved
    at: float = field(default_factory=time.time)  # when it was recorded (history_kept_s)


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


def newest_first(messages: Iterable[StoredMessage]) -> list[StoredMessage]:
    return sorted(messages, key=lambda m: (m.internal_ms, m.id), reverse=True)
