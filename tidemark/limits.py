"""The journal's limits on what enters it, and the checks where an input enters.

Each limit is spelled once, and checked where an input enters: the `tidemark` command, a workflow's
input, a signal's payload.

Each length limit is the one a CHECK constraint of the schema holds a column to
(tidemark/migrations/), so that an input is refused with one line naming the field and the limit
before it reaches the database, not by a constraint violation halfway through a command;
tests/test_limits.py reads the constraints back from a migrated database and holds these numbers
to them. The limits on a plan document (its size, its nesting, the digits of a number) are the
ones a payload can cross Temporal and Python's json module with.

Three kinds of bad input are refused, each with its own line (InputError: ``<field>: <why>``):
too long, a character the journal or one output line cannot hold (a control character such as
NUL, a line separator, a lone surrogate: what a byte that is not UTF-8 becomes in ``sys.argv``),
and JSON that Python cannot decode (nesting deeper than the recursion limit, an integer of
thousands of digits, ``NaN``). A signal cannot be refused (the run must still halt), so its text
is cut to size instead (``cut``).

Pure (the standard library and tidemark.errors only): workflow code imports it.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from typing import Any

from tidemark.errors import InputError

# -- the journal's limits (CHECK constraints of tidemark/migrations/) ----------------------------

# A task id and a series name: plans.task_id, series_runs.task_id and .series, series.series.
ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}"
ID_RE = re.compile(ID_PATTERN)
ID_MAX = 128
ID_RULE = (f"1-{ID_MAX} characters of letters, digits and . _ : -, starting with a letter or "
           "digit")
SCOPE_MAX = 200  # controls.scope: a task id, `*` or `series:<S>`
REASON_MAX = 2000  # controls.reason
LABEL_MAX = 200  # controls.set_by, events.actor, unwinds.unwound_by, grants.revoked_by
ACTION_MAX = 100  # plan_steps.action, journal.action
# A note (`resolve --note`, the reason of approve and reject) is journaled in an event's detail
# and in decisions.note: it is a reason, and held to a reason's limit.
NOTE_MAX = REASON_MAX
POLICY_MAX = 500  # approval_policy.approval: a policy as written (`tidemark policy set`)

# -- a plan document ------------------------------------------------------------------------------

# Temporal refuses a payload over 2 MiB (the server's default blob size limit), and a plan travels
# to the worker as one: a larger plan could be checked but never started.
PLAN_BYTES_MAX = 2 * 1024 * 1024
# A plan is five levels deep (plan, steps, step, args, a list of addresses); Python's json module
# recurses once per level and fails at about a thousand. Far below that, far above any plan.
JSON_DEPTH_MAX = 32
# The largest figure a plan holds is an amount in minor units (Stripe's largest has 8 digits).
# Python refuses to convert an integer of more than 4,300 digits; this refuses long before.
JSON_DIGITS_MAX = 30

# Characters no input may hold: the journal's text cannot hold NUL, and a line printed for a
# person must stay one line (control characters, the Unicode line and paragraph separators).
# A lone surrogate (Cs) is what a byte that is not UTF-8 becomes in sys.argv: not storable.
_KINDS = {"Cc": "a control character", "Cs": "a byte that is not UTF-8",
          "Zl": "a line separator", "Zp": "a paragraph separator"}


def bad_character(text: str) -> tuple[int, str] | None:
    """The position and description of the first character ``text`` may not hold.

    The position (from 0) and the description (``U+0000 (a control character)``) of the
    first character ``text`` may not hold; None when it holds none."""
    for i, ch in enumerate(text):
        kind = _KINDS.get(unicodedata.category(ch))
        if kind is not None:
            return i, f"U+{ord(ch):04X} ({kind})"
    return None


def check_text(field: str, value: str, max_chars: int, *, min_chars: int = 0) -> str:
    """``value`` when it fits ``field``'s limit; InputError otherwise.

    ``value`` when it fits ``field``'s limit and holds only characters the journal and one
    line can hold; InputError naming the field and the limit otherwise."""
    bad = bad_character(value)
    if bad is not None:
        raise InputError(field, f"contains {bad[1]} at position {bad[0] + 1}; only printable "
                                "characters are accepted")
    if len(value) > max_chars:
        raise InputError(field, f"{len(value):,} characters; at most {max_chars:,}")
    if len(value) < min_chars:
        raise InputError(field, f"empty; {min_chars}-{max_chars:,} characters")
    return value


def check_id(field: str, value: str) -> str:
    """A task id or a series name as the journal holds them (ID_RE)."""
    check_text(field, value, ID_MAX, min_chars=1)
    if not ID_RE.fullmatch(value):
        raise InputError(field, f"{value!r} is not {ID_RULE}")
    return value


def cut(text: str, max_chars: int) -> str:
    """``text`` made fit, for what cannot be refused.

    Each character a line cannot hold becomes a space, and what is over ``max_chars`` is cut,
    ending in an ellipsis. For what cannot be refused (a signal's reason: the run must halt
    whatever the payload)."""
    over = len(text) > max_chars
    kept = text[:max_chars - 1] if over else text
    if bad_character(kept) is not None:
        kept = "".join(" " if bad_character(ch) else ch for ch in kept)
    return kept + "…" if over else kept


# -- JSON ---------------------------------------------------------------------------------------


class _Refused(ValueError):
    """Raised from json's hooks: a number this module refuses."""


def _integer(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > JSON_DIGITS_MAX:
        raise _Refused(f"an integer of {digits:,} digits; at most {JSON_DIGITS_MAX}")
    return int(text)


def _number(text: str) -> float:
    if len(text) > JSON_DIGITS_MAX * 2:  # a mantissa and an exponent
        raise _Refused(f"a number of {len(text):,} characters; at most {JSON_DIGITS_MAX * 2}")
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"the number {text[:40]} is too large to be finite")
    return value


def _constant(text: str) -> Any:
    raise _Refused(f"{text} is not JSON (the journal's JSON has no NaN or Infinity)")


def depth(value: Any) -> int:
    """How deeply ``value`` nests lists and objects (a scalar: 0), without recursion."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, level = todo.pop()
        children = item.values() if isinstance(item, dict) else item \
            if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        if level > JSON_DEPTH_MAX:
            break
        todo.extend((child, level + 1) for child in children)
    return deepest


def check_size(field: str, value: Any, max_bytes: int = PLAN_BYTES_MAX) -> Any:
    """``value`` when its JSON fits ``max_bytes``; InputError otherwise.

    ``value`` when its JSON fits ``max_bytes`` (a document that crosses Temporal as one
    payload); InputError otherwise."""
    size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8",
                                                                                    "replace"))
    if size > max_bytes:
        raise InputError(field, f"{size:,} bytes as JSON; at most {max_bytes:,}")
    return value


def decode_json(data: str | bytes, field: str, *, max_bytes: int = PLAN_BYTES_MAX) -> Any:
    """The JSON document ``data``, or InputError naming ``field`` and the limit.

    The limits: size, UTF-8, nesting, the digits of a number, NaN and Infinity, and JSON's own
    grammar."""
    size = len(data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data)
    if size > max_bytes:
        raise InputError(field, f"{size:,} bytes; at most {max_bytes:,}")
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(field, f"not UTF-8 (byte {e.start + 1})") from None
    try:
        value = json.loads(data, parse_int=_integer, parse_float=_number,
                           parse_constant=_constant)
    except RecursionError:
        raise InputError(field, f"nested too deeply; at most {JSON_DEPTH_MAX} levels") from None
    except _Refused as e:
        raise InputError(field, str(e)) from None
    except json.JSONDecodeError as e:
        raise InputError(field, f"not JSON: {e.msg} at line {e.lineno} column {e.colno}"
                         ) from None
    if depth(value) > JSON_DEPTH_MAX:
        raise InputError(field, f"nested more than {JSON_DEPTH_MAX} levels deep; at most "
                                f"{JSON_DEPTH_MAX}")
    return value



# -- what a run waiting for approval shows ------------------------------------------------------

# The irreversible steps a run waiting for approval lists in its details, as its boundary's
# activity returns them: as many lines as fit this many characters (the details travel with
# every workflow task, the result is one payload), each cut to DETAILS_LINE_CHARS. The line "in
# all" beside them names every currency's total, every recipient and every action, so the cut
# hides no step; `tidemark status T` and `tidemark approve T` show every one from the journal.
DETAILS_CHARS = 12_000
DETAILS_LINE_CHARS = 500


def within(lines: list[str], budget: int = DETAILS_CHARS) -> list[str]:
    """The first of ``lines`` that fit ``budget`` characters, each cut to DETAILS_LINE_CHARS."""
    kept: list[str] = []
    for line in lines:
        line = cut(line, DETAILS_LINE_CHARS)
        budget -= len(line) + 3  # as listed: "- " and a line break
        if budget < 0:
            break
        kept.append(line)
    return kept
