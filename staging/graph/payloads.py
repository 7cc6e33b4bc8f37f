"""Message bodies as Graph reads them from a request.

Property names are matched without regard to case, recipients resolved, at most five ``x-``
internet message headers taken, and extended properties put in their canonical form
(PR_MESSAGE_FLAGS dropped, the store computes it)."""

from __future__ import annotations

import re
import secrets
import time
from typing import Any

from staging.core import Reply, Target
from staging.graph.mapi import MESSAGE_FLAGS_ID, normalise_property_id
from staging.graph.store import GraphMessage, Mailbox, iso, new_id

MAX_CUSTOM_HEADERS = 5  # Exchange Online refuses more internetMessageHeaders than this


def ci(d: dict[str, Any]) -> dict[str, Any]:
    """The same object with lower-cased property names: Graph matches them without case."""
    return {str(k).lower(): v for k, v in d.items()}


def parse_message(target: Target, raw: dict[str, Any], box: Mailbox, save_to_sent: bool, *,
                   need_recipients: bool) -> GraphMessage:
    m = ci(raw)
    to = parse_recipients(target, m.get("torecipients"))
    cc = parse_recipients(target, m.get("ccrecipients"))
    bcc = parse_recipients(target, m.get("bccrecipients"))
    if need_recipients and not (to or cc or bcc):
        raise Reply(target.error(400, "ErrorInvalidRecipients",
                               "At least one recipient isn't valid., A message can't be sent "
                               "because it contains no recipients."))
    headers = parse_headers(target, m.get("internetmessageheaders"))
    properties = parse_properties(target, m.get("singlevalueextendedproperties"))
    body = ci(m.get("body") or {})
    content_type = str(body.get("contenttype") or "text").lower()
    if content_type not in ("text", "html"):
        raise Reply(target.error(400, "RequestBodyRead",
                               f"The value '{content_type}' is not valid for BodyType."))
    content = str(body.get("content") or "")
    now = iso(time.time())
    me = {"emailAddress": {"name": box.display_name, "address": box.address}}
    fields: dict[str, Any] = {
        "id": new_id("AAMkAD"), "createdDateTime": now, "lastModifiedDateTime": now,
        "changeKey": new_id("CQAAAB"), "categories": [], "receivedDateTime": now,
        "sentDateTime": None, "hasAttachments": False,
        "internetMessageId": f"<{secrets.token_hex(12).upper()}@STAGING.prod.outlook.com>",
        "subject": str(m.get("subject") or ""), "bodyPreview": " ".join(content.split())[:255],
        "importance": str(m.get("importance") or "normal").lower(), "parentFolderId": "",
        "conversationId": new_id("AAQkAD"), "isDeliveryReceiptRequested": False,
        "isReadReceiptRequested": False, "isRead": True, "isDraft": False,
        "webLink": "https://outlook.office365.com/owa/?ItemID=staging&exvsurl=1",
        "inferenceClassification": "focused",
        "body": {"contentType": content_type, "content": content},
        "sender": me, "from": me, "toRecipients": to, "ccRecipients": cc,
        "bccRecipients": bcc, "replyTo": [], "flag": {"flagStatus": "notFlagged"},
    }
    return GraphMessage(fields, headers, properties, save_to_sent)

def parse_recipients(target: Target, raw: Any) -> list[dict[str, Any]]:
    out = []
    for r in raw or []:
        addr = ci(ci(r if isinstance(r, dict) else {}).get("emailaddress") or {})
        address = addr.get("address")
        if not isinstance(address, str) or not re.fullmatch(r"[^@\s]+@[^@\s]+", address):
            raise Reply(target.error(400, "ErrorInvalidRecipients",
                                   f"At least one recipient isn't valid., Recipient "
                                   f"'{address}' is not resolved. All recipients must be "
                                   "resolved before a message can be submitted."))
        out.append({"emailAddress": {"name": str(addr.get("name") or address),
                                     "address": address}})
    return out

def parse_headers(target: Target, raw: Any) -> list[dict[str, str]]:
    if raw is None:
        return []
    if not isinstance(raw, list) or not 0 < len(raw) <= MAX_CUSTOM_HEADERS:
        raise Reply(target.error(400, "InvalidInternetMessageHeaderCollection",
                               f"Maximum number of headers in one message should be less "
                               f"than or equal to {MAX_CUSTOM_HEADERS}."))
    out = []
    for h in raw:
        h = ci(h if isinstance(h, dict) else {})
        name, value = str(h.get("name") or ""), str(h.get("value") or "")
        if not name.lower().startswith("x-"):
            raise Reply(target.error(400, "InvalidInternetMessageHeader",
                                   f"The internet message header name '{name}' should "
                                   "start with 'x-' or 'X-'."))
        out.append({"name": name, "value": value})
    return out

def parse_properties(target: Target, raw: Any) -> list[dict[str, str]]:
    out = []
    for p in raw or []:
        p = ci(p if isinstance(p, dict) else {})
        prop_id = normalise_property_id(str(p.get("id") or ""))
        if prop_id is None or not isinstance(p.get("value"), str):
            raise Reply(target.error(400, "ErrorInvalidProperty",
                                   f"The extended property id '{p.get('id')}' is not valid."))
        if prop_id != MESSAGE_FLAGS_ID:  # computed by the store, never taken from a client
            out.append({"id": prop_id, "value": p["value"]})
    return out
