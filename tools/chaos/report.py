"""What `tidemark chaos` reports (see tools/chaos/run.py).

It reports each run's result, and the whole experiment as JSON and as a table."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tools.chaos.kills import PHASES, TIME_PHASES, Kill


@dataclass
class RunResult:
    run: int
    kill: Kill
    action: str
    duplicates: int
    mismatch: list[str]
    error: str = ""
    left_over: int = 0  # provisional handles (drafts) an interrupted stage left behind
    misses: int = 0
    absorbed: int = 0  # write requests answered from an idempotency key (replayed)
    harness_error: str = ""
    requests: dict[tuple[str, str], Counter[str]] = field(default_factory=dict)
    # Under --worst-case only: the resume stopped for a person (NeedsDecision) with nothing
    # duplicated. The promise is kept (a probe that cannot tell never acts), but the run did not
    # finish: it is listed, and it is a failure in the default world, where probes can tell.
    needs_person: str = ""

    @property
    def failed(self) -> bool:
        return bool(self.duplicates or self.misses or self.mismatch or self.error)


@dataclass
class ChaosReport:
    seed: int
    runs: list[RunResult] = field(default_factory=list)
    reference_duplicates: int = 0
    pairs: list[tuple[str, str]] = field(default_factory=list)  # what the plan has

    def as_json(self) -> dict[str, Any]:
        failures = [{"run": r.run, "phase": r.kill.phase, "step": r.kill.step,
                     "action": r.action, "duplicates": r.duplicates, "misses": r.misses,
                     "mismatch": r.mismatch, "error": r.error}
                    for r in self.runs if r.failed]
        harness = [{"run": r.run, "phase": r.kill.phase, "step": r.kill.step,
                    "action": r.action, "error": r.harness_error}
                   for r in self.runs if r.harness_error]
        person = [{"run": r.run, "phase": r.kill.phase, "step": r.kill.step,
                   "action": r.action, "reason": r.needs_person}
                  for r in self.runs if r.needs_person]
        requests: dict[str, dict[str, dict[str, int]]] = {}
        for r in self.runs:
            for (target, op), counts in r.requests.items():
                into = requests.setdefault(target, {}).setdefault(
                    op, {"sent": 0, "absorbed": 0, "refused": 0})
                for k, n in counts.items():
                    into[k] += n
        coverage: dict[str, dict[str, int]] = {}
        for r in self.runs:
            by_phase = coverage.setdefault(r.action, {})
            by_phase[r.kill.phase] = by_phase.get(r.kill.phase, 0) + 1
        covered = {(r.action, r.kill.phase) for r in self.runs}
        return {"runs": len(self.runs),
                "duplicates": self.reference_duplicates + sum(r.duplicates for r in self.runs),
                "misses": sum(r.misses for r in self.runs),
                "absorbed": sum(r.absorbed for r in self.runs),
                "mismatches": sum(1 for r in self.runs if r.mismatch or r.error),
                "harness_errors": harness,
                "needs_person": person,
                "phases": dict(sorted(Counter(r.kill.phase for r in self.runs).items())),
                "requests": {t: dict(sorted(ops.items())) for t, ops in sorted(requests.items())},
                "coverage": {"pairs": {a: dict(sorted(p.items()))
                                       for a, p in sorted(coverage.items())},
                             "missing": [f"{a} {p}" for a, p in self.pairs
                                         if (a, p) not in covered]},
                "seed": self.seed, "failures": failures}

    @property
    def ok(self) -> bool:
        data = self.as_json()
        return (data["duplicates"] == 0 and data["misses"] == 0 and data["mismatches"] == 0
                and not data["harness_errors"] and not data["coverage"]["missing"])

    def table(self) -> str:
        rows = ["phase            runs  duplicates  misses  mismatches  absorbed"]
        for phase in PHASES + TIME_PHASES:
            mine = [r for r in self.runs if r.kill.phase == phase]
            if mine:
                rows.append(f"{phase:<16} {len(mine):>4}  {sum(r.duplicates for r in mine):>10}"
                            f"  {sum(r.misses for r in mine):>6}"
                            f"  {sum(1 for r in mine if r.mismatch or r.error):>10}"
                            f"  {sum(r.absorbed for r in mine):>8}")
        data = self.as_json()
        rows.append(f"{'total':<16} {data['runs']:>4}  {data['duplicates']:>10}  "
                    f"{data['misses']:>6}  {data['mismatches']:>10}  {data['absorbed']:>8}"
                    f"   (seed {self.seed})")
        rows.append(f"coverage: {len(self.pairs) - len(data['coverage']['missing'])}/"
                    f"{len(self.pairs)} (action, phase) pairs")
        left = sum(r.left_over for r in self.runs)
        if left:
            rows.append(f"{left} unsent draft(s) left behind by a lost answer to their creation "
                        "(not sent, not journaled; see PROVISIONAL_OPS)")
        for h in data["harness_errors"]:
            rows.append(f"  run {h['run']}: HARNESS ERROR, not judged ({h['phase']} at step "
                        f"{h['step']}): {h['error']}")
        for h in data["needs_person"]:
            rows.append(f"  run {h['run']}: stopped for a person, nothing duplicated "
                        f"({h['phase']} at step {h['step']}): {h['reason']}")
        for f in data["failures"][:20]:
            rows.append(f"  run {f['run']}: {f['phase']} at step {f['step']} ({f['action']}): "
                        + "; ".join([*f["mismatch"], f["error"]] if f["error"] else f["mismatch"])
                        + (f" ({f['duplicates']} duplicate writes)" if f["duplicates"] else "")
                        + (f" ({f['misses']} missing writes)" if f["misses"] else ""))
        return "\n".join(rows)
