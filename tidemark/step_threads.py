"""The worker's step threads, as a coroutine hands them work.

A step whose action awaits its call (tidemark.actions.Action.awaits) runs as a coroutine on the
worker's event loop, so that its wait on the target holds no thread; everything else it does
(the journal's statements, gates, snapshot, probe, stage) is blocking and runs here, on the
same pool of threads the worker's other activities use.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import Executor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class StepThreads:
    """Runs blocking parts of a step on ``executor`` and awaits them."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` on a step thread, in a copy of the caller's context (the
        activity's, and the task a call acts for: activities.acting.acting_for).

        A thread cannot be stopped: if the awaiting coroutine is cancelled, ``fn`` still runs
        to its end. Every part handed here is written to be left that way (a statement of the
        journal commits or not as a whole)."""
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()
        call = functools.partial(context.run, fn, *args, **kwargs)
        return await loop.run_in_executor(self.executor, call)
