"""The ``ledger.post_invoice`` action: post one invoice to the ledger, under the step's key.

Its arguments: {customer, amount, currency, reference}.

Reversible: a posted invoice is voided by compensation. The void stays on the ledger's record (a
ledger never forgets), but the invoice no longer counts. Nothing has left the company yet:
sending the invoice to the customer would be a separate, irreversible step.

How the key reaches the target: the step's key is the request's ``Idempotency-Key``. The ledger
remembers it and replays the first answer to a retry (so a second execute under one key posts
nothing). It also stores it on the invoice, where the probe looks for it. The probe never
matches on customer or reference alone: another invoice with the same customer and reference (a
second instalment, a clerk's manual entry) is not ours.

Configuration (``from_env``): ``TIDEMARK_LEDGER_URL`` (or ``TIDEMARK_STAGING_URL``, with the
staging ledger's default tokens), ``TIDEMARK_LEDGER_WRITE_TOKEN`` and
``TIDEMARK_LEDGER_READ_TOKEN`` (each also as ``..._FILE``), ``TIDEMARK_LEDGER_TIMEOUT_S``.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlencode

from tidemark.actions import Action, Arg, ProbeResult, StepContext, nonempty_str
from tidemark.errors import ConfigError, Refused, TargetUnavailable, Unauthorized

DEFAULT_TIMEOUT_S = 10.0
# The staging ledger's default tokens (tidemark_ledger.staging honours them). They live here, not
# there, so that a worker running this action never imports the staging servers.
WRITE_TOKEN = "ledger-staging-post"
READ_TOKEN = "ledger-staging-read"
CURRENCIES = ("eur", "usd", "gbp")


class LedgerError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"ledger {status} {code}: {message}")
        self.status, self.code = status, code


class LedgerClient:
    """The ledger's HTTP API with one bearer token.

    Sends each request once; a lost answer or a timeout raises TargetUnavailable (the journal,
    not the client, decides what comes next)."""

    def __init__(self, base_url: str, token: str, *, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.base_url = base_url.rstrip("/")
        self._token = token
        self.timeout = timeout

    def __repr__(self) -> str:  # the token never shows in a log line or a traceback
        return f"LedgerClient({self.base_url!r})"

    def call(self, method: str, path: str, body: dict[str, Any] | None = None,
             headers: Mapping[str, str] | None = None) -> dict[str, Any]:
        req = urllib.request.Request(
            self.base_url + path, method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self._token}",
                     "Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:
            try:
                err = json.loads(e.read()).get("error", {})
            except ValueError:
                err = {}
            raise LedgerError(e.code, err.get("code", "error"), err.get("message", "")) from None
        except (OSError, http.client.HTTPException) as e:  # URLError, timeouts, resets
            raise TargetUnavailable(f"ledger {method} {path}: no answer: {e}") from None

    def invoices(self, **filters: str) -> list[dict[str, Any]]:
        return self.call("GET", "/ledger/v1/invoices?" + urlencode(filters))["data"]


def _raise(e: LedgerError, what: str) -> None:
    if e.status == 401 or e.status == 403:
        raise Unauthorized(f"{what}: {e}") from None
    if e.status in (400, 404, 422):
        raise Refused(f"{what}: {e}") from None
    raise TargetUnavailable(f"{what}: {e}") from None  # 409 in progress, 5xx


class PostInvoice(Action):
    """Posts an invoice with the step's key as its Idempotency-Key.

    Args:
        writer: a LedgerClient whose token may post and void (``invoices:write``); used only by
            execute and compensate.
        reader: a LedgerClient with a read-only token (``invoices:read``), for the probe,
            snapshot and gates.
    """

    name = "ledger.post_invoice"
    irreversible = False
    args: ClassVar[dict[str, Arg]] = {
        "customer": Arg(str, check=nonempty_str),
        "amount": Arg(int, check=lambda v: v if v > 0 else _bad("must be positive")),
        "currency": Arg(str, check=lambda v: v if v in CURRENCIES
                        else _bad(f"must be one of {', '.join(CURRENCIES)}")),
        "reference": Arg(str, check=nonempty_str),
    }
    write_attrs = ("writer",)
    timeout_env = "TIDEMARK_LEDGER_TIMEOUT_S"  # `tidemark chaos` cuts it short for slow runs
    horizon_s = 0.0  # the Idempotency-Key fences a late request: it replays, never posts twice

    def __init__(self, writer: LedgerClient, reader: LedgerClient) -> None:
        self.writer = writer
        self.reader = reader
        self.deadline_s = writer.timeout + 5.0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> PostInvoice | None:
        """Bound when TIDEMARK_LEDGER_URL or TIDEMARK_STAGING_URL is set; None otherwise."""
        url = env.get("TIDEMARK_LEDGER_URL")
        staging = env.get("TIDEMARK_STAGING_URL")
        if not url and not staging:
            return None
        write = _secret(env, "TIDEMARK_LEDGER_WRITE_TOKEN") or (None if url else WRITE_TOKEN)
        read = _secret(env, "TIDEMARK_LEDGER_READ_TOKEN") or (None if url else READ_TOKEN)
        if not write or not read:
            raise ConfigError("ledger: TIDEMARK_LEDGER_URL is set but TIDEMARK_LEDGER_WRITE_TOKEN"
                              " or TIDEMARK_LEDGER_READ_TOKEN (or its _FILE) is missing")
        raw = env.get("TIDEMARK_LEDGER_TIMEOUT_S")
        try:
            timeout = float(raw) if raw else DEFAULT_TIMEOUT_S
        except ValueError:
            raise ConfigError(f"TIDEMARK_LEDGER_TIMEOUT_S must be seconds, got {raw!r}") from None
        base = url or staging or ""
        return cls(LedgerClient(base, write, timeout=timeout),
                   LedgerClient(base, read, timeout=timeout))

    @classmethod
    def describe(cls, args: dict[str, Any]) -> str:
        return f"{args['customer']} {args['amount']} {args['currency']} {args['reference']!r}"

    def check_identity(self) -> dict[str, Any]:
        """Both tokens must belong to the same ledger, or the probe would search another's."""
        try:
            w = self.writer.call("GET", "/ledger/v1/whoami")["ledger"]
            r = self.reader.call("GET", "/ledger/v1/whoami")["ledger"]
        except LedgerError as e:
            raise ConfigError(f"ledger: a token is rejected ({e}); check "
                              "TIDEMARK_LEDGER_WRITE_TOKEN and _READ_TOKEN") from None
        if w != r:
            raise ConfigError(f"ledger: the write token posts to ledger {w!r} but the read token "
                              f"reads ledger {r!r}; issue both for the same ledger")
        return {"ledger": w}

    # -- read-only: the reader only ------------------------------------------------------

    def _ours(self, ctx: StepContext) -> list[dict[str, Any]]:
        try:
            return self.reader.invoices(idempotency_key=ctx.key)
        except LedgerError as e:
            _raise(e, "ledger list")
            raise

    def snapshot(self, ctx: StepContext) -> dict[str, Any]:
        """The invoices under this step's key that still count (none before it runs)."""
        return {"live": [i["id"] for i in self._ours(ctx) if i["status"] == "posted"]}

    def probe(self, ctx: StepContext) -> ProbeResult:
        found = self._ours(ctx)
        if not found:
            return ProbeResult.absent("no invoice carries this step's key")
        if len(found) > 1:
            return ProbeResult.unknown(f"{len(found)} invoices carry this step's key")
        inv = found[0]
        if inv["status"] != "posted":
            return ProbeResult.unknown(f"our invoice {inv['id']} is {inv['status']}: someone "
                                       "voided it after we posted it", {"id": inv["id"]})
        wanted = {f: ctx.args[f] for f in ("customer", "amount", "currency", "reference")}
        if {f: inv[f] for f in wanted} != wanted:
            return ProbeResult.unknown(f"our invoice {inv['id']} was amended since",
                                       {"id": inv["id"]})
        return ProbeResult.done(_outcome(inv), f"invoice {inv['id']} carries our key")

    # -- side effects: the writer --------------------------------------------------------

    def execute(self, ctx: StepContext) -> dict[str, Any]:
        body = {f: ctx.args[f] for f in ("customer", "amount", "currency", "reference")}
        try:
            inv = self.writer.call("POST", "/ledger/v1/invoices", body,
                                   {"Idempotency-Key": ctx.key})
        except LedgerError as e:
            _raise(e, "ledger post")
            raise
        return _outcome(inv)

    def compensate(self, ctx: StepContext) -> dict[str, Any]:
        """Voids the invoice the step posted, found by its key (the outcome names it too)."""
        voided = []
        for inv in self.reader.invoices(idempotency_key=ctx.key):
            if inv["status"] == "posted":
                try:
                    self.writer.call("POST", f"/ledger/v1/invoices/{inv['id']}/void")
                except LedgerError as e:
                    if e.code != "already_void":
                        _raise(e, "ledger void")
                voided.append(inv["id"])
        return {"voided": voided}


def _outcome(inv: dict[str, Any]) -> dict[str, Any]:
    return {"id": inv["id"], "number": inv["number"], "amount": inv["amount"],
            "currency": inv["currency"]}


def _bad(message: str) -> Any:
    raise ValueError(message)


def _secret(env: Mapping[str, str], name: str) -> str | None:
    if env.get(name):
        return env[name]
    path = env.get(name + "_FILE")
    if not path:
        return None
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except OSError as e:
        raise ConfigError(f"{name}_FILE names {path}, which cannot be read: {e}") from None
