"""Tidemark's configuration: read from the environment once, by ``load_settings``, and passed down.

Every variable the project reads is listed in docs/reference.md's Configuration table. The Temporal
connection is the SDK's own environment configuration (``temporalio.envconfig``): the profile
``TEMPORAL_PROFILE`` (default ``default``) of ``temporal.toml`` (``TEMPORAL_CONFIG_FILE``, else
the ``temporal`` CLI's default path), overridden by ``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``,
``TEMPORAL_API_KEY``, ``TEMPORAL_TLS*`` and ``TEMPORAL_GRPC_META_*``; so the ``temporal`` CLI and
Tidemark read the same profile.

Target credentials and client settings (``TIDEMARK_<T>_...``) are read from ``Settings.env`` by
``activities/wiring.py``, which takes that mapping as it is.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from tidemark.approval import ApprovalPolicy, policy_from_env
from tidemark.errors import ConfigError
from tidemark.secret_files import unreadable

if TYPE_CHECKING:  # imported where a profile is loaded: a quarter of a command's start-up
    from temporalio.envconfig import ClientConfigProfile

    from tidemark.codec import FileKeys

ENV_DATABASE_URL = "DATABASE_URL"
ENV_DATABASE_PASSWORD_FILE = "DATABASE_PASSWORD_FILE"
ENV_EMBEDDED_DB = "TIDEMARK_EMBEDDED_DB"
ENV_HOME = "TIDEMARK_HOME"
ENV_FS_ROOTS = "TIDEMARK_FS_ROOTS"
ENV_TASK_QUEUE = "TIDEMARK_TASK_QUEUE"
ENV_LOG_LEVEL = "TIDEMARK_LOG_LEVEL"
ENV_TEMPORAL_PROFILE = "TEMPORAL_PROFILE"
ENV_TEMPORAL_CONFIG_FILE = "TEMPORAL_CONFIG_FILE"
ENV_MAX_CONCURRENT_STEPS = "TIDEMARK_MAX_CONCURRENT_STEPS"
ENV_DB_POOL_MAX = "TIDEMARK_DB_POOL_MAX"
ENV_STEP_THREADS = "TIDEMARK_STEP_THREADS"
ENV_UI_URL = "TIDEMARK_UI_URL"
# The payload codec's keys (tidemark/codec.py): a file of ID=BASE64 lines, and the id that
# encrypts.
ENV_CODEC_KEYS_FILE = "TIDEMARK_CODEC_KEYS_FILE"
ENV_CODEC_KEY_ID = "TIDEMARK_CODEC_KEY_ID"

DEFAULT_TASK_QUEUE = "tidemark"
DEFAULT_TEMPORAL_ADDRESS = "localhost:7233"
DEFAULT_TEMPORAL_NAMESPACE = "default"
# Steps a worker runs at once (its activity threads and Temporal's max_concurrent_activities),
# and the journal pool's size (tidemark.store's POOL_MAX, kept equal by a test; not imported
# here, so that reading the settings does not load the store and its driver).
# A step waiting on its target holds no connection (tidemark.store.session), and no thread when
# its action awaits the call (tidemark.step_threads), so the two are sized apart: many steps in
# flight, a few connections for their statements.
DEFAULT_MAX_CONCURRENT_STEPS = 128
DEFAULT_DB_POOL_MAX = 8
# Threads for the blocking parts of a worker's steps (tidemark.step_threads): the journal's
# statements, gates, snapshots and probes of every step, and the whole attempt of a step whose
# action does not await its call (fs.rename). A step waiting on an awaiting action holds none,
# so this is sized for the parts at once, not the steps in flight.
DEFAULT_STEP_THREADS = 32
# The pool's floor: a step's attempt and the reports it journals beside it need two.
MIN_DB_POOL = 2
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("", "0", "false", "no", "off")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# The TLS files a profile may name, by the variable that names them (for error messages).
TLS_FILE_VARIABLES = ("TEMPORAL_TLS_SERVER_CA_CERT_PATH", "TEMPORAL_TLS_CLIENT_CERT_PATH",
                      "TEMPORAL_TLS_CLIENT_KEY_PATH")


@dataclass(frozen=True)
class Settings:
    """Everything Tidemark reads from its environment. Build it with ``load_settings``."""

    # The environment it was read from, unchanged: the target wiring reads TIDEMARK_<T>_* here.
    env: Mapping[str, str] = field(repr=False)
    # Not in the repr: it may carry a password.
    database_url: str | None = field(repr=False)
    database_password_file: str | None
    # Whether an embedded Postgres may stand in when DATABASE_URL is unset: only where asked for
    # (TIDEMARK_EMBEDDED_DB=1, --embedded-db, `tidemark dev`, `tidemark demo`, the tests).
    embedded_db: bool
    home: Path
    fs_roots: str | None
    task_queue: str
    log_level: str
    temporal_profile: str | None
    temporal_config_file: str | None
    # The Temporal profile as loaded (address, namespace, TLS, API key), or None until the
    # ``temporal`` property first needs it (``load_settings(lazy_temporal=True)``). Not in the
    # repr: it may hold an API key.
    loaded_temporal: ClientConfigProfile | None = field(repr=False)
    # The operator's approval policy (TIDEMARK_APPROVAL, TIDEMARK_APPROVERS): which
    # irreversible steps wait for a person, and who may approve. Default: every one, nobody.
    approval: ApprovalPolicy = field(default_factory=ApprovalPolicy)
    # How many steps one worker runs at once (TIDEMARK_MAX_CONCURRENT_STEPS), and how many
    # Postgres connections its journal pool may open (TIDEMARK_DB_POOL_MAX).
    max_concurrent_steps: int = DEFAULT_MAX_CONCURRENT_STEPS
    db_pool_max: int = DEFAULT_DB_POOL_MAX
    # Threads for the blocking parts of its steps (TIDEMARK_STEP_THREADS).
    step_threads: int = DEFAULT_STEP_THREADS
    # The Temporal Web UI our links point at (TIDEMARK_UI_URL), without a trailing slash; None:
    # derived from the stack (tidemark.web_ui.base_url).
    ui_url: str | None = None
    # The payload codec's key file (TIDEMARK_CODEC_KEYS_FILE) and the id that encrypts
    # (TIDEMARK_CODEC_KEY_ID); read when a client connects (temporal_connect), not before.
    codec_keys_file: str | None = None
    codec_key_id: str | None = None

    @property
    def temporal(self) -> ClientConfigProfile:
        """The Temporal profile, loaded on first use where it was left for later.

        A bad one is a ConfigError then, before any connection."""
        profile = self.loaded_temporal
        if profile is None:
            profile = load_temporal_profile(self.env)
            # Frozen for callers; this fills the one field left for later, once.
            object.__setattr__(self, "loaded_temporal", profile)
        return profile

    @property
    def temporal_address(self) -> str:
        return self.temporal.address or DEFAULT_TEMPORAL_ADDRESS

    @property
    def temporal_namespace(self) -> str:
        return self.temporal.namespace or DEFAULT_TEMPORAL_NAMESPACE

    def with_embedded_db(self) -> Settings:
        """These settings with the embedded database allowed (`tidemark dev`, `demo`)."""
        return dataclasses.replace(self, embedded_db=True)

    def with_temporal(self, *, address: str | None = None, namespace: str | None = None
                      ) -> Settings:
        """These settings with the Temporal address or namespace replaced.

        The values come from command-line flags; the profile's TLS and API key stay. Without
        either, the profile is left as it is (loaded or not)."""
        if address is None and namespace is None:
            return self
        profile = dataclasses.replace(
            self.temporal, address=address or self.temporal.address,
            namespace=namespace or self.temporal.namespace)
        return dataclasses.replace(self, loaded_temporal=profile)

    def temporal_connect(self) -> dict[str, Any]:
        """``temporalio.client.Client.connect`` keyword arguments.

        They are target_host, namespace and, where configured, tls (certificate files read here),
        api_key and rpc_metadata. A file that cannot be read is a ConfigError naming the variable
        and what to fix."""
        try:
            config: dict[str, Any] = dict(self.temporal.to_client_connect_config())
        except OSError as e:
            variable = next((k for k in TLS_FILE_VARIABLES if self.env.get(k) == e.filename),
                            f"a TLS file of Temporal profile {self.temporal_profile or 'default'}")
            raise ConfigError(unreadable(variable, str(e.filename), e)) from None
        config["target_host"] = self.temporal_address
        config["namespace"] = self.temporal_namespace
        from tidemark.codec import data_converter

        # Always the codec: without keys it encrypts nothing, and an encrypted payload is
        # refused in one line naming its key id instead of an unknown encoding.
        config["data_converter"] = data_converter(self.codec_keys())
        return config

    def codec_keys(self) -> FileKeys | None:
        """The payload codec's keys, or None when no key file is configured.

        A file that cannot be read, holds a bad line, or lacks the id that encrypts is a
        ConfigError, before anything connects."""
        if self.codec_keys_file is None:
            if self.codec_key_id is not None:
                raise ConfigError(f"{ENV_CODEC_KEY_ID} is set but {ENV_CODEC_KEYS_FILE} is not: "
                                  "point it at the file of keys")
            return None
        from tidemark.codec import file_keys

        return file_keys(self.codec_keys_file, self.codec_key_id)

    def describe_temporal(self) -> str:
        """Where the Temporal connection goes, for logs: never the API key itself."""
        tls = self.temporal.tls
        # As the SDK decides: a TLS section unless disabled, else TLS with an API key.
        on = tls.disabled is not True if tls is not None else bool(self.temporal.api_key)
        secured = "TLS" if on else "no TLS"
        key = ", API key" if self.temporal.api_key else ""
        return f"{self.temporal_address} namespace {self.temporal_namespace} ({secured}{key})"


def flag(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw in TRUE_WORDS:
        return True
    if raw in FALSE_WORDS:
        return False
    raise ConfigError(f"{name} must be 1 or 0 (true/false, yes/no, on/off), got {raw!r}")


def whole_number(env: Mapping[str, str], name: str, default: int, least: int) -> int:
    """``env[name]`` as a whole number of at least ``least``.

    ``env[name]`` as a whole number of at least ``least`` (``default`` when unset or
    empty); anything else is a ConfigError naming the variable."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if not (raw.isascii() and raw.isdigit()) or int(raw) < least:
        raise ConfigError(f"{name} must be a whole number of {least} or more, got {raw!r}")
    return int(raw)


def read_ui_url(env: Mapping[str, str]) -> str | None:
    """``TIDEMARK_UI_URL`` without its trailing slash, None when unset or empty.

    Anything but an http(s) URL with a host (and no query or fragment, which our links add) is
    a ConfigError naming the variable."""
    raw = env.get(ENV_UI_URL, "").strip()
    if not raw:
        return None
    import urllib.parse

    try:
        parts = urllib.parse.urlsplit(raw)
        parts.port  # noqa: B018  # a port that is not a number raises here
    except ValueError:
        parts = None
    if (parts is None or parts.scheme not in ("http", "https") or not parts.hostname
            or parts.query or parts.fragment or any(c.isspace() for c in raw)):
        raise ConfigError(f"{ENV_UI_URL} must be the Temporal Web UI's address, like "
                          f"http://127.0.0.1:8233 (http or https, a host, no query), got {raw!r}")
    return raw.rstrip("/")


def default_home() -> Path:
    return Path.home() / ".local" / "share" / "tidemark"


def load_temporal_profile(env: Mapping[str, str]) -> ClientConfigProfile:
    """The Temporal client profile, as the ``temporal`` CLI reads it.

    The Temporal client profile, as the ``temporal`` CLI reads it from the same variables
    and file. A config file named but missing, a profile not in it or a file that does not
    parse is a ConfigError (the SDK would silently fall back to localhost for the first)."""
    config_file = env.get(ENV_TEMPORAL_CONFIG_FILE)
    profile = env.get(ENV_TEMPORAL_PROFILE) or None
    if config_file and not Path(config_file).is_file():
        raise ConfigError(f"{ENV_TEMPORAL_CONFIG_FILE} names {config_file}, which is not a "
                          f"file: point it at your temporal.toml, or unset it to use the "
                          f"`temporal` CLI's default")
    from temporalio.envconfig import ClientConfigProfile

    try:
        return ClientConfigProfile.load(profile, override_env_vars=dict(env))
    except OSError as e:
        raise ConfigError(unreadable(ENV_TEMPORAL_CONFIG_FILE, str(e.filename), e)) from None
    except Exception as e:  # the SDK's ConfigError comes from its native bridge
        where = config_file or "the temporal CLI's default temporal.toml"
        raise ConfigError(f"Temporal client configuration ({where}, profile "
                          f"{profile or 'default'}): {e}") from None


def load_settings(env: Mapping[str, str] | None = None, *, embedded_db: bool = False,
                  lazy_temporal: bool = False) -> Settings:
    """The settings of ``env`` (default: this process's environment).

    ``embedded_db`` allows the embedded Postgres whatever TIDEMARK_EMBEDDED_DB says (a command that
    is the dev stack). Bad values are a ConfigError saying which variable and what it must be.
    ``lazy_temporal`` leaves the Temporal profile (and temporalio's import) until first use: for a
    command that only reads the journal; one that connects loads it here, so a bad profile stops it
    before it changes anything."""
    source = dict(os.environ if env is None else env)
    level = source.get(ENV_LOG_LEVEL, "INFO").upper()
    if level not in LOG_LEVELS:
        raise ConfigError(f"{ENV_LOG_LEVEL} must be one of {', '.join(LOG_LEVELS)}, "
                          f"got {source[ENV_LOG_LEVEL]!r}")
    home = source.get(ENV_HOME)
    return Settings(
        env=MappingProxyType(source),
        database_url=source.get(ENV_DATABASE_URL) or None,
        database_password_file=source.get(ENV_DATABASE_PASSWORD_FILE) or None,
        embedded_db=embedded_db or flag(source, ENV_EMBEDDED_DB),
        home=Path(home) if home else default_home(),
        fs_roots=source.get(ENV_FS_ROOTS) or None,
        task_queue=source.get(ENV_TASK_QUEUE) or DEFAULT_TASK_QUEUE,
        log_level=level,
        temporal_profile=source.get(ENV_TEMPORAL_PROFILE) or None,
        temporal_config_file=source.get(ENV_TEMPORAL_CONFIG_FILE) or None,
        loaded_temporal=None if lazy_temporal else load_temporal_profile(source),
        approval=policy_from_env(source),
        max_concurrent_steps=whole_number(source, ENV_MAX_CONCURRENT_STEPS,
                                          DEFAULT_MAX_CONCURRENT_STEPS, 1),
        db_pool_max=whole_number(source, ENV_DB_POOL_MAX, DEFAULT_DB_POOL_MAX, MIN_DB_POOL),
        step_threads=whole_number(source, ENV_STEP_THREADS, DEFAULT_STEP_THREADS, 1),
        ui_url=read_ui_url(source),
        codec_keys_file=source.get(ENV_CODEC_KEYS_FILE) or None,
        codec_key_id=source.get(ENV_CODEC_KEY_ID) or None,
    )
