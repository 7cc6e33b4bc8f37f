"""A worker binds Drive and Stripe only when both credentials are one identity.

The read credential must read what the write credential writes: the same Drive user, the same
Stripe account in the same mode. Real clients over HTTP against the staging server, through
activities.wiring.worker_registry."""

from __future__ import annotations

import pytest

from activities.wiring import worker_registry
from helpers.staging_fixtures import post, revoke
from staging.core import StagingServer
from staging.drive import (
    DEFAULT_READ_TOKEN,
    DEFAULT_WRITE_TOKEN,
    SCOPE_DRIVE,
    SCOPE_METADATA_READONLY,
    DriveTarget,
)
from staging.stripe import (
    DEFAULT_READ_KEY,
    DEFAULT_SECRET_KEY,
    PERM_ACCOUNT_READ,
    PERM_READ,
    PERM_WRITE,
)
from tidemark.errors import ConfigError


def drive_env(server: StagingServer, write: str, read: str) -> dict[str, str]:
    return {"TIDEMARK_DRIVE_URL": server.url, "TIDEMARK_DRIVE_WRITE_TOKEN": write,
            "TIDEMARK_DRIVE_READ_TOKEN": read}


def stripe_env(server: StagingServer, write: str, read: str) -> dict[str, str]:
    return {"TIDEMARK_STRIPE_URL": server.url, "TIDEMARK_STRIPE_WRITE_TOKEN": write,
            "TIDEMARK_STRIPE_READ_TOKEN": read}


def token(server: StagingServer, name: str, target: str, scopes: list[str],
          account: str = "default", client: str = "tidemark") -> None:
    post(server, "/_staging/tokens", {"token": name, "target": target, "scopes": scopes,
                                      "account": account, "client": client})


# -- Drive ------------------------------------------------------------------------------------

def test_drive_binds_when_both_tokens_are_the_same_user(server: StagingServer,
                                                       drive: DriveTarget) -> None:
    token(server, "another-read-of-default", "drive", [SCOPE_METADATA_READONLY])
    registry = worker_registry(drive_env(server, DEFAULT_WRITE_TOKEN, "another-read-of-default"))
    identity = registry.bound("drive.rename").check_identity()
    assert identity == {"user": "default@drive.staging.example",
                        "permission_id": drive.user("default")["permissionId"]}


def test_drive_refuses_to_bind_a_read_token_of_another_user(server: StagingServer) -> None:
    post(server, "/_staging/drive/users", {"account": "bob", "emailAddress": "bob@example.com"})
    token(server, "bobs-read", "drive", [SCOPE_METADATA_READONLY], account="bob")
    with pytest.raises(ConfigError) as info:
        worker_registry(drive_env(server, DEFAULT_WRITE_TOKEN, "bobs-read"))
    message = str(info.value)
    assert "default@drive.staging.example" in message and "bob@example.com" in message
    assert "same Google account" in message and "TIDEMARK_DRIVE_READ_TOKEN" in message


def test_drive_refuses_a_read_token_of_another_oauth_client_that_cannot_see_our_stamps(
        server: StagingServer) -> None:
    # The same Drive user, but the read token was issued to another OAuth client: Drive keeps
    # appProperties private to the client that wrote them, so the probe would see no stamp.
    token(server, "other-apps-read", "drive", [SCOPE_METADATA_READONLY], client="other-app")
    with pytest.raises(ConfigError, match="does not see the appProperties the write token") as e:
        worker_registry(drive_env(server, DEFAULT_WRITE_TOKEN, "other-apps-read"))
    assert "\n" not in str(e.value)
    post(server, "/_staging/switches", {"target": "drive", "name": "app_properties_visible_to",
                                        "value": "project"})  # a Drive that shared them
    worker_registry(drive_env(server, DEFAULT_WRITE_TOKEN, "other-apps-read"))


def test_drive_stamp_check_writes_once_and_a_restart_only_reads(
        server: StagingServer) -> None:
    for _ in range(3):  # three worker starts
        worker_registry(drive_env(server, DEFAULT_WRITE_TOKEN, DEFAULT_READ_TOKEN))
    writes = [(e.op, e.detail.get("name")) for e in server.staging.effects_of("drive")]
    assert writes == [("files.create", ".tidemark identity check")]


def test_drive_refuses_to_bind_a_write_token_of_another_user(server: StagingServer) -> None:
    token(server, "carols-write", "drive", [SCOPE_DRIVE], account="carol")
    with pytest.raises(ConfigError, match=r"carol@drive\.staging\.example"):
        worker_registry(drive_env(server, "carols-write", DEFAULT_READ_TOKEN))


def test_drive_refuses_to_bind_a_rejected_token(server: StagingServer) -> None:
    revoke(server, DEFAULT_READ_TOKEN)
    with pytest.raises(ConfigError, match=r"read token.*401"):
        worker_registry(drive_env(server, DEFAULT_WRITE_TOKEN, DEFAULT_READ_TOKEN))


# -- Stripe -----------------------------------------------------------------------------------

def test_stripe_binds_when_both_keys_are_the_same_account_and_mode(server: StagingServer) -> None:
    registry = worker_registry(stripe_env(server, DEFAULT_SECRET_KEY, DEFAULT_READ_KEY))
    assert registry.bound("stripe.payment_intent").check_identity() == {
        "account": "acct_1TidemarkStaging", "mode": "test"}


def test_stripe_refuses_to_bind_a_read_key_of_another_account(server: StagingServer) -> None:
    token(server, "rk_test_other_account", "stripe", [PERM_READ, PERM_ACCOUNT_READ],
          account="acct_other")
    with pytest.raises(ConfigError) as info:
        worker_registry(stripe_env(server, DEFAULT_SECRET_KEY, "rk_test_other_account"))
    message = str(info.value)
    assert "acct_1TidemarkStaging" in message and "acct_other" in message
    assert "same account and mode" in message


def test_stripe_refuses_to_bind_a_live_write_key_with_a_test_read_key(
        server: StagingServer) -> None:
    # Same account, other mode: test and live data are apart, so the test read key would never
    # see a live payment.
    token(server, "sk_live_same_account", "stripe", [PERM_READ, PERM_WRITE, PERM_ACCOUNT_READ])
    with pytest.raises(ConfigError) as info:
        worker_registry(stripe_env(server, "sk_live_same_account", DEFAULT_READ_KEY))
    assert "live mode" in str(info.value) and "test mode" in str(info.value)


def test_stripe_refuses_a_read_key_that_cannot_read_the_account(server: StagingServer) -> None:
    token(server, "rk_test_payments_only", "stripe", [PERM_READ])
    with pytest.raises(ConfigError, match="rak_accounts_kyc_basic_read"):
        worker_registry(stripe_env(server, DEFAULT_SECRET_KEY, "rk_test_payments_only"))


def test_stripe_refuses_a_key_whose_mode_cannot_be_told(server: StagingServer) -> None:
    token(server, "some-proxy-token", "stripe", [PERM_READ, PERM_ACCOUNT_READ])
    with pytest.raises(ConfigError, match="test or a live key"):
        worker_registry(stripe_env(server, DEFAULT_SECRET_KEY, "some-proxy-token"))


def test_a_bad_read_retry_budget_refuses_the_start_in_one_line(server: StagingServer) -> None:
    env = {**drive_env(server, DEFAULT_WRITE_TOKEN, DEFAULT_READ_TOKEN),
           "TIDEMARK_READ_RETRY_S": "a minute"}
    with pytest.raises(ConfigError, match="TIDEMARK_READ_RETRY_S must be a number"):
        worker_registry(env)
