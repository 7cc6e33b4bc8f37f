"""The mutation check's own guarantees.

Every mutant still finds the code it breaks, a lost anchor is an error rather than a kill, the
copy it mutates is what the tests import, every mutant has a tier of tests and breaks a rule of
docs/safety-rules.md, and every rule listed as covered has a mutant."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from dev import mutation_check as mc

ROOT = Path(__file__).resolve().parent.parent


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


def test_every_mutant_runs_against_the_whole_tier_of_its_module() -> None:
    for m in mc.MUTANTS:
        assert m.path in mc.TIERS, f"{m.name}: no tier for {m.path}"
        tier = mc.tier_of(m)
        assert {t.split("::")[0] for t in m.tests} <= set(tier), m.name
        assert len(tier) >= 1 and all((ROOT / f).is_file() for f in tier), (m.name, tier)
    for path, files in mc.TIERS.items():
        assert (ROOT / path).is_file(), path
        assert all(f.startswith("tests/test_") and (ROOT / f).is_file() for f in files), path


def test_the_rules_list_covers_every_mutant_and_every_covered_rule_has_one() -> None:
    rules = mc.read_rules()
    assert mc.rule_problems(rules) == []
    covered = [r for r in rules if r.status == "covered"]
    assert len(covered) >= 30 and all(r.mutants for r in covered)
    # The rules this check's own tests promise to cover are covered, not pending.
    for promised in ("A halt that arrives between two steps keeps the next step from starting",
                     "A journaled failed step is never counted as confirmed",
                     "After a 401, a request is sent again only with a renewed token, and at "
                     "most once",
                     "An unwind never replaces a file that has since taken the original name"):
        assert any(r.text == promised for r in covered), promised


def test_a_rule_without_a_mutant_or_a_mutant_without_a_rule_is_a_problem(
        tmp_path: Path) -> None:
    doc = tmp_path / "rules.md"
    doc.write_text("# Rules\n\n### A rule with no mutant\n\n- status: covered\n\n"
                   "### A rule still to do\n\n- status: pending\n\n"
                   "### A rule naming a ghost\n\n- status: covered\n- mutant: no such mutant\n"
                   "\n### A rule with a known mutant\n\n- status: covered\n"
                   f"- mutant: {mc.MUTANTS[0].name}\n")
    rules = mc.read_rules(doc)
    assert [(r.text, r.status, r.mutants) for r in rules] == [
        ("A rule with no mutant", "covered", ()),
        ("A rule still to do", "pending", ()),
        ("A rule naming a ghost", "covered", ("no such mutant",)),
        ("A rule with a known mutant", "covered", (mc.MUTANTS[0].name,))]
    problems = mc.rule_problems(rules, mc.MUTANTS[:2])
    assert problems == [
        "rule 'A rule with no mutant': covered, but names no mutant",
        "rule 'A rule naming a ghost': no mutant is named 'no such mutant'",
        f"mutant {mc.MUTANTS[1].name!r} breaks no rule listed in safety-rules.md"]


def test_the_summary_reports_the_score_and_the_rules() -> None:
    results = [mc.Result("a", "killed", 1.0), mc.Result("b", "killed", 9.0, "FAILED x", True),
               mc.Result("c", "survived", 30.0), mc.Result("d", "error", 0.0, "anchor")]
    rules = [mc.Rule("r1", "covered", ("a", "b")), mc.Rule("r2", "pending", ())]
    summary = mc.summarize(results, rules, [])
    assert {"mutants", "killed", "survived", "rules", "score"} <= set(summary)
    assert (summary["mutants"], summary["killed"], summary["survived"], summary["score"]) == (
        4, 2, ["c"], 0.5)
    assert summary["killed_by_tier"] == ["b: FAILED x"]
    assert summary["rules"] == {"listed": 2, "covered": 1, "pending": ["r2"], "problems": []}


def test_the_rules_document_lists_every_mutant_by_name() -> None:
    listed = subprocess.run([sys.executable, "-m", "dev.mutation_check", "--rules"],
                            cwd=ROOT, capture_output=True, text=True)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    text = mc.RULES_DOC.read_text(encoding="utf-8")
    assert all(f"- mutant: {m.name}\n" in text for m in mc.MUTANTS)


def test_the_ci_subset_breaks_every_covered_rule_once() -> None:
    """The CI subset breaks every covered rule once.

    --per-rule keeps one mutant per covered rule. Each covered rule still has a mutant in the
    subset, and no mutant outside the first ones named is run."""
    rules = mc.read_rules()
    subset = mc.per_rule(list(mc.MUTANTS), rules)
    names = {m.name for m in subset}
    covered = [r for r in rules if r.status == "covered"]
    assert all(any(n in names for n in r.mutants) for r in covered)
    assert names == {r.mutants[0] for r in covered}
    assert len(subset) < len(mc.MUTANTS)
