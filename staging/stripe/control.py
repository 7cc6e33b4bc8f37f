"""The control endpoints of the emulated Stripe (``/_staging/stripe/...``).

The search lag, execution errors to arm, and customers that PaymentIntents may name."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from aiohttp import web

from staging.stripe.clocks import StripeClock
from staging.stripe.objects import ExecutionError, random_id


class ControlRoutes(StripeClock):
    """The handlers of ``/_staging/stripe/...`` and the customers they add."""

    async def _h_get_lag(self, request: web.Request) -> web.Response:
        return web.json_response({"seconds": self.search_lag})

    async def _h_set_lag(self, request: web.Request) -> web.Response:
        body = await request.json()
        try:
            seconds = float(body["seconds"])
        except (KeyError, TypeError, ValueError):
            return web.json_response({"error": "give {\"seconds\": <number>}"}, status=400)
        self.search_lag = seconds
        return web.json_response({"seconds": seconds})

    async def _h_execution_error(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else {}
        try:
            failure = ExecutionError(**body)
        except TypeError as e:
            return web.json_response({"error": str(e)}, status=400)
        with self.staging.lock:
            self.execution_errors.append(failure)
        return web.json_response({"armed": asdict(failure)})

    async def _h_add_customer(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else {}
        return web.json_response(self.add_customer(**{k: body[k] for k in ("id", "email", "name")
                                                      if k in body}))

    def add_customer(self, id: str | None = None, email: str | None = None,
                     name: str | None = None) -> dict[str, Any]:
        """Adds a customer that PaymentIntents may name, and returns it."""
        customer: dict[str, Any] = {
            "id": id or "cus_" + random_id(14), "object": "customer", "email": email,
            "name": name, "created": int(self.now()), "livemode": False}
        with self.staging.lock:
            self.state.customers[customer["id"]] = customer
        return customer
