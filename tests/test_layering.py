"""The layering rules for worker.py, which `lint-imports` cannot take as a root.

worker.py is a module, not a package. The contracts in pyproject.toml hold the packages it
imports to the same rules, so its own imports are what is left to check. worker.py is no workflow
code: the two workflow contracts (no store or provider SDK, nothing nondeterministic) do not
apply to it; each is seen breaking here when a workflow module imports what it forbids."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("tidemark", "activities", "probes", "workflows", "staging", "tools", "dev")


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth of its code.

    Imports inside functions are included: ``from a.b import c`` gives a.b and a.b.c."""
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
    assert sorted(m for m in modules if within(m, "staging") or within(m, "tools")) \
        == []


def test_nothing_but_the_tooling_imports_the_worker() -> None:
    importers = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            if within(module, "tools") or within(module, "dev"):
                continue
            if any(within(m, "worker") for m in imported_modules(path)):
                importers.append(module)
    assert importers == []


def test_the_check_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from staging.core import StagingServer\n")
    assert "staging.core" in imported_modules(source)


# -- the workflow contracts, seen failing ----------------------------------------------------
# `lint-imports` runs on a copy of the packages with one workflow module added; the copy as it
# is keeps every contract, so what breaks is the added import and nothing else.

WORKFLOW_CONTRACTS = {
    "sdk": "workflows import no store, no database driver, no provider SDK, no activity or probe",
    "nondeterministic": "workflow code imports nothing nondeterministic (clocks, randomness, OS, "
                        "threads, I/O)",
}


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    # The one installed beside this interpreter (the venv's), whether or not its bin is on PATH.
    beside = Path(sys.executable).with_name("lint-imports")
    exe = str(beside) if beside.exists() else shutil.which("lint-imports") or "lint-imports"
    return subprocess.run([exe, "--no-cache",
                           "--no-logo"], cwd=tree, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def broken(output: str) -> set[str]:
    """The names of the contracts lint-imports reports BROKEN (it wraps long names)."""
    flat = " ".join(output.split())
    return {key for key, name in WORKFLOW_CONTRACTS.items() if f"{name} BROKEN" in flat}


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    copy = tmp_path_factory.mktemp("tree")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, copy / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy)
    return copy


def test_the_copied_tree_keeps_every_contract(tree: Path) -> None:
    done = lint_imports(tree)
    assert done.returncode == 0, done.stdout + done.stderr
    assert broken(done.stdout) == set() and "BROKEN" not in done.stdout


@pytest.mark.parametrize(("source", "contract"), [
    ("import random\n", "nondeterministic"),
    ("import uuid\n", "nondeterministic"),
    ("def now() -> float:\n    import time\n    return time.time()\n", "nondeterministic"),
    ("from os import environ\n", "nondeterministic"),
    ("import threading\n", "nondeterministic"),
    ("from tidemark.store import JournalStore\n", "sdk"),
    # Indirectly: tidemark.series reads the journal through tidemark.store.
    ("from tidemark.series import check_declared\n", "sdk"),
    ("import psycopg\n", "sdk"),
    ("from googleapiclient.discovery import build\n", "sdk"),
    ("from msgraph import GraphServiceClient\n", "sdk"),
    ("import stripe\n", "sdk"),
    ("from activities.steps import run_step\n", "sdk"),
    ("from probes.drive import DriveRenameProbe\n", "sdk"),
])
def test_a_workflow_module_that_imports_it_breaks_its_contract(tree: Path, source: str,
                                                                contract: str) -> None:
    module = tree / "workflows" / "offending.py"
    module.write_text(source)
    try:
        done = lint_imports(tree)
    finally:
        module.unlink()
    assert done.returncode == 1, done.stdout + done.stderr
    assert contract in broken(done.stdout), done.stdout
    assert "workflows.offending" in done.stdout
