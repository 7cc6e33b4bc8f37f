"""What a task's irreversible steps will do, in words a person approves.

Every recipient, subject, the start of each body, and every amount in its currency's own units.

Pure (the standard library and tidemark.money): `tidemark status`, the inbox, the gate and the
workflow's details all read it, none of them with more imports than they had.
"""

from __future__ import annotations

from typing import Any

from tidemark.money import shown

# A mail body is shown up to this many characters: enough to recognise the mail, one line long.
BODY_EXCERPT = 120


def _money(amount: Any, currency: Any) -> str:
    """An amount in the currency's own units, with the minor units sent.

    In the currency's own units (50,000 JPY, 42.00 EUR), with the minor units the target is
    sent."""
    cur = str(currency or "")
    if isinstance(amount, int) and not isinstance(amount, bool) and cur:
        return f"amount {shown(amount, cur)} ({amount} minor units)"
    return f"amount {amount} {cur.upper()}"


def excerpt(text: Any, limit: int = BODY_EXCERPT) -> str:
    """The start of a text on one line, ``…`` where it was cut."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[:limit - 1] + "…"


def what_it_will_do(number: int, action: str, args: dict[str, Any]) -> str:
    """One line per irreversible step for the person who approves.

    Every recipient, subject, the start of the body, amount and currency, and every other argument,
    whatever the action."""
    parts = []
    for k in ("to", "cc", "bcc"):
        if args.get(k):
            v = args[k]
            parts.append(f"{k} {', '.join(v) if isinstance(v, list) else v}")
    if "subject" in args:
        parts.append(f"subject {args['subject']!r}")
    if "body" in args:
        parts.append(f"body {excerpt(args['body'])!r}")
    if "amount" in args:
        parts.append(_money(args["amount"], args.get("currency")))
    for k in ("customer", "description"):
        if args.get(k):
            parts.append(f"{k} {args[k]!r}")
    shown_keys = {"to", "cc", "bcc", "subject", "amount", "currency", "customer",
                  "description", "body"}
    parts += [f"{k} {args[k]!r}" for k in sorted(set(args) - shown_keys)]
    return f"step {number} {action}: " + "; ".join(parts)


def at_a_glance(irreversible: list[tuple[str, dict[str, Any]]]) -> str:
    """One line that names everything the irreversible steps will do.

    The steps are given as (action, args). The line holds whatever is cut from a longer listing:
    the total per currency, every recipient, and how many steps of each action."""
    totals: dict[str, int] = {}
    recipients: set[str] = set()
    actions: dict[str, int] = {}
    for action, args in irreversible:
        actions[action] = actions.get(action, 0) + 1
        if isinstance(args.get("amount"), int) and args.get("currency"):
            cur = str(args["currency"]).lower()
            totals[cur] = totals.get(cur, 0) + int(args["amount"])
        for k in ("to", "cc", "bcc"):
            v = args.get(k) or []
            recipients.update(v if isinstance(v, list) else [str(v)])
    parts = [", ".join(f"{n} {a}" for a, n in sorted(actions.items()))]
    if totals:
        parts.append("in all " + ", ".join(shown(t, c) for c, t in sorted(totals.items())))
    if recipients:
        parts.append("to " + ", ".join(sorted(recipients)))
    return "; ".join(parts)
