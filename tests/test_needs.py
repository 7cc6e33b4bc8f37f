"""The next command for each need is written once, in tidemark/needs.py.

Every need a person is asked for has one, and no other module spells one, so the inbox, `tidemark
status`, the Web UI's rows, the errors and the commands' own output cannot drift apart. Pure: no
stack."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tidemark.needs import NEXT, Act, Need, command, next_command

ROOT = Path(__file__).parent.parent
# The commands that decide what a task needs; `tidemark status`, `inbox`, `stop` and `kill`
# only read or hold, and are named freely.
SPELLED = re.compile(r"tidemark (approve|reject|release|resolve|resume|unwind)\b")
HOME = ROOT / "tidemark" / "needs.py"
# Everything that ships or runs, but the prose: docs and the tests' own expectations.
CODE = ["tidemark", "workflows", "activities", "probes", "tools", "staging", "dev", "bench",
        "examples", "worker.py"]


def test_every_need_a_person_is_asked_for_has_its_command() -> None:
    assert set(NEXT) == set(Need) - {Need.NOTHING}
    for need in NEXT:
        assert next_command(need, "t", step=3).startswith("tidemark "), need


def test_the_docs_table_of_needs_opens_each_row_with_its_next_command() -> None:
    """docs/who-needs-me.md's "decide with" column names first the command NEXT names first."""
    text = (ROOT / "docs" / "who-needs-me.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` +\|.*\| (.*?) *\|$", text, re.M))
    assert set(rows) == set(Need)
    for need, acts in NEXT.items():
        verb = re.search(r"tidemark (\w+)", rows[need])
        assert verb is not None and verb.group(1) == command(acts[0]).split()[1], need


@pytest.mark.parametrize(("act", "line"), [
    (Act.APPROVE, "tidemark approve t"),
    (Act.REJECT, "tidemark reject t"),
    (Act.RELEASE, "tidemark release t"),
    (Act.RELEASE_FOR_UNWIND, "tidemark release t --for-unwind"),
    (Act.RESOLVE, "tidemark resolve t --step 3 --as done|absent|never --yes"),
    (Act.RESUME, "tidemark resume t"),
    (Act.UNWIND, "tidemark unwind t --yes"),
    (Act.STATUS, "tidemark status t"),
    (Act.PLAN_CHECK, "tidemark plan check t"),
])
def test_each_act_renders_as_the_command_line_a_person_types(act: Act, line: str) -> None:
    assert command(act, "t", step=3) == line


@pytest.mark.parametrize(("scope", "line"), [
    (None, "tidemark release t"), ("t", "tidemark release t"),
    ("series:nightly", "tidemark release --series nightly"), ("*", "tidemark release --all"),
])
def test_a_release_names_the_scope_of_the_stop(scope: str | None, line: str) -> None:
    assert command(Act.RELEASE, "t", scope=scope) == line
    assert command(Act.RELEASE, scope=scope or "t") == line


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def spelled_commands(path: Path) -> list[str]:
    """The string literals of ``path`` (docstrings aside: prose) that spell a command."""
    tree = ast.parse(path.read_text(), str(path))
    prose = _docstrings(tree)
    return [f"{path.relative_to(ROOT)}:{node.lineno}: {node.value[:80]!r}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in prose and SPELLED.search(node.value)]


def test_no_module_but_the_home_of_needs_spells_a_command() -> None:
    files = [p for top in CODE for p in
             ((ROOT / top).rglob("*.py") if (ROOT / top).is_dir() else [ROOT / top])]
    assert len(files) > 100
    spelled = [hit for p in files if p != HOME for hit in spelled_commands(p)]
    assert spelled == [], "\n".join(spelled)
    assert spelled_commands(HOME), "the guard no longer sees the commands where they live"
