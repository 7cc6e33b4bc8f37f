"""Versioned SQL migrations, applied at start-up and by `tidemark db migrate`.

Each file ``migrations/NNNN_name.sql`` runs once, in order, all of them in one transaction that
first takes a transaction-level advisory lock: processes that start at the same moment are
serialised (the second waits until the first has committed everything, then finds every version
recorded and skips them), and a database either has every migration of a run or none. The lock
is a transaction's, never a session's: it ends with the commit on whatever server connection a
transaction-mode pooler (PgBouncer) gave the transaction, where a session lock taken in one
transaction could be left held on a server connection that another client then reuses.
"""

from __future__ import annotations

import re
from importlib import resources
from typing import Any

import psycopg

from tidemark.errors import ConfigError

# Arbitrary constant shared by every Tidemark process; it only has to differ from the lock ids
# our step keys map to, which are hashes and practically never equal a small number.
MIGRATION_LOCK_ID = 0x7469_6465_6D61_726B  # "tidemark" in ASCII

_NAME_RE = re.compile(r"(\d{4})_[a-z0-9_]+\.sql")


def migration_files() -> list[tuple[int, str, str]]:
    """(version, file name, SQL text) of every bundled migration, in order."""
    found = []
    for entry in resources.files("tidemark.migrations").iterdir():
        m = _NAME_RE.fullmatch(entry.name)
        if m:
            found.append((int(m.group(1)), entry.name, entry.read_text(encoding="utf-8")))
    return sorted(found)


def pending(conn: psycopg.Connection[Any]) -> list[str]:
    """The names of the bundled migrations this database lacks, read without DDL.

    Read without lock too: a worker's or a person's role, which may not change the schema, asks
    this first."""
    found = conn.execute("SELECT to_regclass('tidemark.schema_migrations') IS NOT NULL AS there"
                         ).fetchone()
    there = found["there"] if isinstance(found, dict) else found[0]  # type: ignore[index]
    if not there:
        return [name for _, name, _ in migration_files()]
    rows = conn.execute("SELECT version FROM tidemark.schema_migrations").fetchall()
    applied = {r["version"] if isinstance(r, dict) else r[0] for r in rows}
    return [name for version, name, _ in migration_files() if version not in applied]


def migrate(conn: psycopg.Connection[Any]) -> list[str]:
    """Applies the migrations this database lacks and returns their names.

    A schema that is up to date is left alone without a lock or DDL; one that is not, on a
    connection whose role may not change it, is a ConfigError naming what to run."""
    if not pending(conn):
        return []
    applied: list[str] = []
    try:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_ID,))
            _apply(conn, applied)
    except psycopg.errors.InsufficientPrivilege:
        raise ConfigError(
            f"the journal's schema lacks {len(pending(conn))} migration(s) and the role "
            f"{conn.info.user} may not apply them: run `tidemark db migrate` as the schema's "
            "owner") from None
    return applied


def _apply(conn: psycopg.Connection, applied: list[str]) -> None:
    for version, name, sql in migration_files():
        with conn.transaction():  # a savepoint inside migrate's transaction
            conn.execute("CREATE SCHEMA IF NOT EXISTS tidemark")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS tidemark.schema_migrations ("
                " version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT clock_timestamp())")
            done = conn.execute("SELECT 1 FROM tidemark.schema_migrations WHERE version = %s",
                                (version,)).fetchone()
            if done:
                continue
            conn.execute(sql.encode())  # bytes: a whole script, run as one simple query
            conn.execute("INSERT INTO tidemark.schema_migrations (version, name) VALUES (%s, %s)",
                         (version, name))
            applied.append(name)
