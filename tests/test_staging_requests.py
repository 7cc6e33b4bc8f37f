"""The staging servers' request log: every write request, whatever became of it.

So that a test counts what reached the provider rather than what the journal says."""

from __future__ import annotations

import pytest

from activities.drive import drive_client
from activities.stripe import stripe_client
from helpers.staging_fixtures import CLIENT_TIMEOUT_S, get, post
from helpers.wait import assert_eventually
from staging.core import Fault, Staging, StagingServer
from staging.drive import DEFAULT_WRITE_TOKEN
from staging.stripe import DEFAULT_SECRET_KEY


def test_an_idempotent_replay_is_logged_as_a_request_but_is_no_effect(
        server: StagingServer, staging: Staging) -> None:
    client = stripe_client(server.url, DEFAULT_SECRET_KEY, timeout=CLIENT_TIMEOUT_S)
    ids = [client.v1.payment_intents.create(params={"amount": 900, "currency": "eur"},
                                            options={"idempotency_key": "k-1"}).id
           for _ in range(2)]
    assert ids[0] == ids[1]
    logged = get(server, "/_staging/requests?target=stripe")
    assert [(r["method"], r["route"], r["key"], r["status"], r["replayed"]) for r in logged] == [
        ("POST", "/v1/payment_intents", "k-1", 200, False),
        ("POST", "/v1/payment_intents", "k-1", 200, True)]
    assert len(staging.effects_of("stripe", "payment_intents.create")) == 1


def test_a_dropped_answer_and_a_refusal_are_logged_with_their_status(
        server: StagingServer, staging: Staging) -> None:
    f = post(server, "/_staging/drive/files", {"name": "a.pdf"})
    writer = drive_client(server.url, DEFAULT_WRITE_TOKEN, timeout=CLIENT_TIMEOUT_S)
    staging.arm(Fault("drive", "files.update", "drop_after_commit"))
    with pytest.raises(Exception):  # noqa: B017 - the client sees a dropped connection
        writer.files().update(fileId=f["id"], body={"name": "b.pdf"}).execute(num_retries=0)
    staging.arm(Fault("drive", "files.update", "fail_before_commit"))
    with pytest.raises(Exception):  # noqa: B017 - a 503
        writer.files().update(fileId=f["id"], body={"name": "c.pdf"}).execute(num_retries=0)
    assert [(r.target, r.method, r.status) for r in staging.requests_of("drive")] == [
        ("drive", "PATCH", 0), ("drive", "PATCH", 503)]
    assert len(staging.effects_of("drive", "files.update")) == 1


def test_a_request_the_client_gave_up_on_is_logged_while_it_runs(
        server: StagingServer, staging: Staging) -> None:
    f = post(server, "/_staging/drive/files", {"name": "a.pdf"})
    staging.arm(Fault("drive", "files.update", "delay", seconds=2.0))
    impatient = drive_client(server.url, DEFAULT_WRITE_TOKEN, timeout=0.5)  # the delay's victim
    with pytest.raises(Exception):  # noqa: B017 - the client's own timeout
        impatient.files().update(fileId=f["id"], body={"name": "b.pdf"}).execute(num_retries=0)
    [entry] = staging.requests_of("drive")
    assert entry.status is None and not staging.effects_of("drive")  # still in flight
    assert_eventually(lambda: staging.requests_of("drive")[0].status == 200, timeout=10)
    assert len(staging.effects_of("drive", "files.update")) == 1
