"""The moment a request leaves for a target: the checks made just before.

The moment a request leaves for a target: what the client transports do just before a
request's bytes go out on its open connection (``at_wire``), for the attempt whose call is
under way.

A lease judged before the call, on the database's clock, does not stop a process that wakes
late (a GC pause, swap, a paused VM) from sending what it was about to send. So the check is
made where the request leaves, on the thread (or event loop) that sends it:

1. **The mark.** For an action whose target's fence may not stop a late request
   (``Action.marks_sends``: Drive's rename, Graph's send of a draft), the attempt first
   journals that its effect request may leave from now on (StepSession.mark_sent), in a
   statement that is refused once the attempt no longer owns its intent: a twin took it over,
   and the request never leaves. Once marked, a probe's *absent* is no verdict until the
   attempt reports back (tidemark.attempt.resolve_in_doubt), so a process frozen between the
   mark and its socket cannot make a twin send the same thing again.
2. **The cover.** Then, on this machine's monotonic clock (which a freeze does not stop and
   nobody sets), the lease committed for the call must still cover a request that leaves now,
   with margin (tidemark.store.LeaseKeeper.covers): the moment is still inside what the lease
   gives the call (its deadline from before the lease was written, or the last renewal), so
   that whatever the target does with the request until the horizon is over happens before the
   lease can lapse. Otherwise the request does not leave: NotSent.

The attempt installs its ``Wire`` around its call (``calling``); an action names the request
that is its effect (``effect``). The transports (probes.google_http.OneShotHttp,
probes.google_async.send, the Graph client's transport) call ``at_wire`` (or, on an event loop,
``at_wire_async``: the mark's statement then runs on a worker thread) once the connection is
open, just before the request is written to it; every write under a ``Wire`` has its cover
checked, the effect is also marked. Reads are never held back: a late read changes nothing.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tidemark.errors import NotSent
from tidemark.faults import crash_point

# Methods that change nothing at a target: a late one is harmless.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclass
class Wire:
    """The attempt whose call is under way, as its requests' transports see it.

    ``covered()`` says whether the call's lease covers a request that leaves now; ``mark()``
    journals the mark and says whether this attempt still owns its intent (None: the action
    does not mark).
    """

    step: int
    crash_prefix: str  # "" forward, "undo_" for a compensation (tidemark.faults)
    covered: Callable[[], bool]
    mark: Callable[[], bool] | None = None
    marked: bool = False

    def must_mark(self) -> bool:
        return self.mark is not None and not self.marked and _EFFECT.get()

    def marked_or_refused(self, owned: bool) -> None:
        if not owned:
            raise NotSent("not sent: this attempt no longer owns its intent (a twin took the "
                          "step over while it stood still); its request never left")
        self.marked = True

    def check_cover(self) -> None:
        """Raises NotSent unless the lease covers a request that leaves now."""
        if not self.covered():
            raise NotSent("not sent: the lease committed for this call no longer covers a "
                          "request that leaves now (the process stood still, or the call ran "
                          "past its deadline without renewals); a twin may take the step over")


_WIRE: contextvars.ContextVar[Wire | None] = contextvars.ContextVar("tidemark_wire",
                                                                   default=None)
_EFFECT: contextvars.ContextVar[bool] = contextvars.ContextVar("tidemark_effect", default=False)


@contextmanager
def calling(wire: Wire) -> Iterator[None]:
    """Makes every request in this block the call of ``wire``'s attempt.

    Every request made in this block (this context, and the threads and event loops it is
    copied to) is the call of ``wire``'s attempt."""
    token = _WIRE.set(wire)
    try:
        yield
    finally:
        _WIRE.reset(token)


@contextmanager
def effect() -> Iterator[None]:
    """The requests made in this block are the step's effect (the write it exists for)."""
    token = _EFFECT.set(True)
    try:
        yield
    finally:
        _EFFECT.reset(token)


def _leaving(method: str) -> Wire | None:
    wire = _WIRE.get()
    if wire is None or method.upper() in SAFE_METHODS:
        return None
    if _EFFECT.get():
        crash_point(wire.crash_prefix + "before_send", wire.step)
    return wire


def _passed(wire: Wire) -> None:
    if _EFFECT.get():
        crash_point(wire.crash_prefix + "wire_passed", wire.step)


def at_wire(method: str) -> None:
    """Marks and checks a request just before it leaves; NotSent if it must not.

    Called by a transport on the sending thread, just before the request of ``method``
    leaves: marks it if it is the effect of a marking action, then checks the cover. Raises
    NotSent if it must not leave."""
    wire = _leaving(method)
    if wire is None:
        return
    if wire.must_mark():
        assert wire.mark is not None
        wire.marked_or_refused(wire.mark())
    wire.check_cover()
    _passed(wire)


async def at_wire_async(method: str) -> None:
    """``at_wire`` for a transport on an event loop.

    The mark's statement runs on a worker thread, the check of the cover on the loop itself, just
    before the request is written."""
    wire = _leaving(method)
    if wire is None:
        return
    if wire.must_mark():
        assert wire.mark is not None
        wire.marked_or_refused(await asyncio.to_thread(wire.mark))
    wire.check_cover()
    _passed(wire)


def httpcore_trace(method: str,
                   inner: Callable[[str, dict[str, Any]], Awaitable[None]] | None = None
                   ) -> Callable[[str, dict[str, Any]], Awaitable[None]]:
    """An httpcore ``trace`` extension that calls ``at_wire_async`` before sending.

    An httpcore ``trace`` extension that calls ``at_wire_async`` on the open connection,
    just before the request's headers are written to it (and passes every event on to
    ``inner``). Raising there, httpcore closes the connection with nothing sent."""

    async def trace(event: str, info: dict[str, Any]) -> None:
        if inner is not None:
            await inner(event, info)
        if event.endswith("send_request_headers.started"):
            await at_wire_async(method)

    return trace
