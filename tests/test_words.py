"""The journal's words as types, exactly as the schema's CHECK constraints allow.

Each StrEnum of tidemark.words says exactly what the schema's CHECK constraints allow, as a
migrated database holds them (later migrations replace earlier constraints, so the migration
files alone do not say it)."""

from __future__ import annotations

import inspect
import re
import types
import typing
from enum import StrEnum

import psycopg
import pytest

from tidemark import words
from tidemark.store import JournalStore, StepSession
from tidemark.words import (
    STOPS,
    ControlState,
    Decision,
    DecisionVia,
    EventKind,
    GrantKind,
    GrantPurpose,
    GrantScope,
    Phase,
    ResolvedBy,
    SeriesAdmits,
    StepStatus,
    TaskState,
    Verdict,
)
from tools.cli.main import main

# Each (table, column) whose CHECK lists the words it allows, and the enum that names them.
CHECKED: dict[tuple[str, str], type[StrEnum]] = {
    ("journal", "phase"): Phase,
    ("journal", "status"): StepStatus,
    ("journal", "resolved_by"): ResolvedBy,
    ("events", "kind"): EventKind,
    ("controls", "state"): ControlState,
    ("grants", "scope"): GrantScope,
    ("grants", "kind"): GrantKind,
    ("grants", "purpose"): GrantPurpose,
    ("decisions", "decision"): Decision,
    ("decisions", "via"): DecisionVia,
    ("series", "admits"): SeriesAdmits,
}

# How pg_get_constraintdef renders ``col IN ('a', 'b')`` and ``col = 'a'``.
IN_LIST = re.compile(r"\((\w+) = ANY \(\(?ARRAY\[([^\]]*)\]")
EQUALS = re.compile(r"\((\w+) = '([^']*)'::text\)")
LITERAL = re.compile(r"'([^']*)'::text")


def check_constraints(conninfo: str) -> list[tuple[str, str, str]]:
    """(table, constraint name, definition) of every CHECK in the tidemark schema."""
    with psycopg.connect(conninfo) as conn:
        return conn.execute(
            "SELECT c.conrelid::regclass::text, c.conname, pg_get_constraintdef(c.oid)"
            " FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace"
            " WHERE n.nspname = 'tidemark' AND c.contype = 'c' ORDER BY 1, 2").fetchall()


def listed_words(conninfo: str) -> dict[tuple[str, str], set[str]]:
    """For each column a CHECK compares with string literals, every literal it allows."""
    words: dict[tuple[str, str], set[str]] = {}
    for table, _name, definition in check_constraints(conninfo):
        table = table.removeprefix("tidemark.")
        for column, items in IN_LIST.findall(definition):
            words.setdefault((table, column), set()).update(LITERAL.findall(items))
        for column, literal in EQUALS.findall(definition):
            words.setdefault((table, column), set()).add(literal)
    return words


def test_each_enum_holds_exactly_the_words_its_check_allows(store: JournalStore) -> None:
    listed = listed_words(store.conninfo)
    for (table, column), enum in CHECKED.items():
        assert (table, column) in listed, f"no CHECK lists the words of {table}.{column}"
        assert {str(m) for m in enum} == listed[(table, column)], (
            f"{enum.__name__} and the CHECK on {table}.{column} disagree")


def test_every_check_that_lists_words_has_an_enum(store: JournalStore) -> None:
    """A new CHECK list (a new column of words) must get its enum here too."""
    assert set(listed_words(store.conninfo)) == set(CHECKED)


def test_the_parser_reads_the_checks_as_postgres_renders_them(store: JournalStore) -> None:
    """The parser reads the CHECK constraints as Postgres renders them.

    The two tests above are only as good as the parsing. It reads one CHECK whose words are known
    from the migration text, and the attempt CHECK that compares phase with one word."""
    defs = {name: d for _t, name, d in check_constraints(store.conninfo)}
    assert set(LITERAL.findall(defs["controls_state_check"])) == {"stopped", "killed",
                                                                   "released"}
    attempt = [d for d in defs.values() if "attempt" in d]
    assert attempt and EQUALS.findall(attempt[0]) == [("phase", "undo")]


def test_a_word_missing_from_the_enum_is_caught(store: JournalStore) -> None:
    """A word missing from the enum is caught.

    A kind of event is added to the schema only, as a migration that forgot tidemark.words would.
    The enum no longer matches."""
    with psycopg.connect(store.conninfo, autocommit=True) as conn:
        conn.execute("ALTER TABLE tidemark.events DROP CONSTRAINT events_kind_check")
        conn.execute("ALTER TABLE tidemark.events ADD CONSTRAINT events_kind_check CHECK"
                     f" (kind IN ({', '.join(repr(str(k)) for k in EventKind)}, 'audit'))")
    listed = listed_words(store.conninfo)[("events", "kind")]
    assert listed - {str(k) for k in EventKind} == {"audit"}


def test_the_stops_are_what_stop_of_reads_as_a_stop(store: JournalStore) -> None:
    """tidemark.stop_of() returns a controls row only for the states that stop a task."""
    with psycopg.connect(store.conninfo) as conn:
        source = conn.execute("SELECT prosrc FROM pg_proc p JOIN pg_namespace n"
                              " ON n.oid = p.pronamespace WHERE n.nspname = 'tidemark'"
                              " AND p.proname = 'stop_of'").fetchone()
    assert source is not None
    m = re.search(r"c\.state IN \(([^)]*)\)", source[0])
    assert m is not None
    assert set(re.findall(r"'([^']*)'", m.group(1))) == {str(s) for s in STOPS}


@pytest.mark.parametrize("enum", [e for e in vars(words).values()
                                  if isinstance(e, type) and issubclass(e, StrEnum)
                                  and e is not StrEnum])
def test_a_member_is_its_string(enum: type[StrEnum]) -> None:
    """What lets the store, JSON and Temporal payloads take a member where they took a string."""
    for member in enum:
        assert member == member.value and f"{member}" == member.value
        assert type(member.value) is str


def test_a_verdict_typed_wrong_is_refused_in_one_line_naming_the_words(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``resolve --as`` offers the Verdict words as a person types them, not as enum reprs."""
    with pytest.raises(SystemExit) as e:
        main(["resolve", "t", "--step", "1", "--as", "maybe", "--yes"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2
    assert err.endswith("invalid choice: 'maybe' (choose from "
                        + ", ".join(repr(str(v)) for v in Verdict) + ")")


@pytest.mark.parametrize("enum", [e for e in vars(words).values()
                                  if isinstance(e, type) and issubclass(e, StrEnum)
                                  and e is not StrEnum])
def test_every_word_is_lower_case_and_its_own_name(enum: type[StrEnum]) -> None:
    """Every word is lower case and its own name.

    One spelling per word. The member's name is its value in capitals, so that a reader who meets
    ``"partly_unwound"`` in a payload finds ``TaskState.PARTLY_UNWOUND``."""
    for member in enum:
        assert member.name == member.value.upper() and member.value.islower()


# A parameter of the store named like a word takes the word's enum, so that a type checker
# refuses a misspelt or a wrong word (``status="don"``, a phase where a status goes) before
# the database's CHECK does. Where one name stands for two sets, either enum will do.
WORD_PARAMS: dict[str, tuple[type[StrEnum], ...]] = {
    "phase": (Phase,),
    "status": (StepStatus,),
    "resolved_by": (ResolvedBy,),
    "kind": (EventKind, GrantKind),
    "state": (ControlState, TaskState),
    "scope": (GrantScope,),
    "purpose": (GrantPurpose,),
    "decision": (Decision,),
    "verdict": (Verdict,),
}
# A control's scope is a task id, ``series:S`` or ``*``: a name, not a closed set of words.
NOT_WORDS = {("set_control", "scope"), ("set_killed", "scope")}


def unworded(*classes: type) -> tuple[list[str], int]:
    """The store's parameters named like a word but not typed with its enum, and the count.

    The parameters of the store's methods (those of ``classes`` defined in tidemark.store)
    named like a word but not annotated with its enum (``| None`` allowed), and how many
    such parameters were looked at."""
    wrong, seen = [], 0
    for cls in classes:
        for name, fn in inspect.getmembers(cls, inspect.isfunction):
            if not fn.__module__.startswith("tidemark.store"):
                continue
            hints = typing.get_type_hints(fn)
            for param in inspect.signature(fn).parameters:
                if param not in WORD_PARAMS or (name, param) in NOT_WORDS:
                    continue
                seen += 1
                hint = hints.get(param)
                kinds = set(typing.get_args(hint)) - {type(None)} \
                    if isinstance(hint, types.UnionType) else {hint}
                if not kinds or not kinds <= set(WORD_PARAMS[param]):
                    shown = inspect.formatannotation(hint)
                    wrong.append(f"{cls.__name__}.{name}({param}: {shown})")
    return wrong, seen


def test_the_store_takes_each_word_as_its_enum() -> None:
    wrong, seen = unworded(JournalStore, StepSession)
    assert wrong == []
    assert seen >= 18  # the scan reaches the store's methods (StepSession.complete among them)


def test_a_word_typed_as_a_plain_string_is_caught() -> None:
    class Loose:
        def complete(self, *, status: StepStatus, resolved_by: str) -> None: ...

        def event(self, kind: EventKind | None, phase: Phase = Phase.DO) -> None: ...

    Loose.__module__ = Loose.complete.__module__ = Loose.event.__module__ = "tidemark.store.x"
    assert unworded(Loose) == (["Loose.complete(resolved_by: str)"], 4)
