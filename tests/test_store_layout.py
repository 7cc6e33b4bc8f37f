"""The journal store's shape: one module per concern, and no SQL outside the store.

No module is over 600 lines. JournalStore is composed of one mixin per concern where no method of
one silently replaces another's (Python's method resolution would pick one without a word); and
no SQL statement is outside the store."""

from __future__ import annotations

import ast
import re
import types
from pathlib import Path

from tidemark.store import JournalStore

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("tidemark", "activities", "probes", "workflows", "staging")
MAX_LINES = 600
# A string that begins a statement: what a query or a write sent to Postgres starts with.
STATEMENT = re.compile(r"^\s*(SELECT|INSERT\s+INTO|UPDATE\s+[\w.]+|DELETE\s+FROM"
                       r"|WITH\s+\w+\s+AS)\b")
# Where SQL may live: the store, and the runner that applies migrations/*.sql.
SQL_HOMES = ("tidemark/store/", "tidemark/migrate.py")


def store_files(root: Path) -> list[Path]:
    """The source files of the store, a package or (before it was one) a single module."""
    package = root / "tidemark" / "store"
    return sorted(package.glob("*.py")) if package.is_dir() else [root / "tidemark" / "store.py"]


def too_long(root: Path) -> list[tuple[str, int]]:
    """The store's files over MAX_LINES lines, with their length."""
    lengths = [(f.relative_to(root).as_posix(), len(f.read_text(encoding="utf-8").splitlines()))
               for f in store_files(root)]
    return [(name, n) for name, n in lengths if n > MAX_LINES]


def shadowed(cls: type) -> dict[str, list[str]]:
    """Methods (and properties) defined by more than one class ``cls`` is built from.

    Each comes with the classes that define it, the one that wins first."""
    owners: dict[str, list[str]] = {}
    for base in cls.__mro__[:-1]:  # object defines what every class has
        for name, value in vars(base).items():
            if isinstance(value, types.FunctionType | staticmethod | classmethod | property):
                owners.setdefault(name, []).append(base.__name__)
    return {name: classes for name, classes in owners.items() if len(classes) > 1}


def sql_outside_the_store(root: Path) -> list[str]:
    """``path:line`` of every string literal outside SQL_HOMES that begins an SQL statement."""
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel.startswith(SQL_HOMES):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                        and STATEMENT.match(node.value)):
                    found.append(f"{rel}:{node.lineno}")
    return found


def test_no_module_of_the_store_is_over_600_lines() -> None:
    assert len(store_files(ROOT)) > 1  # a package, one module per concern
    assert too_long(ROOT) == []


def test_a_store_module_over_600_lines_is_named(tmp_path: Path) -> None:
    (tmp_path / "tidemark" / "store").mkdir(parents=True)
    (tmp_path / "tidemark" / "store" / "steps.py").write_text("x = 1\n" * 601)
    (tmp_path / "tidemark" / "store" / "plans.py").write_text("x = 1\n" * 600)
    assert too_long(tmp_path) == [("tidemark/store/steps.py", 601)]


def test_no_method_of_one_concern_replaces_another_s() -> None:
    assert {"persist_plan", "issue_grant", "execution", "_conn"} <= set(dir(JournalStore))
    assert shadowed(JournalStore) == {}


def test_a_method_two_mixins_define_is_named() -> None:
    class Base:
        def _conn(self) -> None: ...

    class Plans(Base):
        def rows(self) -> None: ...

    class Reports(Base):
        def rows(self) -> None: ...

        @property
        def size(self) -> int:
            return 0

    class Store(Plans, Reports):
        pass

    assert shadowed(Store) == {"rows": ["Plans", "Reports"]}


def test_no_sql_statement_outside_the_store() -> None:
    assert sql_outside_the_store(ROOT) == []


def test_sql_outside_the_store_is_found(tmp_path: Path) -> None:
    for rel, text in {
        "tidemark/store/plans.py": 'Q = "SELECT 1"\n',
        "tidemark/migrate.py": 'Q = "INSERT INTO tidemark.schema_migrations VALUES (1)"\n',
        "activities/x.py": 'def f(c):\n    c.execute(\n        "UPDATE tidemark.journal SET"\n'
                           '        " outcome = NULL")\n',
        "workflows/y.py": 'Q = f"  DELETE FROM t WHERE {1}"\n"""Select a row: not SQL."""\n',
    }.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert sql_outside_the_store(tmp_path) == ["activities/x.py:3", "workflows/y.py:1"]
