"""Google's answers as Drive gives them.

The JSON error body, partial responses (``fields``) and the page tokens of ``files.list``."""

from __future__ import annotations

import base64
import re
from typing import Any

from aiohttp import web

DEFAULT_FIELDS = ("kind", "id", "name", "mimeType")  # what Drive v3 answers without `fields`
DEFAULT_PAGE_SIZE = 100  # Drive's default pageSize for files.list
MAX_PAGE_SIZE = 1000  # Drive's documented maximum pageSize


def google_error(http_status: int, message: str, *, reason: str, detail: str | None = None,
                  status: str | None = None, location: tuple[str, str] | None = None,
                  extra: dict[str, Any] | None = None,
                  headers: dict[str, str] | None = None) -> web.Response:
    """Google's JSON error body.

    ``detail`` is the per-error message when it differs from the top-level one; ``status`` the
    RPC status name that newer Google front ends add."""
    item: dict[str, Any] = {"message": detail or message, "domain": "global", "reason": reason}
    if location is not None:
        item["locationType"], item["location"] = location
    err: dict[str, Any] = {"code": http_status, "message": message, "errors": [item]}
    if status:
        err["status"] = status
    err.update(extra or {})
    return web.json_response({"error": err}, status=http_status, headers=headers)


def split_top(fields: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in fields:
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
            continue
        depth += (ch == "(") - (ch == ")")
        cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def select_fields(resource: dict[str, Any], fields: str | None,
            default: tuple[str, ...]) -> dict[str, Any]:
    """Applies a partial-response ``fields`` selection loosely.

    It takes top-level names, ``*``, ``name(sub,fields)`` and ``name/sub`` on lists of objects;
    unknown names are ignored."""
    if fields is None:
        return {k: v for k, v in resource.items() if k in default}
    out: dict[str, Any] = {}
    for part in split_top(fields):
        if part == "*":
            return dict(resource)
        m = re.fullmatch(r"([A-Za-z]+)(?:\((.*)\)|/(.+))?", part)
        if m is None or m.group(1) not in resource:
            continue
        name, sub = m.group(1), m.group(2) or m.group(3)
        value = resource[name]
        if sub and isinstance(value, list):
            value = [select_fields(v, sub, ()) if isinstance(v, dict) else v for v in value]
        elif sub and isinstance(value, dict) and name != "appProperties":
            value = select_fields(value, sub, ())
        out[name] = value
    return out



def encode_page_token(offset: int) -> str:
    return base64.urlsafe_b64encode(f"offset:{offset}".encode()).decode()


def decode_page_token(token: str | None) -> int:
    if not token:
        return 0
    text = base64.urlsafe_b64decode(token.encode()).decode()
    if not text.startswith("offset:"):
        raise ValueError("bad page token")
    return int(text.removeprefix("offset:"))
