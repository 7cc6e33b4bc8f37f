"""The worker's step threads, as a coroutine hands them work.

A step whose action awaits its call (tidemark.actions.Action.awaits) runs as a coroutine on the
worker's event loop, so that its wait on the target holds no thread; everything else it does
(the journal's statements, gates, snapshot, probe, stage) is blocking and runs here, on a pool
of its own (TIDEMARK_STEP_THREADS), apart from the threads of the worker's synchronous
activities.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class StepThreads:
    """Runs blocking parts of a step on ``executor`` and awaits them."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` on a step thread, in a copy of the caller's context.

        The context is the activity's, and the task a call acts for (activities.acting.acting_for).

        A thread cannot be stopped: if the awaiting coroutine is cancelled, ``fn`` still runs
        to its end. Every part handed here is written to be left that way (a statement of the
        journal commits or not as a whole)."""
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()
        call = functools.partial(context.run, fn, *args, **kwargs)
        return await loop.run_in_executor(self.executor, call)


async def to_its_end(work: Awaitable[T]) -> T:
    """Awaits ``work`` to its end even if the awaiting task is cancelled meanwhile.

    Awaits ``work`` to its end even if the awaiting task is cancelled meanwhile, and only
    then passes the cancellation on (``work``'s result is dropped; an error it raised is
    raised instead).

    A step's attempt is run this way, as a thread runs it: cancelling the task that awaits it
    (Temporal timed the attempt out, the worker shuts down) must not cut it between two of its
    statements, nor cut its call to the target, which would not stop a request that has left
    but would leave the step in doubt, to be probed before the target applied it. The attempt
    ends on its own (the call's client timeout bounds it) and is settled; Temporal's retry
    meanwhile meets its lease (StepBusy) and then its outcome."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.cancelled():
                raise  # the work itself was cancelled
            cancelled = True  # the waiter was: the work goes on (or has just ended)
    if cancelled:
        raise asyncio.CancelledError("cancelled while the attempt ran; it ran to its end first")
    return result
