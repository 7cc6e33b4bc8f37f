"""What every emulated target shares: the effect log, armed faults and bearer tokens.

Control endpoints (all JSON):

* ``GET  /_staging/effects[?target=drive]`` — every side effect, with the idempotency key it
  carried, in the order applied;
* ``GET  /_staging/requests[?target=drive]`` — every write request (any method but GET and
  HEAD) a target received, in arrival order, whatever became of it: ``route`` (the route's
  template), ``key`` (its ``Idempotency-Key`` header), ``status`` (``null`` while the handler
  still runs, ``0`` when the connection was dropped), ``replayed`` (answered from an
  idempotency key's saved response). A request is logged when it arrives, so one the client
  gave up on is there too; this log, not the journal, is what a test counts;
* ``POST /_staging/faults`` — arm a fault: ``{"target": "drive", "op": "files.update",
  "kind": "fail_before_commit" | "drop_after_commit" | "delay" | "throttle", "seconds": 1.5,
  "times": 1}`` (``throttle``: the provider's throttled answer, staging/throttle.py, which a
  target's ``throttle_rate`` switch also gives to that share of its requests); ``GET`` lists
  the armed ones;
* ``POST /_staging/tokens`` — ``{"token": "t", "target": "drive", "scopes": [...],
  "client"?: "other-app", "account"?: "bob"}`` adds a token (``client`` is the OAuth client it
  was issued to, :data:`DEFAULT_CLIENT` unless given; ``account`` the mailbox, Drive user or
  Stripe account it is bound to, :data:`DEFAULT_ACCOUNT` unless given);
  ``POST /_staging/tokens/{token}/revoke`` revokes one; ``{"token": "t", "like": "base",
  "expires_in"?: 900}`` mints a token with the target, scopes, client and account of the live
  token ``base``, valid for ``expires_in`` seconds and never longer than ``base`` (the grant
  broker's per-task tokens);
* the OAuth token endpoints of staging/oauth issue tokens that expire (Google's ``/token``,
  Microsoft's ``/{tenant}/oauth2/v2.0/token``);
* ``GET  /_staging/switches`` — every target's behaviour switches (below) with their value,
  default, worst case and the documentation each cites; ``POST /_staging/switches``
  ``{"target": "graph", "name": "submitted_stays_in_drafts_s", "value": 30}`` sets one, and
  ``{"worst": true}`` (optionally with ``"target"``) sets every switch to its worst case;
* ``POST /_staging/reset`` — forget all state, faults and tokens except the default tokens;
  switches go back to the server's baseline (their defaults, or their worst cases for a server
  started with ``Staging(..., worst_case=True)``).

A *switch* is a behaviour of the real provider that is documented (or observed) but less
convenient than the emulator's default: a message that stays in Drafts after its send was
accepted, a clock that disagrees with ours, metadata hidden from a restricted key. Each target
declares its switches as :class:`Switch` values with the worst case the provider documents, so a
test (or ``tidemark chaos``) can hold Tidemark to that worst case instead of the usual one.

A target module (``staging/drive.py`` …) subclasses ``Target`` and adds its routes.
"""

from __future__ import annotations

import asyncio
import random
import ssl
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from aiohttp import web

FAULT_KINDS = ("fail_before_commit", "drop_after_commit", "delay", "throttle")
DEFAULT_CLIENT = "tidemark"  # the OAuth client of every default token
DEFAULT_ACCOUNT = "default"  # the account (mailbox, Drive user, Stripe account) of default tokens


@dataclass
class Fault:
    target: str
    op: str
    kind: str
    seconds: float = 0.0
    times: int = 1


@dataclass(frozen=True)
class Switch:
    """A provider behaviour the emulator can show on demand.

    ``default`` is the emulator's usual (convenient) behaviour; ``worst`` the provider's
    documented worst case; ``choices`` the values allowed (``None``: any JSON number);
    ``doc`` says what the provider documents and where."""

    name: str
    default: Any
    worst: Any
    doc: str
    choices: tuple[Any, ...] | None = None

    def check(self, value: Any) -> Any:
        if self.choices is not None:
            if value not in self.choices:
                raise ValueError(f"switch {self.name}: {value!r} is not one of "
                                 f"{', '.join(map(repr, self.choices))}")
        elif isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"switch {self.name}: {value!r} is not a number")
        return value


@dataclass
class Token:
    token: str
    target: str
    scopes: list[str]
    revoked: bool = False
    # The OAuth client id the token was issued to. Drive keeps appProperties per client;
    # Stripe and Graph ignore it.
    client: str = DEFAULT_CLIENT
    # The account the token is bound to: a mailbox, a Drive user, a Stripe account. A target
    # that keeps data per account serves a token only its own account's data.
    account: str = DEFAULT_ACCOUNT
    expires_at: float | None = None  # time.monotonic() after which the token is refused
    parent: str | None = None  # minted like this token: revoking the parent revokes it too


MAX_CALLS = 200_000  # token log entries kept (Staging.calls)


@dataclass(frozen=True)
class TokenCall:
    """One request a target authorized (or refused), with the bearer token it presented."""

    target: str
    method: str
    path: str
    token: str
    allowed: bool


@dataclass
class WriteRequest:
    target: str
    method: str
    route: str
    path: str
    key: str | None
    status: int | None = None
    replayed: bool = False
    at: float = field(default_factory=time.time)
    done_at: float | None = None


@dataclass
class Effect:
    target: str
    op: str
    key: str | None
    detail: dict[str, Any]
    at: float = field(default_factory=time.time)


class ResponseDropped(Exception):
    """Raised after the connection was closed on purpose, so no response is written."""


class Target:
    """One emulated provider.

    Subclasses set ``name``, ``default_tokens`` and implement ``routes``, ``reset`` and
    ``error`` (the provider's own error body).

    Handlers may ``raise Reply(self.error(...))`` to answer early with a provider error."""

    name: str = ""
    default_tokens: tuple[Token, ...] = ()
    switches: tuple[Switch, ...] = ()  # the provider behaviours this target can show

    def __init__(self) -> None:
        self.staging: Staging  # set by Staging.add
        self.switch_values: dict[str, Any] = {s.name: s.default for s in self.switches}

    def switch(self, name: str) -> Any:
        """The current value of one of this target's switches."""
        return self.switch_values[name]

    def set_switch(self, name: str, value: Any) -> None:
        found = [s for s in self.switches if s.name == name]
        if not found:
            raise ValueError(f"target {self.name} has no switch {name!r}")
        self.switch_values[name] = found[0].check(value)

    def routes(self) -> Iterable[web.RouteDef]:
        return ()

    def reset(self) -> None:
        """Forgets the target's own state."""

    def error(self, status: int, code: str, message: str) -> web.Response:
        return web.json_response({"error": {"code": code, "message": message}}, status=status)

    # Helpers for handlers ------------------------------------------------------------------

    def authorize(self, request: web.Request, *scopes: str) -> Token:
        """Returns the caller's token if it is live and has one of ``scopes``.

        Otherwise raises the provider's 401/403 as an HTTP exception."""
        return self.staging.authorize(self, request, scopes)

    async def before_write(self, request: web.Request, op: str) -> Fault | None:
        """Applies an armed delay or fail-before-commit fault for ``op``.

        Returns the fault so that ``after_commit`` can drop the response."""
        return await self.staging.before_write(self, op)

    def after_commit(self, request: web.Request, fault: Fault | None) -> None:
        """Closes the connection without a response if a drop-after-commit fault is armed."""
        if fault is not None and fault.kind == "drop_after_commit":
            if request.transport is not None:
                request.transport.close()
            raise ResponseDropped(f"{self.name} {fault.op}: response dropped after commit")

    def record(self, op: str, key: str | None, **detail: Any) -> None:
        self.staging.record(Effect(self.name, op, key, detail))

    def throttled(self, op: str) -> web.Response:
        """The provider's answer to a throttled request.

        A target overrides it with what its provider documents: staging/throttle.py."""
        return self.error(429, "throttled", "Too many requests")

    def throttles_now(self) -> bool:
        """Whether this request is one of the share ``throttle_rate`` throttles."""
        rate = self.switch_values.get("throttle_rate") or 0
        return bool(rate) and random.random() < rate


class Staging:
    """Shared state of all targets in one server.

    Handlers run on the server's event loop; the lock makes direct reads from test threads safe."""

    def __init__(self, targets: Iterable[Target], worst_case: bool = False) -> None:
        # reset() puts every switch back here: the defaults, or the documented worst cases.
        self.worst_case = worst_case
        self.lock = threading.Lock()
        self.targets: dict[str, Target] = {}
        self.effects: list[Effect] = []
        self.requests: list[WriteRequest] = []
        # Every authorization a target asked for: which token made which call, and whether it
        # was let through. Tests read it to see that a task's calls present its grant.
        self.calls: list[TokenCall] = []
        self.faults: list[Fault] = []
        self.tokens: dict[str, Token] = {}
        from staging.oauth import OAuth  # it builds on this module's Token
        self.oauth = OAuth(self)
        for t in targets:
            t.staging = self
            self.targets[t.name] = t
        self.reset()

    # state -----------------------------------------------------------------------------------

    def reset(self) -> None:
        with self.lock:
            self.effects.clear()
            self.requests.clear()
            self.calls.clear()
            self.faults.clear()
            self.tokens = {tok.token: Token(tok.token, tok.target, list(tok.scopes),
                                            client=tok.client)
                           for t in self.targets.values() for tok in t.default_tokens}
            for t in self.targets.values():
                t.reset()
                t.switch_values = {s.name: s.worst if self.worst_case else s.default
                                   for s in t.switches}
        self.oauth.reset()

    def set_switch(self, target: str, name: str, value: Any) -> None:
        if target not in self.targets:
            raise ValueError(f"unknown target {target!r}")
        with self.lock:
            self.targets[target].set_switch(name, value)

    def set_worst(self, target: str | None = None) -> None:
        """Every switch (of one target, or of all) to the provider's documented worst case."""
        if target is not None and target not in self.targets:
            raise ValueError(f"unknown target {target!r}")
        with self.lock:
            for t in self.targets.values():
                if target is None or t.name == target:
                    t.switch_values = {s.name: s.worst for s in t.switches}

    def switch_list(self) -> list[dict[str, Any]]:
        with self.lock:
            return [{"target": t.name, "name": s.name, "value": t.switch_values[s.name],
                     "default": s.default, "worst": s.worst, "choices": s.choices, "doc": s.doc}
                    for t in self.targets.values() for s in t.switches]

    def record(self, effect: Effect) -> None:
        with self.lock:
            self.effects.append(effect)

    def effects_of(self, target: str | None = None, op: str | None = None) -> list[Effect]:
        with self.lock:
            return [e for e in self.effects
                    if (target is None or e.target == target) and (op is None or e.op == op)]

    def requests_of(self, target: str | None = None) -> list[WriteRequest]:
        with self.lock:
            return [r for r in self.requests if target is None or r.target == target]

    def in_flight(self) -> list[WriteRequest]:
        """The write requests received and not yet answered.

        They are held by a delay, or being worked on."""
        with self.lock:
            return [r for r in self.requests if r.status is None]

    def arm(self, fault: Fault) -> None:
        if fault.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {fault.kind!r}; one of {', '.join(FAULT_KINDS)}")
        if fault.target not in self.targets:
            raise ValueError(f"unknown target {fault.target!r}")
        with self.lock:
            self.faults.append(fault)

    def _take_fault(self, target: str, op: str) -> Fault | None:
        with self.lock:
            for f in self.faults:
                if f.target == target and f.op == op:
                    f.times -= 1
                    if f.times <= 0:
                        self.faults.remove(f)
                    return f
        return None

    def add_token(self, token: Token) -> None:
        with self.lock:
            self.tokens[token.token] = token

    def revoke(self, token: str) -> bool:
        with self.lock:
            tok = self.tokens.get(token)
            if tok is None:
                return False
            tok.revoked = True
            return True

    # used by Target helpers ---------------------------------------------------------------

    def authorize(self, target: Target, request: web.Request, scopes: tuple[str, ...]) -> Token:
        header = request.headers.get("Authorization", "")
        value = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else ""
        try:
            tok = self._authorize(target, value, scopes)
        except Reply:
            self._log_call(target, request, value, False)
            raise
        self._log_call(target, request, value, True)
        return tok

    def _log_call(self, target: Target, request: web.Request, token: str, allowed: bool) -> None:
        with self.lock:
            if len(self.calls) >= MAX_CALLS:  # a long-lived dev server keeps the recent ones
                del self.calls[:MAX_CALLS // 2]
            self.calls.append(TokenCall(target.name, request.method, request.path, token,
                                        allowed))

    def calls_of(self, target: str | None = None) -> list[TokenCall]:
        with self.lock:
            return [c for c in self.calls if target is None or c.target == target]

    def _authorize(self, target: Target, value: str, scopes: tuple[str, ...]) -> Token:
        with self.lock:
            tok = self.tokens.get(value)
        if tok is None or tok.target != target.name:
            raise Reply(target.error(401, "unauthenticated", "invalid or missing credentials"))
        if tok.revoked:
            raise Reply(target.error(401, "revoked", "the access token has been revoked"))
        with self.lock:
            parent = self.tokens.get(tok.parent) if tok.parent else None
        if parent is not None and parent.revoked:
            raise Reply(target.error(401, "revoked", "the access token has been revoked"))
        expiry = [t.expires_at for t in (tok, parent) if t is not None and t.expires_at]
        if expiry and time.monotonic() > min(expiry):  # a derived token never outlives its base
            raise Reply(target.error(401, "expired", "the access token has expired"))
        if scopes and not set(scopes) & set(tok.scopes):
            raise Reply(target.error(403, "insufficient_scope",
                                        f"requires one of the scopes {', '.join(scopes)}"))
        return tok

    async def before_write(self, target: Target, op: str) -> Fault | None:
        fault = self._take_fault(target.name, op)
        if (fault is not None and fault.kind == "throttle") or target.throttles_now():
            raise Reply(target.throttled(op))
        if fault is None:
            return None
        if fault.kind == "delay":
            await asyncio.sleep(fault.seconds)
        elif fault.kind == "fail_before_commit":
            raise Reply(target.error(503, "backend_error", "the service is unavailable"))
        return fault

    # HTTP --------------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(middlewares=[_drop_middleware])
        app.add_routes([
            web.get("/_staging/effects", self._h_effects),
            web.get("/_staging/requests", self._h_requests),
            web.get("/_staging/faults", self._h_faults),
            web.post("/_staging/faults", self._h_arm),
            web.post("/_staging/tokens", self._h_add_token),
            web.post("/_staging/tokens/{token}/revoke", self._h_revoke),
            web.get("/_staging/switches", self._h_switches),
            web.post("/_staging/switches", self._h_set_switch),
            web.post("/_staging/reset", self._h_reset),
        ])
        for t in self.targets.values():
            app.add_routes([self._logged(t, r) if isinstance(r, web.RouteDef) else r
                            for r in t.routes()])
        app.add_routes(self.oauth.routes())  # last: its Microsoft routes start with {tenant}
        return app

    def _logged(self, target: Target, route: web.RouteDef) -> web.RouteDef:
        """``route`` with every write request it receives kept in the request log."""
        if route.method in ("GET", "HEAD") or route.path.startswith("/_staging/"):
            return route  # reads, and the test's own control endpoints
        handler = route.handler

        async def logged(request: web.Request) -> web.StreamResponse:
            entry = WriteRequest(target.name, request.method, route.path, request.path,
                                 request.headers.get("Idempotency-Key"))
            with self.lock:
                self.requests.append(entry)
            status, replayed = 0, False
            try:
                response = await handler(request)
                status = response.status
                replayed = response.headers.get("Idempotent-Replayed") == "true"
                return response
            except Reply as r:
                status = r.response.status
                replayed = r.response.headers.get("Idempotent-Replayed") == "true"
                raise
            except web.HTTPException as e:
                status = e.status
                raise
            finally:
                with self.lock:
                    entry.status, entry.replayed, entry.done_at = status, replayed, time.time()

        return web.RouteDef(route.method, route.path, logged, route.kwargs)

    async def _h_effects(self, request: web.Request) -> web.Response:
        effects = self.effects_of(request.query.get("target"), request.query.get("op"))
        return web.json_response([asdict(e) for e in effects])

    async def _h_requests(self, request: web.Request) -> web.Response:
        requests = self.requests_of(request.query.get("target"))
        return web.json_response([asdict(r) for r in requests])

    async def _h_faults(self, request: web.Request) -> web.Response:
        with self.lock:
            return web.json_response([asdict(f) for f in self.faults])

    async def _h_arm(self, request: web.Request) -> web.Response:
        body = await request.json()
        try:
            self.arm(Fault(**body))
        except (TypeError, ValueError) as e:
            return web.json_response({"error": str(e)}, status=400)
        return web.json_response({"armed": body})

    async def _h_add_token(self, request: web.Request) -> web.Response:
        body = await request.json()
        if "like" in body:
            return self._mint_like(body)
        try:
            self.add_token(Token(body["token"], body["target"], list(body.get("scopes", [])),
                                 client=str(body.get("client", DEFAULT_CLIENT)),
                                 account=str(body.get("account", DEFAULT_ACCOUNT))))
        except KeyError as e:
            return web.json_response({"error": f"missing {e.args[0]}"}, status=400)
        return web.json_response({"added": body["token"]})

    def _mint_like(self, body: dict[str, Any]) -> web.Response:
        with self.lock:
            base = self.tokens.get(str(body["like"]))
        if base is None or base.revoked or not body.get("token"):
            return web.json_response({"error": "no live base token"}, status=400)
        ttl = body.get("expires_in")
        expires = None if ttl is None else time.monotonic() + float(ttl)
        if base.expires_at is not None:
            # A token derived from another never outlives it (as Google's downscoped tokens,
            # which carry their source token's expiry): an expired base shows in its grants.
            expires = base.expires_at if expires is None else min(expires, base.expires_at)
        self.add_token(Token(str(body["token"]), base.target, list(base.scopes),
                             client=base.client, account=base.account, parent=base.token,
                             expires_at=expires))
        return web.json_response({"added": body["token"]})

    async def _h_revoke(self, request: web.Request) -> web.Response:
        if not self.revoke(request.match_info["token"]):
            return web.json_response({"error": "no such token"}, status=404)
        return web.json_response({"revoked": True})

    async def _h_switches(self, request: web.Request) -> web.Response:
        return web.json_response(self.switch_list())

    async def _h_set_switch(self, request: web.Request) -> web.Response:
        body = await request.json()
        try:
            if body.get("worst") is True:
                self.set_worst(body.get("target"))
            else:
                self.set_switch(str(body["target"]), str(body["name"]), body["value"])
        except KeyError as e:
            return web.json_response({"error": f"missing {e.args[0]}"}, status=400)
        except ValueError as e:
            return web.json_response({"error": str(e)}, status=400)
        return web.json_response(self.switch_list())

    async def _h_reset(self, request: web.Request) -> web.Response:
        self.reset()
        return web.json_response({"reset": True})


class Reply(Exception):
    """Carries a finished response out of a handler (provider errors raised from helpers)."""

    def __init__(self, response: web.Response) -> None:
        super().__init__(response.status)
        self.response = response


@web.middleware
async def _drop_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)
    except Reply as r:
        return r.response
    except ResponseDropped:
        # The transport is closed already; raising CancelledError stops aiohttp from writing.
        raise asyncio.CancelledError() from None


class StagingServer:
    """Runs a Staging app on its own event loop in a daemon thread (for tests and the CLI).

    Use as a context manager; ``url`` is ``http://127.0.0.1:<port>``.
    """

    def __init__(self, staging: Staging, host: str = "127.0.0.1", port: int = 0,
                 tls: ssl.SSLContext | None = None, tls_port: int = 0) -> None:
        self.staging = staging
        self.host = host
        self.port = port
        # A second listener with TLS, serving the same app: msal accepts only an https
        # authority, so the Microsoft token endpoint is reached there (``tls_url``).
        self.tls = tls
        self.tls_port = tls_port
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="staging-server")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def tls_url(self) -> str:
        if self.tls is None:
            raise RuntimeError("this staging server has no TLS listener")
        return f"https://{self.host}:{self.tls_port}"

    def start(self) -> StagingServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    async def _start(self) -> None:
        self._runner = web.AppRunner(self.staging.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = site._server
        assert isinstance(server, asyncio.Server) and server.sockets
        self.port = server.sockets[0].getsockname()[1]
        if self.tls is not None:
            secure = web.TCPSite(self._runner, self.host, self.tls_port, ssl_context=self.tls)
            await secure.start()
            tls_server = secure._server
            assert isinstance(tls_server, asyncio.Server) and tls_server.sockets
            self.tls_port = tls_server.sockets[0].getsockname()[1]

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def __enter__(self) -> StagingServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
