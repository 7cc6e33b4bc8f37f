"""Which Postgres to use: ``DATABASE_URL``, or an embedded server (pgserver) where asked for.

``DATABASE_PASSWORD_FILE`` names a file holding the password for ``DATABASE_URL`` (a Docker
secret), so the password is in neither the URL nor the environment.

The embedded server is used only where it was asked for (``Settings.embedded_db``: `tidemark
dev`, `tidemark demo`, `tidemark chaos`, the tests, ``TIDEMARK_EMBEDDED_DB=1`` or ``tidemark
--embedded-db``); anywhere else a missing ``DATABASE_URL`` is a ConfigError that says how to fix
it, so a production worker never starts a database of its own in a home directory. It keeps its
data in ``$TIDEMARK_HOME/pgdata`` (default ``~/.local/share/tidemark``), so journals survive
restarts of the dev stack. It needs the ``embedded`` extra (pgserver), imported only when it is
started: a worker given ``DATABASE_URL`` never imports it.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import warnings
from pathlib import Path
from typing import Any, BinaryIO

from tidemark.errors import ConfigError
from tidemark.secret_files import read_secret_file
from tidemark.settings import (
    ENV_DATABASE_PASSWORD_FILE,
    ENV_DATABASE_URL,
    ENV_EMBEDDED_DB,
    ENV_HOME,
    Settings,
)

ENV_URL = ENV_DATABASE_URL
ENV_PASSWORD_FILE = ENV_DATABASE_PASSWORD_FILE
__all__ = ["ENV_HOME", "ENV_PASSWORD_FILE", "ENV_URL", "EmbeddedPostgres", "database_url",
           "private_file", "redacted", "stop_embedded", "tidemark_home", "with_password_file"]


def tidemark_home(path: Path) -> Path:
    """The home directory, created and made private on every call.

    ``path`` (``Settings.home``: ``$TIDEMARK_HOME``, default ``~/.local/share/tidemark``),
    created and made private on every call.

    It holds the journal's database, Temporal's history (plans, recipients, amounts) and the
    logs, so it is created 0700 and an existing one with a looser mode is tightened. Run as
    root, the embedded Postgres runs as the system user ``pgserver`` but keeps our group
    (pgserver switches only the user), and must traverse the home to its data directory: then
    the home is 0710 with our own group, closed to everyone else. A home that belongs to
    another user is refused: we could not keep it private.
    """
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    secure_home(path)
    return path


def secure_home(path: Path) -> None:
    st = path.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{ENV_HOME} {path} is not a directory")
    if st.st_uid != os.geteuid():
        raise ConfigError(f"{ENV_HOME} {path} belongs to uid {st.st_uid}, not to this user "
                          f"(uid {os.geteuid()}); it must be private to the user who runs "
                          f"Tidemark: choose another {ENV_HOME} or change its owner")
    mode, gid = 0o700, st.st_gid
    pgdata = path / "pgdata"
    with contextlib.suppress(FileNotFoundError):
        owner = pgdata.stat()
        if owner.st_uid != st.st_uid:  # a database server running as another user
            mode, gid = 0o710, os.getegid()
    if gid != st.st_gid:
        os.chown(path, -1, gid)
    if stat.S_IMODE(st.st_mode) != mode:
        os.chmod(path, mode)


def private_file(path: Path) -> BinaryIO:
    """Opens ``path`` for appending, created (or tightened to) 0600."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "ab")


def import_pgserver() -> Any:
    """``import pgserver``, imported here: only the embedded path needs it.

    pgserver keeps its cross-process lock in platformdirs' user runtime directory, read when
    the module is imported. Without ``XDG_RUNTIME_DIR`` (a root shell, ssh without a login
    session, cron, CI) platformdirs warns and falls back to ``/run/user/<uid>`` or
    ``$TMPDIR/runtime-<uid>``, which it creates 0700 and checks. That fallback is a sound place
    for the lock, and every Tidemark process picks the same one, so the warning tells the user
    nothing to do: that one warning is not shown. Setting ``XDG_RUNTIME_DIR`` here instead
    would move the lock away from where other processes on the same database look for it.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"XDG_RUNTIME_DIR is not set",
                                category=UserWarning)
        import pgserver
    return pgserver


class EmbeddedPostgres:
    """A pgserver instance, stopped when its last holder exits.

    It stops when the last process holding a handle exits (or on ``close``); with ``delete=True``
    its data directory goes too (for tests)."""

    def __init__(self, pgdata: Path, *, delete: bool = False) -> None:
        try:
            pgserver = import_pgserver()
        except ImportError:
            raise ConfigError(f"{ENV_URL} is not set and the embedded Postgres (pgserver) is not "
                              f"installed: set {ENV_URL}, or install the embedded extra "
                              "(pip install 'tidemark[embedded]')") from None

        pgdata.mkdir(parents=True, exist_ok=True)
        self._server: Any = pgserver.get_server(pgdata, cleanup_mode="delete" if delete else "stop")
        # A server this process let go of while another held it stays in pgserver's cache:
        # holding it again must count this process again.
        with self._server._lock:
            self._server.global_process_id_list.get_and_add(os.getpid())

    def url(self, database: str = "postgres") -> str:
        return str(self._server.get_uri(database))

    def close(self) -> None:
        """Lets go of the server: it stops unless another live process holds it.

        pgserver counts its holders by process id in ``.handle_pids.json`` and stops the server
        when the last one lets go. A holder that died without letting go (SIGKILL, a closed
        terminal) stays in that list for ever, and no later holder would ever stop the server:
        the ids of processes that no longer exist are dropped first."""
        server = self._server
        with server._lock:  # pgserver's own lock over the list (pgserver 0.1.4)
            holders = server.global_process_id_list
            with contextlib.suppress(FileNotFoundError):  # deleted with its data already
                holders.put([pid for pid in holders.get() if pid == os.getpid() or _alive(pid)])
        server.cleanup()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    return True


def redacted(url: str) -> str:
    """The URL with any password masked, for printing."""
    import psycopg.conninfo

    try:
        parts = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "<unparsable database URL>"
    if parts.get("password"):
        parts["password"] = "***"
    return psycopg.conninfo.make_conninfo("", **parts)


_embedded: EmbeddedPostgres | None = None


# What a port may be: a number, or one per host of a list of hosts.
_PORTS = re.compile(r"\d+(,\d*)*")
# The parts of a connection string that never hold an @: a URL whose password holds a bare @ (or
# a / or a :) reads with part of the password in one of them, and a connection error would
# print that part.
_NO_AT = ("host", "hostaddr", "port", "user", "dbname")


def checked_url(url: str) -> str:
    """``url`` when it is a connection string whose password stays in place.

    ``url`` when Postgres reads it as a connection string whose password stays in its
    password; otherwise ConfigError naming ``DATABASE_URL`` and how to write it, with no part
    of its value: a URL that does not read may hold a password anywhere, and every error of the
    driver about it (and of the pool that retries it, once per attempt, at every log level)
    quotes the text it could not read."""
    import psycopg.conninfo

    try:
        parts = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        parts = None
    if parts is None or any("@" in str(parts.get(k) or "") for k in _NO_AT) or (
            parts.get("port") and not _PORTS.fullmatch(str(parts["port"]))):
        raise ConfigError(
            f"{ENV_URL} is not a connection string Postgres can read (its value is not shown: it "
            "may hold a password). In a postgresql:// URL, percent-encode each special "
            "character of the user and password (% as %25, a space as %20, @ as %40, \" as %22,"
            " / as %2F, : as %3A), or keep the password in "
            f"{ENV_PASSWORD_FILE}") from None
    return url


def with_password_file(url: str, password_file: str | None) -> str:
    """``url`` with the password read from ``password_file`` (if given) added to it."""
    checked_url(url)
    if not password_file:
        return url
    import psycopg.conninfo

    if psycopg.conninfo.conninfo_to_dict(url).get("password"):
        raise ConfigError(f"{ENV_URL} has a password and {ENV_PASSWORD_FILE} names another: "
                          "keep one of them")
    password = read_secret_file(ENV_PASSWORD_FILE, password_file)
    return psycopg.conninfo.make_conninfo(url, password=password)


def database_url(settings: Settings) -> str:
    """The URL to connect to: ``DATABASE_URL`` or the embedded server.

    The URL to connect to: ``DATABASE_URL`` (with the password of ``DATABASE_PASSWORD_FILE``),
    or, only where ``settings.embedded_db`` allows it, the embedded server (started on first
    use). Neither is a ConfigError that says how to fix it."""
    if settings.database_url:
        return with_password_file(settings.database_url, settings.database_password_file)
    if not settings.embedded_db:
        raise ConfigError(
            f"{ENV_URL} is not set: set it to the journal's Postgres (postgresql://user@host/db), "
            f"or, on a laptop, allow the embedded Postgres in $TIDEMARK_HOME with "
            f"{ENV_EMBEDDED_DB}=1 (`tidemark --embedded-db COMMAND` for one command; `tidemark "
            "dev` and `tidemark demo` use it unless DATABASE_URL is set)")
    global _embedded
    if _embedded is None:
        _embedded = EmbeddedPostgres(tidemark_home(settings.home) / "pgdata")
        # Run as root, pgserver opens every directory above its data to everyone (o+rx) so
        # that its own system user can reach it; take that back for our home.
        tidemark_home(settings.home)
    return _embedded.url()


def stop_embedded() -> None:
    """Lets go of the embedded server this process uses, if any (EmbeddedPostgres.close).

    The stacks call it when they stop, so that a Ctrl-C stops the Postgres they started."""
    global _embedded
    if _embedded is not None:
        embedded, _embedded = _embedded, None
        embedded.close()
