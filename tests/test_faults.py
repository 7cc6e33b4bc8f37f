"""The fault points of tidemark.faults, in processes of their own.

A freeze point stops the thread that reaches it before that thread does anything more. The Graph
client's event loop reaches ``before_send`` on a thread of its own, just before it journals the
mark: a thread that ran on past its freeze point would mark the send of a worker that a test
takes for frozen before its mark.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers.freeze import wake
from helpers.wait import assert_eventually
from tidemark.faults import FREEZE_ENV

ROOT = Path(__file__).resolve().parent.parent
# The point is reached on a thread of its own, as the Graph client's loop reaches it; the file is
# written only by a thread that went on past the point.
REACHED_ON_A_THREAD = """
import os, sys, threading
from tidemark.faults import crash_point

def send():
    fd = os.open(sys.argv[1] + ".tmp", os.O_WRONLY | os.O_CREAT)
    crash_point("before_send", 1)
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])  # the first thing done after the point
    os.write(fd, b"went on")

thread = threading.Thread(target=send)
thread.start()
thread.join()
"""
# Each run that went on would show it; several make a thread that goes on now and then show.
RUNS = 5


def wholly_stopped(pid: int) -> bool:
    """Whether every thread of process ``pid`` is stopped (state T); False once it is gone."""
    try:
        stats = [(t / "stat").read_text() for t in Path(f"/proc/{pid}/task").iterdir()]
    except FileNotFoundError:
        return False
    return bool(stats) and all(s.rsplit(")", 1)[1].split()[0] == "T" for s in stats)


def test_a_thread_that_reaches_a_freeze_point_does_nothing_more_until_woken(
        tmp_path: Path) -> None:
    env = {**os.environ, FREEZE_ENV: "before_send:1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    marks = [tmp_path / f"went-on-{n}" for n in range(RUNS)]
    procs = [subprocess.Popen([sys.executable, "-c", REACHED_ON_A_THREAD, str(mark)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for mark in marks]
    try:
        for proc in procs:
            assert_eventually(lambda p=proc: p.poll() is not None or wholly_stopped(p.pid),
                              timeout=30)
            assert proc.poll() is None, proc.communicate()
        went_on = [m.name for m in marks if m.exists()]
        assert not went_on, f"the thread went on past its freeze point in {went_on}"
    finally:
        ended = [wake(proc) for proc in procs]
    assert all(code == 0 for code, _, _ in ended), ended
    assert all(m.read_text() == "went on" for m in marks)  # woken, each goes on from the point
