"""Stripe's clock on every answer.

The ``Date`` header comes from Stripe's clock (this host's plus the ``clock_offset_s`` switch),
errors and replays included. The same wrapper hides metadata from a restricted key when the
``restricted_key_metadata`` switch says so."""

from __future__ import annotations

import email.utils
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from staging.core import Reply
from staging.stripe.accounts import StripeAccounts, key_of
from staging.stripe.responses import without_metadata


class StripeClock(StripeAccounts):
    """Stripe's clock, and the wrapper that puts it in every answer's ``Date``."""

    def now(self) -> float:
        """Stripe's clock: this host's plus the ``clock_offset_s`` switch."""
        return time.time() + float(self.switch("clock_offset_s"))

    def _dated(self, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
               ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """``handler`` with Stripe's ``Date`` header on every answer.

        The header is on Stripe's clock, not this host's, errors and replays included. Metadata
        is hidden from a restricted key when the ``restricted_key_metadata`` switch says so."""

        async def wrapped(request: web.Request) -> web.StreamResponse:
            try:
                response = await handler(request)
            except Reply as r:
                response = r.response
            if (isinstance(response, web.Response) and response.status == 200
                    and key_of(request).startswith("rk_")
                    and self.switch("restricted_key_metadata") == "hidden"):
                response = without_metadata(response)
            response.headers["Date"] = email.utils.formatdate(self.now(), usegmt=True)
            return response

        return wrapped
