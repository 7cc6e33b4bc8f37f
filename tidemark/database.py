"""Which Postgres to use: ``DATABASE_URL`` if set, else an embedded server (pgserver).

``DATABASE_PASSWORD_FILE`` names a file holding the password for ``DATABASE_URL`` (a Docker
secret), so the password is in neither the URL nor the environment.

The embedded server keeps its data in ``$TIDEMARK_HOME/pgdata`` (default
``~/.local/share/tidemark``), so journals survive restarts of the dev stack. It needs the
``embedded`` extra (pgserver), imported only when it is started: a worker given ``DATABASE_URL``
never imports it.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

from tidemark.errors import ConfigError
from tidemark.secret_files import read_secret_file

ENV_URL = "DATABASE_URL"
ENV_PASSWORD_FILE = "DATABASE_PASSWORD_FILE"
ENV_HOME = "TIDEMARK_HOME"


def tidemark_home() -> Path:
    """``$TIDEMARK_HOME`` (default ``~/.local/share/tidemark``), made private on every call.

    It holds the journal's database, Temporal's history (plans, recipients, amounts) and the
    logs, so it is created 0700 and an existing one with a looser mode is tightened. Run as
    root, the embedded Postgres runs as the system user ``pgserver`` but keeps our group
    (pgserver switches only the user), and must traverse the home to its data directory: then
    the home is 0710 with our own group, closed to everyone else. A home that belongs to
    another user is refused: we could not keep it private.
    """
    home = os.environ.get(ENV_HOME)
    path = Path(home) if home else Path.home() / ".local" / "share" / "tidemark"
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


class EmbeddedPostgres:
    """A pgserver instance. It stops when the last process holding a handle exits (or on
    ``close``); with ``delete=True`` its data directory goes too (for tests)."""

    def __init__(self, pgdata: Path, *, delete: bool = False) -> None:
        try:
            import pgserver  # imported here: only the embedded path needs it
        except ImportError:
            raise ConfigError(f"{ENV_URL} is not set and the embedded Postgres (pgserver) is not "
                              f"installed: set {ENV_URL}, or install the embedded extra "
                              "(pip install 'tidemark[embedded]')") from None

        pgdata.mkdir(parents=True, exist_ok=True)
        self._server: Any = pgserver.get_server(pgdata, cleanup_mode="delete" if delete else "stop")

    def url(self, database: str = "postgres") -> str:
        return str(self._server.get_uri(database))

    def close(self) -> None:
        self._server.cleanup()


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


def with_password_file(url: str, password_file: str | None) -> str:
    """``url`` with the password read from ``password_file`` (if given) added to it."""
    if not password_file:
        return url
    import psycopg.conninfo

    if psycopg.conninfo.conninfo_to_dict(url).get("password"):
        raise ConfigError(f"{ENV_URL} has a password and {ENV_PASSWORD_FILE} names another: "
                          "keep one of them")
    password = read_secret_file(ENV_PASSWORD_FILE, password_file)
    return psycopg.conninfo.make_conninfo(url, password=password)


def database_url() -> str:
    """The URL to connect to: ``DATABASE_URL`` (with the password of ``DATABASE_PASSWORD_FILE``),
    or the embedded server (started on first use)."""
    url = os.environ.get(ENV_URL)
    if url:
        return with_password_file(url, os.environ.get(ENV_PASSWORD_FILE))
    global _embedded
    if _embedded is None:
        _embedded = EmbeddedPostgres(tidemark_home() / "pgdata")
        # Run as root, pgserver opens every directory above its data to everyone (o+rx) so
        # that its own system user can reach it; take that back for our home.
        tidemark_home()
    return _embedded.url()
