"""The login roles the tests connect as, besides the superuser that owns each test database.

The journal knows who does what by the login role of the connection (its migration 0016): a
worker's role decides nothing, an operator releases and declares, an approver decides. The
fixtures of tests/conftest.py make these roles once per cluster.
"""

from __future__ import annotations

import os
import pwd

import psycopg

from tidemark.words import JournalRole

# The person running the tests: an operator and an approver, as `tidemark dev` makes its user.
OS_USER = pwd.getpwuid(os.geteuid()).pw_name
# A worker's login role: a member of tidemark_worker only.
WORKER_ROLE = "tm_worker"
# Other people, each with the journal's role an operator granted them: two approvers, an
# operator who may not approve, and somebody with none.
PEOPLE = {"ana": JournalRole.TIDEMARK_APPROVER, "ben": JournalRole.TIDEMARK_APPROVER,
          "olga": JournalRole.TIDEMARK_OPERATOR, "mallory": None}


def as_role(url: str, role: str) -> str:
    """``url`` for the login role ``role``."""
    return psycopg.conninfo.make_conninfo(url, user=role)
