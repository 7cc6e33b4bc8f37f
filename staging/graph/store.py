"""The data of the emulated Exchange mail store.

Messages with the properties Graph returns only on request, folders (the well-known ones with
ids stable for a mailbox's life), mailboxes with their send behaviour, and the ids and
timestamps Exchange gives them."""

from __future__ import annotations

import base64
import hashlib
import secrets
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

MAILBOX = "agent@staging.example"
MAILBOX_NAME = "Staging Agent"

# Sub-second so that tests see both states quickly, non-zero so "queued" is observable at all.
DEFAULT_SEND_DELAY = 0.5

WELL_KNOWN = {"drafts": "Drafts", "outbox": "Outbox", "sentitems": "Sent Items",
              "deleteditems": "Deleted Items", "inbox": "Inbox", "archive": "Archive",
              "recoverableitemsdeletions": "Deletions"}
# Outside the folder tree /me/messages lists (Recoverable Items is, on Exchange, too).
HIDDEN = ("recoverableitemsdeletions",)


@dataclass
class GraphMessage:
    """One message and the properties Graph returns only on request."""

    fields: dict[str, Any]
    headers: list[dict[str, str]]
    properties: list[dict[str, str]]
    save_to_sent: bool = True
    deliver_at: float | None = None  # set while it waits to be sent
    submitted: bool = False  # mfSubmitted: sent, and still in Drafts waiting for transport
    flagged_from: float = 0.0  # when mfSubmitted shows (time.time()): submitted_flag_after_s
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
            f = Folder(stable_id("AQMkAD", f"{self.account}/{name}"), name, display)
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


def folder_view(f: Folder) -> dict[str, Any]:
    return {"id": f.id, "displayName": f.display_name, "parentFolderId": None,
            "childFolderCount": 0, "unreadItemCount": 0,
            "totalItemCount": len(f.messages), "isHidden": f.name in HIDDEN}


def new_id(prefix: str) -> str:
    return prefix + base64.urlsafe_b64encode(secrets.token_bytes(48)).decode()


def stable_id(prefix: str, seed: str) -> str:
    digest = hashlib.sha384(seed.encode()).digest()  # 48 bytes, like new_id's
    return prefix + base64.urlsafe_b64encode(digest).decode()


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def newest_first(messages: Iterable[GraphMessage]) -> list[GraphMessage]:
    return sorted(messages, key=lambda m: m.seq, reverse=True)
