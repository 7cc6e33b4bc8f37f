"""``ledger.record``: a tiny real target for tests of the journal itself.

The effect is a line ``<key> <entry>`` appended to a ledger file, so a test can count exactly
how many times the outside world was touched. ``hold_s`` keeps the action running for a while
(to race twins against it), ``hold_while`` as long as a file exists; ``unavailable_while``
makes execute fail (TargetUnavailable, nothing written), ``refused_while`` makes the target
refuse it for good (Refused, nothing written) and ``probe_raises_while`` makes the
probe raise, as a disk or network error would. The probe reads the ledger
for our key: done / absent, and unknown when the ledger's directory cannot be read.
"""

from __future__ import annotations

import asyncio
import errno
import os
import time
from pathlib import Path
from typing import Any, ClassVar

from tidemark.actions import Action, Arg, GateRefused, ProbeResult, Registry, StepContext
from tidemark.errors import Refused, TargetUnavailable
from tidemark.plan import load_plan
from tidemark.store import JournalStore

# The longest ``hold_while`` holds: far beyond any test's own hold, short enough that a twin
# that should never have got this far fails its test in seconds rather than minutes.
HOLD_LIMIT_S = 15


def ledger_lines(path: str | Path) -> list[str]:
    p = Path(path)
    return p.read_text().splitlines() if p.exists() else []


class LedgerRecord(Action):
    name: ClassVar[str] = "ledger.record"
    irreversible: ClassVar[bool] = True
    args: ClassVar[dict[str, Arg]] = {
        "ledger": Arg(str),
        "entry": Arg(str),
        "hold_s": Arg((int, float), required=False),
        "gate_file": Arg(str, required=False),  # the gate refuses while this file exists
        "hold_while": Arg(str, required=False),  # execute waits while this file exists
        "blind_while": Arg(str, required=False),  # the probe cannot tell while this exists
        "probe_raises_while": Arg(str, required=False),  # the probe itself fails (OSError)
        "unavailable_while": Arg(str, required=False),  # execute fails before writing
        "refused_while": Arg(str, required=False),  # the target refuses the entry
    }
    # Short, so that a test waiting out a killed attempt's lease stays fast; a hold longer than
    # this is covered by the lease keeper's renewals.
    deadline_s = 1.0
    horizon_s = 0.0

    def preconditions(self, ctx: StepContext) -> None:
        gate = ctx.args.get("gate_file")
        if gate and os.path.exists(gate):
            raise GateRefused(f"{gate} exists")

    def snapshot(self, ctx: StepContext) -> dict[str, Any]:
        return {"lines": len(ledger_lines(ctx.args["ledger"]))}

    def probe(self, ctx: StepContext) -> ProbeResult:
        path = Path(ctx.args["ledger"])
        blind = ctx.args.get("blind_while")
        if blind and os.path.exists(blind):
            return ProbeResult.unknown(f"the ledger is unreadable while {blind} exists")
        broken = ctx.args.get("probe_raises_while")
        if broken and os.path.exists(broken):
            raise OSError(errno.EIO, "input/output error reading the ledger", str(path))
        if not path.parent.exists():
            return ProbeResult.unknown(f"cannot read the ledger directory {path.parent}")
        if any(line.split(" ", 1)[0] == ctx.key for line in ledger_lines(path)):
            return ProbeResult.done({"entry": ctx.args["entry"]}, "our key is in the ledger")
        return ProbeResult.absent("our key is not in the ledger")

    def execute(self, ctx: StepContext) -> dict[str, Any]:
        self._admit(ctx)
        hold = float(ctx.args.get("hold_s", 0))
        if hold:
            time.sleep(hold)
        hold_while = ctx.args.get("hold_while")
        deadline = time.monotonic() + HOLD_LIMIT_S
        while hold_while and os.path.exists(hold_while):
            if time.monotonic() > deadline:  # a test that forgot to let go: fail, never write
                raise RuntimeError(f"{hold_while} still exists after {HOLD_LIMIT_S} s; "
                                   "nothing written")
            time.sleep(0.02)
        return self._record(ctx)

    @staticmethod
    def _admit(ctx: StepContext) -> None:
        """The ledger's refusals before it writes anything: unavailable, or refusing."""
        down = ctx.args.get("unavailable_while")
        if down and os.path.exists(down):
            raise TargetUnavailable(f"the ledger is unavailable while {down} exists")
        refused = ctx.args.get("refused_while")
        if refused and os.path.exists(refused):
            raise Refused(f"the ledger refuses entries while {refused} exists")

    @staticmethod
    def _record(ctx: StepContext) -> dict[str, Any]:
        """Appends the step's line (its key, its entry) to the ledger, on disk."""
        with open(ctx.args["ledger"], "a") as f:
            f.write(f"{ctx.key} {ctx.args['entry']}\n")
            f.flush()
            os.fsync(f.fileno())
        return {"entry": ctx.args["entry"], "pid": os.getpid()}


class AwaitedLedgerRecord(LedgerRecord):
    """``ledger.await``: ``ledger.record`` whose call is awaited (Action.awaits).

    Its hold is an ``asyncio.sleep``, so a held step keeps no thread. As a remote target does,
    the ledger applies an entry it was sent once the hold ends, whether or not the caller still
    waits for the answer. ``execute`` stays as the parent's, for the paths that do not await."""

    name: ClassVar[str] = "ledger.await"
    awaits: ClassVar[bool] = True

    async def execute_async(self, ctx: StepContext) -> dict[str, Any]:
        self._admit(ctx)
        applying = asyncio.ensure_future(self._apply(ctx))  # the target's side, sent
        _APPLYING.add(applying)
        applying.add_done_callback(_APPLYING.discard)
        return await asyncio.shield(applying)

    @staticmethod
    async def _apply(ctx: StepContext) -> dict[str, Any]:
        await asyncio.sleep(float(ctx.args.get("hold_s", 0)))
        hold_while = ctx.args.get("hold_while")
        while hold_while and os.path.exists(hold_while):
            await asyncio.sleep(0.02)
        return LedgerRecord._record(ctx)  # one short local write: no thread for it


_APPLYING: set[asyncio.Future[dict[str, Any]]] = set()  # held until applied (tasks are weak)


def ledger_step(tmp_path: Path, entry: str = "e", **extra: object) -> dict[str, Any]:
    """A plan step that records ``entry`` in ``tmp_path/ledger``."""
    return {"action": "ledger.record",
            "args": {"ledger": str(tmp_path / "ledger"), "entry": entry, **extra}}


def ledger_registry() -> Registry:
    return Registry([LedgerRecord(), AwaitedLedgerRecord()])


def persisted(store: JournalStore, tmp_path: Path, task_id: str, n: int,
              **per_step: dict[str, Any]) -> None:
    """Stores a plan of ``n`` ledger steps (entries e1..en).

    ``per_step["s<k>"]`` adds arguments to step k."""
    steps = [ledger_step(tmp_path, f"e{i}", **per_step.get(f"s{i}", {})) for i in range(1, n + 1)]
    store.persist_plan(load_plan({"task_id": task_id, "steps": steps}, ledger_registry()))
