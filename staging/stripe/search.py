"""Stripe's search query language, the subset the emulator understands.

Anything else is a Stripe-like error, never a silent non-match."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

_CLAUSE = re.compile(r"""\s*(?:
    metadata\[(?P<mq>['"])(?P<mkey>.+?)(?P=mq)\]\s*:\s*(?P<mvq>['"])(?P<mval>.*?)(?P=mvq)
  | (?P<field>status|currency|customer|description)\s*:\s*(?P<fq>['"])(?P<fval>.*?)(?P=fq)
  | (?P<num>amount|created)\s*(?P<op>>=|<=|:|>|<)\s*(?P<nval>-?\d+)
)\s*""", re.VERBOSE)


def parse_search(query: str) -> Callable[[dict[str, Any]], bool]:
    """Compiles a search ``query`` into a predicate over PaymentIntent objects.

    Raises:
        ValueError: outside the emulated subset (the message is Stripe-like).
    """
    joiners = re.findall(r"\s(AND|OR)\s", query)
    if len(set(joiners)) > 1:
        raise ValueError("Queries may combine clauses with AND or with OR, not both.")
    parts = re.split(r"\s(?:AND|OR)\s", query) if joiners else [query]
    preds: list[Callable[[dict[str, Any]], bool]] = []
    for part in parts:
        m = _CLAUSE.fullmatch(part)
        if m is None:
            raise ValueError(f"Invalid query: could not parse {part.strip()!r}.")
        preds.append(clause(m))
    if joiners and joiners[0] == "OR":
        return lambda o: any(p(o) for p in preds)
    return lambda o: all(p(o) for p in preds)


_COMPARE: dict[str, Callable[[int, int], bool]] = {
    ":": lambda x, v: x == v, ">": lambda x, v: x > v, "<": lambda x, v: x < v,
    ">=": lambda x, v: x >= v, "<=": lambda x, v: x <= v}


def clause(m: re.Match[str]) -> Callable[[dict[str, Any]], bool]:
    if m.group("mkey") is not None:
        key, value = m.group("mkey"), m.group("mval")
        return lambda o: o["metadata"].get(key) == value
    if m.group("field") is not None:
        name, text = m.group("field"), m.group("fval")
        return lambda o: o.get(name) == text
    num, compare, bound = m.group("num"), _COMPARE[m.group("op")], int(m.group("nval"))
    return lambda o: compare(o[num], bound)
