"""The layering rules for worker.py, which `lint-imports` cannot take as a root (it is a module,
not a package): the contracts in pyproject.toml hold the packages it imports to the same rules,
so its own imports are what is left to check."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("tidemark", "activities", "probes", "workflows", "staging")


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth of its code (imports inside functions
    included): ``from a.b import c`` gives a.b and a.b.c."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_worker_imports_neither_the_staging_servers_nor_the_tooling() -> None:
    modules = imported_modules(ROOT / "worker.py")
    assert "activities.steps" in modules  # the walk sees what the worker really imports
    assert sorted(m for m in modules if within(m, "staging") or within(m, "tidemark.tools")) \
        == []


def test_nothing_but_the_tooling_imports_the_worker() -> None:
    importers = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            if within(module, "tidemark.tools"):
                continue
            if any(within(m, "worker") for m in imported_modules(path)):
                importers.append(module)
    assert importers == []


def test_the_check_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from staging.core import StagingServer\n")
    assert "staging.core" in imported_modules(source)
