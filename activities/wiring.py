"""Which actions a worker can run, built from its configuration (environment variables).

Every known action class is registered, so plans validate everywhere; an instance is bound only
where its clients are configured and its provider's client library is installed (an extra,
docs/install.md), and a plan that needs an unconfigured action is refused before its first
step. Each target takes a base URL and two credentials: one that may write (used by
``execute`` and ``compensate`` only) and a read-only one (probes, snapshots, gates).

A secret is read from ``NAME`` or from the file named by ``NAME_FILE``; it is never logged and
never journaled. ``TIDEMARK_STAGING_URL`` points every target that is not configured otherwise
at the staging servers with their documented default credentials. ``fs.rename`` is bound only
with ``TIDEMARK_FS_ROOTS``, the directories it may touch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from activities.catalog import BUILTIN_ACTIONS, builtin_refs, missing_libraries
from activities.fs import FsRename
from probes.fs import ROOTS_ENV, parse_roots
from tidemark import staging_tokens
from tidemark.actions import Action, Registry
from tidemark.credentials import CredentialSource, StaticToken, google_source, graph_source
from tidemark.errors import ConfigError
from tidemark.grants import LocalMinter, Minter, StagingMinter
from tidemark.plugins import bind_plugin, plugin_action_classes
from tidemark.reads import patient_reads, read_budget_s
from tidemark.secret_files import unreadable
from tidemark.words import GrantScope

if TYPE_CHECKING:  # each builder imports its target's module (and client library) itself
    from activities.drive import DriveRename
    from activities.gmail import GmailSend
    from activities.graph import GraphSendMail
    from activities.stripe import StripePaymentIntent

log = logging.getLogger("tidemark.worker")

STAGING_URL = "TIDEMARK_STAGING_URL"
DRIVE_HORIZON = "TIDEMARK_DRIVE_HORIZON_S"


@dataclass(frozen=True)
class Target:
    """How one target is configured.

    Its variable names, real default URL, staging defaults, and the OAuth scopes a credential
    file is asked for (None: tokens only)."""

    prefix: str  # TIDEMARK_<PREFIX>_URL, _WRITE_TOKEN, _READ_TOKEN, _WRITE_CREDENTIALS_FILE ...
    default_url: str
    staging_write: str
    staging_read: str
    scopes: dict[str, tuple[str, ...]] | None = None  # write/read -> scopes of a file's token


GOOGLE = "https://www.googleapis.com/auth/"
GRAPH = "https://graph.microsoft.com/"
TARGETS = {
    "drive": Target("DRIVE", "https://www.googleapis.com", staging_tokens.DRIVE_WRITE,
                    staging_tokens.DRIVE_READ,
                    {"write": (GOOGLE + "drive",), "read": (GOOGLE + "drive.metadata.readonly",)}),
    "gmail": Target("GMAIL", "https://gmail.googleapis.com", staging_tokens.GMAIL_COMPOSE,
                    staging_tokens.GMAIL_READ,
                    {"write": (GOOGLE + "gmail.compose",), "read": (GOOGLE + "gmail.readonly",)}),
    # Delegated scopes (a refresh token); an app-only credential gets its app's roles.
    "graph": Target("GRAPH", "https://graph.microsoft.com", staging_tokens.GRAPH_SEND,
                    staging_tokens.GRAPH_READ,
                    {"write": tuple(GRAPH + s for s in ("Mail.ReadWrite", "Mail.Send",
                                                        "User.Read")),
                     "read": tuple(GRAPH + s for s in ("Mail.Read", "User.Read"))}),
    "stripe": Target("STRIPE", "https://api.stripe.com", staging_tokens.STRIPE_SECRET,
                     staging_tokens.STRIPE_READ),
}
GRAPH_USER = "TIDEMARK_GRAPH_USER"
# The clients' timeout where TIDEMARK_<T>_TIMEOUT_S is unset: the default of the client modules
# (probes.google_http, probes.graph, activities.stripe), written here so that reading it
# imports none of their client libraries; tests/test_cli_imports.py keeps them equal.
DEFAULT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Credentials:
    """A configured target: its URL and the sources of its write and read credentials."""

    url: str
    write: CredentialSource
    read: CredentialSource
    graph_user: str | None = None  # app-only Graph credentials address this mailbox


def secret(env: Mapping[str, str], name: str) -> str | None:
    """``env[name]``, or the stripped contents of the file named by ``env[name + "_FILE"]``."""
    if env.get(name):
        return env[name]
    path = env.get(name + "_FILE")
    if not path:
        return None
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except PermissionError as e:
        raise ConfigError(unreadable(f"{name}_FILE", path, e)) from None
    except OSError as e:
        raise ConfigError(f"{name}_FILE: cannot read {path}: {e.strerror}") from None


def _source(env: Mapping[str, str], target: str, scope: str,
            app_only: list[bool]) -> CredentialSource | None:
    """The ``scope`` (write or read) credential of ``target``.

    It is a static token (``..._TOKEN[_FILE]``) or a credential file (``..._CREDENTIALS_FILE``),
    never both."""
    t = TARGETS[target]
    name = f"TIDEMARK_{t.prefix}_{scope.upper()}"
    token = secret(env, f"{name}_TOKEN")
    path = env.get(f"{name}_CREDENTIALS_FILE")
    if path and token is not None:
        raise ConfigError(f"{target}: both {name}_TOKEN and {name}_CREDENTIALS_FILE are set; "
                          f"set one of them")
    if not path:
        return None if token is None else StaticToken(token)
    if t.scopes is None:
        raise ConfigError(f"{name}_CREDENTIALS_FILE: {target} takes only a static key "
                          f"({name}_TOKEN or {name}_TOKEN_FILE)")
    variable = f"{name}_CREDENTIALS_FILE"
    if target == "graph":
        source, only = graph_source(path, t.scopes[scope], variable)
        app_only.append(only)
        return source
    return google_source(path, t.scopes[scope], env.get(f"TIDEMARK_{t.prefix}_SUBJECT"),
                         variable)


def credentials(env: Mapping[str, str], target: str) -> Credentials | None:
    """The URL and credential sources of a target, or None when it is not configured."""
    t = TARGETS[target]
    p = f"TIDEMARK_{t.prefix}"
    app_only: list[bool] = []
    write = _source(env, target, GrantScope.WRITE, app_only)
    read = _source(env, target, GrantScope.READ, app_only)
    url = env.get(f"{p}_URL")
    staging = env.get(STAGING_URL)
    if write is None and read is None and url is None:
        if not staging:
            return None
        return Credentials(staging, StaticToken(t.staging_write), StaticToken(t.staging_read))
    if write is None or read is None:
        missing = f"{p}_WRITE_TOKEN" if write is None else f"{p}_READ_TOKEN"
        files = f" or {missing.removesuffix('_TOKEN')}_CREDENTIALS_FILE" if t.scopes else ""
        raise ConfigError(f"{target}: {missing} (or {missing}_FILE{files}) is missing; a "
                          f"target needs a write credential for actions and a read-only one "
                          f"for probes")
    static = isinstance(write, StaticToken) and isinstance(read, StaticToken)
    if url is None and staging and (not static or (write.token(), read.token()) != (
            t.staging_write, t.staging_read)):
        # Real credentials and no URL of their own: the staging URL would receive them.
        kinds = ["TOKEN" if isinstance(x, StaticToken) else "CREDENTIALS_FILE"
                 for x in (write, read)]
        raise ConfigError(
            f"{target}: {p}_WRITE_{kinds[0]} and {p}_READ_{kinds[1]} are set but {p}_URL is "
            f"not, while {STAGING_URL} is: the {target} credentials would be sent to the staging "
            f"servers at {staging}. Set {p}_URL (the real service is {t.default_url}) or unset "
            f"{STAGING_URL}")
    user = env.get(GRAPH_USER) if target == "graph" else None
    if app_only and not all(app_only) and any(app_only):
        raise ConfigError("graph: one credential file is app-only (client secret or "
                          "certificate) and the other delegated (refresh token); both must "
                          "address the mailbox the same way")
    if any(app_only) and not user:
        raise ConfigError(f"graph: app-only credentials (client secret or certificate) have "
                          f"no /me; set {GRAPH_USER} to the id or userPrincipalName of the "
                          f"mailbox to act on")
    return Credentials(url or staging or t.default_url, write, read, user)


def timeout_s(env: Mapping[str, str], target: str) -> float:
    """The client timeout of ``target`` in seconds.

    ``TIDEMARK_<T>_TIMEOUT_S``, else the client modules' default (30 s)."""
    value = seconds(env, f"TIDEMARK_{TARGETS[target].prefix}_TIMEOUT_S", DEFAULT_TIMEOUT_S)
    if value == 0:
        raise ConfigError(f"TIDEMARK_{TARGETS[target].prefix}_TIMEOUT_S must be more than 0")
    return value


def seconds(env: Mapping[str, str], name: str, default: float) -> float:
    """``env[name]`` as seconds from 0 to 600, else ``default``."""
    raw = env.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number of seconds, got {raw!r}") from None
    if not 0 <= value <= 600:
        raise ConfigError(f"{name} must be from 0 to 600 seconds, got {raw!r}")
    return value


def _minter(env: Mapping[str, str], url: str) -> Minter:
    """Per-task grants: minted at staging servers, the worker's credential at real ones.

    At the staging servers they are minted and revoked per token. At a real provider
    (tidemark.grants) the grant is the worker's own credential, refused by the broker once
    revoked."""
    staging = env.get(STAGING_URL)
    return StagingMinter(url) if staging and url.rstrip("/") == staging.rstrip("/") \
        else LocalMinter(url)


def grant_minter(env: Mapping[str, str], url: str) -> Minter:
    """How per-task grants for the target at ``url`` are minted.

    For clients built outside this module, such as a planner's reader."""
    return _minter(env, url)


def _google(env: Mapping[str, str], target: str, client: Any, scope: GrantScope, url: str,
            source: CredentialSource) -> Any:
    from activities.granted import granted_google

    return granted_google(client, target, scope, _minter(env, url), source)


# A builder imports its target's module only when the target is configured: a worker without
# Stripe credentials never imports stripe.
def _drive(env: Mapping[str, str], c: Credentials) -> DriveRename:
    from activities.drive import DEFAULT_HORIZON_S, DriveRename, drive_client

    timeout = timeout_s(env, "drive")
    return DriveRename(
        _google(env, "drive", drive_client(c.url, "", timeout=timeout), GrantScope.WRITE, c.url,
                c.write),
        _google(env, "drive", drive_client(c.url, "", timeout=timeout), GrantScope.READ, c.url,
                c.read),
        timeout=timeout, horizon_s=seconds(env, DRIVE_HORIZON, DEFAULT_HORIZON_S))


def _gmail(env: Mapping[str, str], c: Credentials) -> GmailSend:
    from activities.gmail import GmailSend

    action = GmailSend.from_env(env, c.url, "", "")
    _google(env, "gmail", action.writer, GrantScope.WRITE, c.url, c.write)
    _google(env, "gmail", action.reader.reader, GrantScope.READ, c.url, c.read)
    return action


def _graph(env: Mapping[str, str], c: Credentials) -> GraphSendMail:
    from activities.acting import granted_graph
    from activities.graph import GraphSendMail, confirm_timeout, late_timeout
    from probes.graph import graph_client

    timeout = timeout_s(env, "graph")
    return GraphSendMail(
        granted_graph(graph_client(c.url, c.write, timeout=timeout, user=c.graph_user),
                      "graph", GrantScope.WRITE, _minter(env, c.url)),
        granted_graph(graph_client(c.url, c.read, timeout=timeout, user=c.graph_user),
                      "graph", GrantScope.READ, _minter(env, c.url)),
        # From the same configuration as the rest, not the process environment alone.
        confirm_s=confirm_timeout(env), late_s=late_timeout(env))


def _stripe(env: Mapping[str, str], c: Credentials) -> StripePaymentIntent:
    from activities.acting import granted_stripe
    from activities.stripe import StripePaymentIntent, key_mode, stripe_client
    from tidemark.payment_limits import limits_from_env

    timeout = timeout_s(env, "stripe")
    w, r = c.write.token(), c.read.token()  # restricted keys: static
    return StripePaymentIntent(
        granted_stripe(stripe_client(c.url, w, timeout=timeout), "stripe", GrantScope.WRITE,
                       _minter(env, c.url)),
        granted_stripe(stripe_client(c.url, r, timeout=timeout), "stripe", GrantScope.READ,
                       _minter(env, c.url)),
        limits=limits_from_env(env), modes=(key_mode(w), key_mode(r)), timeout=timeout)


BUILDERS: dict[str, Callable[[Mapping[str, str], Credentials], Action]] = {
    "drive": _drive, "gmail": _gmail, "graph": _graph, "stripe": _stripe,
}
# The action each target's builder binds.
TARGET_ACTIONS = {"drive": "drive.rename", "gmail": "gmail.send", "graph": "graph.send_mail",
                  "stripe": "stripe.payment_intent"}


def installed_targets() -> list[str]:
    """The targets whose client library is installed.

    Each missing one is told in one log line naming the extra to install. The worker binds what
    is installed, and a plan that names a left-out action is refused by its validation
    (ActionUnavailable)."""
    left_out: set[str] = set()
    for library, names in missing_libraries().items():
        left_out.update(names)
        log.warning("%s left out: %s is not installed (pip install 'tidemark[%s]')",
                    ", ".join(names), library.what, library.extra)
    return [t for t in BUILDERS if TARGET_ACTIONS[t] not in left_out]


def bound_actions(env: Mapping[str, str],
                  plugins: list[type[Action]] | None = None) -> list[Action]:
    """Instances of every action configured in ``env`` whose client library is installed.

    ``plugins``: the installed plugin classes, when the caller has loaded them already."""
    actions: list[Action] = []
    roots = parse_roots(env.get(ROOTS_ENV))
    if roots:  # without roots fs.rename is not bound: it would reach the whole disk
        actions.append(FsRename(roots))
    # Every target's configuration is checked before any client is built or called; a target
    # whose library is missing is not read (a credential file of its needs that library).
    configured = {target: credentials(env, target) for target in installed_targets()}
    for target, build in BUILDERS.items():
        creds = configured.get(target)
        if creds is not None:
            action = build(env, creds)
            with patient_reads(read_budget_s(env)):  # a throttled read at start is waited out
                action.check_identity()  # a probe that reads a foreign account proves nothing
            actions.append(action)
    for cls in plugin_action_classes() if plugins is None else plugins:
        if cls.name not in BUILTIN_ACTIONS:  # bound where their configuration is present
            plugin = bind_plugin(cls, env)
            if plugin is not None:
                plugin.check_identity()
                actions.append(plugin)
    return actions


def worker_registry(env: Mapping[str, str]) -> Registry:
    """Every action known (plans validate), the configured ones bound.

    A built-in action whose target is not configured stays a reference: its module and client
    library are imported only if a plan names it. Plugins are loaded, and checked, at start:
    they are bound there."""
    read_budget_s(env)  # a bad TIDEMARK_READ_RETRY_S refuses the start, not the first probe
    plugins = plugin_action_classes()
    registry = Registry([*builtin_refs(), *plugins])
    for action in bound_actions(env, plugins):
        registry.register(action)
    return registry
