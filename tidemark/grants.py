"""The grant broker: per-task credentials with an expiry, recorded in Postgres, revocable.

Activities obtain a target's credential only through the broker, for the task they act for:
``GrantBroker.token(task, target, scope, base, minter)``. Every outbound call asks again, and
the broker answers only while the grant is live (not revoked, not expired); once ``tidemark
kill`` has revoked a task's grants, no new one is issued while the task's stop state holds, so
the next call of that task fails with ``Unauthorized`` — from a wedged worker too, and at the
provider itself where the provider can revoke (the staging servers do, per token).

A ``Minter`` is how one provider issues and revokes a short-lived credential:

* ``StagingMinter``: ``POST /_staging/tokens`` mints a token with the account, scopes and OAuth
  client of the worker's base token; ``POST /_staging/tokens/{t}/revoke`` revokes it; the
  staging server answers the next request with it 401.
* ``LocalMinter``: the provider offers nothing per task; the grant presents the worker's own
  credential and revoking it makes the broker refuse. It stops our code, not a process that
  already holds the credential.

What real providers offer (docs/operate.md, "Kill"): Google — OAuth access tokens live an hour;
``https://oauth2.googleapis.com/revoke?token=`` revokes a token (and the refresh token it came
from); a per-task token needs its own OAuth grant or a service account with domain-wide
delegation minting one token per task. Microsoft Graph — ``revokeSignInSessions`` invalidates
refresh tokens and session cookies, not access tokens already issued (they live until expiry,
up to an hour, less with continuous access evaluation); keep access tokens short. Stripe —
restricted keys can be created per purpose and rolled (``roll`` with an expiry of now), which
invalidates the key for every request after it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import secrets
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import NoReturn, Protocol

from tidemark.errors import TargetUnavailable, TidemarkError, Unauthorized
from tidemark.needs import Act, command
from tidemark.store import JournalStore
from tidemark.words import EventKind, GrantKind, GrantPurpose, GrantScope

GRANT_TTL_S = 900.0  # a grant outlives any step (STEP_START_TO_CLOSE is 5 minutes)
MINT_TIMEOUT_S = 10.0


class Minter(Protocol):
    @property
    def kind(self) -> GrantKind:
        """The grants.kind column: staging | local."""

    @property
    def issuer(self) -> str: ...

    def new_handle(self, base: str) -> tuple[str, str]:
        """(token to present, handle that revokes it); nothing is issued yet."""

    def mint(self, token: str, base: str, ttl_s: float) -> None:
        """Makes ``token`` valid at the provider, like ``base``, for ``ttl_s`` seconds."""

    def revoke(self, handle: str) -> None:
        """Revokes at the provider; a token it does not know is already as good as revoked."""


@dataclass(frozen=True)
class LocalMinter:
    issuer: str = ""
    kind: GrantKind = GrantKind.LOCAL

    def new_handle(self, base: str) -> tuple[str, str]:
        return base, "sha256:" + hashlib.sha256(base.encode()).hexdigest()[:16]

    def mint(self, token: str, base: str, ttl_s: float) -> None:
        return None

    def revoke(self, handle: str) -> None:
        return None


@dataclass(frozen=True)
class StagingMinter:
    issuer: str  # the staging server's base URL
    kind: GrantKind = GrantKind.STAGING

    def new_handle(self, base: str) -> tuple[str, str]:
        # A Stripe key's prefix is its kind and mode (sk_test_, rk_live_ ...): keep it.
        kind = re.match(r"(?:sk|rk)_(?:live|test)_", base)
        token = (kind.group(0) if kind else "") + "grant-" + secrets.token_urlsafe(24)
        return token, token

    def mint(self, token: str, base: str, ttl_s: float) -> None:
        self._post("/_staging/tokens", {"token": token, "like": base, "expires_in": ttl_s})

    def revoke(self, handle: str) -> None:
        try:
            self._post(f"/_staging/tokens/{handle}/revoke", {})
        except urllib.error.HTTPError as e:
            if e.code != 404:
                raise

    def _post(self, path: str, body: dict[str, object]) -> None:
        req = urllib.request.Request(self.issuer.rstrip("/") + path,
                                     data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=MINT_TIMEOUT_S) as resp:
            resp.read()


def minter_for(kind: str, issuer: str) -> Minter:
    return StagingMinter(issuer) if kind == GrantKind.STAGING else LocalMinter(issuer)


class GrantBroker:
    """Issues and checks per-task grants for one worker; thread-safe."""

    def __init__(self, store: JournalStore, ttl_s: float = GRANT_TTL_S) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        # (task, target, scope, purpose) -> (grant id, token, base it was issued for); the
        # token only ever lives here.
        self._held: dict[tuple[str, str, GrantScope, GrantPurpose], tuple[int, str, str]] = {}

    def token(self, task_id: str, target: str, scope: GrantScope, base: str, minter: Minter,
              purpose: GrantPurpose = GrantPurpose.RUN) -> str:
        """The credential this task presents to ``target`` now.

        ``base`` is the worker's own current token (tidemark.credentials): when it was
        refreshed since the held grant was issued, the task gets a new grant for the new base
        (a local grant presents the base itself; a minted one lives no longer than its base),
        unless the held grant was revoked while the task is stopped.

        ``purpose`` ``undo``: the compensations of a person's unwind, which act on a stopped
        task. Its grant is issued only while the task is stopped and not killed, on whichever
        worker runs the unwind and however long after the stop; a kill revokes it and refuses
        a new one until a person releases the kill for unwinding.

        Raises:
            Unauthorized: the task's grant was revoked, or the task is stopped or killed (no
                grant is issued then; for an undo grant: killed, or not stopped).
            TargetUnavailable: the provider could not mint one.
        """
        key = (task_id, target, scope, purpose)
        with self._lock:
            held = self._held.get(key)
        if held is not None:
            state = self.store.grant_state(held[0])
            if state is not None and state["live"] and held[2] == base:
                return held[1]
            if purpose == GrantPurpose.RUN and state is not None and \
                    state["revoked"] is not None and self.store.stop_state(task_id) is not None:
                # Once released (a person settled it), the task gets a fresh grant below.
                self._refused(task_id, target, scope, f"grant {held[0]} revoked at "
                              f"{state['revoked']:%Y-%m-%d %H:%M:%S%z} by {state['revoked_by']}")
        return self._issue(key, base, minter)

    def _refused(self, task_id: str, target: str, scope: str, why: str) -> NoReturn:
        """Logs the refused call and raises Unauthorized.

        Logs the refused call (a killed task's worker that still tries to act is worth
        knowing about) and raises Unauthorized."""
        with contextlib.suppress(TidemarkError):
            self.store.record_event(task_id, EventKind.GRANT, {"refused": target, "scope": scope,
                                                       "why": why})
        raise Unauthorized(f"{target}: no live {scope} grant for task {task_id}: {why}")

    def _issue(self, key: tuple[str, str, GrantScope, GrantPurpose], base: str,
               minter: Minter) -> str:
        task_id, target, scope, purpose = key
        token, handle = minter.new_handle(base)
        row = self.store.issue_grant(task_id, target, scope, minter.kind, minter.issuer, handle,
                                     self.ttl_s, purpose)
        if row is None:
            self._refused(task_id, target, scope, UNDO_REFUSED if purpose == GrantPurpose.UNDO else
                          "the task is stopped; no grant is issued")
        try:
            minter.mint(token, base, self.ttl_s)
        except (OSError, urllib.error.URLError) as e:
            raise TargetUnavailable(f"{target}: cannot mint a grant: {e}") from None
        state = self.store.grant_state(row["id"])
        if state is None or not state["live"]:  # revoked while it was being minted
            minter.revoke(handle)
            self._refused(task_id, target, scope, "revoked while it was minted")
        with self._lock:
            self._held[key] = (row["id"], token, base)
        return token


UNDO_REFUSED = ("no undo grant is issued: the task is killed "
                f"(`{command(Act.RELEASE_FOR_UNWIND, 'T')}` lifts the kill for an unwind), "
                "not stopped, or unwound")


def revoke_task_grants(store: JournalStore, task_id: str | None, by: str,
                       purpose: GrantPurpose | None = None) -> list[dict[str, object]]:
    """Revokes a task's grants in the table, then at each provider.

    None: every task's; ``purpose``: only those.

    Returns the revoked grants (without handles), each with ``at_provider``: what the provider
    said (``revoked``, ``nothing to revoke`` for local grants, or the error)."""
    out: list[dict[str, object]] = []
    for g in store.revoke_grants(task_id, by, purpose):
        handle = str(g.pop("handle"))
        try:
            minter_for(str(g["kind"]), str(g["issuer"])).revoke(handle)
            said = ("revoked" if g["kind"] == GrantKind.STAGING
                    else "nothing to revoke (local grant)")
        except (OSError, urllib.error.URLError) as e:
            said = f"provider did not answer: {e}"
        except Exception as e:  # one grant the provider side cannot take holds up no other
            said = f"not revoked at the provider: {type(e).__name__}: {e}"
        out.append({**g, "at_provider": said})
    return out
