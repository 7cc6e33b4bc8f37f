"""Stripe's answers.

The error body, the ``Request-Id`` every answer carries, keys masked as Stripe's messages show
them, and an answer with metadata emptied for a key that may not see it."""

from __future__ import annotations

import json
import re
from typing import Any

from aiohttp import web

from staging.stripe.objects import random_id


def stripe_error(status: int, type_: str, message: str, *, code: str | None = None,
                 param: str | None = None,
                 headers: dict[str, str] | None = None) -> web.Response:
    """Stripe's error body: ``{"error": {"type", "message", "code"?, "param"?, "doc_url"?}}``."""
    err: dict[str, Any] = {"message": message, "type": type_}
    if code is not None:
        err["code"] = code
        err["doc_url"] = f"https://stripe.com/docs/error-codes/{code.replace('_', '-')}"
    if param is not None:
        err["param"] = param
    return stripe_json({"error": err}, status=status, headers=headers)


def mask_key(key: str) -> str:
    """Shows a key the way Stripe's messages do: its prefix and last four characters."""
    m = re.match(r"(?:sk|rk|pk)_(?:test|live)_", key)
    prefix = m.group(0) if m else ""
    rest = key[len(prefix):]
    return prefix + "*" * max(len(rest) - 4, 0) + rest[-4:]


def without_metadata(response: web.Response) -> web.Response:
    """The same answer with every PaymentIntent's metadata emptied.

    That is how a key that may not see metadata would get it (one object, or a list or search
    page of them)."""
    body = json.loads(response.body) if isinstance(response.body, bytes) else {}
    for obj in body.get("data", [body]) if isinstance(body, dict) else []:
        if isinstance(obj, dict) and "metadata" in obj:
            obj["metadata"] = {}
    hidden = web.json_response(body, status=response.status)
    for name, value in response.headers.items():
        if name.lower() not in ("content-length", "content-type"):
            hidden.headers[name] = value
    return hidden


def stripe_json(body: Any, status: int = 200,
                headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(body, status=status,
                             headers={"Request-Id": request_id(), **(headers or {})})


def no_such(obj_id: str, param: str, status: int) -> web.Response:
    return stripe_error(status, "invalid_request_error", f"No such payment_intent: '{obj_id}'",
                        code="resource_missing", param=param)


def request_id() -> str:
    return "req_" + random_id(14)
