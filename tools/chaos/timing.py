"""The interruptions of `tidemark chaos --time-faults` (see tools/chaos/run.py): time, not a crash.

* ``freeze``: the worker stands still (SIGSTOP, as under a long GC pause, swap or a paused VM)
  just before a step's effect request leaves (the fault point ``before_send``,
  tidemark.wire), past its lease; the resume (the twin) takes the step over and runs the plan
  on; then the frozen worker is woken (SIGCONT) and goes on from where it stood.
* ``clock_step``: while a step's write is held at the provider (a ``delay`` fault), the
  database's clock jumps CLOCK_STEP_S ahead (libfaketime under chaos's own Postgres:
  tools/chaos/stepped_clock.py), and the resume runs beside the worker, as a twin that reads every
  lease on the database's clock as long past.

Either way, the judge then reads the staging servers once nothing is in flight there."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tidemark.faults import FREEZE_ENV
from tools.chaos.kills import Kill
from tools.chaos.stepped_clock import SteppedClock
from tools.chaos.world import staging_http

CLOCK_STEP_S = 30.0  # the forward step the issue measured a twin taking a step over with
# How long the provider holds the write while the clock steps: long enough for the resume to
# try to take the step over while the write is at the provider, short of the client timeout.
CLOCK_HOLD_S = 2.0
# How long the worker may take to reach its freeze point, or to end once woken.
PATIENCE_S = 120.0


def stopped(proc: subprocess.Popen[Any]) -> bool:
    """Whether ``proc`` is stopped (its state in /proc is T)."""
    try:
        stat = Path(f"/proc/{proc.pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] == "T"


def worker_env(kill: Kill) -> dict[str, str]:
    """The interrupted worker's environment: a frozen one stops before its step's effect leaves.

    Its clients keep their timeouts (a worker's first calls, its identity checks, need them on a
    loaded machine). So the lease the resume waits out is its action's whole deadline
    (tools/chaos/run.py, FREEZE_PATIENCE_S)."""
    return {FREEZE_ENV: f"before_send:{kill.step}"} if kill.phase == "freeze" else {}


def worker_fault(kill: Kill) -> dict[str, Any] | None:
    """The staging fault the worker arms before its step: the held write of a clock step."""
    if kill.phase != "clock_step":
        return None
    assert kill.op is not None
    return {"target": kill.op[0], "op": kill.op[1], "kind": "delay", "seconds": CLOCK_HOLD_S,
            "step": kill.step}


def _until(check: Callable[[], bool], timeout: float = PATIENCE_S) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _held(staging_url: str) -> bool:
    return any(r["status"] is None for r in staging_http(staging_url, "/_staging/requests"))


def interrupt(proc: subprocess.Popen[Any], kill: Kill, resume: Callable[[], str],
              staging_url: str, clock: SteppedClock | None) -> str:
    """Interrupts the worker ``proc`` in time as ``kill`` says, and resumes the plan.

    ``resume`` returns '' or what stopped it. Then waits until the worker ended and nothing is in
    flight at the staging server. Returns the resume's error, or why the run could not be
    interrupted."""
    try:
        if kill.phase == "freeze":
            if not _until(lambda: stopped(proc) or proc.poll() is not None):
                return "the worker reached neither its freeze point nor its end"
            if proc.poll() is not None:
                return f"the freeze point was not reached (exit {proc.returncode})"
            try:
                err = resume()
            finally:
                os.kill(proc.pid, signal.SIGCONT)
        else:
            if clock is None:
                return "a clock step needs chaos's own Postgres (--time-faults)"
            if not _until(lambda: _held(staging_url) or proc.poll() is not None):
                return "the held write never reached the staging server"
            clock.step(CLOCK_STEP_S)
            err = resume()
        proc.wait(timeout=PATIENCE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if not _until(lambda: not _held(staging_url)):
        return "a write was still held at the staging server"
    return err
