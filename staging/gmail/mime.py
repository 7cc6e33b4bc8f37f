"""RFC 822 / MIME handling as Gmail does it.

What Gmail does to an outgoing message (its own Message-ID, a From and a Date), the labels a
sent copy gets, a stored message as a ``users.messages`` resource in each ``format``, and the
raw bytes a request carries (base64url or a multipart upload)."""

from __future__ import annotations

import base64
import binascii
import email
import email.utils
import json
import secrets
from email.message import EmailMessage, Message
from typing import Any

from aiohttp import BodyPartReader, web

from staging.core import Reply, Target
from staging.gmail.store import StoredMessage

KEY_HEADER = "X-Tidemark-Key"  # recorded as the effect's key when present


def recipients_of(target: Target, msg: Message) -> list[str]:
    """The To, Cc and Bcc addresses of a message to be sent; a 400 when there are none."""
    recipients = [a for h in ("To", "Cc", "Bcc") for _, a in
                  email.utils.getaddresses([str(v) for v in msg.get_all(h, [])]) if a]
    if not recipients:
        raise Reply(target.error(400, "invalidArgument", "Recipient address required"))
    if any("@" not in a for a in recipients):
        raise Reply(target.error(400, "invalidArgument", "Invalid To header"))
    return recipients


def as_sent(msg: Message, address: str) -> Message:
    """What Gmail does to an outgoing message.

    Its own Message-ID replaces the client's, the account becomes the sender when none is given,
    and a Date is added."""
    local = "CA" + base64.urlsafe_b64encode(secrets.token_bytes(30)).decode().rstrip("=")
    del msg["Message-ID"]
    msg["Message-ID"] = f"<{local}@mail.gmail.com>"
    if msg["From"] is None:
        msg["From"] = address
    if msg["Date"] is None:
        msg["Date"] = email.utils.formatdate(usegmt=True)
    return msg


def sent_labels(address: str, recipients: list[str]) -> list[str]:
    if address.lower() in (a.lower() for a in recipients):
        return ["UNREAD", "SENT", "INBOX"]
    return ["SENT"]


def resource(m: StoredMessage, fmt: str, metadata_headers: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"id": m.id, "threadId": m.thread_id, "labelIds": list(m.label_ids),
                           "snippet": snippet(m.parsed), "sizeEstimate": len(m.raw),
                           "historyId": str(m.history_id), "internalDate": str(m.internal_ms)}
    if fmt == "raw":
        out["raw"] = base64.urlsafe_b64encode(m.raw).decode()
    elif fmt == "metadata":
        wanted = {h.lower() for h in metadata_headers}
        out["payload"] = {"mimeType": m.parsed.get_content_type(),
                          "headers": [h for h in header_list(m.parsed)
                                      if not wanted or h["name"].lower() in wanted]}
    elif fmt == "full":
        out["payload"] = part_json(m.parsed, "")
    return out


def header_list(part: Message) -> list[dict[str, str]]:
    return [{"name": k, "value": str(v)} for k, v in part.items()]


def part_json(part: Message, part_id: str) -> dict[str, Any]:
    out: dict[str, Any] = {"partId": part_id, "mimeType": part.get_content_type(),
                           "filename": part.get_filename() or "", "headers": header_list(part)}
    if part.is_multipart():
        out["body"] = {"size": 0}
        children = part.get_payload()
        assert isinstance(children, list)
        prefix = f"{part_id}." if part_id else ""
        out["parts"] = [part_json(p, f"{prefix}{i}") for i, p in enumerate(children)]
    else:
        data = part.get_payload(decode=True)
        data = data if isinstance(data, bytes) else b""
        out["body"] = {"size": len(data),
                       "data": base64.urlsafe_b64encode(data).decode()} if data else {"size": 0}
    return out


SNIPPET_CHARS = 200  # about what Gmail shows; enough for a person to recognise the message


def snippet(msg: Message) -> str:
    if isinstance(msg, EmailMessage):
        body = msg.get_body(preferencelist=("plain", "html"))
        if body is not None and isinstance(body, EmailMessage):
            text = body.get_content()
            if isinstance(text, str):
                return " ".join(text.split())[:SNIPPET_CHARS]
    return ""


def b64url_decode(target: Target, raw: str) -> bytes:
    try:
        # Gmail takes URL-safe base64 with or without padding; '+' and '/' are refused.
        if "+" in raw or "/" in raw:
            raise binascii.Error("not URL-safe")
        return base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))
    except (binascii.Error, ValueError):
        raise Reply(target.error(400, "invalidArgument",
                                 "Invalid value at 'message.raw' (TYPE_BYTES), Base64 decoding "
                                 "failed")) from None


async def read_related(target: Target, request: web.Request) -> tuple[dict[str, Any], bytes]:
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
