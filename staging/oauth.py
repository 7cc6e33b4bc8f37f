"""OAuth token endpoints in the shape of Google's and Microsoft's.

They issue staging bearer tokens (staging/core ``Token``) that expire, so that refreshing
credentials are exercised for real.

Google (``https://oauth2.googleapis.com/token``):

* ``POST /token`` form ``grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer&assertion=…``:
  the assertion is an RS256 JWT a service account signed (``iss`` its email, ``scope``, ``aud``
  this endpoint, ``iat``/``exp`` at most an hour apart, optional ``sub``: the user it acts for
  by domain-wide delegation); the signature is checked with the public key registered for the
  service account. The token's account is ``sub`` (else the service account's email);
* ``POST /token`` form ``grant_type=refresh_token&client_id&client_secret&refresh_token[&scope]``:
  a registered refresh token; ``scope`` may narrow, never widen, what it was granted.

  The target (drive or gmail) follows from the scopes; both in one token is refused
  (``invalid_scope``). Errors: 400 ``invalid_grant`` / ``invalid_scope``, 401 ``invalid_client``,
  as Google answers.

Microsoft identity platform (``https://login.microsoftonline.com/{tenant}/oauth2/v2.0/token``):

* ``GET /{tenant}/v2.0/.well-known/openid-configuration`` — msal's tenant discovery;
* ``POST /{tenant}/oauth2/v2.0/token`` ``grant_type=client_credentials`` with ``client_secret``
  or a certificate's ``client_assertion`` (RS256 JWT, ``x5t`` header, checked with the
  registered certificate's key), ``scope=https://graph.microsoft.com/.default``: an app-only
  Graph token with the app's registered roles, reaching every mailbox of the tenant through
  ``/users/{id}`` (never ``/me``);
* ``grant_type=refresh_token`` — a registered delegated refresh token: a token for its account
  (``/me``) with the requested scopes (``offline_access``, ``openid``, ``profile`` ignored),
  and a new refresh token.

msal insists on an https authority, so this endpoint is reached over the staging server's TLS
listener (StagingServer ``tls``).

Control endpoints (JSON):

* ``POST /_staging/oauth/settings`` ``{"lifetime_s": 2}`` — how long issued tokens live
  (default 3600, as Google's and Microsoft's do);
* ``POST /_staging/oauth/google/service_accounts`` ``{"client_email", "public_key"` (PEM),
  ``"client"?}`` — ``client`` is the OAuth client the tokens belong to (Drive keeps
  appProperties per client), :data:`staging.core.DEFAULT_CLIENT` unless given;
* ``POST /_staging/oauth/google/refresh_tokens`` ``{"refresh_token", "client_id",
  "client_secret", "account", "scopes", "client"?}``;
* ``POST /_staging/oauth/microsoft/apps`` ``{"tenant", "client_id", "client_secret"?,
  "certificate"? (PEM), "roles"}``;
* ``POST /_staging/oauth/microsoft/refresh_tokens`` ``{"tenant", "client_id",
  "refresh_token", "account", "scopes"}``;
* ``POST /_staging/oauth/revoke`` ``{"refresh_token"}`` — as a person revoking consent: the
  refresh token is refused from then on (tokens already issued live until they expire);
* ``POST /_staging/oauth/expire`` — every access token issued here expires now, ahead of the
  ``expires_in`` it was issued with (a clock skewed against the provider's, a token the
  provider cut short): the next request with one gets 401, as an expired token does;
* ``GET /_staging/oauth/issued`` — every token issued: ``{token_kind, target, account, scopes,
  grant_type}`` without the token itself, in order.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import jwt
from aiohttp import web
from cryptography import x509

from staging.core import DEFAULT_CLIENT, Token

if TYPE_CHECKING:
    from staging.core import Staging

JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
CLIENT_ASSERTION = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
DEFAULT_LIFETIME_S = 3600.0
GRAPH_RESOURCE = "https://graph.microsoft.com/"
APP_ONLY = "app-only"  # Token.account of an app-only Graph token: the whole tenant
IGNORED_MS_SCOPES = {"offline_access", "openid", "profile", "email"}


def google_target(scopes: list[str]) -> str | None:
    """drive or gmail, from the scopes asked for; None when mixed or unknown."""
    kinds = set()
    for s in scopes:
        if s.startswith("https://www.googleapis.com/auth/drive"):
            kinds.add("drive")
        elif s.startswith("https://www.googleapis.com/auth/gmail") or \
                s == "https://mail.google.com/":
            kinds.add("gmail")
        else:
            return None
    return kinds.pop() if len(kinds) == 1 else None


@dataclass
class Grant:
    """A registered refresh token."""

    client_id: str
    client_secret: str
    account: str
    scopes: list[str]
    client: str = DEFAULT_CLIENT
    tenant: str = ""
    revoked: bool = False


@dataclass
class App:
    tenant: str
    client_id: str
    roles: list[str]
    client_secret: str | None = None
    certificate: Any = None  # cryptography x509.Certificate


@dataclass
class OAuth:
    staging: Staging
    lifetime_s: float = DEFAULT_LIFETIME_S
    service_accounts: dict[str, tuple[Any, str]] = field(default_factory=dict)  # email->(key,cl)
    refresh_tokens: dict[str, Grant] = field(default_factory=dict)
    apps: dict[tuple[str, str], App] = field(default_factory=dict)
    issued: list[dict[str, Any]] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)  # every access token issued, in order
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self) -> None:
        with self.lock:
            self.lifetime_s = DEFAULT_LIFETIME_S
            self.service_accounts.clear()
            self.refresh_tokens.clear()
            self.apps.clear()
            self.issued.clear()
            self.tokens.clear()

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/token", self._h_google_token),
            web.get("/{tenant}/v2.0/.well-known/openid-configuration", self._h_openid),
            web.post("/{tenant}/oauth2/v2.0/token", self._h_ms_token),
            web.post("/_staging/oauth/settings", self._h_settings),
            web.post("/_staging/oauth/google/service_accounts", self._h_add_sa),
            web.post("/_staging/oauth/google/refresh_tokens", self._h_add_refresh),
            web.post("/_staging/oauth/microsoft/apps", self._h_add_app),
            web.post("/_staging/oauth/microsoft/refresh_tokens", self._h_add_refresh),
            web.post("/_staging/oauth/revoke", self._h_revoke),
            web.post("/_staging/oauth/expire", self._h_expire),
            web.get("/_staging/oauth/issued", self._h_issued),
        ]

    # issuing ----------------------------------------------------------------------------------

    def _issue(self, kind: str, target: str, account: str, scopes: list[str], client: str,
               grant_type: str, prefix: str) -> tuple[str, float]:
        token = prefix + secrets.token_urlsafe(24)
        with self.lock:
            lifetime = self.lifetime_s
            self.tokens.append(token)
            self.issued.append({"token_kind": kind, "target": target, "account": account,
                                "scopes": scopes, "grant_type": grant_type, "at": time.time()})
        self.staging.add_token(Token(token, target, scopes, client=client, account=account,
                                     expires_at=time.monotonic() + lifetime))
        return token, lifetime

    # Google -----------------------------------------------------------------------------------

    async def _h_google_token(self, request: web.Request) -> web.Response:
        form = await request.post()
        grant_type = str(form.get("grant_type", ""))
        if grant_type == JWT_BEARER:
            return self._google_jwt(request, str(form.get("assertion", "")))
        if grant_type == "refresh_token":
            return self._google_refresh(form)
        return _oauth_error(400, "unsupported_grant_type", f"Invalid grant_type: {grant_type}")

    def _google_jwt(self, request: web.Request, assertion: str) -> web.Response:
        try:
            unverified = jwt.decode(assertion, options={"verify_signature": False})
        except jwt.PyJWTError:
            return _oauth_error(400, "invalid_grant", "Invalid JWT: malformed assertion")
        email = str(unverified.get("iss", ""))
        with self.lock:
            known = self.service_accounts.get(email)
        if known is None:
            return _oauth_error(401, "invalid_client", "The OAuth client was not found.")
        key, client = known
        try:
            claims = jwt.decode(assertion, key, algorithms=["RS256"],
                                options={"verify_aud": False, "require": ["iat", "exp"]})
        except jwt.InvalidSignatureError:
            return _oauth_error(400, "invalid_grant", "Invalid JWT Signature.")
        except jwt.PyJWTError as e:
            return _oauth_error(400, "invalid_grant", f"Invalid JWT: {e}")
        if not str(claims.get("aud", "")).endswith("/token"):
            return _oauth_error(400, "invalid_grant", "Invalid JWT: Failed audience check.")
        if float(claims["exp"]) - float(claims["iat"]) > 3600:
            return _oauth_error(400, "invalid_grant", "Invalid JWT: Token must be a short-lived "
                                "token (60 minutes) and in a reasonable timeframe.")
        scopes = str(claims.get("scope", "")).split()
        target = google_target(scopes)
        if target is None:
            return _oauth_error(400, "invalid_scope", "Invalid OAuth scope or ID token audience "
                                "provided.")
        account = str(claims.get("sub") or email)
        token, lifetime = self._issue("google", target, account, scopes, client, JWT_BEARER,
                                      "ya29.staging-")
        return web.json_response({"access_token": token, "expires_in": int(lifetime) or 1,
                                  "token_type": "Bearer"})

    def _google_refresh(self, form: Any) -> web.Response:
        with self.lock:
            grant = self.refresh_tokens.get(str(form.get("refresh_token", "")))
        if grant is None or grant.tenant:
            return _oauth_error(400, "invalid_grant", "Bad Request")
        if (str(form.get("client_id", "")), str(form.get("client_secret", ""))) != \
                (grant.client_id, grant.client_secret):
            return _oauth_error(401, "invalid_client", "The OAuth client was not found.")
        if grant.revoked:
            return _oauth_error(400, "invalid_grant", "Token has been expired or revoked.")
        asked = str(form.get("scope", "")).split() or grant.scopes
        if not set(asked) <= set(grant.scopes):
            return _oauth_error(400, "invalid_scope", "Bad Request")
        target = google_target(asked)
        if target is None:
            return _oauth_error(400, "invalid_scope", "Bad Request")
        token, lifetime = self._issue("google", target, grant.account, asked, grant.client,
                                      "refresh_token", "ya29.staging-")
        return web.json_response({"access_token": token, "expires_in": int(lifetime) or 1,
                                  "scope": " ".join(asked), "token_type": "Bearer"})

    # Microsoft --------------------------------------------------------------------------------

    async def _h_openid(self, request: web.Request) -> web.Response:
        tenant = request.match_info["tenant"]
        base = f"{request.scheme}://{request.host}/{tenant}"
        return web.json_response({
            "token_endpoint": f"{base}/oauth2/v2.0/token",
            "authorization_endpoint": f"{base}/oauth2/v2.0/authorize",
            "device_authorization_endpoint": f"{base}/oauth2/v2.0/devicecode",
            "issuer": f"{base}/v2.0",
            "token_endpoint_auth_methods_supported": ["client_secret_post",
                                                      "private_key_jwt",
                                                      "client_secret_basic"]})

    async def _h_ms_token(self, request: web.Request) -> web.Response:
        tenant = request.match_info["tenant"]
        form = await request.post()
        grant_type = str(form.get("grant_type", ""))
        if grant_type == "client_credentials":
            return self._ms_client_credentials(tenant, form)
        if grant_type == "refresh_token":
            return self._ms_refresh(tenant, form)
        return _ms_error(400, "unsupported_grant_type",
                         f"AADSTS70003: The app requested an unsupported grant type "
                         f"'{grant_type}'.")

    def _ms_client_credentials(self, tenant: str, form: Any) -> web.Response:
        client_id = str(form.get("client_id", ""))
        with self.lock:
            app = self.apps.get((tenant, client_id))
        if app is None:
            return _ms_error(400, "unauthorized_client", f"AADSTS700016: Application with "
                             f"identifier '{client_id}' was not found in the directory "
                             f"'{tenant}'.")
        if not self._ms_client_ok(app, form):
            return _ms_error(401, "invalid_client", "AADSTS7000215: Invalid client secret "
                             "provided.")
        if str(form.get("scope", "")).split() != [GRAPH_RESOURCE + ".default"]:
            return _ms_error(400, "invalid_scope", "AADSTS1002012: The provided value for scope "
                             "is not valid. Client credential flows must have a scope value "
                             "with /.default suffixed to the resource identifier.")
        token, lifetime = self._issue("microsoft", "graph", APP_ONLY, list(app.roles),
                                      client_id, "client_credentials", "eyJ0.staging-")
        return web.json_response({"token_type": "Bearer", "expires_in": int(lifetime) or 1,
                                  "ext_expires_in": int(lifetime) or 1, "access_token": token})

    def _ms_client_ok(self, app: App, form: Any) -> bool:
        if form.get("client_secret") is not None:
            return app.client_secret is not None and \
                secrets.compare_digest(str(form["client_secret"]), app.client_secret)
        if form.get("client_assertion_type") == CLIENT_ASSERTION and app.certificate is not None:
            try:
                claims = jwt.decode(str(form.get("client_assertion", "")),
                                    app.certificate.public_key(), algorithms=["RS256", "PS256"],
                                    options={"verify_aud": False})
            except jwt.PyJWTError:
                return False
            return claims.get("iss") == app.client_id == claims.get("sub")
        return False

    def _ms_refresh(self, tenant: str, form: Any) -> web.Response:
        old = str(form.get("refresh_token", ""))
        with self.lock:
            grant = self.refresh_tokens.get(old)
        if grant is None or grant.tenant != tenant or grant.revoked or \
                grant.client_id != str(form.get("client_id", "")):
            return _ms_error(400, "invalid_grant", "AADSTS70000: The provided value for the "
                             "'refresh_token' is not valid.")
        asked = [s.removeprefix(GRAPH_RESOURCE) for s in str(form.get("scope", "")).split()
                 if s not in IGNORED_MS_SCOPES]
        scopes = grant.scopes if asked in ([], [".default"]) else asked
        if not set(scopes) <= set(grant.scopes):
            return _ms_error(400, "invalid_grant", "AADSTS65001: The user or administrator has "
                             "not consented to use the application.")
        token, lifetime = self._issue("microsoft", "graph", grant.account, scopes,
                                      grant.client_id, "refresh_token", "eyJ0.staging-")
        new = "0.staging-rt-" + secrets.token_urlsafe(24)
        with self.lock:  # the old one stays valid too, as Microsoft's do until they lapse
            self.refresh_tokens[new] = grant
        return web.json_response({
            "token_type": "Bearer", "scope": " ".join(GRAPH_RESOURCE + s for s in scopes),
            "expires_in": int(lifetime) or 1, "ext_expires_in": int(lifetime) or 1,
            "access_token": token, "refresh_token": new})

    # control ----------------------------------------------------------------------------------

    async def _h_settings(self, request: web.Request) -> web.Response:
        body = await request.json()
        try:
            lifetime = float(body["lifetime_s"])
        except (KeyError, TypeError, ValueError):
            return web.json_response({"error": "lifetime_s (seconds) is required"}, status=400)
        if lifetime <= 0:
            return web.json_response({"error": "lifetime_s must be positive"}, status=400)
        with self.lock:
            self.lifetime_s = lifetime
        return web.json_response({"lifetime_s": lifetime})

    async def _h_add_sa(self, request: web.Request) -> web.Response:
        body = await request.json()
        try:
            key = _public_key(str(body["public_key"]))
            email = str(body["client_email"])
        except (KeyError, ValueError) as e:
            return web.json_response({"error": f"bad service account: {e}"}, status=400)
        with self.lock:
            self.service_accounts[email] = (key, str(body.get("client", DEFAULT_CLIENT)))
        return web.json_response({"added": email})

    async def _h_add_refresh(self, request: web.Request) -> web.Response:
        body = await request.json()
        tenant = str(body.get("tenant", "")) if request.path.endswith(
            "/microsoft/refresh_tokens") else ""
        try:
            grant = Grant(str(body["client_id"]), str(body.get("client_secret", "")),
                          str(body["account"]), [str(s) for s in body["scopes"]],
                          client=str(body.get("client", DEFAULT_CLIENT)), tenant=tenant)
            with self.lock:
                self.refresh_tokens[str(body["refresh_token"])] = grant
        except (KeyError, TypeError) as e:
            return web.json_response({"error": f"missing {e}"}, status=400)
        return web.json_response({"added": True})

    async def _h_add_app(self, request: web.Request) -> web.Response:
        body = await request.json()
        try:
            cert = x509.load_pem_x509_certificate(str(body["certificate"]).encode()) \
                if body.get("certificate") else None
            app = App(str(body["tenant"]), str(body["client_id"]),
                      [str(r) for r in body["roles"]], body.get("client_secret"), cert)
        except (KeyError, TypeError, ValueError) as e:
            return web.json_response({"error": f"bad app: {e}"}, status=400)
        with self.lock:
            self.apps[(app.tenant, app.client_id)] = app
        return web.json_response({"added": app.client_id})

    async def _h_revoke(self, request: web.Request) -> web.Response:
        body = await request.json()
        with self.lock:
            grant = self.refresh_tokens.get(str(body.get("refresh_token", "")))
            if grant is None:
                return web.json_response({"error": "no such refresh token"}, status=404)
            grant.revoked = True  # every refresh token of this consent shares the object
        return web.json_response({"revoked": True})

    async def _h_expire(self, request: web.Request) -> web.Response:
        now = time.monotonic()
        with self.lock:
            issued = list(self.tokens)
        with self.staging.lock:
            for t in issued:
                tok = self.staging.tokens.get(t)
                if tok is not None:
                    tok.expires_at = min(tok.expires_at or now, now)
        return web.json_response({"expired": len(issued)})

    async def _h_issued(self, request: web.Request) -> web.Response:
        with self.lock:
            return web.json_response(list(self.issued))


def _public_key(pem: str) -> Any:
    from cryptography.hazmat.primitives import serialization
    if "CERTIFICATE" in pem:
        return x509.load_pem_x509_certificate(pem.encode()).public_key()
    return serialization.load_pem_public_key(pem.encode())


def _oauth_error(status: int, error: str, description: str) -> web.Response:
    return web.json_response({"error": error, "error_description": description}, status=status)


def _ms_error(status: int, error: str, description: str) -> web.Response:
    return web.json_response({"error": error, "error_description": description,
                              "error_codes": [int(description[6:description.index(":")])]
                              if description.startswith("AADSTS") else [],
                              "timestamp": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime()),
                              "trace_id": secrets.token_hex(16),
                              "correlation_id": secrets.token_hex(16)}, status=status)
