"""``stripe.payment_intent`` awaiting its call (``execute_async``) as ``execute`` does.

It goes through stripe-python's asynchronous client against the Stripe staging server: the same
request, key and outcome as ``execute``, the same handling of a saved 5xx and of a lost answer,
per-task grants on the wire, and a wait that holds no thread."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from activities.acting import acting_for
from activities.stripe import StripePaymentIntent, stripe_client
from activities.wiring import worker_registry
from helpers.staging_fixtures import CLIENT_TIMEOUT_S, post
from helpers.steps import step_context
from helpers.wait import assert_eventually
from staging.core import Fault, Staging, StagingServer
from staging.stripe import DEFAULT_READ_KEY, DEFAULT_SECRET_KEY, StripeTarget
from tidemark.actions import ProbeStatus, StepContext
from tidemark.errors import NeedsDecision, TargetUnavailable, Unauthorized
from tidemark.grants import GrantBroker, revoke_task_grants
from tidemark.payment_limits import PaymentLimits
from tidemark.plan import load_plan
from tidemark.store import JournalStore

CREATE = "payment_intents.create"
HELD = 50  # steps waiting at once on one held create each


def make_action(server: StagingServer, timeout: float = CLIENT_TIMEOUT_S) -> StripePaymentIntent:
    return StripePaymentIntent(writer=stripe_client(server.url, DEFAULT_SECRET_KEY,
                                                    timeout=timeout),
                               reader=stripe_client(server.url, DEFAULT_READ_KEY,
                                                    timeout=CLIENT_TIMEOUT_S),
                               limits=PaymentLimits(per_step=10_000))


def context(amount: int = 2500, key: str | None = None, **extra: Any) -> StepContext:
    return step_context("stripe.payment_intent", {"amount": amount, "currency": "usd", **extra},
                        key=key, before_state={})


def threads() -> int:
    """The process's threads as the kernel counts them (any thread, not only Python's)."""
    return len(os.listdir("/proc/self/task"))


async def until_held(staging: Staging, n: int, calls: list[asyncio.Task[Any]]) -> None:
    """Returns once ``n`` creates have reached Stripe and are being held there.

    The calls still wait on them. Fails as soon as a call ended instead."""
    while sum(r.status is None for r in staging.requests_of("stripe")) < n:
        assert not any(c.done() for c in calls), [c.exception() for c in calls if c.done()]
        await asyncio.sleep(0.02)


async def test_execute_async_creates_once_with_the_key_and_replays_the_second_time(
        server: StagingServer, stripe_target: StripeTarget, staging: Staging) -> None:
    action = make_action(server)
    assert action.awaits
    ctx = context(description="invoice 7")
    first = await action.execute_async(ctx)
    assert first["id"].startswith("pi_") and first["idempotent_replayed"] is False
    obj = stripe_target.state.intents[first["id"]].obj
    assert obj["metadata"] == {"tidemark_key": ctx.key} and obj["description"] == "invoice 7"
    [effect] = staging.effects_of("stripe", CREATE)
    assert effect.key == ctx.key  # the step's key went out as the Idempotency-Key
    second = await action.execute_async(ctx)
    assert second["id"] == first["id"] and second["idempotent_replayed"] is True
    assert action.execute(ctx) == second  # the blocking path answers the same
    assert len(staging.effects_of("stripe")) == 1
    assert action.probe(ctx).observed["id"] == first["id"]


async def test_fifty_held_creates_wait_without_a_thread_each(server: StagingServer,
                                                             staging: Staging) -> None:
    action = make_action(server)
    await action.execute_async(context(key="warm-up-" + "0" * 24))  # pools and imports ready
    before = threads()
    staging.arm(Fault("stripe", CREATE, "delay", seconds=1.5, times=HELD))
    calls = [asyncio.create_task(action.execute_async(context(amount=100 + i)))
             for i in range(HELD)]
    await until_held(staging, HELD, calls)
    grown = threads() - before
    assert grown < 10, f"{grown} threads for {HELD} waiting creates"
    outcomes = await asyncio.gather(*calls)
    assert len({o["id"] for o in outcomes}) == HELD
    assert len(staging.effects_of("stripe", CREATE)) == HELD + 1


async def test_each_event_loop_gets_connections_of_its_own(server: StagingServer,
                                                           staging: Staging) -> None:
    """Each event loop gets connections of its own.

    httpx keeps a connection for the loop it was opened on. A client awaited from a loop after
    another one ended must not reuse that loop's connections (each call here would fail before it
    left, in doubt for nothing)."""
    action = make_action(server)
    first = await action.execute_async(context(amount=100))  # on the tests' loop
    for amount in (200, 300):  # each on a loop of its own that ends with the call
        outcome = await asyncio.to_thread(asyncio.run, action.execute_async(context(amount)))
        assert outcome["amount"] == amount
    assert (await action.execute_async(context(amount=400)))["id"] != first["id"]
    assert len(staging.effects_of("stripe", CREATE)) == 4


def arm_execution_error(server: StagingServer, commit: bool = False) -> None:
    post(server, "/_staging/stripe/execution_errors", {"status": 500, "commit": commit})


async def test_a_replayed_500_is_done_when_listed_and_for_a_person_when_not(
        server: StagingServer, staging: Staging) -> None:
    action = make_action(server)
    listed, unlisted = context(), context(amount=3000)
    arm_execution_error(server, commit=True)
    with pytest.raises(TargetUnavailable, match="500"):  # fresh 500: in doubt
        await action.execute_async(listed)
    outcome = await action.execute_async(listed)  # the saved 500, and the listing shows it
    [effect] = staging.effects_of("stripe")
    assert outcome["id"] == effect.detail["id"] and outcome["idempotent_replayed"] is True

    arm_execution_error(server)
    with pytest.raises(TargetUnavailable, match="500"):
        await action.execute_async(unlisted)
    with pytest.raises(NeedsDecision) as info:  # saved 500, nothing listed: a person decides
        await action.execute_async(unlisted)
    assert "Idempotent-Replayed" in str(info.value) and "resolve" in str(info.value)
    assert len(staging.effects_of("stripe")) == 1


async def test_a_lost_answer_is_in_doubt_and_never_retried(server: StagingServer,
                                                           staging: Staging) -> None:
    action = make_action(server, timeout=0.5)
    dropped, slow = context(), context(amount=3000)
    staging.arm(Fault("stripe", CREATE, "drop_after_commit"))
    with pytest.raises(TargetUnavailable):
        await action.execute_async(dropped)
    staging.arm(Fault("stripe", CREATE, "delay", seconds=1.0))
    with pytest.raises(TargetUnavailable, match="APIConnectionError"):  # our client gave up
        await action.execute_async(slow)
    assert_eventually(lambda: len(staging.effects_of("stripe")) == 2)
    assert [r.key for r in staging.requests_of("stripe")] == [dropped.key, slow.key]
    assert action.probe(dropped).status is ProbeStatus.DONE


async def test_a_cancelled_create_raises_cancelled(server: StagingServer,
                                                   staging: Staging) -> None:
    action = make_action(server)
    staging.arm(Fault("stripe", CREATE, "delay", seconds=1.0))
    call = asyncio.create_task(action.execute_async(context()))
    await until_held(staging, 1, [call])
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    # The create had left: Stripe applies it all the same (the caller holds it in doubt). Wait
    # for it here, so that it does not land in the next test's staging state.
    assert_eventually(lambda: len(staging.effects_of("stripe", CREATE)) == 1, timeout=5)


async def test_execute_async_presents_the_tasks_grant_and_a_revoked_one_is_refused(
        store: JournalStore, server: StagingServer, staging: Staging) -> None:
    registry = worker_registry({"TIDEMARK_STAGING_URL": server.url})
    action = registry.bound("stripe.payment_intent")
    doc = {"task_id": "pay-a", "steps": [
        {"action": "stripe.payment_intent", "args": {"amount": 1200, "currency": "usd"}}]}
    store.persist_plan(load_plan(doc, registry))
    ctx = StepContext(task_id="pay-a", step=1, action="stripe.payment_intent",
                      args={"amount": 1200, "currency": "usd"}, key="a" * 32)
    broker = GrantBroker(store)
    with acting_for(broker, "pay-a"):
        outcome = await action.execute_async(ctx)
    assert outcome["id"].startswith("pi_")
    [grant] = store.grants("pay-a")
    assert (grant["target"], grant["scope"]) == ("stripe", "write")
    [call] = [c for c in staging.calls_of("stripe") if c.method == "POST"]
    assert call.token.startswith("sk_test_grant-") and call.allowed  # the grant, not the base

    store.set_killed("pay-a", "drill", "ops")  # what `tidemark kill` does first
    revoke_task_grants(store, "pay-a", "ops")
    with acting_for(broker, "pay-a"), pytest.raises(Unauthorized, match="revoked"):
        await action.execute_async(StepContext(
            task_id="pay-a", step=2, action="stripe.payment_intent",
            args={"amount": 1300, "currency": "usd"}, key="b" * 32))
    assert len(staging.effects_of("stripe")) == 1
