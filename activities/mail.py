"""What ``gmail.send`` and ``graph.send_mail`` share: one plain-text mail.

They share its arguments and its summary line. Each provider's module adds its clients, its
probe and its execute.

Headers and addresses are checked when the plan is checked (``tidemark plan check`` and the
workflow's ``prepare``), before anything is stored. A value the mail library would refuse, fold
or rewrite after the intent is written would fail the task for good, or send something other
than what the plan says.
"""

from __future__ import annotations

import re
import unicodedata
from email.errors import HeaderParseError, MessageError
from email.headerregistry import Address
from typing import Any, ClassVar

from tidemark.actions import Action, Arg, address_list

# Every character str.splitlines() breaks on, beyond CR and LF: a mail library (or a provider)
# that honours any of them would end the header there.
LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def _char_name(ch: str) -> str:
    return f"U+{ord(ch):04X} {unicodedata.name(ch, 'control character')}"


def one_line(value: str) -> str:
    """A header value, refused if it holds a line break.

    A line break would end the header (or forge another). So it is refused when the plan is
    checked rather than when the mail is built, after its intent."""
    for ch in value:
        if ch in LINE_BREAKS:
            raise ValueError(f"must be one line: it contains a line break ({_char_name(ch)})")
        if unicodedata.category(ch) == "Cc" and ch != "\t":
            raise ValueError(f"contains a control character ({_char_name(ch)})")
    return value


def mail_address(item: Any) -> str:
    """One bare address, exactly as it will be sent: ``local@example.com``.

    Parsed with the standard library's strict RFC 5322 parser (email.headerregistry), and
    accepted only if it renders back to the very same text: no display names, groups, lists,
    comments or quoted local parts, which providers and libraries treat differently. A domain
    must be ASCII host labels; a non-ASCII domain is refused with its IDNA A-label to use
    instead, so that the plan says exactly what goes on the wire.
    """
    if not isinstance(item, str):
        raise ValueError(f"{item!r} is not a mail address (must be a string)")
    if not item or any(ch.isspace() or unicodedata.category(ch) == "Cc" for ch in item):
        raise ValueError(f"{item!r} is not one bare address like name@example.com (no spaces, "
                         "display names, groups or lists)")
    try:
        parsed = Address(addr_spec=item)
    except (ValueError, HeaderParseError, MessageError, IndexError) as e:
        raise ValueError(f"{item!r} is not a mail address: {e}") from None
    if parsed.addr_spec != item:
        raise ValueError(f"{item!r} is not a bare address: it would be sent as "
                         f"{parsed.addr_spec!r}")
    if parsed.addr_spec.startswith('"'):
        raise ValueError(f"{item!r}: quoted local parts are not accepted")
    domain = parsed.domain
    if not domain.isascii():
        raise ValueError(f"{item!r}: the domain is not ASCII; write it as its IDNA A-label"
                         + _a_label_hint(parsed.username, domain))
    labels = domain.split(".")
    if not all(_LABEL.fullmatch(label) for label in labels) or len(domain) > 253:
        raise ValueError(f"{item!r}: the domain must be a host name (letters, digits and "
                         "hyphens between dots; no address literals)")
    if len(parsed.username) > 64 or len(item) > 254:
        raise ValueError(f"{item!r} is too long (local part at most 64, address at most 254)")
    return item


def _a_label_hint(local: str, domain: str) -> str:
    try:
        import idna  # IDNA 2008, as registries use; the stdlib codec is IDNA 2003

        return f", e.g. {local}@{idna.encode(domain).decode()}"
    except (ImportError, UnicodeError, ValueError):  # idna.IDNAError is a UnicodeError
        return ""


def mail_address_list(value: str | list[Any]) -> list[str]:
    """A single address or a list of them, each checked by :func:`mail_address`."""
    items = [value] if isinstance(value, str) else value
    if not items:
        raise ValueError("must name at least one address")
    return [mail_address(item) for item in items]


class MailAction(Action):
    """Base class of the actions that send one plain-text mail: ``{to, cc?, subject, body}``.

    ``to`` and ``cc`` take one address or a list of them. A sent mail cannot be called back, so
    every mail action is irreversible.
    """

    irreversible: ClassVar[bool] = True
    args: ClassVar[dict[str, Arg]] = {
        "to": Arg((str, list), check=mail_address_list),
        "cc": Arg((str, list), required=False, check=mail_address_list),
        "subject": Arg(str, check=one_line),
        "body": Arg(str),
    }

    @classmethod
    def describe(cls, args: dict[str, Any]) -> str:
        """The subject and the recipients, e.g. ``'Q3 report' to bob@example.com (+1 cc)``."""
        to = address_list(args["to"])
        cc = f" (+{len(address_list(args['cc']))} cc)" if args.get("cc") else ""
        return f"{args['subject']!r} to {', '.join(to)}{cc}"
