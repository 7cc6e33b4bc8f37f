"""How the store reaches Postgres, and what a lost connection means.

Its timeouts and sizes, and what a lost connection means to the caller (StoreUnavailable,
retryable)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg_pool import PoolTimeout

from tidemark.errors import ConfigError, DecisionRefused, NotAuthorized, StoreUnavailable

# A step waits this long for a pooled connection before its attempt fails as retryable; long
# enough to ride out a burst, short enough that a dead database surfaces within one heartbeat.
POOL_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 5  # libpq connect_timeout: a blackholed host fails fast, not after minutes
# Each statement of a step borrows a connection for itself; none is held across a call to a
# target (StepSession), so a few connections serve a worker's many steps in flight.
POOL_MAX = 8


# TIDEMARK_DB_POOLER says what stands between Tidemark and Postgres: nothing (``none``, the
# default) or a transaction-mode pooler such as PgBouncer (``transaction``). The store keeps no
# session state either way (no session locks, no session settings: see StepSession), so the one
# difference is prepared statements: psycopg prepares a statement on the server session after
# it ran a few times, and through a transaction-mode pooler the next transaction may run on a
# server session that never saw it (PgBouncer before 1.21, or with max_prepared_statements 0).
POOLER_ENV = "TIDEMARK_DB_POOLER"
POOLERS = ("none", "transaction")


def pooler(env: Mapping[str, str] = os.environ) -> str:
    """The pooler TIDEMARK_DB_POOLER names.

    Any other value is a ConfigError: a session-mode pooler pins a server connection to every
    client connection, which bounds nothing."""
    value = env.get(POOLER_ENV, "none").strip() or "none"
    if value == "session":
        raise ConfigError(f"{POOLER_ENV}=session: Tidemark needs no session, and a pooler in "
                          "session mode gives every client connection a server connection of "
                          "its own; run it with pool_mode = transaction and set "
                          f"{POOLER_ENV}=transaction")
    if value not in POOLERS:
        raise ConfigError(f"{POOLER_ENV}={value!r}: expected one of {', '.join(POOLERS)}")
    return value


def connect_options(env: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """psycopg.connect arguments for the pooler in use.

    No server-side prepared statements through a transaction-mode pooler."""
    return {"prepare_threshold": None} if pooler(env) == "transaction" else {}


# The SQLSTATEs the journal's own checks raise (tidemark/migrations/0016_authority.sql): an act
# the login role may not do, and the rule that refused a decision.
NOT_AUTHORIZED = ("TA001", "TA002")
BAD_APPROVER = "TA003"
DECISION_REFUSALS = {"TD002": "approvers", "TD003": "decided", "TD004": "stopped",
                     "TD005": "nothing", "TD006": "plan"}


@contextmanager
def _translated(role: str = "of this connection") -> Iterator[None]:
    """Turns connection failures and the journal's refusals into typed errors.

    Turns connection-level failures into the retryable StoreUnavailable, and the journal's
    refusals of an act (who may do it, whether a decision holds) into their typed errors, each
    with the database's one line. ``role`` names the login role in a refusal."""
    try:
        yield
    except PoolTimeout as e:  # an OperationalError of its own: before the others
        raise StoreUnavailable(f"no database connection in time: {e}") from e
    except psycopg.errors.InsufficientPrivilege as e:
        raise NotAuthorized(f"the journal refuses this to the role {role}: "
                            f"{e.diag.message_primary}; an operator grants what it takes "
                            "(tidemark_operator, tidemark_approver: docs/operate.md, who may do "
                            "what)") from None
    except psycopg.Error as e:
        if e.sqlstate in NOT_AUTHORIZED:
            raise NotAuthorized(str(e.diag.message_primary)) from None
        if e.sqlstate == BAD_APPROVER:
            raise ConfigError(str(e.diag.message_primary)) from None
        if e.sqlstate in DECISION_REFUSALS:
            raise DecisionRefused(str(e.diag.message_primary),
                                  DECISION_REFUSALS[e.sqlstate]) from None
        if isinstance(e, psycopg.OperationalError | psycopg.errors.SerializationFailure
                      | psycopg.errors.DeadlockDetected):
            raise StoreUnavailable(f"database unavailable: {e}".strip()) from e
        raise


def login_role(conninfo: str) -> str:
    """The login role a connection string connects as.

    Its user, else libpq's default, the operating-system user."""
    import getpass

    try:
        user = psycopg.conninfo.conninfo_to_dict(conninfo).get("user")
    except psycopg.ProgrammingError:
        user = None
    return str(user) if user else getpass.getuser()


def database_beside(conninfo: str, name: str) -> str:
    """The URL of the database ``name`` on the server of ``conninfo``, created if missing.

    A journal of its own beside another (the demo's, tools/stack/demo.py). Creating it needs
    CREATEDB (the embedded Postgres's owner has it); a role without it is a ConfigError that
    says what to do."""
    from psycopg import errors, sql

    with psycopg.connect(conninfo, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as conn:
        there = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                             (name,)).fetchone() is not None
        if not there:
            try:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            except errors.DuplicateDatabase:  # another process made it meanwhile
                pass
            except errors.InsufficientPrivilege:
                raise ConfigError(f"the database {name} does not exist and login role "
                                  f"{login_role(conninfo)} may not create it: create it "
                                  f"(CREATE DATABASE {name}) or grant CREATEDB") from None
    return psycopg.conninfo.make_conninfo(conninfo, dbname=name)
