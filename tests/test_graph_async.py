"""``graph.send_mail`` awaiting its call (``execute_async``) without a thread.

msgraph-sdk on its client loop, awaited from the caller's loop without a thread, against the
Graph staging server. The same send, watch for a late send and confirm as ``execute``; per-task
grants on the wire; a wait that holds no thread; a cancelled call cancelled on the client loop
too."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import replace
from typing import Any

import pytest

from activities.acting import acting_for
from activities.graph import GraphSendMail
from activities.wiring import worker_registry
from helpers.staging_fixtures import CLIENT_TIMEOUT_S, arm, effects
from helpers.steps import step_context
from helpers.wait import assert_eventually
from probes.graph import GraphClient, graph_client
from staging.core import Staging, StagingServer
from staging.graph import READ_TOKEN, SEND_TOKEN
from tidemark.actions import ProbeStatus, StepContext
from tidemark.errors import TargetUnavailable
from tidemark.grants import GrantBroker
from tidemark.plan import load_plan
from tidemark.store import JournalStore

ARGS = {"to": ["bob@example.com"], "subject": "Invoice 42", "body": "Details below."}
SEND = "message.send"
HELD = 50  # steps waiting at once on one held send each
LATE_S = 2.0


def action(server: StagingServer, *, timeout: float = CLIENT_TIMEOUT_S,
           confirm_s: float = 1.0) -> GraphSendMail:
    return GraphSendMail(writer=graph_client(server.url, SEND_TOKEN, timeout=timeout),
                         reader=graph_client(server.url, READ_TOKEN,
                                             timeout=max(timeout, CLIENT_TIMEOUT_S)),
                         confirm_s=confirm_s, late_s=LATE_S)


def staged(a: GraphSendMail, subject: str = "Invoice 42", task_id: str = "t") -> StepContext:
    """A step whose draft was created and journaled, as run_step builds it.

    ``stage`` runs on a step thread; only ``execute`` awaits."""
    ctx = step_context("graph.send_mail", {**ARGS, "subject": subject}, task_id=task_id,
                       before_state={"fence": "draft"})
    return replace(ctx, staged=a.stage(ctx))


def keys_sent(server: StagingServer) -> list[str | None]:
    return [e["key"] for e in effects(server, "graph", SEND)]


def threads() -> int:
    """The process's threads as the kernel counts them (any thread, not only Python's)."""
    return len(os.listdir("/proc/self/task"))


async def until_held(staging: Staging, n: int, calls: list[asyncio.Task[Any]]) -> None:
    """Returns once ``n`` sends have reached Graph and are being held there.

    The calls still wait on them. Fails as soon as a call ended instead."""
    def held() -> int:
        return sum(r.status is None and r.route.endswith("/send")
                   for r in staging.requests_of("graph"))
    while held() < n:
        assert not any(c.done() for c in calls), [c.exception() for c in calls if c.done()]
        await asyncio.sleep(0.02)


async def test_execute_async_sends_the_staged_draft_once_as_execute_does(
        mail: StagingServer) -> None:
    a = action(mail)
    assert a.awaits
    awaited, blocked = staged(a, "awaited"), staged(a, "blocked")
    outcome = await a.execute_async(awaited)
    assert outcome["internetMessageId"] == awaited.staged["internetMessageId"]
    assert outcome["draft"] == awaited.staged and outcome["accepted"] is True
    assert set(outcome) == set(a.execute(blocked))
    assert sorted(keys_sent(mail)) == sorted([awaited.key, blocked.key])
    # Both reads find the sent copy; where (Outbox, then Sent Items) depends on the moment, as
    # Graph moves a submitted message on its own time.
    probed, read = await a.reader.probe_async(awaited), a.probe(awaited)
    assert probed.status is ProbeStatus.DONE and read.status is ProbeStatus.DONE
    assert probed.observed["internetMessageId"] == read.observed["internetMessageId"] == \
        awaited.staged["internetMessageId"]


async def test_fifty_held_sends_wait_without_a_thread_each(mail: StagingServer,
                                                           staging: Staging) -> None:
    # Held long enough that all fifty reach Graph before the first is let go, on a loaded
    # machine. The clients wait well beyond the hold, and each send's confirmation (its draft
    # has left Drafts) gets as long: fifty are read at once when the hold ends.
    hold_s = 5.0
    a = action(mail, timeout=4 * hold_s, confirm_s=4 * hold_s)
    contexts = [staged(a, f"s{i}") for i in range(HELD)]
    await a.execute_async(staged(a, "warm-up"))  # the client loop's pools are ready
    before = threads()
    arm(mail, "graph", SEND, "delay", seconds=hold_s, times=HELD)
    calls = [asyncio.create_task(a.execute_async(ctx)) for ctx in contexts]
    await until_held(staging, HELD, calls)
    grown = threads() - before
    assert grown < 10, f"{grown} threads for {HELD} waiting sends"
    outcomes = await asyncio.gather(*calls)
    assert [o["internetMessageId"] for o in outcomes] == [
        c.staged["internetMessageId"] for c in contexts]
    assert len(keys_sent(mail)) == HELD + 1


async def test_an_unanswered_send_is_watched_until_it_lands(mail: StagingServer) -> None:
    ctx = staged(action(mail))
    a = action(mail, timeout=0.3)
    arm(mail, "graph", SEND, "delay", seconds=1.0)
    outcome = await a.execute_async(ctx)
    assert outcome["internetMessageId"] == ctx.staged["internetMessageId"]
    assert keys_sent(mail) == [ctx.key]


async def test_a_send_that_never_lands_is_watched_for_late_s_then_in_doubt(
        mail: StagingServer) -> None:
    ctx = staged(action(mail))
    a = action(mail, timeout=0.3)
    arm(mail, "graph", SEND, "delay", seconds=LATE_S + 2)  # lands after the watch
    started = time.monotonic()
    with pytest.raises(TargetUnavailable):
        await a.execute_async(ctx)
    assert time.monotonic() - started >= LATE_S
    assert keys_sent(mail) == []  # it has not landed yet, and nothing sent it again
    # It lands later, once; waited for here so that it cannot land in the next test's server.
    assert_eventually(lambda: keys_sent(mail) == [ctx.key], timeout=10)


async def test_a_lost_answer_is_in_doubt_and_sent_once(mail: StagingServer) -> None:
    a = action(mail)
    ctx = staged(a)
    arm(mail, "graph", SEND, "drop_after_commit")
    with pytest.raises(TargetUnavailable):
        await a.execute_async(ctx)
    assert keys_sent(mail) == [ctx.key]
    assert a.probe(ctx).status is ProbeStatus.DONE


async def client_loop_tasks(client: GraphClient) -> int:
    """How many tasks the client's loop runs (those that count them included)."""
    async def count() -> int:
        return len(asyncio.all_tasks())
    return await client.loop.run_async(count(), 5.0)


async def test_a_cancelled_send_raises_cancelled_and_is_cancelled_on_the_client_loop(
        mail: StagingServer, staging: Staging) -> None:
    a = action(mail)
    ctx = staged(a)
    arm(mail, "graph", SEND, "delay", seconds=2.0)
    idle = await client_loop_tasks(a.writer)
    call = asyncio.create_task(a.execute_async(ctx))
    await until_held(staging, 1, [call])
    assert await client_loop_tasks(a.writer) > idle  # the send, waiting
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    deadline = time.monotonic() + 0.5  # well before the held send is answered
    while await client_loop_tasks(a.writer) > idle and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert await client_loop_tasks(a.writer) == idle  # not left waiting for the answer
    # The send had left: Graph applies it all the same (the caller holds it in doubt). Wait
    # for it here, so that it does not land in the next test's staging state.
    assert_eventually(lambda: keys_sent(mail) == [ctx.key], timeout=5)


async def test_execute_async_presents_the_tasks_grants(store: JournalStore,
                                                      mail: StagingServer,
                                                      staging: Staging) -> None:
    registry = worker_registry({"TIDEMARK_STAGING_URL": mail.url})
    a = registry.bound("graph.send_mail")
    assert isinstance(a, GraphSendMail)
    doc = {"task_id": "mail-a", "steps": [{"action": "graph.send_mail", "args": ARGS}]}
    store.persist_plan(load_plan(doc, registry))
    broker = GrantBroker(store)
    with acting_for(broker, "mail-a"):
        ctx = await asyncio.to_thread(staged, a, "granted", "mail-a")  # a step thread's part
        seen = len(staging.calls_of("graph"))
        outcome = await a.execute_async(ctx)
    assert outcome["internetMessageId"] == ctx.staged["internetMessageId"]
    assert sorted((g["target"], g["scope"]) for g in store.grants("mail-a")) == [
        ("graph", "read"), ("graph", "write")]
    calls = staging.calls_of("graph")[seen:]
    [send] = [c for c in calls if c.path.endswith("/send")]
    reads = [c for c in calls if c.method == "GET"]
    assert "grant-" in send.token and send.allowed  # the task's grant, not the worker's token
    assert reads and all("grant-" in c.token for c in reads)
