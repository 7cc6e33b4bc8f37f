"""Named fault points for the windows that matter, driven by tests against real processes.

Set ``TIDEMARK_CRASH_AT=<point>[:<step>]`` in a process's environment and it SIGKILLs itself when
it reaches that point (of that step): no cleanup, no finally blocks, no outcome write. That is
the only honest way to test the window "after the provider returned, before the journal commit".

Set ``TIDEMARK_FREEZE_AT=<point>[:<step>]`` and it SIGSTOPs itself there instead, once: the
whole process stands still (as under a long GC pause, swap or a paused VM) until something
sends it SIGCONT, and then goes on from that very point. That is how a test shows what a
process that wakes late does.

The stop is sent to the thread that reached the point, which then stops before it returns from
the signal's system call; the rest of the process stops with it. A SIGSTOP sent to the process
as a whole is taken by a thread the kernel picks (the main thread, asleep in a wait) and stops
the others only once that thread runs: meanwhile the thread that sent it goes on, on a loaded
machine long enough to journal the mark it was about to write (the Graph client's event loop
reaches ``before_send`` on a thread of its own).

Unset (the normal case), a fault point costs two dictionary lookups.
"""

import os
import signal
import threading

CRASH_ENV = "TIDEMARK_CRASH_AT"
FREEZE_ENV = "TIDEMARK_FREEZE_AT"

POINTS = (
    "in_prepare",      # a run's prepare began (any step: the point names no step)
    "before_intent",   # gates and snapshot done, nothing journaled
    "after_intent",    # intent committed, action not started
    "after_stage",     # the action's fenced handle (e.g. a draft) is created and journaled
    "before_send",     # the step's effect request is about to leave (tidemark.wire)
    "wire_passed",     # ... it passed the wire's checks (marked, covered) and is written next
    "after_execute",   # the target applied the action; its outcome is not journaled
    "after_outcome",   # outcome committed
    "undo_after_intent",   # a compensation's intent committed, compensation not started
    "undo_before_send",    # the compensation's request is about to leave
    "undo_wire_passed",    # ... it passed the wire's checks and is written next
    "undo_after_execute",  # the compensation applied; its outcome is not journaled
)

_frozen: set[str] = set()  # the freeze points this process has stopped at (each once)
_frozen_lock = threading.Lock()


def _names(spec: str | None, point: str, step: int) -> bool:
    if not spec:
        return False
    name, _, at_step = spec.partition(":")
    return name == point and (not at_step or int(at_step) == step)


def crash_point(point: str, step: int) -> None:
    """Kills or stops this process at a named crash point.

    Kills this process if ``TIDEMARK_CRASH_AT`` names this point (and step); stops it if
    ``TIDEMARK_FREEZE_AT`` does (the first time it is reached)."""
    if _names(os.environ.get(CRASH_ENV), point, step):
        os.kill(os.getpid(), signal.SIGKILL)
    if _names(os.environ.get(FREEZE_ENV), point, step):
        with _frozen_lock:
            first = point not in _frozen
            _frozen.add(point)
        if first:
            # This thread, not the process: see the module docstring.
            signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
