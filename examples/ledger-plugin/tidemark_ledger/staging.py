"""The invoice ledger's staging server: a small system of record over HTTP.

It is mounted next to Tidemark's own emulated targets (entry point ``tidemark.staging``).

API (JSON; ``Authorization: Bearer <token>``):

* ``POST /ledger/v1/invoices`` {customer, amount, currency, reference} with an
  ``Idempotency-Key`` header (scope ``invoices:write``): posts an invoice (``201``). The key is
  remembered: the same key with the same body replays the first answer (header
  ``Idempotent-Replayed: true``) and posts nothing; with another body it is refused (``422``);
  while the first request is still being processed, ``409``. The invoice keeps the key
  (``idempotency_key``), so it can be found by it later.
* ``GET /ledger/v1/invoices?idempotency_key=&customer=&reference=`` (``invoices:read``): the
  invoices matching every filter given, oldest first.
* ``GET /ledger/v1/invoices/{id}``; ``POST /ledger/v1/invoices/{id}/void`` (``invoices:write``):
  voids a posted invoice (it stays on the record, status ``void``; a void of a void is ``409``).
* ``PATCH /ledger/v1/invoices/{id}`` {amount?, reference?} (``invoices:write``): amends a posted
  invoice, as a clerk in the ledger's own UI would.
* ``GET /ledger/v1/whoami``: the ledger (company) the token belongs to.

Effects: ``invoices.post``, ``invoices.void``, ``invoices.amend`` (the last two carry the key of
the invoice they touch; a post without a key, a third party's, carries None).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from aiohttp import web

from staging.core import DEFAULT_ACCOUNT, Reply, Target, Token
from tidemark_ledger.action import CURRENCIES, READ_TOKEN, WRITE_TOKEN

WRITE_SCOPE = "invoices:write"
READ_SCOPE = "invoices:read"


@dataclass
class Invoice:
    id: str
    number: int
    customer: str
    amount: int
    currency: str
    reference: str
    status: str  # posted | void
    idempotency_key: str | None
    ledger: str


class LedgerTarget(Target):
    name = "ledger"
    default_tokens = (Token(WRITE_TOKEN, "ledger", [WRITE_SCOPE, READ_SCOPE]),
                      Token(READ_TOKEN, "ledger", [READ_SCOPE]))

    def reset(self) -> None:
        self.invoices: dict[str, Invoice] = {}
        # key -> (request body, response body) once answered; None while in progress
        self.keys: dict[str, tuple[dict[str, Any], dict[str, Any]] | None] = {}

    def routes(self) -> Iterable[web.RouteDef]:
        return [web.post("/ledger/v1/invoices", self._h_post),
                web.get("/ledger/v1/invoices", self._h_list),
                web.get("/ledger/v1/invoices/{id}", self._h_get),
                web.patch("/ledger/v1/invoices/{id}", self._h_amend),
                web.post("/ledger/v1/invoices/{id}/void", self._h_void),
                web.get("/ledger/v1/whoami", self._h_whoami)]

    def error(self, status: int, code: str, message: str) -> web.Response:
        return web.json_response({"error": {"code": code, "message": message}}, status=status)

    def _mine(self, token: Token) -> list[Invoice]:
        return [i for i in self.invoices.values() if i.ledger == token.account]

    async def _h_post(self, request: web.Request) -> web.StreamResponse:
        token = self.authorize(request, WRITE_SCOPE)
        body = await request.json()
        bad = _invalid(body)
        if bad:
            return self.error(400, "invalid_request", bad)
        key = request.headers.get("Idempotency-Key") or None
        if key is not None:
            if key in self.keys:
                seen = self.keys[key]
                if seen is None:
                    return self.error(409, "request_in_progress",
                                      "a request with this Idempotency-Key is being processed")
                if seen[0] != body:
                    return self.error(422, "idempotency_mismatch",
                                      "this Idempotency-Key was used with another request body")
                return web.json_response(seen[1], status=201,
                                         headers={"Idempotent-Replayed": "true"})
            self.keys[key] = None
        try:
            fault = await self.before_write(request, "invoices.post")
        except BaseException:
            self.keys.pop(key or "", None)
            raise
        number = len(self.invoices) + 1
        inv = Invoice(id=f"inv_{number:06d}", number=number, customer=body["customer"],
                      amount=body["amount"], currency=body["currency"],
                      reference=body["reference"], status="posted", idempotency_key=key,
                      ledger=token.account)
        self.invoices[inv.id] = inv
        answer = _public(inv)
        if key is not None:
            self.keys[key] = (body, answer)
        self.record("invoices.post", key, id=inv.id, customer=inv.customer, amount=inv.amount)
        self.after_commit(request, fault)
        return web.json_response(answer, status=201)

    async def _h_list(self, request: web.Request) -> web.Response:
        token = self.authorize(request, READ_SCOPE, WRITE_SCOPE)
        q = request.query
        out = [_public(i) for i in self._mine(token)
               if all(getattr(i, f) == q[f] for f in ("idempotency_key", "customer",
                                                       "reference", "status") if f in q)]
        return web.json_response({"data": out})

    def _find(self, request: web.Request, token: Token) -> Invoice:
        inv = self.invoices.get(request.match_info["id"])
        if inv is None or inv.ledger != token.account:
            raise Reply(self.error(404, "not_found", "no such invoice"))
        return inv

    async def _h_get(self, request: web.Request) -> web.Response:
        token = self.authorize(request, READ_SCOPE, WRITE_SCOPE)
        return web.json_response(_public(self._find(request, token)))

    async def _h_void(self, request: web.Request) -> web.StreamResponse:
        token = self.authorize(request, WRITE_SCOPE)
        inv = self._find(request, token)
        if inv.status == "void":
            return self.error(409, "already_void", f"invoice {inv.id} is void already")
        fault = await self.before_write(request, "invoices.void")
        inv.status = "void"
        self.record("invoices.void", inv.idempotency_key, id=inv.id)
        self.after_commit(request, fault)
        return web.json_response(_public(inv))

    async def _h_amend(self, request: web.Request) -> web.Response:
        token = self.authorize(request, WRITE_SCOPE)
        inv = self._find(request, token)
        body = await request.json()
        if inv.status != "posted":
            return self.error(409, "not_posted", f"invoice {inv.id} is {inv.status}")
        for f in ("amount", "reference"):
            if f in body:
                setattr(inv, f, body[f])
        self.record("invoices.amend", inv.idempotency_key, id=inv.id, **body)
        return web.json_response(_public(inv))

    async def _h_whoami(self, request: web.Request) -> web.Response:
        token = self.authorize(request, READ_SCOPE, WRITE_SCOPE)
        return web.json_response({"ledger": token.account or DEFAULT_ACCOUNT})


def _invalid(body: Any) -> str:
    if not isinstance(body, dict):
        return "the body must be a JSON object"
    for f in ("customer", "reference", "currency"):
        if not isinstance(body.get(f), str) or not body[f]:
            return f"{f} must be a non-empty string"
    amount = body.get("amount")
    if isinstance(amount, bool) or not isinstance(amount, int) or amount <= 0:
        return "amount must be a positive integer (minor units)"
    if body["currency"] not in CURRENCIES:
        return f"currency must be one of {', '.join(CURRENCIES)}"
    return ""


def _public(inv: Invoice) -> dict[str, Any]:
    out = asdict(inv)
    out.pop("ledger")
    return out


def ledger_target() -> LedgerTarget:
    """The ``tidemark.staging`` entry point: a fresh emulated ledger."""
    return LedgerTarget()


__all__ = ["READ_TOKEN", "WRITE_TOKEN", "LedgerTarget", "ledger_target"]
