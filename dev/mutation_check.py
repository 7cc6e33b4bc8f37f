"""Mutation check: break one safety rule at a time and see whether the suite notices.

``python -m dev.mutation_check [--json] [--list] [--rules] [--only NAME ...] [--jobs N]
[--no-baseline] [--full] [--per-rule] [--named-only]``

Each mutant (dev/mutants/, by area) is the smallest plausible bug against one rule Tidemark
promises (listed in docs/safety-rules.md with the mutants that break it): an inverted condition,
a dropped check, a wrong default. It is anchored on a small source snippet that must occur
exactly once in its file; a snippet found zero or several times is an ERROR (the code moved:
re-anchor it), never counted as killed.

How it runs, and why it stays inside CI's budget on two cores:

* the tracked files of the working tree are copied to a temporary directory once; each mutant
  gets its own copy of that copy (a few hundred small files), with one edit applied. The real
  tree is never written.
* pytest runs in the copy (its own ``tests/``, ``conftest.py`` and ``pyproject.toml``) with
  ``PYTHONPATH`` set to the copy, which shadows the editable install (setuptools' editable
  finder comes after the path finder). Subprocesses the tests start (run_one.py, worker
  processes) inherit that environment. Before any mutant runs, the script checks from a
  subprocess that ``tidemark``, ``activities``, ``probes``, ``workflows`` and ``staging`` are
  imported from the copy, and stops with an error otherwise.
* each mutant runs against the whole tier of tests of the module it touches (``TIERS``): first
  the tests named with it, which are known to notice it, with ``-x``; if they all pass, the
  rest of the tier with ``-x``. A killed mutant thus costs its named tests (seconds, a minute
  for RunPlan's), and a survivor has been measured against every test of its module, so a
  survivor means the suite is weak, not that the wrong test was picked. A kill by the rest of
  the tier is reported (``killed_by_tier``): name that test with the mutant.
* a baseline run of the named tests on the unmutated copy comes first: a test that fails
  without a mutant would "kill" every mutant it is named for, so a red baseline is an error,
  not a result. ``--full`` (nightly) runs the baseline over every tier instead, so that a kill
  by the rest of a tier cannot be a test that fails anyway; in CI the suite has just passed.
* three mutants run at a time (``--jobs``, default 3): every pytest session starts its own
  embedded Postgres and staging servers in a private ``--basetemp``, so runs share no state.
  The runs mostly wait (leases lapsing, subprocesses starting), so running several at once cuts
  the wall time at little CPU cost (docs/safety-rules.md, Measured).
* the rules list: docs/safety-rules.md names each rule of the safety surface with its mutants
  and a status; ``--rules`` checks it without running anything, and every run checks it too:
  every covered rule names at least one mutant, every name is a mutant here, every mutant
  breaks a listed rule. Pending rules (no mutant yet) are reported as such.

Where a rule is checked twice on purpose, the mutant breaks the check that enforces it. The stop
and unwound states are read when a step's lock is taken (tidemark.attempt.locked) and checked
again by the statement that writes the intent or claims it (StepSession.begin/claim); the early
read only saves work, so dropping it alone changes nothing a test could see. Those mutants edit
the statement, and the tests that kill them commit the stop (or the release) after the lock was
taken, during the snapshot or the probe.

A mutant is killed when one of its tests fails (or they time out); it survives when its whole
tier passes. A mutant that only makes the tests' set-up fail (pytest ``ERROR``, no ``FAILED``:
e.g. a migration that no longer runs) is an error, not a kill: no test showed the rule broken.
The exit code is 0 only when every mutant was killed, there were no errors and the rules list
has no problem. ``--json`` prints ``{"mutants": N, "killed": K, "survived": [...], "rules":
{"listed", "covered", "pending", "problems"}, "score": K/N, "errors": [...],
"killed_by_tier": [...]}``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PER_MUTANT_TIMEOUT_S = 240  # the named tests
PER_TIER_TIMEOUT_S = 1200  # the rest of the tier, for a mutant they let through
PACKAGES = ("tidemark", "activities", "probes", "workflows", "staging", "tools", "worker")

sys.path.insert(0, str(ROOT))  # run as a script, too

from dev.mutants import MUTANTS, TIERS, Mutant  # noqa: E402

RULES_DOC = ROOT / "docs" / "safety-rules.md"


@dataclass
class Result:
    name: str
    outcome: str  # killed | survived | error
    seconds: float
    detail: str = ""
    by_tier: bool = False  # killed by the rest of the tier, not by a named test


@dataclass(frozen=True)
class Rule:
    """One rule of docs/safety-rules.md: its text, status (covered | pending) and mutants."""

    text: str
    status: str
    mutants: tuple[str, ...]


def read_rules(path: Path = RULES_DOC) -> list[Rule]:
    """The rules listed in the docs.

    Each is a ``### `` heading followed by ``- status: covered`` or ``- status: pending`` and,
    for a covered rule, one ``- mutant: NAME`` line per mutant."""
    rules: list[Rule] = []
    text: str | None = None
    status, names = "", list[str]()

    def close() -> None:
        if text is not None:
            rules.append(Rule(text, status, tuple(names)))

    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("### "):
            close()
            text, status, names = line[4:].strip(), "", []
        elif text is not None and line.startswith("- status: "):
            status = line.removeprefix("- status: ").strip()
        elif text is not None and line.startswith("- mutant: "):
            names.append(line.removeprefix("- mutant: ").strip())
    close()
    return rules


def rule_problems(rules: list[Rule], mutants: tuple[Mutant, ...] = MUTANTS) -> list[str]:
    """What is wrong with the rules list against the mutants.

    That is a covered rule without a mutant, a mutant name no mutant has, a mutant no rule
    names, a status other than the two."""
    known = {m.name for m in mutants}
    problems = []
    for r in rules:
        if r.status not in ("covered", "pending"):
            problems.append(f"rule {r.text!r}: status {r.status!r} is not covered or pending")
        elif r.status == "covered" and not r.mutants:
            problems.append(f"rule {r.text!r}: covered, but names no mutant")
        for name in r.mutants:
            if name not in known:
                problems.append(f"rule {r.text!r}: no mutant is named {name!r}")
    named = {n for r in rules for n in r.mutants}
    problems += [f"mutant {m.name!r} breaks no rule listed in {RULES_DOC.name}"
                 for m in mutants if m.name not in named]
    return problems


def tier_of(mutant: Mutant) -> list[str]:
    """The test files of the mutant's module, its named tests' files included."""
    files = list(TIERS.get(mutant.path, ()))
    for t in mutant.tests:
        f = t.split("::")[0]
        if f not in files:
            files.append(f)
    return files


def tracked_copy(dest: Path) -> Path:
    """Copies the working tree's tracked files (as they are now) to ``dest``."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def env_for(copy: Path) -> dict[str, str]:
    # A mutant breaks a safety rule, not the workflows' determinism: the replay of every
    # session's runs in Temporal's sandbox (tests/conftest.py) is left to the suite itself.
    return {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1",
            "TIDEMARK_TEST_SANDBOX_REPLAY": "0"}


def check_imports(copy: Path) -> None:
    """Fails unless a subprocess with the mutants' environment imports the copy's code."""
    code = ("import importlib, json; print(json.dumps({m: importlib.import_module(m).__file__ "
            f"for m in {PACKAGES!r}}}))")
    out = subprocess.run([sys.executable, "-c", code], env=env_for(copy), cwd="/",
                         capture_output=True, text=True, check=True).stdout
    wrong = {m: f for m, f in json.loads(out).items()
             if not Path(f).resolve().is_relative_to(copy.resolve())}
    if wrong:
        raise SystemExit(f"the copy does not shadow the installed package: {wrong}")


def anchor_errors(base: Path, mutant: Mutant) -> str | None:
    path = base / mutant.path
    if not path.is_file():
        return f"{mutant.path}: no such file"
    count = path.read_text(encoding="utf-8").count(mutant.anchor)
    if count != 1:
        return f"{mutant.path}: anchor found {count} times, not once: {mutant.anchor[:60]!r}"
    return None


def pytest(copy: Path, tests: list[str], timeout: float,
           deselect: tuple[str, ...] = ()) -> tuple[int | None, str]:
    # A private basetemp: pytest prunes old numbered temp dirs, which would delete the
    # embedded Postgres of a session running next to this one.
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
           f"--basetemp={copy.parent / 'pytest-tmp'}", *tests,
           *(f"--deselect={t}" for t in deselect)]
    try:
        p = subprocess.run(cmd, cwd=copy, env=env_for(copy), capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "timed out"
    return p.returncode, (p.stdout + p.stderr)[-3000:]


def failure_line(out: str) -> str:
    """The first ``FAILED``/``ERROR`` line of pytest's summary (what killed the mutant)."""
    lines = out.strip().splitlines()
    hits = [ln for ln in lines if ln.startswith(("FAILED ", "ERROR "))]
    return (hits or lines or [""])[0][:300]


def verdict(name: str, code: int | None, out: str, took: float) -> Result | None:
    """A pytest run's verdict on a mutant; None when every test passed (not killed yet)."""
    if code == 1 and "\nFAILED " not in out and "\nERROR " in out:
        # Only set-up or collection errors: the mutant broke the tests' machinery (e.g. SQL
        # that no longer migrates), so no test showed the rule broken.
        return Result(name, "error", took,
                      f"no test failed, the tests' set-up did: {failure_line(out)}")
    if code is None or code == 1:
        return Result(name, "killed", took, failure_line(out))
    if code in (0, 5):  # 5: no test left to run once the named ones are deselected
        return None
    return Result(name, "error", took, f"pytest exit {code}: {out}")


def run_mutant(base: Path, mutant: Mutant, tier: bool = True) -> Result:
    """Applies the mutant to a copy of ``base`` and runs its tests.

    First its named tests; then, with ``tier``, the rest of its module's tier. Each run uses
    ``-x``."""
    started = time.monotonic()
    error = anchor_errors(base, mutant)
    if error:
        return Result(mutant.name, "error", 0.0, error)
    with tempfile.TemporaryDirectory(prefix="mutant-") as tmp:
        copy = Path(tmp) / "tree"
        shutil.copytree(base, copy)
        target = copy / mutant.path
        text = target.read_text(encoding="utf-8").replace(mutant.anchor, mutant.replacement)
        target.write_text(text, encoding="utf-8")
        if target.suffix == ".py":
            try:
                compile(text, str(target), "exec")
            except SyntaxError as e:
                return Result(mutant.name, "error", 0.0, f"mutant does not compile: {e}")
        code, out = pytest(copy, list(mutant.tests), PER_MUTANT_TIMEOUT_S)
        found = verdict(mutant.name, code, out, time.monotonic() - started)
        if found is not None or not tier:
            return found or Result(mutant.name, "survived", time.monotonic() - started)
        code, out = pytest(copy, tier_of(mutant), PER_TIER_TIMEOUT_S, deselect=mutant.tests)
        if code is None:  # a slow tier is no kill: the mutant was not measured to the end
            return Result(mutant.name, "error", time.monotonic() - started,
                          f"the rest of the tier did not finish in {PER_TIER_TIMEOUT_S}s")
        found = verdict(mutant.name, code, out, time.monotonic() - started)
    if found is None:
        return Result(mutant.name, "survived", time.monotonic() - started,
                      f"the whole tier passed: {' '.join(tier_of(mutant))}")
    found.by_tier = found.outcome == "killed"
    return found


def per_rule(mutants: list[Mutant], rules: list[Rule]) -> list[Mutant]:
    """The first mutant each covered rule names, once each, in the mutants' order.

    So every rule of the safety surface is still broken once (CI's subset of the full run)."""
    first = {r.mutants[0] for r in rules if r.status == "covered" and r.mutants}
    return [m for m in mutants if m.name in first]


def summarize(results: list[Result], rules: list[Rule], problems: list[str]
              ) -> dict[str, Any]:
    killed = [r for r in results if r.outcome == "killed"]
    covered = [r for r in rules if r.status == "covered" and r.mutants]
    return {
        "mutants": len(results), "killed": len(killed),
        "survived": [r.name for r in results if r.outcome == "survived"],
        "errors": [f"{r.name}: {r.detail[:300]}" for r in results if r.outcome == "error"],
        # Killed only by the rest of the tier: worth naming the test that did it.
        "killed_by_tier": [f"{r.name}: {r.detail}" for r in killed if r.by_tier],
        "rules": {"listed": len(rules), "covered": len(covered),
                  "pending": [r.text for r in rules if r.status == "pending"],
                  "problems": problems},
        "score": round(len(killed) / len(results), 4) if results else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--json", action="store_true", help="print the summary as JSON only")
    ap.add_argument("--list", action="store_true", help="list the mutants and their tests")
    ap.add_argument("--rules", action="store_true",
                    help="check the rules list of docs/safety-rules.md against the mutants only")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutants")
    ap.add_argument("--jobs", type=int, default=3)
    ap.add_argument("--no-baseline", action="store_true",
                    help="skip the unmutated run of the selected tests")
    ap.add_argument("--full", action="store_true",
                    help="the baseline runs every selected mutant's whole tier, not only the "
                         "named tests (nightly; see docs/develop.md, Testing)")
    ap.add_argument("--per-rule", action="store_true",
                    help="one mutant per covered rule, the first it names (CI's subset; the "
                         "full run is the documented heavier check)")
    ap.add_argument("--named-only", action="store_true",
                    help="run each mutant against its named tests only (quick; not a score)")
    args = ap.parse_args(argv)
    mutants = list(MUTANTS)
    if args.only:
        unknown = set(args.only) - {m.name for m in mutants}
        if unknown:
            ap.error(f"no such mutant: {', '.join(sorted(unknown))}")
        mutants = [m for m in mutants if m.name in args.only]
    rules = read_rules()
    problems = rule_problems(rules)
    if args.per_rule:
        mutants = per_rule(mutants, rules)
    if args.list:
        for m in mutants:
            print(f"- {m.name} ({m.path}; {', '.join(t.split('::')[-1] for t in m.tests)})")
        return 0
    say = (lambda *a: print(*a, file=sys.stderr, flush=True)) if args.json else (
        lambda *a: print(*a, flush=True))
    if args.rules:
        for p in problems:
            say(p)
        say(f"{len(rules)} rules, {sum(r.status == 'pending' for r in rules)} pending, "
            f"{len(problems)} problems")
        return 1 if problems else 0
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mutation-base-") as tmp:
        base = tracked_copy(Path(tmp) / "tree")
        check_imports(base)
        results: list[Result] = []
        if not args.no_baseline:
            tests = sorted({t for m in mutants for t in m.tests})
            if args.full:
                tests = sorted({f for m in mutants for f in tier_of(m)})
            code, out = pytest(base, tests, PER_TIER_TIMEOUT_S * 2)
            say(f"baseline: {len(tests)} {'test files' if args.full else 'tests'}, exit {code}")
            if code != 0:
                results = [Result(m.name, "error", 0.0, "baseline failed") for m in mutants]
                say(out)
        if not results:
            with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
                for r in pool.map(lambda m: run_mutant(base, m, not args.named_only), mutants):
                    say(f"{r.outcome:8} {r.seconds:6.1f}s  {r.name}"
                        + (" (by the rest of its tier)" if r.by_tier else "")
                        + (f"\n         {r.detail}" if r.detail else ""))
                    results.append(r)
    summary = summarize(results, rules, problems)
    for p in problems:
        say(f"rules: {p}")
    if args.json:
        print(json.dumps(summary))
    else:
        say(f"{summary['killed']}/{len(results)} killed (score {summary['score']}), "
            f"{len(summary['survived'])} survived, {len(summary['errors'])} errors; "
            f"{summary['rules']['covered']}/{len(rules)} rules covered, "
            f"{len(summary['rules']['pending'])} pending; "
            f"{time.monotonic() - started:.0f}s")
    return 0 if not (summary["survived"] or summary["errors"] or problems) else 1


if __name__ == "__main__":
    sys.exit(main())
