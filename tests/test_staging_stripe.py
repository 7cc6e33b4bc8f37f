"""The Stripe PaymentIntents staging server, driven by the real stripe-python over HTTP."""

from __future__ import annotations

import email.utils
import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
import stripe

from activities.stripe import stripe_client
from helpers.staging_fixtures import post
from helpers.wait import assert_eventually
from staging.core import Fault, Staging, StagingServer
from staging.stripe import DEFAULT_READ_KEY, DEFAULT_SECRET_KEY, StripeTarget, mask_key


@pytest.fixture
def sk(server: StagingServer, staging: Staging) -> stripe.StripeClient:
    return stripe_client(server.url, DEFAULT_SECRET_KEY, timeout=5)


@pytest.fixture
def rk(server: StagingServer, staging: Staging) -> stripe.StripeClient:
    return stripe_client(server.url, DEFAULT_READ_KEY, timeout=5)


def create(client: stripe.StripeClient, key: str | None = None, **params: Any) -> Any:
    options = {"idempotency_key": key} if key else None
    return client.v1.payment_intents.create(
        params={"amount": 2500, "currency": "usd", **params}, options=options)


def test_create_is_form_encoded_with_nested_metadata(sk: stripe.StripeClient,
                                                     staging: Staging) -> None:
    pi = create(sk, "k1", description="invoice 7", metadata={"tidemark_key": "k1", "n": "7"})
    assert pi.id.startswith("pi_") and pi.object == "payment_intent"
    assert (pi.amount, pi.currency, pi.status) == (2500, "usd", "requires_payment_method")
    assert pi.metadata.to_dict() == {"tidemark_key": "k1", "n": "7"}
    assert pi.client_secret.startswith(pi.id + "_secret_")
    [effect] = staging.effects_of("stripe", "payment_intents.create")
    assert effect.key == "k1" and effect.detail["id"] == pi.id


def test_retrieve_and_its_404(sk: stripe.StripeClient, rk: stripe.StripeClient) -> None:
    pi = create(sk)
    assert rk.v1.payment_intents.retrieve(pi.id).to_dict() == pi.to_dict()
    with pytest.raises(stripe.InvalidRequestError) as info:
        rk.v1.payment_intents.retrieve("pi_missing")
    assert info.value.http_status == 404
    assert info.value.json_body == {"error": {
        "message": "No such payment_intent: 'pi_missing'", "type": "invalid_request_error",
        "code": "resource_missing", "param": "intent",
        "doc_url": "https://stripe.com/docs/error-codes/resource-missing"}}


def test_list_is_newest_first_and_pages_with_starting_after(sk: stripe.StripeClient,
                                                            rk: stripe.StripeClient) -> None:
    made = [create(sk, amount=1000 + i).id for i in range(5)]
    page1 = rk.v1.payment_intents.list(params={"limit": 2})
    assert [p.id for p in page1.data] == made[::-1][:2] and page1.has_more
    page2 = rk.v1.payment_intents.list(params={"limit": 2, "starting_after": page1.data[-1].id})
    page3 = rk.v1.payment_intents.list(params={"limit": 2, "starting_after": page2.data[-1].id})
    assert [p.id for p in page2.data + page3.data] == made[::-1][2:]
    assert not page3.has_more
    back = rk.v1.payment_intents.list(params={"limit": 2, "ending_before": page3.data[0].id})
    assert [p.id for p in back.data] == [p.id for p in page2.data]


def test_list_filters_by_created_and_customer(server: StagingServer, sk: stripe.StripeClient,
                                              rk: stripe.StripeClient,
                                              stripe_target: StripeTarget) -> None:
    old = create(sk)
    stripe_target.state.intents[old.id].obj["created"] -= 3600  # as if made an hour ago
    cus = post(server, "/_staging/stripe/customers", {"email": "a@example.com"})["id"]
    mine = create(sk, customer=cus)
    other = create(sk)
    since = int(time.time()) - 60
    recent = rk.v1.payment_intents.list(params={"created": {"gte": since}})
    assert {p.id for p in recent.data} == {mine.id, other.id}
    by_customer = rk.v1.payment_intents.list(params={"customer": cus})
    assert [p.id for p in by_customer.data] == [mine.id]
    exact = rk.v1.payment_intents.list(params={"created": old.created - 3600})
    assert [p.id for p in exact.data] == [old.id]


def test_unknown_cursor_and_bad_limit_are_400s(rk: stripe.StripeClient) -> None:
    with pytest.raises(stripe.InvalidRequestError) as info:
        rk.v1.payment_intents.list(params={"starting_after": "pi_nope"})
    assert info.value.code == "resource_missing"
    with pytest.raises(stripe.InvalidRequestError) as info:
        rk.v1.payment_intents.list(params={"limit": 101})
    assert info.value.json_body["error"]["param"] == "limit"


def test_search_lags_behind_creation(server: StagingServer, sk: stripe.StripeClient,
                                     rk: stripe.StripeClient) -> None:
    assert post(server, "/_staging/stripe/search_lag", {"seconds": 0.3}) == {"seconds": 0.3}
    pi = create(sk, metadata={"tidemark_key": "k1"})
    query = {"query": "metadata['tidemark_key']:'k1' AND currency:'usd'"}
    assert rk.v1.payment_intents.search(params=query).data == []
    found = assert_eventually(lambda: rk.v1.payment_intents.search(params=query).data)
    assert [p.id for p in found] == [pi.id]
    # The consistent read never lagged.
    assert rk.v1.payment_intents.list().data[0].id == pi.id


def test_search_supports_amount_comparisons_and_or(server: StagingServer,
                                                   sk: stripe.StripeClient,
                                                   rk: stripe.StripeClient) -> None:
    post(server, "/_staging/stripe/search_lag", {"seconds": 0})
    small, big = create(sk, amount=100), create(sk, amount=9000)
    got = rk.v1.payment_intents.search(params={"query": "amount>=5000"})
    assert [p.id for p in got.data] == [big.id]
    got = rk.v1.payment_intents.search(params={"query": "amount:100 OR amount:9000"})
    assert {p.id for p in got.data} == {small.id, big.id}
    with pytest.raises(stripe.InvalidRequestError):
        rk.v1.payment_intents.search(params={"query": "amount>1 AND amount<5 OR amount:3"})


def test_same_key_same_params_replays_the_first_response(sk: stripe.StripeClient,
                                                         staging: Staging) -> None:
    first = create(sk, "k1", metadata={"tidemark_key": "k1"})
    again = create(sk, "k1", metadata={"tidemark_key": "k1"})
    assert again.to_dict() == first.to_dict()
    assert first.last_response.headers.get("Idempotent-Replayed") is None
    assert again.last_response.headers["Idempotent-Replayed"] == "true"
    assert len(staging.effects_of("stripe")) == 1


def test_errors_of_execution_are_replayed_too(server: StagingServer,
                                              sk: stripe.StripeClient) -> None:
    with pytest.raises(stripe.InvalidRequestError) as first:
        create(sk, "k1", customer="cus_unknown")
    assert first.value.code == "resource_missing"
    post(server, "/_staging/stripe/customers", {"id": "cus_unknown"})
    # The customer exists now, but the key's answer was fixed by the first request.
    with pytest.raises(stripe.InvalidRequestError) as again:
        create(sk, "k1", customer="cus_unknown")
    assert again.value.json_body == first.value.json_body
    assert again.value.headers["Idempotent-Replayed"] == "true"


def test_validation_errors_are_not_remembered(sk: stripe.StripeClient) -> None:
    with pytest.raises(stripe.InvalidRequestError) as info:
        sk.v1.payment_intents.create(params={"amount": 2500}, options={"idempotency_key": "k1"})
    assert info.value.code == "parameter_missing"
    assert create(sk, "k1").amount == 2500
    with pytest.raises(stripe.InvalidRequestError) as info:
        create(sk, "k2", colour="blue")
    assert info.value.code == "parameter_unknown" and info.value.param == "colour"


def test_same_key_other_params_is_a_400_idempotency_error(sk: stripe.StripeClient,
                                                          staging: Staging) -> None:
    create(sk, "k1")
    with pytest.raises(stripe.IdempotencyError) as info:
        create(sk, "k1", amount=2600)
    assert info.value.http_status == 400
    assert info.value.json_body["error"]["type"] == "idempotency_error"
    assert "same parameters" in info.value.json_body["error"]["message"]
    assert len(staging.effects_of("stripe")) == 1


def test_a_twin_while_the_first_runs_is_a_409(sk: stripe.StripeClient, staging: Staging,
                                              stripe_target: StripeTarget) -> None:
    staging.arm(Fault("stripe", "payment_intents.create", "delay", seconds=0.8))
    results: list[Any] = []
    first = threading.Thread(target=lambda: results.append(create(sk, "k1")))
    first.start()
    assert_eventually(lambda: "k1" in stripe_target.state.keys)
    with pytest.raises(stripe.APIError) as info:
        create(sk, "k1")
    first.join(timeout=5)
    assert info.value.http_status == 409
    assert info.value.json_body["error"]["type"] == "idempotency_error"
    assert info.value.json_body["error"]["code"] == "idempotency_key_in_use"
    assert len(results) == 1 and len(staging.effects_of("stripe")) == 1
    assert create(sk, "k1").last_response.headers["Idempotent-Replayed"] == "true"


def test_a_dropped_answer_is_replayed_on_retry(sk: stripe.StripeClient, staging: Staging) -> None:
    staging.arm(Fault("stripe", "payment_intents.create", "drop_after_commit"))
    with pytest.raises(stripe.APIConnectionError):
        create(sk, "k1")
    retry = create(sk, "k1")
    assert retry.last_response.headers["Idempotent-Replayed"] == "true"
    [effect] = staging.effects_of("stripe")
    assert effect.detail["id"] == retry.id


def test_a_failure_in_front_of_the_api_is_not_remembered(sk: stripe.StripeClient,
                                                         staging: Staging) -> None:
    staging.arm(Fault("stripe", "payment_intents.create", "fail_before_commit"))
    with pytest.raises(stripe.APIError) as info:
        create(sk, "k1")
    assert info.value.http_status == 503
    assert staging.effects_of("stripe") == []
    retry = create(sk, "k1")
    assert retry.last_response.headers.get("Idempotent-Replayed") is None
    assert len(staging.effects_of("stripe")) == 1


def test_restricted_read_key_reads_but_cannot_create(sk: stripe.StripeClient,
                                                     rk: stripe.StripeClient,
                                                     staging: Staging) -> None:
    create(sk)
    assert len(rk.v1.payment_intents.list().data) == 1
    with pytest.raises(stripe.PermissionError) as info:
        create(rk)
    assert info.value.http_status == 403
    error = info.value.json_body["error"]
    assert error["type"] == "invalid_request_error"
    assert "does not have the required permissions" in error["message"]
    assert "rak_payment_intent_write" in error["message"]
    assert DEFAULT_READ_KEY not in error["message"]  # Stripe masks keys in messages
    assert len(staging.effects_of("stripe")) == 1


def test_missing_unknown_and_revoked_keys_get_stripes_401(server: StagingServer,
                                                          sk: stripe.StripeClient) -> None:
    req = urllib.request.Request(server.url + "/v1/payment_intents")
    with pytest.raises(urllib.error.HTTPError) as raw:
        urllib.request.urlopen(req, timeout=5)
    assert raw.value.code == 401
    assert "did not provide an API key" in json.loads(raw.value.read())["error"]["message"]
    with pytest.raises(stripe.AuthenticationError) as info:
        stripe_client(server.url, "sk_test_wrongwrong").v1.payment_intents.list()
    assert info.value.user_message == f"Invalid API Key provided: {mask_key('sk_test_wrongwrong')}"
    post(server, f"/_staging/tokens/{DEFAULT_SECRET_KEY}/revoke", {})
    with pytest.raises(stripe.AuthenticationError) as info:
        create(sk, "k1")
    assert info.value.json_body["error"]["code"] == "api_key_expired"


def test_mask_key_keeps_prefix_and_last_four() -> None:
    assert mask_key("sk_test_abcdefgh1234") == "sk_test_********1234"
    assert mask_key("rk_live_xy") == "rk_live_xy"


# -- a failure during execution is saved under the key and replayed ---------------------------

def test_a_500_during_execution_is_saved_and_replayed(server: StagingServer,
                                                      sk: stripe.StripeClient,
                                                      staging: Staging) -> None:
    post(server, "/_staging/stripe/execution_errors", {"status": 500})
    with pytest.raises(stripe.APIError) as first:
        create(sk, "k1")
    assert first.value.http_status == 500
    assert (first.value.headers or {}).get("Idempotent-Replayed") is None
    for _ in range(2):  # every later request with the key gets the saved answer back
        with pytest.raises(stripe.APIError) as again:
            create(sk, "k1")
        assert again.value.http_status == 500
        assert again.value.headers["Idempotent-Replayed"] == "true"
        assert again.value.json_body == first.value.json_body
    with pytest.raises(stripe.IdempotencyError):  # other parameters: still a 400
        create(sk, "k1", amount=2600)
    assert staging.effects_of("stripe") == []  # nothing was created
    assert create(sk, "k2").amount == 2500  # a new key is a new request


def test_a_500_after_the_create_committed_is_saved_too(server: StagingServer,
                                                       sk: stripe.StripeClient,
                                                       rk: stripe.StripeClient,
                                                       staging: Staging) -> None:
    post(server, "/_staging/stripe/execution_errors", {"status": 500, "commit": True})
    with pytest.raises(stripe.APIError):
        create(sk, "k1", metadata={"tidemark_key": "k1"})
    with pytest.raises(stripe.APIError) as again:
        create(sk, "k1", metadata={"tidemark_key": "k1"})
    assert again.value.headers["Idempotent-Replayed"] == "true"
    [pi] = rk.v1.payment_intents.list().data  # it exists all the same
    assert pi.metadata["tidemark_key"] == "k1"


# -- accounts and modes -----------------------------------------------------------------------

def test_each_account_and_mode_sees_only_its_own_data(server: StagingServer,
                                                      sk: stripe.StripeClient,
                                                      rk: stripe.StripeClient) -> None:
    post(server, "/_staging/tokens", {"token": "sk_test_other", "target": "stripe",
                                      "account": "acct_other",
                                      "scopes": ["rak_payment_intent_read",
                                                 "rak_payment_intent_write",
                                                 "rak_accounts_kyc_basic_read"]})
    post(server, "/_staging/tokens", {"token": "sk_live_same", "target": "stripe",
                                      "scopes": ["rak_payment_intent_read",
                                                 "rak_payment_intent_write",
                                                 "rak_accounts_kyc_basic_read"]})
    other = stripe_client(server.url, "sk_test_other", timeout=5)
    live = stripe_client(server.url, "sk_live_same", timeout=5)
    mine = create(sk, "k1")
    theirs = create(other, "k1")  # the same key in another account is another request
    in_live = create(live, "k1")
    assert not mine.livemode and not theirs.livemode and in_live.livemode
    assert [p.id for p in rk.v1.payment_intents.list().data] == [mine.id]
    assert [p.id for p in other.v1.payment_intents.list().data] == [theirs.id]
    assert [p.id for p in live.v1.payment_intents.list().data] == [in_live.id]
    assert sk.v1.accounts.retrieve_current().id == rk.v1.accounts.retrieve_current().id
    assert other.v1.accounts.retrieve_current().id == "acct_other"


def test_a_restricted_key_needs_the_account_permission_to_read_the_account(
        server: StagingServer) -> None:
    post(server, "/_staging/tokens", {"token": "rk_test_narrow", "target": "stripe",
                                      "scopes": ["rak_payment_intent_read"]})
    with pytest.raises(stripe.PermissionError) as info:
        stripe_client(server.url, "rk_test_narrow", timeout=5).v1.accounts.retrieve_current()
    assert "rak_accounts_kyc_basic_read" in info.value.json_body["error"]["message"]


# -- switches: Stripe's clock, metadata for restricted keys, the idempotency key's life -------

def switch(server: StagingServer, name: str, value: Any) -> None:
    post(server, "/_staging/switches", {"target": "stripe", "name": name, "value": value})


def test_created_and_the_date_header_follow_stripes_clock(server: StagingServer,
                                                          sk: stripe.StripeClient,
                                                          rk: stripe.StripeClient) -> None:
    switch(server, "clock_offset_s", -600)
    pi = create(sk)
    assert abs(pi.created - (time.time() - 600)) < 5
    page = rk.v1.payment_intents.list(params={"limit": 1})
    assert page.last_response is not None
    date = email.utils.parsedate_to_datetime(page.last_response.headers["Date"]).timestamp()
    assert abs(date - (time.time() - 600)) < 5
    assert [p.id for p in rk.v1.payment_intents.list(
        params={"created": {"gte": int(time.time()) - 300}}).data] == []  # our clock misses it


def test_metadata_can_be_hidden_from_restricted_keys_only(server: StagingServer,
                                                          sk: stripe.StripeClient,
                                                          rk: stripe.StripeClient) -> None:
    pi = create(sk, metadata={"tidemark_key": "k"})
    assert rk.v1.payment_intents.retrieve(pi.id).metadata.to_dict() == {"tidemark_key": "k"}
    switch(server, "restricted_key_metadata", "hidden")
    assert rk.v1.payment_intents.retrieve(pi.id).metadata.to_dict() == {}
    assert [p.metadata.to_dict() for p in rk.v1.payment_intents.list().data] == [{}]
    assert sk.v1.payment_intents.retrieve(pi.id).metadata.to_dict() == {"tidemark_key": "k"}


def test_a_key_past_its_life_is_forgotten_and_runs_again(server: StagingServer,
                                                         sk: stripe.StripeClient,
                                                         staging: Staging) -> None:
    switch(server, "idempotency_ttl_s", 1)
    first = create(sk, "life")
    assert create(sk, "life").id == first.id  # remembered: the saved answer
    time.sleep(1.5)
    assert create(sk, "life").id != first.id  # pruned: a new payment
    assert len(staging.effects_of("stripe", "payment_intents.create")) == 2
