"""What decoding a step's payloads costs in the Temporal SDK's converter, two ways.

The payload dataclasses' annotations are evaluated (tidemark/payloads.py as it is) or kept as
strings (the same source under ``from __future__ import annotations``), side by side in one run.

RunPlan decodes a StepOutput in its workflow task for every step of the activity path, and the
worker decodes a StepInput for every attempt. The converter reads a dataclass's field types
with ``typing.get_type_hints`` each time; string annotations are compiled into ForwardRefs anew
on every call.

    python bench/payload_decode.py [--calls 5000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from temporalio.converter import DataConverter

from tidemark import payloads

FUTURE = "from __future__ import annotations\n"


def stringly() -> types.ModuleType:
    """tidemark/payloads.py's source under ``from __future__ import annotations``."""
    source = Path(payloads.__file__).read_text()
    module = types.ModuleType("payloads_stringly")
    sys.modules[module.__name__] = module  # dataclasses looks its module up there
    exec(compile(FUTURE + source, "payloads_stringly", "exec"), module.__dict__)
    return module


def per_call_us(fn: Callable[[], Any], calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - started) / calls * 1e6


def measure(calls: int, rounds: int) -> dict[str, dict[str, float]]:
    conv = DataConverter.default.payload_converter
    variants = {"evaluated": payloads, "strings": stringly()}
    out: dict[str, dict[str, list[float]]] = {}
    for _ in range(rounds):
        for name, mod in variants.items():
            for kind, value in (("StepOutput", mod.StepOutput(3, "done", "execute", False)),
                                ("StepInput", mod.StepInput("t", 3))):
                encoded = conv.to_payloads([value])
                cls = type(value)
                us = per_call_us(lambda e=encoded, c=cls: conv.from_payloads(e, [c]), calls)
                out.setdefault(kind, {}).setdefault(name, []).append(us)
    return {kind: {name: statistics.median(v) for name, v in by.items()}
            for kind, by in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    for kind, by in measure(a.calls, a.rounds).items():
        print(f"decode {kind}: {by['evaluated']:.1f} us evaluated, {by['strings']:.1f} us as "
              f"strings ({by['strings'] / by['evaluated']:.2f}x), median of {a.rounds} rounds "
              f"of {a.calls} calls")


if __name__ == "__main__":
    main()
