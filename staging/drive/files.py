"""The files of the emulated Drive.

It holds who owns each and with whom it is shared by role, the appProperties each OAuth client
keeps on it, and the ``File`` resource a client sees."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from staging.core import DEFAULT_ACCOUNT, DEFAULT_CLIENT

ROLES = ("owner", "organizer", "fileOrganizer", "writer", "commenter", "reader")
EDIT_ROLES = frozenset({"owner", "organizer", "fileOrganizer", "writer"})


@dataclass
class DriveFile:
    id: str
    name: str
    mime_type: str = "application/octet-stream"
    trashed: bool = False
    description: str | None = None
    # appProperties by OAuth client id: Drive shows and changes only the requesting app's own.
    app_properties_by_client: dict[str, dict[str, str]] = field(default_factory=dict)
    version: int = 1
    created: str = field(default_factory=lambda: now())
    modified: str = field(default_factory=lambda: now())
    # Who may see and change it: the owner, and the accounts it is shared with, by role.
    owner: str = DEFAULT_ACCOUNT
    shared: dict[str, str] = field(default_factory=dict)
    # The OAuth clients a user opened or created it with: all a ``drive.file`` token may touch.
    apps: set[str] = field(default_factory=lambda: {DEFAULT_CLIENT})

    def role_of(self, account: str) -> str | None:
        """The Drive role ``account`` has on this file; None if it is not shared with it."""
        return "owner" if account == self.owner else self.shared.get(account)

    def app_properties_of(self, client: str) -> dict[str, str]:
        """The appProperties ``client`` set on this file (a live dict, empty if none)."""
        return self.app_properties_by_client.setdefault(client, {})

    @property
    def app_properties(self) -> dict[str, str]:
        """The default client's appProperties: those our own tokens see."""
        return self.app_properties_of(DEFAULT_CLIENT)

    @app_properties.setter
    def app_properties(self, value: dict[str, str]) -> None:
        self.app_properties_by_client[DEFAULT_CLIENT] = value

    def resource(self, client: str = DEFAULT_CLIENT) -> dict[str, Any]:
        """The full Drive ``File`` resource (as with ``fields=*``) as ``client`` sees it."""
        out: dict[str, Any] = {
            "kind": "drive#file", "id": self.id, "name": self.name, "mimeType": self.mime_type,
            "trashed": self.trashed, "version": str(self.version),
            "createdTime": self.created, "modifiedTime": self.modified,
        }
        if self.description is not None:
            out["description"] = self.description
        props = self.app_properties_by_client.get(client)
        if props:
            out["appProperties"] = dict(props)
        return out


def prop_str(v: object) -> str:
    return json.dumps(v) if isinstance(v, bool) else str(v)


def new_file_id() -> str:
    # Drive ids are 33 characters of base64url-ish text starting with "1".
    return "1" + secrets.token_urlsafe(24)[:32]


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
