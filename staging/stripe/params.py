"""Request parameters as Stripe reads them.

The form/query encoding (``a[b]=v``), the parameters each endpoint accepts (anything else is
``parameter_unknown``), integers, page limits and ``created`` filters."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from staging.core import Reply
from staging.stripe.responses import stripe_error

DEFAULT_LIMIT = 10  # Stripe's default page size for list and search
MAX_LIMIT = 100  # Stripe's maximum page size

CREATE_PARAMS = frozenset({
    "amount", "currency", "customer", "description", "metadata", "receipt_email",
    "payment_method_types", "automatic_payment_methods", "capture_method",
    "statement_descriptor_suffix", "expand",
})
# What "Update a PaymentIntent" takes that the emulator applies (a Dashboard edit is the same
# request): the amount, currency, description and metadata can change after the create.
UPDATE_PARAMS = frozenset({"amount", "currency", "description", "metadata", "receipt_email",
                           "expand"})
LIST_PARAMS = frozenset({"created", "customer", "limit", "starting_after", "ending_before",
                         "expand"})
SEARCH_PARAMS = frozenset({"query", "limit", "page", "expand"})


def no_unknown(params: Mapping[str, Any], allowed: Iterable[str]) -> None:
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise Reply(stripe_error(400, "invalid_request_error",
                                 f"Received unknown parameter: {unknown[0]}",
                                 code="parameter_unknown", param=unknown[0]))


def integer(value: Any, param: str) -> int:
    try:
        return int(str(value))
    except ValueError:
        raise Reply(stripe_error(400, "invalid_request_error", f"Invalid integer: {value}",
                                 code="parameter_invalid_integer", param=param)) from None


def page_limit(params: Mapping[str, Any]) -> int:
    limit = integer(params.get("limit", DEFAULT_LIMIT), "limit")
    if not 1 <= limit <= MAX_LIMIT:
        raise Reply(stripe_error(400, "invalid_request_error",
                                 f"This value must be between 1 and {MAX_LIMIT}.",
                                 code="parameter_invalid_integer", param="limit"))
    return limit


def created_filter(value: Any) -> Callable[[int], bool]:
    if value is None:
        return lambda c: True
    if not isinstance(value, dict):
        at = integer(value, "created")
        return lambda c: c == at
    ops: dict[str, Callable[[int, int], bool]] = {
        "gt": lambda c, v: c > v, "gte": lambda c, v: c >= v,
        "lt": lambda c, v: c < v, "lte": lambda c, v: c <= v}
    bounds = []
    for k, v in value.items():
        if k not in ops:
            raise Reply(stripe_error(400, "invalid_request_error",
                                     f"Received unknown parameter: created[{k}]",
                                     code="parameter_unknown", param=f"created[{k}]"))
        bounds.append((ops[k], integer(v, f"created[{k}]")))
    return lambda c: all(op(c, v) for op, v in bounds)


def decode_params(items: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """Decodes Stripe's form/query encoding (``a[b]=v``, ``a[0]=v``) into nested dicts.

    Lists stay dicts keyed by index here (``metadata`` keys may be digits too); the few list
    parameters are turned into lists where they are used.
    """
    out: dict[str, Any] = {}
    for raw, value in items:
        m = re.fullmatch(r"([^\[\]]+)((?:\[[^\[\]]*\])*)", raw)
        if m is None:
            raise Reply(stripe_error(400, "invalid_request_error",
                                     f"Invalid parameter name: {raw}"))
        path = [m.group(1), *re.findall(r"\[([^\[\]]*)\]", m.group(2))]
        cur = out
        for part in path[:-1]:
            nxt = cur.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise Reply(stripe_error(400, "invalid_request_error",
                                         f"Invalid object: {raw}", param=path[0]))
            cur = nxt
        cur[path[-1]] = value
    return out
