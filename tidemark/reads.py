"""Reads that wait out a provider's moment: one retry loop for every probe and gate read.

A 429, a 503 or a timeout on a read is a moment, not a verdict: the provider asks us to come
back (Graph, Drive, Gmail and Stripe all document backing off and trying again), and a read
changes nothing, so asking again is safe. A read made while a probe, a gate or a snapshot runs
is therefore tried again, waiting as long as the provider's ``Retry-After`` says and at least an
exponential backoff, until the read answers or the budget (``READ_RETRY_BUDGET_S``, or
``TIDEMARK_READ_RETRY_S``) is spent; only then does its error reach the probe, which answers
*unknown* with it as it always did.

Writes never come through here: whether a write that failed may be sent again is the journal's
question (its probe, after the target's horizon), never a loop's.

Only the reads of a probe, a gate or a snapshot wait: callers mark that stretch with
``patient_reads()``. Outside it the budget is 0 and a read fails at once, as before; an action
that reads inside its own call (a send confirmed by a listing) runs under a deadline its lease
was written for, which a wait of a minute would overrun.

Each provider module says which of its errors are such a moment (a ``classify`` function that
returns a :class:`Transient`, or None for an answer that stands). The loop is written once, as a
coroutine whose waits go through a ``sleep`` the caller gives: ``retried`` runs it on the calling
thread (blocking sleeps), ``retried_with`` awaits it on an event loop.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from tidemark.errors import ConfigError

log = logging.getLogger(__name__)

T = TypeVar("T")

ENV_READ_RETRY = "TIDEMARK_READ_RETRY_S"
# How long one read of a probe or gate keeps asking before its error stands. A minute covers
# what the providers ask of a throttled client: Graph's Retry-After (seconds to tens of seconds
# for a mailbox), Drive's truncated exponential backoff (up to 32 or 64 s), Stripe's
# per-second rate limits, and a 503 during a short incident; it is still well inside a step's
# five minutes (workflows/shared.py STEP_START_TO_CLOSE), and the step heartbeats meanwhile.
READ_RETRY_BUDGET_S = 60.0
MAX_READ_RETRY_S = 240.0  # a setting past this would outlast the step's own start-to-close
# The first wait and its ceiling: short enough that a single blip costs half a second, long
# enough at the top that a throttled mailbox is asked a handful of times a minute, not hundreds.
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 8.0

_budget: contextvars.ContextVar[float] = contextvars.ContextVar("tidemark_read_budget",
                                                                default=0.0)


@dataclass(frozen=True)
class Transient:
    """A read's error that is a moment of the provider's.

    Throttled, unavailable, timed out. ``retry_after``: the seconds the provider asked us to wait,
    when it said."""

    retry_after: float | None = None


def read_budget_s(env: Mapping[str, str] | None = None) -> float:
    """The seconds one probe or gate read may keep asking.

    ``TIDEMARK_READ_RETRY_S``, else READ_RETRY_BUDGET_S. A value that is not a number from 0 to
    MAX_READ_RETRY_S is a ConfigError (0 turns the waiting off)."""
    raw = (os.environ if env is None else env).get(ENV_READ_RETRY, "").strip()
    if not raw:
        return READ_RETRY_BUDGET_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= MAX_READ_RETRY_S:
        raise ConfigError(f"{ENV_READ_RETRY} must be a number of seconds from 0 to "
                          f"{MAX_READ_RETRY_S:g}, got {raw!r}")
    return value


@contextlib.contextmanager
def patient_reads(budget_s: float | None = None) -> Iterator[None]:
    """Within the block, reads through ``retried`` wait out transient errors.

    Within the block, reads made through ``retried`` wait out transient errors for up to
    ``budget_s`` seconds each (default: ``read_budget_s()``)."""
    token = _budget.set(read_budget_s() if budget_s is None else budget_s)
    try:
        yield
    finally:
        _budget.reset(token)


def retry_after_s(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header given in seconds, or None.

    Seconds from a ``Retry-After`` header given in seconds (RFC 9110 section 10.2.3);
    None when absent, or given as a date (our clocks may disagree with the provider's)."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


class Backoff:
    """The waits between the tries of one read.

    At least the provider's Retry-After, else an exponential backoff with jitter, and none once the
    next wait would end past the budget."""

    def __init__(self, budget_s: float) -> None:
        self.deadline = time.monotonic() + budget_s
        self.tries = 0

    def next_wait(self, transient: Transient) -> float | None:
        """Seconds to wait before the next try, or None when the budget does not allow one."""
        self.tries += 1
        backoff = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** (self.tries - 1))
        wait = backoff * random.uniform(0.5, 1.0)  # jitter: twins do not come back together
        if transient.retry_after is not None:
            wait = max(wait, transient.retry_after)
        if time.monotonic() + wait > self.deadline:
            return None
        return wait


async def retried_with(call: Callable[[], Awaitable[T]],
                       classify: Callable[[BaseException], Transient | None],
                       sleep: Callable[[float], Awaitable[None]]) -> T:
    """``call()``'s answer, tried again after each transient error.

    ``call()``'s answer, tried again after each transient error (``classify``) while the
    budget of the block (``patient_reads``) allows; the last error is raised as it is."""
    backoff = Backoff(_budget.get())
    while True:
        try:
            return await call()
        except Exception as e:
            transient = classify(e)
            wait = None if transient is None else backoff.next_wait(transient)
            if wait is None:
                raise
            log.info("read failed (%s: %s); asking again in %.1fs", type(e).__name__, e, wait)
        await sleep(wait)


def retried(call: Callable[[], T], classify: Callable[[BaseException], Transient | None]) -> T:
    """``retried_with`` on the calling thread, which blocks through every wait."""

    async def once() -> T:
        return call()

    async def pause(seconds: float) -> None:
        time.sleep(seconds)

    return blocking(retried_with(once, classify, pause))


def blocking(coro: Coroutine[Any, Any, T]) -> T:
    """The result of a coroutine that never suspends, run in the calling thread.

    The result of a coroutine that never suspends (its waits block the thread), run in the
    calling thread, whether or not that thread runs an event loop."""
    try:
        coro.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    coro.close()
    raise RuntimeError("a coroutine run with blocking() suspended")
