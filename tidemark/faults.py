"""Named crash points for the windows that matter, driven by tests against real processes.

Set ``TIDEMARK_CRASH_AT=<point>[:<step>]`` in a process's environment and it SIGKILLs itself when
it reaches that point (of that step): no cleanup, no finally blocks, no outcome write. That is
the only honest way to test the window "after the provider returned, before the journal commit".
Unset (the normal case), a crash point costs one dictionary lookup.
"""

import os
import signal

CRASH_ENV = "TIDEMARK_CRASH_AT"

POINTS = (
    "before_intent",   # gates and snapshot done, nothing journaled
    "after_intent",    # intent committed, action not started
    "after_stage",     # the action's fenced handle (e.g. a draft) is created and journaled
    "after_execute",   # the target applied the action; its outcome is not journaled
    "after_outcome",   # outcome committed
    "undo_after_intent",   # a compensation's intent committed, compensation not started
    "undo_after_execute",  # the compensation applied; its outcome is not journaled
)


def crash_point(point: str, step: int) -> None:
    """Kills this process if ``TIDEMARK_CRASH_AT`` names this point (and step)."""
    spec = os.environ.get(CRASH_ENV)
    if not spec:
        return
    name, _, at_step = spec.partition(":")
    if name == point and (not at_step or int(at_step) == step):
        os.kill(os.getpid(), signal.SIGKILL)
