"""Shared fixtures: a real Postgres (embedded unless DATABASE_URL is set), a fresh database per
test, and a migrated JournalStore on it."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from tidemark.actions import Action, Registry
from tidemark.database import ENV_URL, EmbeddedPostgres
from tidemark.store import JournalStore


class PostgresServer:
    """Makes one fresh database per test on a server."""

    def __init__(self, admin_url: str, url_for: Callable[[str], str]) -> None:
        self.admin_url = admin_url
        self.url_for = url_for

    def new_database(self) -> str:
        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name)))
        return self.url_for(name)


@pytest.fixture(scope="session")
def pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer]:
    external = os.environ.get(ENV_URL)
    if external:
        base = psycopg.conninfo.conninfo_to_dict(external)

        def url_for(name: str) -> str:
            return psycopg.conninfo.make_conninfo(**{**base, "dbname": name})

        yield PostgresServer(external, url_for)
        return
    server = EmbeddedPostgres(Path(tmp_path_factory.mktemp("pg")) / "data", delete=True)
    yield PostgresServer(server.url(), server.url)
    server.close()


@pytest.fixture
def db_url(pg: PostgresServer) -> str:
    return pg.new_database()


@pytest.fixture
def store(db_url: str) -> Iterator[JournalStore]:
    s = JournalStore(db_url).open()
    s.migrate()
    yield s
    s.close()


@pytest.fixture
def registry_for() -> Callable[..., Registry]:
    """Builds a registry of bound action instances: ``registry_for(FsRename(), ...)``."""

    def build(*actions: Action) -> Registry:
        return Registry(actions)

    return build

