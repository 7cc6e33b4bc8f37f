"""Fixtures and helpers shared by the Gmail and Graph tests: one staging server for the session,
reset before every test, and its control endpoints driven over HTTP as an operator would.

Test modules import the fixtures by their function names (``mail_fixture``,
``mail_server_fixture``) and use them as ``mail`` and ``mail_server``."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from staging.core import Staging, StagingServer
from staging.gmail import GmailTarget
from staging.graph import GraphTarget
from tidemark.actions import Registry, StepContext
from tidemark.keys import key_for
from tidemark.plan import load_plan
from tidemark.store import JournalStore

# Short enough that a timeout test is quick, long enough that a loaded 2-core CI box never
# trips it on a healthy request.
CLIENT_TIMEOUT_S = 5.0


@pytest.fixture(scope="session", name="mail_server")
def mail_server_fixture() -> Iterator[StagingServer]:
    with StagingServer(Staging([GmailTarget(), GraphTarget()])) as server:
        yield server


@pytest.fixture(name="mail")
def mail_fixture(mail_server: StagingServer) -> StagingServer:
    """The staging server with no messages, faults or extra tokens."""
    post(mail_server, "/_staging/reset")
    return mail_server


def post(server: StagingServer, path: str, body: dict[str, Any] | None = None) -> Any:
    """POSTs a staging control endpoint and returns its JSON answer."""
    req = urllib.request.Request(server.url + path, data=json.dumps(body or {}).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


def get(server: StagingServer, path: str) -> Any:
    with urllib.request.urlopen(server.url + path, timeout=5) as resp:
        return json.loads(resp.read())


def arm(server: StagingServer, target: str, op: str, kind: str, **extra: Any) -> None:
    post(server, "/_staging/faults", {"target": target, "op": op, "kind": kind, **extra})


def revoke(server: StagingServer, token: str) -> None:
    post(server, f"/_staging/tokens/{token}/revoke")


def add_token(server: StagingServer, token: str, target: str, scopes: list[str]) -> None:
    post(server, "/_staging/tokens", {"token": token, "target": target, "scopes": scopes})


def effects(server: StagingServer, target: str, op: str) -> list[dict[str, Any]]:
    return get(server, f"/_staging/effects?target={target}&op={op}")


def step_context(action: str, args: dict[str, Any], task_id: str = "mail-task",
                 step: int = 1) -> StepContext:
    """The context run_step would build once the intent exists (started now)."""
    return StepContext(task_id=task_id, step=step, action=action, args=args,
                       key=key_for(task_id, step, action, args), started_at=datetime.now(UTC))


def persist(store: JournalStore, specs: Registry, steps: list[dict[str, Any]],
            task_id: str = "mail-task") -> str:
    plan = load_plan({"task_id": task_id, "steps": steps}, specs)
    store.persist_plan(plan)
    return plan.task_id
