"""Credential sources: where a target's base access token comes from, kept valid.

A source hands out the worker's current access token for one target and one scope (write or
read) and refreshes it before it expires; the grant broker (tidemark.grants) asks it for the
base token on every call and is still the one place that hands credentials to a request.

* :class:`StaticToken` — a bearer token from configuration (staging, Stripe restricted keys,
  a token someone else keeps fresh). It cannot be renewed.
* :class:`GoogleSource` — google-auth credentials: a service-account key with domain-wide
  delegation (``subject`` is the mailbox or Drive user), or an authorized-user file with a
  refresh token. The refresh goes to the ``token_uri`` the file names.
* :class:`AzureSource` — an azure-identity ``TokenCredential`` (client secret or certificate,
  app-only) for Microsoft Graph.
* :class:`MsalRefreshSource` — a delegated Microsoft refresh token, redeemed with msal (the
  library azure-identity is built on; azure-identity has no public refresh-token credential).

A refreshing source renews a token once less than a quarter of its lifetime, or five minutes,
is left (whichever is less), so a request never leaves with a token about to lapse; ``renew``
forces a refresh after the provider refused a token (a token revoked or expired early), unless
another thread renewed it already. Sources are thread-safe. A refresh the provider refuses
(revoked refresh token, deleted key) raises ``Unauthorized``: a person must restore the
credential. A refresh that could not reach the provider raises ``TargetUnavailable``.
Secrets are never logged; ``describe`` names the credential without them.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from tidemark.errors import ConfigError, TargetUnavailable, Unauthorized

REFRESH_MARGIN_S = 300.0  # renew at most this long before expiry ...
REFRESH_FRACTION = 0.25  # ... or when this share of the lifetime is left, if that is less
REFRESH_TIMEOUT_S = 10.0  # one call to a token endpoint


class CredentialSource(Protocol):
    def token(self) -> str:
        """A token that is valid now (refreshed first if it is close to expiry)."""

    def renew(self, stale: str) -> str:
        """A fresh token after the provider refused ``stale``.

        Returns ``stale`` itself when this source cannot renew (a static token)."""

    def describe(self) -> str:
        """What the credential is, without any secret."""


class StaticToken:
    def __init__(self, token: str) -> None:
        self._token = token

    def token(self) -> str:
        return self._token

    def renew(self, stale: str) -> str:
        return self._token

    def describe(self) -> str:
        return "a static token"


class RefreshingSource:
    """Caches a token with its expiry and fetches a new one before it lapses."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._token: str | None = None
        self._renew_at = 0.0  # time.time() from which the token is renewed before use
        self.refreshes = 0  # how many tokens were fetched (for operators and tests)

    def _fetch(self, forced: bool) -> tuple[str, float]:
        """A new token and its expiry (seconds since the epoch).

        ``forced``: after the provider refused the current one, which a library's own cache must
        not hand out again."""
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def token(self) -> str:
        with self._lock:
            if self._token is None or time.time() >= self._renew_at:
                self._refresh()
            assert self._token is not None
            return self._token

    def renew(self, stale: str) -> str:
        with self._lock:
            if self._token is None or self._token == stale:
                self._refresh(forced=True)  # nobody renewed it since it was handed out
            assert self._token is not None
            return self._token

    def _refresh(self, forced: bool = False) -> None:
        token, expires = self._fetch(forced)
        now = time.time()
        lifetime = max(0.0, expires - now)
        self._token = token
        self._renew_at = expires - min(REFRESH_MARGIN_S, REFRESH_FRACTION * lifetime)
        self.refreshes += 1


class _TimedRequest:
    """google-auth's requests transport with a bounded timeout (its default is 120 s)."""

    def __init__(self) -> None:
        import google.auth.transport.requests
        import requests
        self._inner = google.auth.transport.requests.Request(requests.Session())

    def __call__(self, url: str, method: str = "GET", body: Any = None, headers: Any = None,
                 timeout: float | None = None, **kwargs: Any) -> Any:
        return self._inner(url, method=method, body=body, headers=headers,
                           timeout=REFRESH_TIMEOUT_S, **kwargs)


class GoogleSource(RefreshingSource):
    """google-auth credentials (service account or authorized user), refreshed by google-auth."""

    def __init__(self, credentials: Any, what: str) -> None:
        super().__init__()
        self.credentials = credentials
        self._what = what
        self._request = _TimedRequest()

    def describe(self) -> str:
        return self._what

    def _fetch(self, forced: bool) -> tuple[str, float]:
        from google.auth import exceptions
        try:
            self.credentials.refresh(self._request)
        except exceptions.TransportError as e:
            raise TargetUnavailable(f"{self._what}: the token endpoint did not answer: "
                                    f"{_first_line(e)}") from None
        except exceptions.RefreshError as e:
            if getattr(e, "retryable", False):
                raise TargetUnavailable(f"{self._what}: token refresh failed for now: "
                                        f"{_first_line(e)}") from None
            raise Unauthorized(f"{self._what}: the token endpoint refused to refresh: "
                               f"{_first_line(e)}") from None
        expiry = self.credentials.expiry  # naive UTC (google-auth's convention)
        if expiry is None:
            return str(self.credentials.token), time.time() + 3600.0
        from datetime import UTC
        return str(self.credentials.token), expiry.replace(tzinfo=UTC).timestamp()


class AzureSource(RefreshingSource):
    """An azure-identity TokenCredential asked for one scope (``…/.default`` for app-only)."""

    def __init__(self, credential: Any, scope: str, what: str) -> None:
        super().__init__()
        self.credential = credential
        self.scope = scope
        self._what = what

    def describe(self) -> str:
        return self._what

    def _fetch(self, forced: bool) -> tuple[str, float]:
        from azure.core.exceptions import ClientAuthenticationError, ServiceRequestError
        # azure-identity hands out its cached token until five minutes before expiry. After a
        # refusal, ask for a token issued from now on, the claims challenge Microsoft's
        # continuous access evaluation sends (``access_token.nbf``); msal skips its cache
        # for a claims challenge.
        claims = json.dumps({"access_token": {"nbf": {"essential": True,
                                                      "value": str(int(time.time()))}}}) \
            if forced else None
        try:
            at = self.credential.get_token(self.scope, claims=claims)
        except ServiceRequestError as e:
            raise TargetUnavailable(f"{self._what}: the token endpoint did not answer: "
                                    f"{_first_line(e)}") from None
        except ClientAuthenticationError as e:
            raise Unauthorized(f"{self._what}: the token endpoint refused: "
                               f"{_first_line(e)}") from None
        return at.token, float(at.expires_on)


class MsalRefreshSource(RefreshingSource):
    """A delegated Microsoft refresh token redeemed with msal.

    The newest refresh token the endpoint returns replaces the old one in memory (the file is never
    rewritten)."""

    def __init__(self, app: Any, refresh_token: str, scopes: Sequence[str], what: str) -> None:
        super().__init__()
        self._app = app
        self._refresh_token = refresh_token
        self._scopes = list(scopes)
        self._what = what

    def describe(self) -> str:
        return self._what

    def _fetch(self, forced: bool) -> tuple[str, float]:
        import requests
        try:
            out = self._app.acquire_token_by_refresh_token(self._refresh_token, self._scopes)
        except (requests.RequestException, OSError) as e:
            raise TargetUnavailable(f"{self._what}: the token endpoint did not answer: "
                                    f"{_first_line(e)}") from None
        if "access_token" not in out:
            raise Unauthorized(f"{self._what}: the token endpoint refused the refresh token: "
                               f"{out.get('error')}: {_first_line(out.get('error_description'))}")
        self._refresh_token = out.get("refresh_token") or self._refresh_token
        return str(out["access_token"]), time.time() + float(out.get("expires_in", 3600))


def _first_line(e: object) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


# Loading from files ---------------------------------------------------------------------------


def read_json(path: str, variable: str) -> dict[str, Any]:
    """The JSON object in ``path``; a ConfigError naming ``variable`` otherwise."""
    from tidemark.secret_files import unreadable
    try:
        text = Path(path).read_text(encoding="utf-8")
    except PermissionError as e:
        raise ConfigError(unreadable(variable, path, e)) from None
    except OSError as e:
        raise ConfigError(f"{variable}: cannot read {path}: {e.strerror}") from None
    try:
        info = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{variable}: {path} is not JSON ({e.msg} at line {e.lineno})") \
            from None
    if not isinstance(info, dict):
        raise ConfigError(f"{variable}: {path} must hold a JSON object")
    return info


def _need(info: dict[str, Any], fields: Sequence[str], variable: str, what: str) -> None:
    missing = [f for f in fields if not info.get(f)]
    if missing:
        raise ConfigError(f"{variable}: a {what} needs {', '.join(missing)}")


def google_source(path: str, scopes: Sequence[str], subject: str | None,
                  variable: str) -> GoogleSource:
    """A token source from a Google key file.

    ``type`` is ``service_account`` (with ``subject``, the user whose mailbox or Drive it acts on,
    for domain-wide delegation) or ``authorized_user`` (a refresh token; an optional ``token_uri``
    field points its refresh elsewhere than Google's endpoint, e.g. at the staging servers)."""
    info = read_json(path, variable)
    kind = info.get("type")
    try:
        if kind == "service_account":
            from google.oauth2 import service_account
            _need(info, ("client_email", "private_key", "token_uri"), variable,
                  "service-account key")
            sa = service_account.Credentials.from_service_account_info(
                info, scopes=list(scopes), subject=subject or None)
            who = f" acting as {subject}" if subject else ""
            return GoogleSource(sa, f"service account {info['client_email']}{who}")
        if kind == "authorized_user":
            from google.oauth2.credentials import Credentials
            _need(info, ("client_id", "client_secret", "refresh_token"), variable,
                  "authorized-user file")
            user = Credentials.from_authorized_user_info(info, scopes=list(scopes))
            if info.get("token_uri"):  # google-auth ignores it in the file; we do not
                user = user.with_token_uri(str(info["token_uri"]))
            return GoogleSource(user, f"authorized user of OAuth client {info['client_id']}")
    except ValueError as e:  # a malformed private key, say
        raise ConfigError(f"{variable}: {path}: {_first_line(e)}") from None
    raise ConfigError(f"{variable}: {path} has type {kind!r}; expected a Google "
                      f"'service_account' key or an 'authorized_user' file")


GRAPH_DEFAULT_SCOPE = "https://graph.microsoft.com/.default"
GRAPH_AUTHORITY = "https://login.microsoftonline.com"


def graph_source(path: str, delegated_scopes: Sequence[str], variable: str,
                 ) -> tuple[RefreshingSource, bool]:
    """A token source from a JSON file describing a Microsoft Entra app.

    The file holds ``tenant_id``, ``client_id`` and one of ``client_secret``, ``certificate_path``
    (a PEM with the private key and certificate; ``certificate_password`` if it is encrypted) —
    app-only, Graph calls go to ``/users/{TIDEMARK_GRAPH_USER}`` — or ``refresh_token`` (delegated,
    calls go to ``/me``; ``client_secret`` too for a confidential client). Optional: ``authority``
    (the login host, default ``https://login.microsoftonline.com``) and ``ca_bundle`` (a CA file to
    trust for it). Returns the source and whether it is app-only."""
    info = read_json(path, variable)
    _need(info, ("tenant_id", "client_id"), variable, "Microsoft credential file")
    authority = str(info.get("authority") or GRAPH_AUTHORITY).rstrip("/")
    custom = authority != GRAPH_AUTHORITY
    verify: Any = str(info["ca_bundle"]) if info.get("ca_bundle") else True
    tenant, client = str(info["tenant_id"]), str(info["client_id"])
    opts: dict[str, Any] = {"authority": authority, "disable_instance_discovery": custom}
    if verify is not True:
        opts["connection_verify"] = verify
    if info.get("refresh_token"):
        import functools

        import msal
        import requests
        session = requests.Session()
        # Per request, so that REQUESTS_CA_BUNDLE in the environment cannot override ca_bundle
        # (requests lets it override a session-wide verify).
        session.request = functools.partial(  # type: ignore[method-assign]
            session.request, verify=verify, timeout=REFRESH_TIMEOUT_S)
        kw: dict[str, Any] = {"authority": f"{authority}/{tenant}", "http_client": session,
                              "instance_discovery": not custom}
        try:
            app: Any = (msal.ConfidentialClientApplication(
                client, client_credential=str(info["client_secret"]), **kw)
                if info.get("client_secret") else msal.PublicClientApplication(client, **kw))
        except ValueError as e:
            raise ConfigError(f"{variable}: {_first_line(e)}") from None
        return MsalRefreshSource(app, str(info["refresh_token"]), delegated_scopes,
                                 f"refresh token of app {client} in tenant {tenant}"), False
    from azure.identity import CertificateCredential, ClientSecretCredential
    try:
        if info.get("client_secret"):
            cred: Any = ClientSecretCredential(tenant, client, str(info["client_secret"]),
                                               **opts)
            what = f"client secret of app {client} in tenant {tenant}"
        elif info.get("certificate_path"):
            cred = CertificateCredential(tenant, client, str(info["certificate_path"]),
                                         password=info.get("certificate_password"), **opts)
            what = f"certificate of app {client} in tenant {tenant}"
        else:
            raise ConfigError(f"{variable}: a Microsoft credential file needs client_secret, "
                              f"certificate_path or refresh_token")
    except (ValueError, OSError) as e:
        raise ConfigError(f"{variable}: {_first_line(e)}") from None
    return AzureSource(cred, GRAPH_DEFAULT_SCOPE, what), True

