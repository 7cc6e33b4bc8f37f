"""The checks at the wire (tidemark.wire), each alone, through the real client transports.

They run against the staging servers. A write never leaves once the lease committed for its call
no longer covers it, on the worker's monotonic clock (the Google clients' blocking and awaited
transports, the Graph client's), nor within the margin of its cover; the mark is refused once a
twin owns the intent; a renewal extends only the cover of a lease it renewed."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from activities.catalog import spec_registry
from activities.drive import DriveRename, drive_client
from activities.graph import GraphSendMail
from helpers.staging_fixtures import CLIENT_TIMEOUT_S, get
from helpers.steps import persist, step_context
from probes.graph import graph_client
from staging.core import StagingServer
from staging.drive import DEFAULT_READ_TOKEN, DEFAULT_WRITE_TOKEN, DriveTarget
from staging.graph import READ_TOKEN, SEND_TOKEN
from tidemark.actions import StepContext
from tidemark.errors import NotSent
from tidemark.keys import key_for
from tidemark.store import JournalStore
from tidemark.store.leases import LAPSE_MARGIN_S
from tidemark.wire import Wire, calling, effect

ARGS = {"to": ["bob@example.com"], "subject": "Invoice 42", "body": "Details below."}


@pytest.fixture
def keeper_store(store: JournalStore, db_url: str) -> Iterator[JournalStore]:
    """A store on the test's (migrated) database whose lease keeper notes a lapse.

    The keeper notes it instead of ending the process."""
    lapsed: list[list[str]] = []
    with JournalStore(db_url, on_lapse=lapsed.append) as store:
        yield store


def held(store: JournalStore, task: str, covered_for: float) -> str:
    """Step 1's intent, and a call on it held by the lease keeper for another owner.

    The intent is written by one attempt. The call's owner is not the row's (a twin took it over:
    no renewal extends it). It is covered for ``covered_for`` seconds from now (negative: the
    cover has run out)."""
    with store.execution(task, 1) as s:
        key = key_for(task, 1, s.spec.action, s.spec.args)
        s.begin(task_id=task, step=1, key=key, action=s.spec.action, args=s.spec.args,
                before_state={}, lease_s=60.0)
    store.leases.hold(key, uuid.uuid4(), 60.0, horizon_s=0.0,
                      covered_until=time.monotonic() + covered_for, deadline_s=60.0)
    return key


def wire(store: JournalStore, key: str) -> Wire:
    return Wire(1, "", covered=lambda: store.covers(key))


def drive_task(store: JournalStore, drive: DriveTarget, task: str) -> tuple[str, StepContext]:
    f = drive.seed("scan.pdf")
    args = {"file_id": f.id, "name": "Q3.pdf"}
    persist(store, spec_registry(DriveRename), [{"action": "drive.rename", "args": args}], task)
    return f.id, step_context("drive.rename", args, task)


def writes(server: StagingServer, target: str) -> list[dict[str, Any]]:
    return [r for r in get(server, f"/_staging/requests?target={target}")
            if r["method"] != "GET"]


def rename(server: StagingServer) -> DriveRename:
    return DriveRename(
        writer=drive_client(server.url, DEFAULT_WRITE_TOKEN, timeout=CLIENT_TIMEOUT_S),
        reader=drive_client(server.url, DEFAULT_READ_TOKEN, timeout=CLIENT_TIMEOUT_S),
        timeout=CLIENT_TIMEOUT_S)


@pytest.mark.parametrize("path", ["blocking", "awaited"])
def test_a_drive_write_never_leaves_once_the_lease_no_longer_covers_it(
        keeper_store: JournalStore, server: StagingServer, drive: DriveTarget,
        path: str) -> None:
    file_id, ctx = drive_task(keeper_store, drive, f"uncovered-{path}")
    key = held(keeper_store, ctx.task_id, covered_for=-1.0)
    action = rename(server)
    with calling(wire(keeper_store, key)), pytest.raises(NotSent, match="no longer covers"):
        if path == "blocking":
            action.execute(ctx)
        else:
            asyncio.run(action.execute_async(ctx))
    assert writes(server, "drive") == []  # nothing reached Drive
    assert drive.files[file_id].name == "scan.pdf"


def test_a_drive_write_covered_by_its_lease_leaves(
        keeper_store: JournalStore, server: StagingServer, drive: DriveTarget) -> None:
    file_id, ctx = drive_task(keeper_store, drive, "covered")
    key = held(keeper_store, ctx.task_id, covered_for=120.0)
    with calling(wire(keeper_store, key)):
        rename(server).execute(ctx)
    assert drive.files[file_id].name == "Q3.pdf"


def test_a_request_within_the_margin_of_its_cover_does_not_leave(
        keeper_store: JournalStore, server: StagingServer, drive: DriveTarget) -> None:
    """A request within the margin of its cover does not leave.

    The call is covered for a moment more, within the margin the deadline watch keeps too (it
    would end the process there)."""
    _, ctx = drive_task(keeper_store, drive, "at-the-edge")
    key = held(keeper_store, ctx.task_id, covered_for=LAPSE_MARGIN_S / 2)
    with calling(wire(keeper_store, key)), pytest.raises(NotSent):
        rename(server).execute(ctx)
    assert writes(server, "drive") == []


def test_a_graph_write_never_leaves_once_the_lease_no_longer_covers_it(
        keeper_store: JournalStore, server: StagingServer) -> None:
    persist(keeper_store, spec_registry(GraphSendMail),
            [{"action": "graph.send_mail", "args": ARGS}], "uncovered-graph")
    key = held(keeper_store, "uncovered-graph", covered_for=-1.0)
    action = GraphSendMail(writer=graph_client(server.url, SEND_TOKEN, timeout=CLIENT_TIMEOUT_S),
                           reader=graph_client(server.url, READ_TOKEN, timeout=CLIENT_TIMEOUT_S))
    with calling(wire(keeper_store, key)), effect(), pytest.raises(NotSent):
        action.stage(step_context("graph.send_mail", ARGS, "uncovered-graph"))
    assert writes(server, "graph") == []


def test_the_mark_is_refused_once_a_twin_owns_the_intent(store: JournalStore,
                                                        drive: DriveTarget) -> None:
    _, ctx = drive_task(store, drive, "mark-owner")
    with store.execution(ctx.task_id, 1) as first:
        first.begin(task_id=ctx.task_id, step=1, key=ctx.key, action=ctx.action,
                    args=ctx.args, before_state={}, lease_s=0.0)  # lapses at once
    with store.execution(ctx.task_id, 1) as twin:
        assert twin.take_over(ctx.key, 5.0, 5.0) is None
        assert not first.mark_sent(ctx.key)  # the first attempt's request must not leave
        assert twin.mark_sent(ctx.key)
    row = store.step_row(ctx.task_id, 1)
    assert row is not None and row.sent_at is not None and row.returned_at is None


def test_a_renewal_extends_only_the_cover_of_a_lease_it_renewed(
        keeper_store: JournalStore, drive: DriveTarget) -> None:
    _, ctx = drive_task(keeper_store, drive, "renewed-only")
    with keeper_store.execution(ctx.task_id, 1) as s:
        s.begin(task_id=ctx.task_id, step=1, key=ctx.key, action=ctx.action, args=ctx.args,
                before_state={}, lease_s=60.0)
        owner = s.attempt_token()
    keeper = keeper_store.leases
    for who, extended in ((uuid.uuid4(), False), (owner, True)):
        keeper.hold(ctx.key, who, 30.0, horizon_s=0.0, covered_until=time.monotonic() - 1.0,
                    deadline_s=60.0)
        keeper._renew({ctx.key: (30.0, 0.0, who)}, [])
        assert keeper.covers(ctx.key) is extended, who
        keeper.drop(ctx.key)
