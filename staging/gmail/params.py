"""Request parameters as Gmail reads them.

A JSON body, integer options clamped to their range, page tokens, and the ``format`` of a
message (``gmail.metadata`` may not read full or raw)."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from aiohttp import web

from staging.core import Reply, Target, Token
from staging.gmail.scopes import METADATA_SCOPE

DEFAULT_PAGE_SIZE = 100  # Gmail's default maxResults
MAX_PAGE_SIZE = 500  # Gmail's upper bound for maxResults


async def json_body(target: Target, request: web.Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.read() or b"{}")
    except ValueError:
        raise Reply(target.error(400, "parseError", "Invalid JSON payload received.")) from None
    if not isinstance(body, dict):
        raise Reply(target.error(400, "invalidArgument", "Invalid JSON payload received."))
    return body


def int_param(target: Target, request: web.Request, name: str, default: int, lo: int,
               hi: int) -> int:
    value = request.query.get(name)
    if value is None:
        return default
    try:
        n = int(value)
    except ValueError:
        raise Reply(target.error(400, "invalidArgument",
                                 f"Invalid value at '{name}' (TYPE_UINT32), \"{value}\"")) from None
    return min(max(n, lo), hi)


def page_token(offset: int) -> str:
    return base64.urlsafe_b64encode(f"o{offset}".encode()).decode()


def page_offset(target: Target, token: str | None) -> int:
    if not token:
        return 0
    try:
        text = base64.urlsafe_b64decode(token).decode()
        if not text.startswith("o"):
            raise ValueError(text)
        return int(text[1:])
    except (ValueError, binascii.Error):
        raise Reply(target.error(400, "invalidArgument", "Invalid pageToken")) from None


def message_format(target: Target, request: web.Request, token: Token) -> str:
    fmt = request.query.get("format", "full").lower()
    if fmt not in ("full", "metadata", "minimal", "raw"):
        raise Reply(target.error(400, "invalidArgument", f"Invalid value at 'format', \"{fmt}\""))
    if fmt in ("full", "raw") and METADATA_SCOPE in token.scopes:
        raise Reply(target.error(403, "forbidden",
                                 f"Metadata scope doesn't allow format {fmt.upper()}"))
    return fmt
