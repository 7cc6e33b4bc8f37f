"""The benchmarks' action, ``bench.step``: a no-op that can be held in doubt.

``doubt_while``: while that file exists the action fails as a revoked credential would
(Unauthorized): the run ends with the step in doubt, as after a crash, and the next start
probes it. The probe answers *absent* (a no-op leaves no trace), so the step runs again.

``hold_while``: the call waits while that file exists, as a slow provider call would (at most
HOLD_LIMIT_S): bench/recovery.py kills the worker that holds it.
"""

from __future__ import annotations

import os
import time
from typing import Any, ClassVar

from tidemark.actions import Action, Arg, ProbeResult, StepContext
from tidemark.errors import Unauthorized

HOLD_LIMIT_S = 30.0


class BenchStep(Action):
    name: ClassVar[str] = "bench.step"
    irreversible: ClassVar[bool] = True
    args: ClassVar[dict[str, Arg]] = {"i": Arg(int), "doubt_while": Arg(str, required=False),
                                      "hold_while": Arg(str, required=False)}
    deadline_s = 5.0

    def probe(self, ctx: StepContext) -> ProbeResult:
        return ProbeResult.absent("a no-op leaves no trace")

    def execute(self, ctx: StepContext) -> dict[str, Any]:
        held = ctx.args.get("doubt_while")
        if held and os.path.exists(held):
            raise Unauthorized(f"bench: held in doubt while {held} exists")
        hold = ctx.args.get("hold_while")
        until = time.monotonic() + HOLD_LIMIT_S
        while hold and os.path.exists(hold) and time.monotonic() < until:
            time.sleep(0.01)
        return {"i": ctx.args["i"]}


class ShortBenchStep(BenchStep):
    """``bench.step`` with a deadline within the attempt lease's floor.

    The floor is tidemark.store.LEASE_S, and the deadline is fs.rename's: the lease of an attempt
    killed in its call lapses LEASE_S after its last renewal. bench.step's 5 s deadline keeps a
    killed attempt's lease until 5 s after its intent."""

    name: ClassVar[str] = "bench.short_step"
    deadline_s = 2.0


def bench_plan(task_id: str, n: int, *, execution: str = "activity",
               doubts: dict[int, str] | None = None,
               holds: dict[int, str] | None = None,
               action: str = "bench.step") -> dict[str, Any]:
    """A plan of ``n`` no-op steps.

    ``doubts`` maps step numbers to their doubt_while file, ``holds`` to their hold_while file."""
    doubts, holds = doubts or {}, holds or {}
    steps = []
    for i in range(1, n + 1):
        args: dict[str, Any] = {"i": i}
        if i in doubts:
            args["doubt_while"] = doubts[i]
        if i in holds:
            args["hold_while"] = holds[i]
        steps.append({"action": action, "args": args})
    return {"task_id": task_id, "execution": execution, "steps": steps}
