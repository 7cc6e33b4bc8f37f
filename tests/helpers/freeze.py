"""A process stopped by SIGSTOP (its own, at a freeze point: tidemark.faults), as a test sees it."""

from __future__ import annotations

import os
import signal
import subprocess

from helpers.wait import assert_eventually
from tools.chaos.timing import stopped

__all__ = ["stopped", "wait_stopped", "wake"]


def wait_stopped(proc: subprocess.Popen[str], timeout: float = 60.0) -> None:
    """Waits until ``proc`` stopped itself; fails if it ended instead."""
    assert_eventually(lambda: stopped(proc) or proc.poll() is not None, timeout=timeout)
    if proc.poll() is not None:
        out, err = proc.communicate()
        raise AssertionError(f"the process ended (exit {proc.returncode}) before it froze: "
                             f"{out!r} {err[-2000:]!r}")


def wake(proc: subprocess.Popen[str], timeout: float = 60.0) -> tuple[int, str, str]:
    """SIGCONT: the process goes on from where it froze.

    Returns its exit status and output once it has ended."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err
