"""MAPI single-value extended properties as Graph exposes them.

Property ids in their canonical form, PR_MESSAGE_FLAGS (computed by the store, never taken from
a client), and the key a sender stamps into a message (a header or a named property) that the
emulator records with an effect."""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from staging.graph.store import GraphMessage

KEY_HEADER = "x-tidemark-key"  # recorded as the effect's key when present
KEY_PROPERTY_NAME = "tidemark_key"  # ... or a named extended property of that name

# PR_MESSAGE_FLAGS (PidTagMessageFlags), a PT_LONG every message has; Graph reads it as the
# single-value extended property "Integer 0x0E07". Exchange computes it: a client cannot set it
# once the message is saved, so a value sent with a message is dropped. Bits per [MS-OXCMSG]
# 2.2.1.6 (PidTagMessageFlags): mfRead 0x1, mfSubmitted 0x4 ("marked for sending as a result of
# a call to the RopSubmitMessage ROP"), mfUnsent 0x8 (still being composed, a draft).
MESSAGE_FLAGS_ID = "Integer 0x0e07"
MSGFLAG_READ = 0x1
MSGFLAG_SUBMIT = 0x4
MSGFLAG_UNSENT = 0x8

_PROP_ID = re.compile(
    r"(?i)^(string|integer|boolean|systemtime|long|double|binary|guid)\s+"
    r"(?:\{([0-9a-f-]{36})\}\s+(name\s+\S.*|id\s+0x[0-9a-f]+)|(0x[0-9a-f]{1,4}))$")


def normalise_property_id(prop_id: str) -> str | None:
    """The canonical form of an extended property id, or None when it is not one.

    GUIDs are lower case, with single spaces. Exchange compares property ids this way, not as
    raw strings."""
    m = _PROP_ID.match(prop_id.strip())
    if m is None:
        return None
    kind = m.group(1).capitalize()
    if m.group(4):
        return f"{kind} {m.group(4).lower()}"
    word, _, rest = m.group(3).partition(" ")
    return f"{kind} {{{m.group(2).lower()}}} {word.capitalize()} {rest.strip()}"


def message_flags(m: GraphMessage) -> int:
    """PR_MESSAGE_FLAGS as the store computes it.

    Read; unsent while a draft; submitted while a sent draft waits in Drafts for transport (once
    the ``submitted_flag_after_s`` window after its 202 is over)."""
    flags = MSGFLAG_READ if m.fields.get("isRead") else 0
    if m.fields.get("isDraft"):
        flags |= MSGFLAG_UNSENT
    if m.submitted and time.time() >= m.flagged_from:
        flags |= MSGFLAG_SUBMIT
    return flags


def effect_key(m: GraphMessage) -> str | None:
    for h in m.headers:
        if h["name"].lower() == KEY_HEADER:
            return h["value"]
    for p in m.properties:
        if p["id"].endswith(f" Name {KEY_PROPERTY_NAME}"):
            return p["value"]
    return None
