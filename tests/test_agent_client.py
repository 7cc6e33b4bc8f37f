"""The agent's client (tools/operate/client.py) against the dev server and a real worker.

The worker process is tests/helpers/worker_main.py, unmodified, on the Temporal dev server. It
runs the ledger plugin it found through the ``tidemark.actions`` entry point."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from helpers.staging_fixtures import effects
from staging.core import StagingServer
from tidemark.errors import PlanError
from tools.operate.client import PlanBuilder, RunNotFound, TidemarkClient, validate, workflow_id

EXAMPLE = Path(__file__).parent.parent / "examples" / "agent_example.py"


def address(env: WorkflowEnvironment) -> str:
    return env.client.service_client.config.target_host


def invoice(builder: PlanBuilder, reference: str = "2026-Q3 retainer") -> PlanBuilder:
    return builder.add("ledger.post_invoice", customer="acme", amount=120_000, currency="eur",
                       reference=reference)


def test_validation_is_local_and_names_the_bad_field() -> None:
    with pytest.raises(PlanError, match=r"steps\[0\]\.args\.amount"):
        validate(PlanBuilder("t").add("ledger.post_invoice", customer="acme", amount="12",
                                      currency="eur", reference="r"))
    with pytest.raises(PlanError, match=r"ledger\.post_invoce"):
        validate(PlanBuilder("t").add("ledger.post_invoce", customer="acme"))
    assert validate(invoice(PlanBuilder("t"))).steps[0].action == "ledger.post_invoice"
    assert workflow_id("t") == "tidemark-t"


async def test_the_ten_line_example_runs_the_plugin_on_an_unmodified_worker(
        temporal_env: WorkflowEnvironment, workers: object, task_queue: str,
        server: StagingServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # The example reads the CLI's settings: the dev server here is on a port of its own.
    assert not address(temporal_env).endswith(":7233")
    monkeypatch.setenv("TEMPORAL_ADDRESS", address(temporal_env))
    monkeypatch.setenv("TIDEMARK_TASK_QUEUE", task_queue)
    workers.start(TIDEMARK_STAGING_URL=server.url)  # type: ignore[attr-defined]
    spec = importlib.util.spec_from_file_location("agent_example", EXAMPLE)
    assert spec and spec.loader
    example = importlib.util.module_from_spec(spec)
    sys.modules["agent_example"] = example
    spec.loader.exec_module(example)
    state = await example.main(task_id="agent-1")
    assert state == "completed"
    posted = effects(server, "ledger", "invoices.post")
    assert len(posted) == 1 and posted[0]["detail"]["customer"] == "acme"
    tm = await TidemarkClient.connect(address(temporal_env), task_queue=task_queue)
    status = await tm.status("agent-1")
    assert status["state"] == "completed" and status["confirmed"] == 1


async def test_submit_status_halt_and_unknown_runs(temporal_env: WorkflowEnvironment,
                                                   workers: object, task_queue: str,
                                                   server: StagingServer) -> None:
    tm = await TidemarkClient.connect(address(temporal_env), task_queue=task_queue)
    with pytest.raises(RunNotFound):
        await tm.status("never-submitted")
    plan = PlanBuilder("agent-halt")
    for i in range(3):
        invoice(plan, f"ref {i}")
    run = await tm.submit(plan)  # no worker yet: the run has not started its first step
    await tm.halt("agent-halt", "the agent changed its mind")
    workers.start(TIDEMARK_STAGING_URL=server.url)  # type: ignore[attr-defined]
    result = await run.wait()
    assert result.state == "halted" and result.stopped_at == 1, result
    assert (await tm.status("agent-halt"))["state"] == "halted"
    assert effects(server, "ledger", "invoices.post") == []
