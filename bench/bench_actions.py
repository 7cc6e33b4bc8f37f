"""The benchmarks' action, ``bench.step``: a no-op that can be held in doubt.

``doubt_while``: while that file exists the action fails as a revoked credential would
(Unauthorized): the run ends with the step in doubt, as after a crash, and the next start
probes it. The probe answers *absent* (a no-op leaves no trace), so the step runs again.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

from tidemark.actions import Action, Arg, ProbeResult, StepContext
from tidemark.errors import Unauthorized


class BenchStep(Action):
    name: ClassVar[str] = "bench.step"
    irreversible: ClassVar[bool] = True
    args: ClassVar[dict[str, Arg]] = {"i": Arg(int), "doubt_while": Arg(str, required=False)}
    deadline_s = 5.0

    def probe(self, ctx: StepContext) -> ProbeResult:
        return ProbeResult.absent("a no-op leaves no trace")

    def execute(self, ctx: StepContext) -> dict[str, Any]:
        held = ctx.args.get("doubt_while")
        if held and os.path.exists(held):
            raise Unauthorized(f"bench: held in doubt while {held} exists")
        return {"i": ctx.args["i"]}


def bench_plan(task_id: str, n: int, *, execution: str = "activity",
               doubts: dict[int, str] | None = None) -> dict[str, Any]:
    """A plan of ``n`` no-op steps; ``doubts`` maps step numbers to their doubt_while file."""
    doubts = doubts or {}
    steps = []
    for i in range(1, n + 1):
        args: dict[str, Any] = {"i": i}
        if i in doubts:
            args["doubt_while"] = doubts[i]
        steps.append({"action": "bench.step", "args": args})
    return {"task_id": task_id, "execution": execution, "steps": steps}
