"""Which actions a worker can run, built from its configuration (environment variables).

Every known action class is registered, so plans validate everywhere; an instance is bound only
where its clients are configured, and a plan that needs an unconfigured action is refused before
its first step. Each target takes a base URL and two credentials: one that may write (used by
``execute`` and ``compensate`` only) and a read-only one (probes, snapshots, gates).

A secret is read from ``NAME`` or from the file named by ``NAME_FILE``; it is never logged and
never journaled. ``TIDEMARK_STAGING_URL`` points every target that is not configured otherwise
at the staging servers with their documented default credentials. ``fs.rename`` is bound only
with ``TIDEMARK_FS_ROOTS``, the directories it may touch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from activities.catalog import ACTION_CLASSES, BUILTIN_ACTION_CLASSES
from activities.drive import DEFAULT_HORIZON_S, DriveRename, drive_client
from activities.fs import FsRename
from activities.gmail import GmailSend
from activities.granted import granted_google, granted_graph, granted_stripe
from activities.graph import GraphSendMail
from activities.stripe import StripePaymentIntent, key_mode, stripe_client
from probes.fs import ROOTS_ENV, parse_roots
from probes.google_http import DEFAULT_TIMEOUT_S
from probes.graph import graph_client
from staging import drive as staging_drive
from staging import gmail as staging_gmail
from staging import graph as staging_graph
from staging import stripe as staging_stripe
from tidemark.actions import Action, Registry
from tidemark.errors import ConfigError
from tidemark.grants import LocalMinter, Minter, StagingMinter
from tidemark.plugins import bind_plugin
from tidemark.secret_files import unreadable

STAGING_URL = "TIDEMARK_STAGING_URL"
DRIVE_HORIZON = "TIDEMARK_DRIVE_HORIZON_S"
# The largest PaymentIntent one step may create unless TIDEMARK_STRIPE_MAX_AMOUNT says
# otherwise, in minor units (500.00 in a two-decimal currency): a gate, not a business rule.
DEFAULT_STRIPE_MAX_AMOUNT = 50_000
# The largest total one task may ask for per currency, unless TIDEMARK_STRIPE_MAX_TASK_AMOUNT
# says otherwise: four payments at the per-step limit.
DEFAULT_STRIPE_MAX_TASK_AMOUNT = 200_000


@dataclass(frozen=True)
class Target:
    """How one target is configured: variable names, real default URL, staging defaults."""

    prefix: str  # TIDEMARK_<PREFIX>_URL, _WRITE_TOKEN, _READ_TOKEN
    default_url: str
    staging_write: str
    staging_read: str


TARGETS = {
    "drive": Target("DRIVE", "https://www.googleapis.com", staging_drive.DEFAULT_WRITE_TOKEN,
                    staging_drive.DEFAULT_READ_TOKEN),
    "gmail": Target("GMAIL", "https://gmail.googleapis.com", staging_gmail.COMPOSE_TOKEN,
                    staging_gmail.READ_TOKEN),
    "graph": Target("GRAPH", "https://graph.microsoft.com", staging_graph.SEND_TOKEN,
                    staging_graph.READ_TOKEN),
    "stripe": Target("STRIPE", "https://api.stripe.com", staging_stripe.DEFAULT_SECRET_KEY,
                     staging_stripe.DEFAULT_READ_KEY),
}


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


def credentials(env: Mapping[str, str], target: str) -> tuple[str, str, str] | None:
    """(base URL, write secret, read secret) of a target, or None when it is not configured."""
    t = TARGETS[target]
    p = f"TIDEMARK_{t.prefix}"
    write, read = secret(env, f"{p}_WRITE_TOKEN"), secret(env, f"{p}_READ_TOKEN")
    url = env.get(f"{p}_URL")
    staging = env.get(STAGING_URL)
    if write is None and read is None and url is None:
        if not staging:
            return None
        return staging, t.staging_write, t.staging_read
    if write is None or read is None:
        missing = f"{p}_WRITE_TOKEN" if write is None else f"{p}_READ_TOKEN"
        raise ConfigError(f"{target}: {missing} (or {missing}_FILE) is missing; a target needs "
                          "a write credential for actions and a read-only one for probes")
    if url is None and staging and (write, read) != (t.staging_write, t.staging_read):
        # Real credentials and no URL of their own: the staging URL would receive them.
        raise ConfigError(
            f"{target}: {p}_WRITE_TOKEN and {p}_READ_TOKEN are set but {p}_URL is not, while "
            f"{STAGING_URL} is: the {target} credentials would be sent to the staging servers "
            f"at {staging}. Set {p}_URL (the real service is {t.default_url}) or unset "
            f"{STAGING_URL}")
    return url or staging or t.default_url, write, read


def _amount(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None


def timeout_s(env: Mapping[str, str], target: str) -> float:
    """The client timeout of ``target`` in seconds: ``TIDEMARK_<T>_TIMEOUT_S``, else the
    client module's default (30 s)."""
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
    """Per-task grants: minted and revoked per token at the staging servers; the worker's own
    credential, refused by the broker once revoked, at a real provider (tidemark.grants)."""
    staging = env.get(STAGING_URL)
    return StagingMinter(url) if staging and url.rstrip("/") == staging.rstrip("/") \
        else LocalMinter(url)


def _google(env: Mapping[str, str], target: str, client: Any, scope: str, url: str) -> Any:
    return granted_google(client, target, scope, _minter(env, url))


def _gmail(env: Mapping[str, str], url: str, w: str, r: str) -> GmailSend:
    action = GmailSend.from_env(env, url, w, r)
    _google(env, "gmail", action.writer, "write", url)
    _google(env, "gmail", action.reader.reader, "read", url)
    return action


BUILDERS: dict[str, Callable[[Mapping[str, str], str, str, str], Action]] = {
    "drive": lambda env, url, w, r: DriveRename(
        _google(env, "drive", drive_client(url, w, timeout=timeout_s(env, "drive")), "write",
                url),
        _google(env, "drive", drive_client(url, r, timeout=timeout_s(env, "drive")), "read",
                url),
        timeout=timeout_s(env, "drive"), horizon_s=seconds(env, DRIVE_HORIZON, DEFAULT_HORIZON_S)),
    "gmail": lambda env, url, w, r: _gmail(env, url, w, r),
    "graph": lambda env, url, w, r: GraphSendMail(
        granted_graph(graph_client(url, w, timeout=timeout_s(env, "graph")), "graph", "write",
                      _minter(env, url)),
        granted_graph(graph_client(url, r, timeout=timeout_s(env, "graph")), "graph", "read",
                      _minter(env, url))),
    "stripe": lambda env, url, w, r: StripePaymentIntent(
        granted_stripe(stripe_client(url, w, timeout=timeout_s(env, "stripe")), "stripe",
                       "write", _minter(env, url)),
        granted_stripe(stripe_client(url, r, timeout=timeout_s(env, "stripe")), "stripe", "read",
                       _minter(env, url)),
        max_amount=_amount(env, "TIDEMARK_STRIPE_MAX_AMOUNT", DEFAULT_STRIPE_MAX_AMOUNT),
        max_task_amount=_amount(env, "TIDEMARK_STRIPE_MAX_TASK_AMOUNT",
                                DEFAULT_STRIPE_MAX_TASK_AMOUNT),
        modes=(key_mode(w), key_mode(r)), timeout=timeout_s(env, "stripe")),
}


def bound_actions(env: Mapping[str, str]) -> list[Action]:
    """Instances of every action whose configuration is present in ``env``."""
    actions: list[Action] = []
    roots = parse_roots(env.get(ROOTS_ENV))
    if roots:  # without roots fs.rename is not bound: it would reach the whole disk
        actions.append(FsRename(roots))
    # Every target's configuration is checked before any client is built or called.
    configured = {target: credentials(env, target) for target in BUILDERS}
    for target, build in BUILDERS.items():
        creds = configured[target]
        if creds is not None:
            action = build(env, *creds)
            action.check_identity()  # a probe that reads a foreign account proves nothing
            actions.append(action)
    builtin = {cls.name for cls in BUILTIN_ACTION_CLASSES}
    for cls in ACTION_CLASSES:  # installed plugins, bound where their configuration is present
        if cls.name not in builtin:
            plugin = bind_plugin(cls, env)
            if plugin is not None:
                plugin.check_identity()
                actions.append(plugin)
    return actions


def worker_registry(env: Mapping[str, str]) -> Registry:
    registry = Registry(ACTION_CLASSES)
    for action in bound_actions(env):
        registry.register(action)
    return registry
