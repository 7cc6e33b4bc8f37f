"""The staging server for the target tests: one server with all four targets.

It serves the whole session, reset before every test that uses it, and its control endpoints driven
over HTTP as an operator would.

Registered as a pytest plugin in ``conftest.py``, so test modules take the fixtures by name
and import only the helper functions.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any, TypeVar

import pytest

from staging.core import Staging, StagingServer, Target
from staging.drive import DriveTarget
from staging.stripe import StripeTarget
from staging.targets import build_staging

# Short enough that a timeout test is quick, long enough that a loaded 2-core CI box never
# trips it on a healthy request.
CLIENT_TIMEOUT_S = 5.0

T = TypeVar("T", bound=Target)


@pytest.fixture(scope="session")
def staging_server() -> Iterator[StagingServer]:
    """The one staging server of the session (Drive, Gmail, Graph, Stripe), as it is.

    Use ``server`` for a reset one."""
    with StagingServer(build_staging()) as s:
        yield s


# How long a test's server waits for writes an earlier test left held (a delay fault outlasting
# its test) before it resets: the longest delay a test arms is a few seconds.
LEFT_IN_FLIGHT_S = 20.0


@pytest.fixture
def server(staging_server: StagingServer) -> StagingServer:
    """The staging server with no files, messages, payments, faults or extra tokens.

    No write of an earlier test is still held: one that landed after the reset would be this
    test's effect (a mail sent twice that was sent once)."""
    staging = staging_server.staging
    deadline = time.monotonic() + LEFT_IN_FLIGHT_S
    while (held := staging.in_flight()) and time.monotonic() < deadline:
        time.sleep(0.02)
    if held:
        pytest.fail(f"an earlier test left {len(held)} write(s) held at the staging server for "
                    f"over {LEFT_IN_FLIGHT_S:g} s, e.g. {held[0].method} {held[0].path}")
    staging.reset()
    return staging_server


@pytest.fixture
def mail(server: StagingServer) -> StagingServer:
    """The reset staging server, under the name the Gmail and Graph tests give it."""
    return server


@pytest.fixture
def staging(server: StagingServer) -> Staging:
    """The reset server's state, for arming faults and reading effects directly."""
    return server.staging


@pytest.fixture
def drive(staging: Staging) -> DriveTarget:
    return target_of(staging, DriveTarget)


@pytest.fixture
def stripe_target(staging: Staging) -> StripeTarget:
    return target_of(staging, StripeTarget)


def target_of(staging: Staging, kind: type[T]) -> T:
    """The target of class ``kind`` in ``staging``, typed as such."""
    target = staging.targets[kind.name]
    assert isinstance(target, kind)
    return target


def post(server: StagingServer, path: str, body: dict[str, Any] | None = None) -> Any:
    """POSTs a staging control endpoint and returns its JSON answer."""
    req = urllib.request.Request(server.url + path, data=json.dumps(body or {}).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


def get(server: StagingServer, path: str) -> Any:
    """GETs a staging control endpoint and returns its JSON answer."""
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
