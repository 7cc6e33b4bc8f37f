"""The OData query options staging Graph understands on message listings.

They are ``$filter`` on one extended property, ``$expand`` of extended properties, ``$select``,
``$top`` and ``$skip``; also the JSON view of a message they shape. Any other form is a clear
400, never silently ignored."""

from __future__ import annotations

import re
from typing import Any

from staging.core import Reply, Target
from staging.graph.mapi import MESSAGE_FLAGS_ID, message_flags, normalise_property_id
from staging.graph.store import GraphMessage

DEFAULT_PAGE_SIZE = 10  # Graph's default $top for messages
MAX_PAGE_SIZE = 1000  # Graph's upper bound for $top on messages

MESSAGE_PROPERTIES = (
    "id", "createdDateTime", "lastModifiedDateTime", "changeKey", "categories",
    "receivedDateTime", "sentDateTime", "hasAttachments", "internetMessageId", "subject",
    "bodyPreview", "importance", "parentFolderId", "conversationId", "isDeliveryReceiptRequested",
    "isReadReceiptRequested", "isRead", "isDraft", "webLink", "inferenceClassification", "body",
    "sender", "from", "toRecipients", "ccRecipients", "bccRecipients", "replyTo", "flag",
)
SELECT_ONLY = ("internetMessageHeaders", "uniqueBody")  # returned only when $select names them

_ANY_FILTER = re.compile(
    r"(?is)^\s*singleValueExtendedProperties/any\(\s*(\w+)\s*:\s*(.*)\)\s*$")
_COMPARISON = re.compile(r"(?is)^\s*(\w+)/(id|value)\s+eq\s+'((?:[^']|'')*)'\s*$")
_EXPAND = re.compile(
    r"(?is)^\s*singleValueExtendedProperties(?:\(\s*\$filter\s*=\s*(.*)\))?\s*$")
_EXPAND_ID = re.compile(r"(?is)^\s*id\s+eq\s+'((?:[^']|'')*)'\s*$")


def odata_string(text: str) -> str:
    return text.replace("''", "'")


def parse_filter(target: Target, text: str | None) -> Any:
    """A predicate for the one $filter form a probe needs; anything else is a clear 400."""
    if text is None:
        return lambda m: True
    wanted: dict[str, str] = {}
    m = _ANY_FILTER.match(text)
    if m is not None:
        for term in re.split(r"(?i)\s+and\s+", m.group(2)):
            c = _COMPARISON.match(term)
            if c is None or c.group(1) != m.group(1):
                wanted = {}
                break
            wanted[c.group(2).lower()] = odata_string(c.group(3))
    if set(wanted) != {"id", "value"}:
        raise Reply(target.error(400, "ErrorInvalidUrlQueryFilter",
                                 f"The query filter contains one or more invalid nodes "
                                 f"(staging Graph supports only singleValueExtendedProperties/"
                                 f"any(ep: ep/id eq '...' and ep/value eq '...')): {text}"))
    prop_id = normalise_property_id(wanted["id"])
    if prop_id is None:
        raise Reply(target.error(400, "ErrorInvalidProperty",
                                 f"The extended property id '{wanted['id']}' is not valid."))
    return lambda msg: any(p["id"] == prop_id and p["value"] == wanted["value"]
                           for p in msg.properties)


def parse_expand(target: Target, text: str | None
                  ) -> tuple[bool, tuple[str, ...] | None]:
    """Whether to expand singleValueExtendedProperties, and which ids.

    None for the ids: all of them. The filter is ``id eq '…'`` or several of those joined by
    ``or``."""
    if text is None:
        return False, None
    m = _EXPAND.match(text)
    if m is None:
        raise Reply(target.error(400, "BadRequest",
                                 f"Parsing OData Select and Expand failed: staging Graph expands "
                                 f"only singleValueExtendedProperties, not {text!r}"))
    if m.group(1) is None:
        return True, None
    ids = []
    for term in re.split(r"(?i)\s+or\s+", m.group(1)):
        c = _EXPAND_ID.match(term)
        prop_id = normalise_property_id(odata_string(c.group(1))) if c else None
        if prop_id is None:
            raise Reply(target.error(400, "ErrorInvalidProperty",
                                     f"The extended property id in '{term.strip()}' is not "
                                     f"valid."))
        ids.append(prop_id)
    return True, tuple(ids)


def parse_select(target: Target, text: str | None) -> list[str] | None:
    if text is None:
        return None
    known = {p.lower(): p for p in (*MESSAGE_PROPERTIES, *SELECT_ONLY)}
    out = []
    for name in (n.strip() for n in text.split(",") if n.strip()):
        if name.lower() not in known:
            raise Reply(target.error(400, "RequestBroker--ParseUri",
                                     f"Could not find a property named '{name}' on type "
                                     "'microsoft.graph.message'."))
        out.append(known[name.lower()])
    return out


def int_option(target: Target, query: Any, name: str, default: int, hi: int) -> int:
    value = query.get(name)
    if value is None:
        return default
    if not value.isdigit():
        raise Reply(target.error(400, "BadRequest",
                                 f"Invalid value '{value}' for query option '{name}'."))
    return min(int(value), hi)


def message_view(m: GraphMessage, select: list[str] | None,
          expand: tuple[bool, tuple[str, ...] | None]) -> dict[str, Any]:
    out: dict[str, Any] = {"@odata.etag": f'W/"{m.fields["changeKey"]}"'}
    names = MESSAGE_PROPERTIES if select is None else ["id", *select]
    for name in names:
        if name == "internetMessageHeaders":
            # Exchange Online keeps no internet headers on the Sent Items copy, and that
            # copy stays without them when it is moved on (to Deleted Items, say).
            if m.fields["sentDateTime"] is None and m.headers:
                out[name] = [dict(h) for h in m.headers]
        elif name in m.fields:
            out[name] = m.fields[name]
    wanted, prop_ids = expand
    if wanted:
        props = [dict(p) for p in m.properties if prop_ids is None or p["id"] in prop_ids]
        if prop_ids is not None and MESSAGE_FLAGS_ID in prop_ids:
            props.append({"id": "Integer 0xe07", "value": str(message_flags(m))})
        if props:  # Graph leaves the collection out when nothing matches
            out["singleValueExtendedProperties"] = props
    return out
