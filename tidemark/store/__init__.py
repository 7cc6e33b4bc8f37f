"""JournalStore: every read and write of the journal, in one package.

Synchronous psycopg 3: the actions call synchronous SDKs (google-api-python-client, stripe) from
worker threads. A step owns its journal row by a fenced lease (session.StepSession), not by a
connection: each statement borrows a pooled connection for itself, none is held while a step
waits on its target, and nothing relies on session state, so the pool may sit behind a
transaction-mode pooler (connection.POOLER_ENV).

All SQL of the project lives in this package and in ``migrations/``; values are always
parameters. One module per concern, each a set of JournalStore's methods over the shared pool
(base.StoreBase):

* ``steps``: a step's attempt (what it reads when it begins, lease hold, batches); ``session``
  its StepSession (intent, take-over, claim, stage, outcome, all fenced by the attempt's owner
  token); ``leases`` the attempt lease and its keeper;
* ``plans``, ``reports``, ``unwinds``, ``controls`` (stop, kill, release), ``approvals`` (the
  irreversible boundary, the operator's policy, decisions), ``series``, ``grants``, ``needs``
  (who waits for a person) and ``roles`` (login roles for a laptop stack);
* ``journal``: the row shapes and the conditions on a task's state the statements share;
  ``connection``: timeouts, pool size, and what a lost connection means.
"""

from __future__ import annotations

from tidemark.store.approvals import ApprovalsMixin
from tidemark.store.base import StoreBase
from tidemark.store.connection import CONNECT_TIMEOUT_S, POOL_MAX, POOL_TIMEOUT_S
from tidemark.store.controls import ControlsMixin
from tidemark.store.grants import GrantsMixin
from tidemark.store.journal import JournalRow, Progress
from tidemark.store.leases import (
    EXIT_LEASE_LAPSED,
    LAPSE_MARGIN_S,
    LEASE_RENEW_S,
    LEASE_S,
    RENEW_AHEAD_S,
    RENEW_MIN_GAP_S,
    RENEW_TIMEOUT_MS,
    WATCH_EVERY_S,
    LeaseKeeper,
    end_process,
)
from tidemark.store.needs import NeedsMixin
from tidemark.store.plans import PlansMixin
from tidemark.store.reports import ReportsMixin
from tidemark.store.roles import RolesMixin
from tidemark.store.series import SeriesMixin
from tidemark.store.session import StepSession
from tidemark.store.steps import StepsMixin
from tidemark.store.unwinds import UnwindsMixin


class JournalStore(StepsMixin, PlansMixin, ReportsMixin, UnwindsMixin, ControlsMixin,
                   ApprovalsMixin, SeriesMixin, GrantsMixin, NeedsMixin, RolesMixin, StoreBase):
    """The journal on one Postgres database: every concern's statements over one pool."""


__all__ = [
    "CONNECT_TIMEOUT_S",
    "EXIT_LEASE_LAPSED",
    "LAPSE_MARGIN_S",
    "LEASE_RENEW_S",
    "LEASE_S",
    "POOL_MAX",
    "POOL_TIMEOUT_S",
    "RENEW_AHEAD_S",
    "RENEW_MIN_GAP_S",
    "RENEW_TIMEOUT_MS",
    "WATCH_EVERY_S",
    "JournalRow",
    "JournalStore",
    "LeaseKeeper",
    "Progress",
    "StepSession",
    "end_process",
]
