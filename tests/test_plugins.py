"""Actions from installed packages (entry point group ``tidemark.actions``).

They are known to plan checks everywhere, and bound by a worker only where their configuration is
present."""

from __future__ import annotations

import pytest
from tidemark_ledger.action import PostInvoice

from activities.catalog import ACTION_CLASSES
from activities.wiring import worker_registry
from staging.core import StagingServer
from staging.targets import all_targets
from tidemark.errors import ActionNotConfigured, ConfigError
from tidemark.plugins import bind_plugin, plugin_action_classes
from tools.operate import commands


def test_the_installed_ledger_plugin_is_known_to_plan_checks() -> None:
    assert PostInvoice in plugin_action_classes()
    assert ACTION_CLASSES[-1] is PostInvoice  # after the built-in ones
    plan = commands.plan_check("examples/ledger-invoices.json")
    assert [s.action for s in plan.steps] == ["ledger.post_invoice"] * 4
    assert "ledger" in [t.name for t in all_targets()]


def test_a_worker_binds_it_only_where_it_is_configured(server: StagingServer) -> None:
    unconfigured = worker_registry({})
    assert unconfigured.spec("ledger.post_invoice") is PostInvoice
    with pytest.raises(ActionNotConfigured):
        unconfigured.bound("ledger.post_invoice")
    bound = worker_registry({"TIDEMARK_STAGING_URL": server.url}).bound("ledger.post_invoice")
    assert isinstance(bound, PostInvoice)
    assert bound.check_identity() == {"ledger": "default"}


def test_a_half_configured_plugin_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="TIDEMARK_LEDGER_WRITE_TOKEN"):
        bind_plugin(PostInvoice, {"TIDEMARK_LEDGER_URL": "http://ledger.example"})


def test_a_ledger_token_of_another_ledger_is_refused_at_bind(server: StagingServer) -> None:
    from helpers.staging_fixtures import post

    post(server, "/_staging/tokens", {"token": "other-read", "target": "ledger",
                                      "scopes": ["invoices:read"], "account": "globex-books"})
    with pytest.raises(ConfigError, match="'globex-books'"):
        worker_registry({"TIDEMARK_LEDGER_URL": server.url,
                         "TIDEMARK_LEDGER_WRITE_TOKEN": "ledger-staging-post",
                         "TIDEMARK_LEDGER_READ_TOKEN": "other-read"})
