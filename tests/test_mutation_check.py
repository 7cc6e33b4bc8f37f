"""The mutation check's own guarantees: every mutant still finds the code it breaks, a lost
anchor is an error rather than a kill, the copy it mutates is what the tests import, and the
README lists the mutants it runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import mutation_check as mc  # noqa: E402


def test_every_anchor_occurs_exactly_once_and_names_are_unique() -> None:
    assert len(mc.MUTANTS) >= 20
    assert len({m.name for m in mc.MUTANTS}) == len(mc.MUTANTS)
    errors = [e for m in mc.MUTANTS if (e := mc.anchor_errors(ROOT, m))]
    assert errors == []
    for m in mc.MUTANTS:
        assert m.anchor != m.replacement and m.tests, m.name
        for test in m.tests:
            assert (ROOT / test.split("::")[0]).is_file(), (m.name, test)


def test_a_lost_anchor_is_an_error_not_a_kill(tmp_path: Path) -> None:
    (tmp_path / "tidemark").mkdir()
    (tmp_path / "tidemark" / "x.py").write_text("a = 1\na = 1\n")
    twice = mc.Mutant("twice", "tidemark/x.py", "a = 1", "a = 2", ("tests/none.py",))
    gone = mc.Mutant("gone", "tidemark/x.py", "b = 1", "b = 2", ("tests/none.py",))
    for m in (twice, gone):
        result = mc.run_mutant(tmp_path, m)
        assert result.outcome == "error" and "not once" in result.detail


def test_the_copy_is_what_a_subprocess_imports(tmp_path: Path) -> None:
    copy = mc.tracked_copy(tmp_path / "tree")
    mc.check_imports(copy)  # raises SystemExit when the installed package wins
    code = "import tidemark.run_step as r; print(r.__file__)"
    out = subprocess.run([sys.executable, "-c", code], env=mc.env_for(copy), cwd="/",
                         capture_output=True, text=True, check=True).stdout
    assert Path(out.strip()).resolve().is_relative_to(copy.resolve())


def test_the_readme_lists_every_mutant() -> None:
    listed = subprocess.run([sys.executable, str(ROOT / "tools" / "mutation_check.py"),
                             "--list"], capture_output=True, text=True, check=True).stdout
    assert listed.count("\n") == len(mc.MUTANTS)
    assert listed in (ROOT / "README.md").read_text(encoding="utf-8")
