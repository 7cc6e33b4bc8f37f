"""Tidemark's generic import names are checked at start: another project's copy is refused."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tidemark.import_names import shadowed

ROOT = Path(__file__).parent.parent


def run_with_first_on_path(folder: Path, code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter with ``folder`` first on sys.path."""
    prelude = f"import sys\nsys.path.insert(0, {str(folder)!r})\n"
    return subprocess.run([sys.executable, "-c", prelude + code], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_in_this_tree_every_name_is_ours() -> None:
    assert shadowed() == []


def test_an_applications_package_and_module_of_our_names_are_named(tmp_path: Path) -> None:
    (tmp_path / "staging").mkdir()
    (tmp_path / "staging" / "__init__.py").write_text("")
    (tmp_path / "worker.py").write_text("")
    got = run_with_first_on_path(
        tmp_path, "from tidemark.import_names import shadowed\nprint(shadowed())")
    assert got.returncode == 0, got.stderr
    assert f"'staging' from {tmp_path.resolve()}" in got.stdout
    assert f"'worker' from {tmp_path.resolve()}" in got.stdout
    assert "tools" not in got.stdout


def test_the_command_refuses_to_run_beside_a_shadowing_package(tmp_path: Path) -> None:
    (tmp_path / "probes").mkdir()
    (tmp_path / "probes" / "__init__.py").write_text("")
    got = run_with_first_on_path(
        tmp_path, "from tools.cli.main import main\nsys.exit(main(['status', 'any-task']))")
    assert got.returncode == 1, (got.stdout, got.stderr)
    [line] = got.stderr.splitlines()
    assert line.startswith("tidemark: ConfigError: another project's code shadows"), line
    assert f"'probes' from {tmp_path.resolve()}" in line
    assert got.stdout == ""


def test_a_name_a_finder_refuses_is_absent_not_an_error(tmp_path: Path) -> None:
    """A package left out on purpose (the worker image has no staging) is not a shadow."""
    refuse = ("class Refuse:\n"
              "    def find_spec(self, name, path=None, target=None):\n"
              "        if name == 'staging':\n"
              "            raise ModuleNotFoundError(name)\n"
              "sys.meta_path.insert(0, Refuse())\n")
    got = run_with_first_on_path(
        tmp_path, refuse + "from tidemark.import_names import shadowed\nprint(shadowed())")
    assert (got.returncode, got.stdout.strip()) == (0, "[]"), got.stderr
