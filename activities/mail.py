"""What ``gmail.send`` and ``graph.send_mail`` share: one plain-text mail, its arguments and
its summary line. Each provider's module adds its clients, its probe and its execute."""

from __future__ import annotations

from typing import Any, ClassVar

from tidemark.actions import Action, Arg, address_list


def one_line(value: str) -> str:
    """A header value: a line break would end the header (or forge another), so it is refused
    when the plan is checked rather than when the mail is built, after its intent."""
    if "\r" in value or "\n" in value:
        raise ValueError("must be one line (no line breaks)")
    return value


class MailAction(Action):
    """Base class of the actions that send one plain-text mail: ``{to, cc?, subject, body}``.

    ``to`` and ``cc`` take one address or a list of them. A sent mail cannot be called back, so
    every mail action is irreversible.
    """

    irreversible: ClassVar[bool] = True
    args: ClassVar[dict[str, Arg]] = {
        "to": Arg((str, list), check=address_list),
        "cc": Arg((str, list), required=False, check=address_list),
        "subject": Arg(str, check=one_line),
        "body": Arg(str),
    }

    @classmethod
    def describe(cls, args: dict[str, Any]) -> str:
        """The subject and the recipients, e.g. ``'Q3 report' to bob@example.com (+1 cc)``."""
        to = address_list(args["to"])
        cc = f" (+{len(address_list(args['cc']))} cc)" if args.get("cc") else ""
        return f"{args['subject']!r} to {', '.join(to)}{cc}"
