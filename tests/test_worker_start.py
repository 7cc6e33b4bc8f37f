"""A worker refuses a namespace whose search attributes the workflows could not upsert.

It refuses at start and in one line: every run would otherwise hang on its first workflow task."""

from __future__ import annotations

import pytest
from temporalio.testing import WorkflowEnvironment

from tidemark.errors import ConfigError
from tools.stack.devstack import temporal_binary
from worker import check_search_attributes
from workflows.shared import NEEDS, SEARCH_ATTRIBUTES


async def test_a_namespace_without_a_search_attribute_is_refused_naming_it() -> None:
    older = [a for a in SEARCH_ATTRIBUTES if a.name != NEEDS.name]
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(), search_attributes=older,
        dev_server_log_level="error")
    try:
        with pytest.raises(ConfigError, match=f"lacks the search attribute.*{NEEDS.name}") as e:
            await check_search_attributes(env.client)
        assert "\n" not in str(e.value)
    finally:
        await env.shutdown()


async def test_a_namespace_with_every_search_attribute_is_accepted(
        temporal_env: WorkflowEnvironment) -> None:
    await check_search_attributes(temporal_env.client)
