"""Which Postgres to use: ``DATABASE_URL`` if set, else an embedded server (pgserver).

The embedded server keeps its data in ``$TIDEMARK_HOME/pgdata`` (default
``~/.local/share/tidemark``), so journals survive restarts of the dev stack.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

ENV_URL = "DATABASE_URL"
ENV_HOME = "TIDEMARK_HOME"


def tidemark_home() -> Path:
    home = os.environ.get(ENV_HOME)
    path = Path(home) if home else Path.home() / ".local" / "share" / "tidemark"
    path.mkdir(parents=True, exist_ok=True)
    return path


class EmbeddedPostgres:
    """A pgserver instance. It stops when the last process holding a handle exits (or on
    ``close``); with ``delete=True`` its data directory goes too (for tests)."""

    def __init__(self, pgdata: Path, *, delete: bool = False) -> None:
        import pgserver  # imported here: only the embedded path needs it

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
    return psycopg.conninfo.make_conninfo(**parts)


_embedded: EmbeddedPostgres | None = None


def database_url() -> str:
    """The URL to connect to: ``DATABASE_URL``, or the embedded server (started on first use)."""
    url = os.environ.get(ENV_URL)
    if url:
        return url
    global _embedded
    if _embedded is None:
        _embedded = EmbeddedPostgres(tidemark_home() / "pgdata")
    return _embedded.url()
