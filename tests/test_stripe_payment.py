"""stripe.payment_intent through the real stripe-python against the staging server.

Directly, and through run_step with a real journal."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from activities.catalog import spec_registry
from activities.stripe import StripePaymentIntent, stripe_client
from helpers.staging_fixtures import CLIENT_TIMEOUT_S, post
from helpers.steps import persist as persist_plan
from helpers.steps import step_context
from helpers.wait import assert_eventually
from staging.core import Fault, Staging, StagingServer
from staging.stripe import DEFAULT_READ_KEY, DEFAULT_SECRET_KEY, StripeTarget
from tidemark.actions import GateRefused, ProbeStatus, Registry, StepContext
from tidemark.errors import (
    NeedsDecision,
    PlanError,
    PreconditionFailed,
    Refused,
    StepFailed,
    TargetUnavailable,
    Unauthorized,
)
from tidemark.payment_limits import PaymentLimits
from tidemark.run_step import run_step
from tidemark.store import JournalStore

# Healthy calls get the suite's client timeout; only a call meant to time out gets this one,
# and the delay faults that victimise it exceed it.
SHORT_TIMEOUT = 0.5
MAX_AMOUNT = 10_000  # the per-step limit the actions under test are configured with


def make_action(server: StagingServer, timeout: float = CLIENT_TIMEOUT_S,
                writer_key: str = DEFAULT_SECRET_KEY) -> StripePaymentIntent:
    return StripePaymentIntent(writer=stripe_client(server.url, writer_key, timeout=timeout),
                               reader=stripe_client(server.url, DEFAULT_READ_KEY,
                                                    timeout=timeout),
                               limits=PaymentLimits(per_step=MAX_AMOUNT))


@pytest.fixture
def action(server: StagingServer, staging: Staging) -> StripePaymentIntent:
    return make_action(server)


def context(amount: int = 2500, key: str | None = None, **extra: Any) -> StepContext:
    return step_context("stripe.payment_intent", {"amount": amount, "currency": "usd", **extra},
                        key=key, before_state={})


def other_payment(server: StagingServer, key: str, amount: int = 2500) -> str:
    """A PaymentIntent made by someone else (another key), as a raw stripe-python call."""
    client = stripe_client(server.url, DEFAULT_SECRET_KEY)
    return client.v1.payment_intents.create(
        params={"amount": amount, "currency": "usd", "metadata": {"tidemark_key": key}},
        options={"idempotency_key": "other-" + key}).id


# -- the action on its own ------------------------------------------------------------------

def test_happy_path_creates_once_with_the_key_and_probes_done(action: StripePaymentIntent,
                                                              stripe_target: StripeTarget,
                                                              staging: Staging) -> None:
    ctx = context(description="invoice 7")
    action.preconditions(ctx)
    before = action.snapshot(ctx)
    assert abs(before["stripe_clock"] - time.time()) < 5  # Stripe's clock, from its Date header
    assert action.probe(ctx).status is ProbeStatus.ABSENT
    outcome = action.execute(ctx)
    assert outcome["id"].startswith("pi_")
    assert {k: outcome[k] for k in ("amount", "currency", "status", "idempotent_replayed")} == {
        "amount": 2500, "currency": "usd", "status": "requires_payment_method",
        "idempotent_replayed": False}
    obj = stripe_target.state.intents[outcome["id"]].obj
    assert obj["metadata"] == {"tidemark_key": ctx.key} and obj["description"] == "invoice 7"
    [effect] = staging.effects_of("stripe", "payment_intents.create")
    assert effect.key == ctx.key  # the journal key went out as the Idempotency-Key
    probed = action.probe(ctx)
    assert probed.status is ProbeStatus.DONE and probed.observed["id"] == outcome["id"]


def test_executing_twice_replays_instead_of_paying_twice(action: StripePaymentIntent,
                                                         staging: Staging) -> None:
    ctx = context()
    first = action.execute(ctx)
    second = action.execute(ctx)
    assert second["id"] == first["id"] and second["idempotent_replayed"] is True
    assert len(staging.effects_of("stripe")) == 1


def test_args_are_checked() -> None:
    ok = StripePaymentIntent.validate_args({"amount": 1, "currency": "eur"}, "args")
    assert ok == {"amount": 1, "currency": "eur"}
    for bad in ({"amount": 0, "currency": "usd"}, {"amount": True, "currency": "usd"},
                {"amount": "12", "currency": "usd"}, {"amount": 5, "currency": "USD"},
                {"amount": 5, "currency": "usd", "customer": ""}):
        with pytest.raises(PlanError):
            StripePaymentIntent.validate_args(bad, "args")
    assert StripePaymentIntent.describe({"amount": 2500, "currency": "usd",
                                         "customer": "cus_1"}) == "25.00 USD from cus_1"
    assert StripePaymentIntent.describe({"amount": 500, "currency": "jpy"}) == "500 JPY"


def test_the_gate_refuses_more_than_the_limit(action: StripePaymentIntent) -> None:
    action.preconditions(context(amount=MAX_AMOUNT))
    with pytest.raises(GateRefused, match=r"100\.01 USD is over the per-step limit of 100\.00 USD"):
        action.preconditions(context(amount=MAX_AMOUNT + 1))


def test_search_lag_does_not_fool_the_probe(server: StagingServer, action: StripePaymentIntent,
                                            staging: Staging) -> None:
    post(server, "/_staging/stripe/search_lag", {"seconds": 3600})
    ctx = context()
    outcome = action.execute(ctx)
    search = action.reads.reader.v1.payment_intents.search(
        params={"query": f"metadata['tidemark_key']:'{ctx.key}'"})
    assert search.data == []  # search would say "never happened"
    probed = action.probe(ctx)
    assert probed.status is ProbeStatus.DONE and probed.observed["id"] == outcome["id"]


def test_the_probe_ignores_other_keys_and_pages_through_the_list(
        server: StagingServer, action: StripePaymentIntent) -> None:
    ctx = context()
    other_payment(server, "someone-else")
    assert action.probe(ctx).status is ProbeStatus.ABSENT
    outcome = action.execute(ctx)
    for i in range(120):  # newer than ours: ours ends up on the second page of 100
        other_payment(server, f"later-{i}", amount=100 + i)
    probed = action.probe(ctx)
    assert probed.status is ProbeStatus.DONE and probed.observed["id"] == outcome["id"]


def test_a_listing_cut_off_after_its_last_page_is_unknown_never_judged(
        server: StagingServer, action: StripePaymentIntent,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A listing cut off before its last page is never judged: the probe says unknown.

    The window holds more PaymentIntents than the probe lists (here two pages of one): the
    listing stops with more to come, and what it did not see may be ours. So the probe answers
    unknown; judged, the pages it saw would say absent, and the resume would pay again."""
    ctx = context()
    ctx = StepContext(**{**ctx.__dict__, "before_state": action.snapshot(ctx)})
    action.execute(ctx)
    for i in range(2):  # newer than ours: listed first
        other_payment(server, f"later-{i}", amount=100 + i)
    monkeypatch.setattr("probes.stripe.PAGE_SIZE", 1)
    monkeypatch.setattr("probes.stripe.MAX_PAGES", 2)
    probed = action.probe(ctx)
    assert probed.status is ProbeStatus.UNKNOWN, probed.reason
    assert "gave up listing" in probed.reason


def test_a_duplicate_carrying_our_key_is_unknown(server: StagingServer,
                                                 action: StripePaymentIntent) -> None:
    ctx = context()
    first = action.execute(ctx)
    second = other_payment(server, ctx.key)
    probed = action.probe(ctx)
    assert probed.status is ProbeStatus.UNKNOWN
    assert first["id"] in probed.reason and second in probed.reason


def test_a_failing_list_makes_the_probe_unknown(action: StripePaymentIntent,
                                                staging: Staging) -> None:
    ctx = context()
    staging.arm(Fault("stripe", "payment_intents.list", "fail_before_commit"))
    probed = action.probe(ctx)
    assert probed.status is ProbeStatus.UNKNOWN and "could not list" in probed.reason


def test_a_concurrent_twin_gets_409_as_target_unavailable(server: StagingServer,
                                                          staging: Staging,
                                                          stripe_target: StripeTarget) -> None:
    patient = make_action(server)
    ctx = context()
    staging.arm(Fault("stripe", "payment_intents.create", "delay", seconds=0.8))
    outcomes: list[dict[str, Any]] = []
    first = threading.Thread(target=lambda: outcomes.append(patient.execute(ctx)))
    first.start()
    assert_eventually(lambda: ctx.key in stripe_target.state.keys)
    with pytest.raises(TargetUnavailable, match="409 idempotency_key_in_use"):
        patient.execute(ctx)
    first.join(timeout=5)
    assert len(outcomes) == 1 and len(staging.effects_of("stripe")) == 1


def test_the_same_key_with_other_params_is_refused(action: StripePaymentIntent,
                                                   staging: Staging) -> None:
    ctx = context()
    action.execute(ctx)
    with pytest.raises(Refused, match="IdempotencyError HTTP 400"):
        action.execute(context(amount=2600, key=ctx.key))
    assert len(staging.effects_of("stripe")) == 1


def test_an_unknown_customer_is_refused(action: StripePaymentIntent, staging: Staging) -> None:
    with pytest.raises(Refused, match="resource_missing"):
        action.execute(context(customer="cus_nobody"))
    assert staging.effects_of("stripe") == []


def test_revoked_key_is_unauthorized(server: StagingServer,
                                     action: StripePaymentIntent) -> None:
    ctx = context()
    post(server, f"/_staging/tokens/{DEFAULT_SECRET_KEY}/revoke", {})
    with pytest.raises(Unauthorized, match="api_key_expired"):
        action.execute(ctx)
    post(server, f"/_staging/tokens/{DEFAULT_READ_KEY}/revoke", {})
    with pytest.raises(Unauthorized):
        action.probe(ctx)


def test_a_restricted_read_key_cannot_execute(server: StagingServer, staging: Staging) -> None:
    misconfigured = make_action(server, writer_key=DEFAULT_READ_KEY)
    with pytest.raises(Unauthorized, match="403"):
        misconfigured.execute(context())
    assert staging.effects_of("stripe") == []


# -- through run_step -------------------------------------------------------------------------

def persist(store: JournalStore, amount: int = 2500, **extra: Any) -> str:
    return persist_plan(store, spec_registry(StripePaymentIntent), [
        {"action": "stripe.payment_intent", "args": {"amount": amount, "currency": "usd",
                                                     **extra}}])


def test_run_step_happy_path(store: JournalStore, action: StripePaymentIntent,
                             staging: Staging) -> None:
    task = persist(store)
    result = run_step(store, Registry([action]), task, 1)
    assert (result.status, result.resolved_by) == ("done", "execute")
    assert run_step(store, Registry([action]), task, 1).skipped
    assert [e.key for e in staging.effects_of("stripe")] == [result.key]


def test_run_step_resolves_a_dropped_answer_by_probe(store: JournalStore,
                                                     action: StripePaymentIntent,
                                                     staging: Staging) -> None:
    task = persist(store)
    staging.arm(Fault("stripe", "payment_intents.create", "drop_after_commit"))
    with pytest.raises(TargetUnavailable):
        run_step(store, Registry([action]), task, 1)
    resumed = run_step(store, Registry([action]), task, 1)
    assert (resumed.status, resumed.resolved_by) == ("done", "probe")
    [effect] = staging.effects_of("stripe")
    assert resumed.outcome["id"] == effect.detail["id"]


def test_run_step_retry_during_a_slow_first_attempt(server: StagingServer, store: JournalStore,
                                                    staging: Staging) -> None:
    action = make_action(server, timeout=SHORT_TIMEOUT)
    # The first attempt times out while Stripe is still working on it. The retry finds nothing
    # yet (absent), re-executes with the same key, and Stripe answers 409: retry later. Once the
    # first request has finished, the next attempt's probe finds it.
    task = persist(store)
    staging.arm(Fault("stripe", "payment_intents.create", "delay", seconds=1.0))
    with pytest.raises(TargetUnavailable, match="APIConnectionError"):
        run_step(store, Registry([action]), task, 1)
    with pytest.raises(TargetUnavailable, match="409"):
        run_step(store, Registry([action]), task, 1)
    assert_eventually(lambda: staging.effects_of("stripe"))
    resumed = run_step(store, Registry([action]), task, 1)
    assert (resumed.status, resumed.resolved_by) == ("done", "probe")
    assert len(staging.effects_of("stripe")) == 1


def test_run_step_gate_refuses_before_any_intent(store: JournalStore,
                                                 action: StripePaymentIntent,
                                                 staging: Staging) -> None:
    task = persist(store, amount=MAX_AMOUNT + 1)
    with pytest.raises(PreconditionFailed, match="per-step limit"):
        run_step(store, Registry([action]), task, 1)
    assert store.step_row(task, 1) is None and staging.effects_of("stripe") == []


def test_run_step_records_a_refusal_as_failed(store: JournalStore,
                                              action: StripePaymentIntent) -> None:
    task = persist(store, customer="cus_nobody")
    with pytest.raises(StepFailed, match="No such customer"):
        run_step(store, Registry([action]), task, 1)
    row = store.step_row(task, 1)
    assert row is not None and row.status == "failed"


def test_run_step_with_a_revoked_key_stops_with_unauthorized(server: StagingServer,
                                                             store: JournalStore,
                                                             action: StripePaymentIntent,
                                                             staging: Staging) -> None:
    task = persist(store)
    post(server, f"/_staging/tokens/{DEFAULT_SECRET_KEY}/revoke", {})
    with pytest.raises(Unauthorized) as info:
        run_step(store, Registry([action]), task, 1)
    assert not info.value.retryable
    row = store.step_row(task, 1)
    assert row is not None and row.in_doubt and staging.effects_of("stripe") == []


# -- a 500 that Stripe saved under our key ----------------------------------------------------

def arm_execution_error(server: StagingServer, commit: bool = False) -> None:
    post(server, "/_staging/stripe/execution_errors", {"status": 500, "commit": commit})


def test_run_step_after_a_replayed_500_leaves_the_step_for_a_person_never_failed(
        server: StagingServer, store: JournalStore, action: StripePaymentIntent,
        staging: Staging) -> None:
    task = persist(store)
    arm_execution_error(server)
    with pytest.raises(TargetUnavailable, match="500"):  # fresh 500: in doubt, retry
        run_step(store, Registry([action]), task, 1)
    # The retry probes (absent), executes with the same key and gets the saved 500 back: the
    # key cannot succeed while Stripe remembers it, and a 5xx never proves that nothing
    # happened, so a person decides with the facts; nothing invites a second payment.
    with pytest.raises(NeedsDecision) as info:
        run_step(store, Registry([action]), task, 1)
    message = str(info.value)
    assert "Idempotent-Replayed" in message and "500" in message
    assert "new task" not in message and "resolve" in message
    row = store.step_row(task, 1)
    assert row is not None and row.in_doubt
    assert staging.effects_of("stripe") == []


def test_a_saved_500_after_the_create_committed_is_done_by_probe(
        server: StagingServer, store: JournalStore, action: StripePaymentIntent,
        staging: Staging) -> None:
    task = persist(store)
    arm_execution_error(server, commit=True)
    with pytest.raises(TargetUnavailable, match="500"):
        run_step(store, Registry([action]), task, 1)
    resumed = run_step(store, Registry([action]), task, 1)
    assert (resumed.status, resumed.resolved_by) == ("done", "probe")
    assert len(staging.effects_of("stripe")) == 1


def test_a_replayed_500_with_our_payment_listed_is_done(server: StagingServer,
                                                        action: StripePaymentIntent,
                                                        staging: Staging) -> None:
    # Executed again without a probe in between: the replay says "finished, failed", but the
    # listing taken after it shows the payment, so it happened.
    ctx = context()
    arm_execution_error(server, commit=True)
    with pytest.raises(TargetUnavailable):
        action.execute(ctx)
    outcome = action.execute(ctx)
    [effect] = staging.effects_of("stripe")
    assert outcome["id"] == effect.detail["id"] and outcome["idempotent_replayed"] is True


# -- clocks, forgotten keys, hidden metadata -------------------------------------------------

def switch(server: StagingServer, name: str, value: Any) -> None:
    post(server, "/_staging/switches", {"target": "stripe", "name": name, "value": value})


@pytest.mark.parametrize("offset", [-600, 600])
def test_clock_skew_and_a_forgotten_key_never_pay_twice(server: StagingServer,
                                                         store: JournalStore,
                                                         action: StripePaymentIntent,
                                                         staging: Staging, offset: int) -> None:
    # Stripe's clock `offset` s from ours (and Postgres's); the first answer is lost after the
    # payment was made, and the resume comes after Stripe forgot the Idempotency-Key.
    switch(server, "clock_offset_s", offset)
    switch(server, "idempotency_ttl_s", 1)
    task = persist(store)
    staging.arm(Fault("stripe", "payment_intents.create", "drop_after_commit"))
    with pytest.raises(TargetUnavailable):
        run_step(store, Registry([action]), task, 1)
    time.sleep(1.5)  # the key is forgotten: a create with it now makes a new payment
    resumed = run_step(store, Registry([action]), task, 1)
    [effect] = staging.effects_of("stripe", "payment_intents.create")
    assert (resumed.status, resumed.resolved_by) == ("done", "probe")
    assert resumed.outcome["id"] == effect.detail["id"]


def test_the_window_starts_a_margin_before_stripes_date(server: StagingServer,
                                                         action: StripePaymentIntent) -> None:
    """The probe's window starts a margin before Stripe's own Date.

    The server that answered the snapshot's Date need not agree with the one that creates
    the payment: ours, created a minute before the Date the snapshot read (within the margin),
    is in the probe's window."""
    switch(server, "clock_offset_s", 60)  # the server the snapshot reads runs a minute ahead
    ctx = context()
    ctx = StepContext(**{**ctx.__dict__, "before_state": action.snapshot(ctx)})
    switch(server, "clock_offset_s", 0)  # the one that creates the payment does not
    outcome = action.execute(ctx)
    probed = action.probe(ctx)
    assert probed.status is ProbeStatus.DONE, probed.reason
    assert probed.observed["id"] == outcome["id"]


def test_a_saved_500_whose_payment_was_created_is_done_under_clock_skew(
        server: StagingServer, store: JournalStore, action: StripePaymentIntent,
        staging: Staging) -> None:
    switch(server, "clock_offset_s", -600)  # Postgres ten minutes ahead of Stripe
    task = persist(store)
    arm_execution_error(server, commit=True)
    with pytest.raises(TargetUnavailable, match="500"):
        run_step(store, Registry([action]), task, 1)
    resumed = run_step(store, Registry([action]), task, 1)
    [effect] = staging.effects_of("stripe", "payment_intents.create")
    assert (resumed.status, resumed.outcome["id"]) == ("done", effect.detail["id"])


def test_metadata_hidden_from_the_read_key_never_reads_absent(
        server: StagingServer, action: StripePaymentIntent, staging: Staging) -> None:
    switch(server, "restricted_key_metadata", "hidden")
    ctx = context(description="invoice 9")
    ctx = StepContext(**{**ctx.__dict__, "before_state": action.snapshot(ctx)})
    assert action.probe(ctx).status is ProbeStatus.ABSENT  # nothing there yet: truly absent
    outcome = action.execute(ctx)
    listed = action.reads.reader.v1.payment_intents.list(params={"limit": 1}).data[0]
    assert listed.id == outcome["id"] and listed.metadata.to_dict() == {}  # the switch holds
    probed = action.probe(ctx)
    assert probed.status is not ProbeStatus.ABSENT
    if probed.status is ProbeStatus.UNKNOWN:
        assert outcome["id"] in probed.reason and "metadata" in probed.reason
    else:
        assert probed.observed["id"] == outcome["id"]


def test_hidden_metadata_and_a_forgotten_key_stop_for_a_person_with_one_payment(
        server: StagingServer, store: JournalStore, action: StripePaymentIntent,
        staging: Staging) -> None:
    switch(server, "restricted_key_metadata", "hidden")
    switch(server, "clock_offset_s", -600)
    switch(server, "idempotency_ttl_s", 1)
    task = persist(store)
    staging.arm(Fault("stripe", "payment_intents.create", "drop_after_commit"))
    with pytest.raises(TargetUnavailable):
        run_step(store, Registry([action]), task, 1)
    time.sleep(1.5)
    with pytest.raises(NeedsDecision, match="metadata"):
        run_step(store, Registry([action]), task, 1)
    assert len(staging.effects_of("stripe", "payment_intents.create")) == 1
    row = store.step_row(task, 1)
    assert row is not None and row.in_doubt


@pytest.mark.parametrize("amount, currency", [(2600, "usd"), (2500, "eur")])
def test_our_key_on_another_amount_or_currency_is_unknown(server: StagingServer,
                                                          action: StripePaymentIntent,
                                                          amount: int, currency: str) -> None:
    ctx = context(amount=2500)
    ctx = StepContext(**{**ctx.__dict__, "before_state": action.snapshot(ctx)})
    client = stripe_client(server.url, DEFAULT_SECRET_KEY)
    other = client.v1.payment_intents.create(
        params={"amount": amount, "currency": currency, "metadata": {"tidemark_key": ctx.key}},
        options={"idempotency_key": "other-" + ctx.key}).id
    probed = action.probe(ctx)
    assert probed.status is ProbeStatus.UNKNOWN and other in probed.reason


@pytest.mark.parametrize("edit", [{"amount": 2600}, {"description": "invoice 9, corrected"},
                                  {"amount": 2400, "description": "refunded in part"}])
@pytest.mark.parametrize("customer", [None, "cus_edit"])
def test_an_edited_payment_with_hidden_metadata_after_a_forgotten_key_is_not_paid_again(
        server: StagingServer, store: JournalStore, action: StripePaymentIntent,
        staging: Staging, edit: dict[str, Any], customer: str | None) -> None:
    # The create's answer is lost, a person edits the payment in the Dashboard, the read key
    # cannot see metadata, and the resume comes after Stripe forgot the key: the edited payment
    # may be ours, so the step waits for a person instead of paying a second time.
    switch(server, "restricted_key_metadata", "hidden")
    switch(server, "idempotency_ttl_s", 1)
    extra: dict[str, Any] = {"description": "invoice 9"}
    if customer:
        post(server, "/_staging/stripe/customers", {"id": customer})
        extra["customer"] = customer
    task = persist(store, **extra)
    staging.arm(Fault("stripe", "payment_intents.create", "drop_after_commit"))
    with pytest.raises(TargetUnavailable):
        run_step(store, Registry([action]), task, 1)
    [made] = staging.effects_of("stripe", "payment_intents.create")
    stripe_client(server.url, DEFAULT_SECRET_KEY).v1.payment_intents.update(
        made.detail["id"], params=edit)  # type: ignore[arg-type]
    time.sleep(1.5)  # the key is forgotten: a create with it now makes a new payment
    with pytest.raises(NeedsDecision, match=made.detail["id"]):
        run_step(store, Registry([action]), task, 1)
    assert len(staging.effects_of("stripe", "payment_intents.create")) == 1


def test_with_metadata_visible_a_keyless_payment_of_another_amount_is_not_ours(
        server: StagingServer, action: StripePaymentIntent) -> None:
    # The read key sees metadata (another payment shows it): a payment without our key and for
    # another amount is somebody else's, and the probe's absent stands.
    ctx = context(description="invoice 9")
    ctx = StepContext(**{**ctx.__dict__, "before_state": action.snapshot(ctx)})
    client = stripe_client(server.url, DEFAULT_SECRET_KEY)
    client.v1.payment_intents.create(params={"amount": 900, "currency": "usd",
                                             "metadata": {"order": "77"}})
    client.v1.payment_intents.create(params={"amount": 2600, "currency": "usd"})
    assert action.probe(ctx).status is ProbeStatus.ABSENT
