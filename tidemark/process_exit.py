"""Ending a process that used the Temporal SDK without the interpreter's teardown.

The SDK's Rust core keeps threads of its own; when the interpreter finalizes while one of them
still holds a Python thread state, CPython aborts ("Fatal Python error: PyGILState_Release:
thread state ... must be current when releasing", exit -6), after the command has done its
work and printed its answer (temporalio/sdk-python issue 300). A command that exits through
``exit_now`` runs everything registered with ``atexit`` (the embedded Postgres lets go of its
server there), flushes its output, and ends without that teardown.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from typing import NoReturn


def exit_now(code: int) -> NoReturn:
    """Exits with ``code`` after the atexit handlers and a flush of stdout and stderr."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more to say
            stream.flush()
    os._exit(code)
