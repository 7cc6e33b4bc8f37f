"""Drive's ``q`` language, the subset Tidemark uses.

Terms are joined with ``and`` on ``name``, ``mimeType``, ``trashed`` and ``appProperties has``.
Anything else is a ValueError (the route answers Drive's 400), never a silent non-match."""

from __future__ import annotations

import re
from collections.abc import Callable

from staging.core import DEFAULT_CLIENT
from staging.drive.files import DriveFile

_TOKEN = re.compile(r"""\s*(?:
    (?P<str>'(?:[^'\\]|\\.)*')
  | (?P<op>!=|=|\{|\})
  | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
)""", re.VERBOSE)


def _tokens(q: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(q):
        if q[pos:].strip() == "":
            break
        m = _TOKEN.match(q, pos)
        if m is None:
            raise ValueError(f"cannot read the query at {q[pos:]!r}")
        kind = m.lastgroup or ""
        text = m.group(kind)
        if kind == "str":
            text = re.sub(r"\\(.)", r"\1", text[1:-1])
        out.append((kind, text))
        pos = m.end()
    return out


Predicate = Callable[[DriveFile], bool]


class _Cursor:
    """The tokens of a ``q`` and how far they have been read."""

    def __init__(self, toks: list[tuple[str, str]]) -> None:
        self.toks = toks
        self.i = 0

    def more(self) -> bool:
        return self.i < len(self.toks)

    def next_kind(self) -> str:
        """The kind of the next token, or "" past the end (the take that follows refuses it)."""
        return self.toks[self.i][0] if self.more() else ""

    def take(self, kind: str, text: str | None = None) -> str:
        """The next token's text, which must be of ``kind`` (and read ``text``, any case)."""
        toks, i = self.toks, self.i
        if i >= len(toks) or toks[i][0] != kind or (text is not None and
                                                    toks[i][1].lower() != text.lower()):
            raise ValueError(f"expected {text or kind} at token {i}")
        self.i += 1
        return toks[i][1]

    def expect(self, *words: tuple[str, str]) -> None:
        """Reads a fixed sequence of (kind, text) tokens."""
        for kind, text in words:
            self.take(kind, text)


def parse_query(q: str, client: str = DEFAULT_CLIENT) -> Predicate:
    """Compiles a Drive ``q`` of terms joined with ``and`` into a predicate.

    The predicate is for a caller of OAuth client ``client`` (``appProperties has`` matches only
    that client's properties).

    Raises:
        ValueError: the query uses something outside the supported subset.
    """
    cur = _Cursor(_tokens(q))
    preds: list[Predicate] = []
    while cur.more():
        if preds:
            cur.take("word", "and")
        fld = cur.take("word")
        term = _TERMS.get(fld)
        if term is None:
            raise ValueError(f"field {fld} is not supported")
        preds.append(term(cur, fld, client))
    return lambda f: all(p(f) for p in preds)


def _app_properties_term(cur: _Cursor, fld: str, client: str) -> Predicate:
    """``appProperties has { key='k' and value='v' }``, on ``client``'s own properties."""
    cur.expect(("word", "has"), ("op", "{"), ("word", "key"), ("op", "="))
    k = cur.take("str")
    cur.expect(("word", "and"), ("word", "value"), ("op", "="))
    v = cur.take("str")
    cur.take("op", "}")
    return lambda f: f.app_properties_by_client.get(client, {}).get(k) == v


def _text_term(cur: _Cursor, fld: str, client: str) -> Predicate:
    """``name`` or ``mimeType`` with ``=`` or ``!=``; ``name contains``."""
    attr = "name" if fld == "name" else "mime_type"
    op = cur.take("word", "contains") if cur.next_kind() == "word" else cur.take("op")
    s = cur.take("str")
    if op == "=":
        return lambda f: bool(getattr(f, attr) == s)
    if op == "!=":
        return lambda f: bool(getattr(f, attr) != s)
    if op.lower() == "contains" and fld == "name":
        # Drive matches `contains` on name prefixes of words; a substring test is
        # looser but never misses what Drive would find.
        return lambda f: s.lower() in f.name.lower()
    raise ValueError(f"operator {op} is not supported on {fld}")


def _trashed_term(cur: _Cursor, fld: str, client: str) -> Predicate:
    """``trashed = true|false`` (or ``!=``)."""
    op = cur.take("op")
    value = cur.take("word").lower()
    if op not in ("=", "!=") or value not in ("true", "false"):
        raise ValueError("trashed takes = or != and true or false")
    want = (value == "true") == (op == "=")
    return lambda f: f.trashed is want


# The fields a ``q`` may name, each with the parser of its term (after the field's name).
_TERMS: dict[str, Callable[[_Cursor, str, str], Predicate]] = {
    "appProperties": _app_properties_term,
    "name": _text_term,
    "mimeType": _text_term,
    "trashed": _trashed_term,
}
