"""The moment a request leaves for a target: what the client transports call just before a
request's bytes go out on its socket (``at_wire``), for the attempt whose call is under way.

An attempt installs its ``Wire`` around its call (tidemark.attempt); an action marks the
request that is its effect (``effect``: Drive's ``files.update``, Graph's send of the draft).
The transports (probes.google_http.OneShotHttp, probes.google_async.send, the Graph client's
transport) call ``at_wire`` once the connection is open, just before the request is written.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tidemark.faults import crash_point

# Methods that change nothing at a target: a late one is harmless.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclass
class Wire:
    """The attempt whose call is under way, as its requests' transports see it."""

    step: int
    crash_prefix: str  # "" forward, "undo_" for a compensation (tidemark.faults)


_WIRE: contextvars.ContextVar[Wire | None] = contextvars.ContextVar("tidemark_wire",
                                                                   default=None)
_EFFECT: contextvars.ContextVar[bool] = contextvars.ContextVar("tidemark_effect", default=False)


@contextmanager
def calling(wire: Wire) -> Iterator[None]:
    """Every request made in this block (this context) is the call of ``wire``'s attempt."""
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


def at_wire(method: str) -> None:
    """Called by a transport on the sending thread, just before ``method``'s request leaves."""
    wire = _WIRE.get()
    if wire is None or method.upper() in SAFE_METHODS or not _EFFECT.get():
        return
    crash_point(wire.crash_prefix + "before_send", wire.step)


async def at_wire_async(method: str) -> None:
    """``at_wire`` for a transport on an event loop."""
    at_wire(method)


def httpcore_trace(method: str, inner: Callable[[str, dict[str, Any]], Awaitable[None]] | None
                   = None) -> Callable[[str, dict[str, Any]], Awaitable[None]]:
    """An httpcore ``trace`` extension that calls ``at_wire_async`` just before the request's
    headers are written to the open connection (and passes every event on to ``inner``)."""

    async def trace(event: str, info: dict[str, Any]) -> None:
        if inner is not None:
            await inner(event, info)
        if event.endswith("send_request_headers.started"):
            await at_wire_async(method)

    return trace
