"""The journal's limits, spelled once in tidemark/limits.py.

Each equals the CHECK constraint a migrated database holds its columns to, and each check refuses
what passes it with one line naming the field and the limit (tidemark.errors.InputError)."""

from __future__ import annotations

import json
import re

import pytest
from test_words import check_constraints

from tidemark import limits
from tidemark.errors import InputError, PlanError
from tidemark.plan import load_plan
from tidemark.store import JournalStore

# Each (table, column) whose CHECK bounds its length, and the limit of tidemark.limits that must
# equal it: a constraint loosened or tightened in a migration must be followed here.
LENGTHS: dict[tuple[str, str], int] = {
    ("controls", "scope"): limits.SCOPE_MAX,
    ("controls", "reason"): limits.REASON_MAX,
    ("controls", "set_by"): limits.LABEL_MAX,
    ("events", "actor"): limits.LABEL_MAX,
    ("unwinds", "unwound_by"): limits.LABEL_MAX,
    ("grants", "revoked_by"): limits.LABEL_MAX,
    ("grants", "task_id"): limits.ID_MAX,
    ("plan_steps", "action"): limits.ACTION_MAX,
    ("journal", "action"): limits.ACTION_MAX,
    ("approval_policy", "approval"): limits.POLICY_MAX,
    ("approval_policy", "set_by"): limits.LABEL_MAX,
    ("decisions", "os_user"): limits.LABEL_MAX,
    ("decisions", "label"): limits.LABEL_MAX,
    ("decisions", "note"): limits.NOTE_MAX,
}
# Bounded columns no input reaches: the worker writes them from its own configuration (a
# grant's target name, the provider URL that issued it, its handle).
NOT_INPUT = {("grants", "handle"), ("grants", "issuer"), ("grants", "target")}
# The columns a CHECK holds to the id pattern: task ids and series names.
PATTERNS = {("plans", "task_id"), ("series_runs", "task_id"), ("series_runs", "series"),
            ("series", "series")}
# How pg_get_constraintdef renders ``length(col) <= N`` and ``length(col) BETWEEN 1 AND N``
# (``(length(col) >= 1) AND (length(col) <= N)``), and ``col ~ 'pattern'``.
AT_MOST = re.compile(r"length\((\w+)\) <= (\d+)")
MATCHES = re.compile(r"\((\w+) ~ '\^(.*)\$'::text\)")


def schema_limits(conninfo: str) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], str]]:
    """Every length bound and every pattern the CHECK constraints of a migrated database hold."""
    lengths: dict[tuple[str, str], int] = {}
    patterns: dict[tuple[str, str], str] = {}
    for table, _name, definition in check_constraints(conninfo):
        table = table.removeprefix("tidemark.")
        for column, n in AT_MOST.findall(definition):
            lengths[(table, column)] = int(n)
        for column, pattern in MATCHES.findall(definition):
            patterns[(table, column)] = pattern
    return lengths, patterns


def test_each_limit_equals_the_check_of_its_column(store: JournalStore) -> None:
    lengths, patterns = schema_limits(store.conninfo)
    inputs = {k: v for k, v in lengths.items() if k not in NOT_INPUT}
    assert inputs == LENGTHS, "a CHECK on a length and tidemark.limits disagree"
    assert set(lengths) >= NOT_INPUT
    hashes = {("plans", "plan_hash"), ("journal", "idem_key"),  # ours, never an input
              ("decisions", "plan_hash")}
    assert {k: v for k, v in patterns.items() if k not in hashes} == \
        dict.fromkeys(PATTERNS, limits.ID_PATTERN)
    assert int(re.findall(r"\{0,(\d+)\}", limits.ID_PATTERN)[0]) + 1 == limits.ID_MAX
    assert limits.NOTE_MAX == limits.REASON_MAX  # a note is held to a reason's limit


@pytest.mark.parametrize(("value", "said"), [
    ("a" * 2001, "--reason: 2,001 characters; at most 2,000"),
    ("ok\x00then", "--reason: contains U+0000 (a control character) at position 3"),
    ("line\nbreak", "--reason: contains U+000A (a control character) at position 5"),
    ("sep\u2028x", "--reason: contains U+2028 (a line separator) at position 4"),
    ("bad\udcffbyte", "--reason: contains U+DCFF (a byte that is not UTF-8) at position 4"),
])
def test_a_text_over_its_limit_or_with_a_character_the_journal_cannot_hold_is_one_line(
        value: str, said: str) -> None:
    with pytest.raises(InputError) as e:
        limits.check_text("--reason", value, limits.REASON_MAX)
    assert str(e.value).startswith(said) and "\n" not in str(e.value)
    assert limits.check_text("--reason", "a" * 2000, limits.REASON_MAX) == "a" * 2000


@pytest.mark.parametrize(("data", "said"), [
    ("[" * 100_000 + "]" * 100_000, "plan: nested too deeply; at most 32 levels"),
    ("[" * 40 + "]" * 40, "plan: nested more than 32 levels deep; at most 32"),
    ('{"amount": ' + "9" * 5000 + "}", "plan: an integer of 5,000 digits; at most 30"),
    ('{"amount": 1e999}', "plan: the number 1e999 is too large to be finite"),
    ('{"amount": NaN}', "plan: NaN is not JSON"),
    ("{", "plan: not JSON: Expecting property name enclosed in double quotes at line 1 "
          "column 2"),
    (b'{"a": "\xff"}', "plan: not UTF-8 (byte 8)"),
    ("x" * (limits.PLAN_BYTES_MAX + 1), "plan: 2,097,153 bytes; at most 2,097,152"),
])
def test_json_that_cannot_be_decoded_is_refused_with_its_limit(data: str | bytes,
                                                               said: str) -> None:
    with pytest.raises(InputError) as e:
        limits.decode_json(data, "plan")
    assert str(e.value).startswith(said), str(e.value)


def test_json_within_the_limits_decodes_as_json_does() -> None:
    doc = {"steps": [{"action": "a", "args": {"amount": 10 ** 29, "x": [[[1.5]]]}}]}
    assert limits.decode_json(json.dumps(doc), "plan") == doc
    assert limits.decode_json(json.dumps(doc).encode(), "plan") == doc


def test_a_signal_text_is_cut_to_one_line_of_the_limit() -> None:
    assert limits.cut("a\x00b\nc", 100) == "a b c"
    cut = limits.cut("r" * 5000, limits.REASON_MAX)
    assert len(cut) == limits.REASON_MAX and cut.endswith("…")
    assert limits.cut("short", 10) == "short"


def test_a_plan_task_id_or_series_the_journal_cannot_hold_is_an_input_error() -> None:
    step = {"action": "fs.rename", "args": {"path": "/tmp/a", "name": "b"}}
    for field, value in (("task_id", "a\x00b"), ("task_id", "t" * 129), ("series", "s\x01"),
                         ("task_id", 7)):
        with pytest.raises(InputError) as e:
            load_plan({field: value, "steps": [step]}, _registry())
        assert e.value.field == field and isinstance(e.value, PlanError)


def _registry():  # type: ignore[no-untyped-def]
    from activities.catalog import spec_registry

    return spec_registry()
