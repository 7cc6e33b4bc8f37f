"""Metrics: what the journal settles is counted, on the Prometheus endpoint.

The endpoint is the Temporal runtime's, beside the SDK's own metrics; read over HTTP as
Prometheus would."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.testing import WorkflowEnvironment

from activities.catalog import spec_registry
from activities.telemetry import metrics_address, telemetry, tracing_wanted
from helpers.ledger import LedgerRecord, ledger_lines, ledger_step
from helpers.steps import persist, wait_unlocked
from helpers.wait import assert_eventually
from tidemark import metrics
from tidemark.actions import Registry
from tidemark.activity_names import ActivityName
from tidemark.errors import ConfigError, StepBusy, TargetUnavailable
from tidemark.faults import CRASH_ENV
from tidemark.payloads import RunResult
from tidemark.run_step import run_step
from tidemark.store import JournalStore
from tools.stack.devstack import free_port
from workflows.outcome import run_result

SPECS = spec_registry(LedgerRecord)
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def scrape(address: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of ``http://address/metrics``, keyed by name and labels."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m and not line.startswith("#"):
            labels = frozenset(LABEL.findall(m.group(2) or ""))
            samples[(m.group(1), labels)] = float(m.group(3))
    return samples


def value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
          **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 if none)."""
    want = set(labels.items())
    return sum(v for (n, got), v in samples.items() if n == name and want <= got)


@pytest.fixture
def prometheus() -> Iterator[str]:
    """Our counters on a Temporal runtime's Prometheus endpoint, in this process."""
    address = f"127.0.0.1:{free_port()}"
    runtime = Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=address)))
    previous = metrics.install(metrics.MeterMetrics(runtime.metric_meter))
    yield address
    metrics.install(previous)


def test_run_step_counts_lease_waits_probes_doubt_and_settled_steps(
        store: JournalStore, db_url: str, tmp_path: Path, prometheus: str) -> None:
    registry = Registry([LedgerRecord()])
    hold, down = tmp_path / "hold", tmp_path / "down"
    hold.write_text("")
    task = persist(store, SPECS, [ledger_step(tmp_path, "a", hold_while=str(hold)),
                                  ledger_step(tmp_path, "b", unavailable_while=str(down))])
    errors: list[BaseException] = []

    def first() -> None:
        try:
            run_step(store, registry, task, 1)
        except BaseException as e:  # A is stopped in doubt below, as a crash would leave it
            errors.append(e)

    a = threading.Thread(target=first)
    a.start()
    row = assert_eventually(lambda: store.step_row(task, 1))
    with pytest.raises(StepBusy):  # A is still acting under its lease
        run_step(store, registry, task, 1)
    # A's outcome is refused, as for an attempt that lost its intent: a twin's probe settles it.
    with psycopg.connect(db_url, autocommit=True) as admin:
        admin.execute("UPDATE tidemark.journal SET owner = gen_random_uuid()"
                      " WHERE idem_key = %s", (row.idem_key,))
    hold.unlink()
    a.join(30)
    assert [type(e).__name__ for e in errors] == ["StepBusy"]
    assert len(ledger_lines(tmp_path / "ledger")) == 1
    wait_unlocked(db_url)
    assert run_step(store, registry, task, 1).resolved_by == "probe"

    down.write_text("")
    with pytest.raises(TargetUnavailable):
        run_step(store, registry, task, 2)
    down.unlink()
    wait_unlocked(db_url)
    assert run_step(store, registry, task, 2).resolved_by == "execute"  # probe: absent
    assert run_step(store, registry, task, 2).skipped  # read back: not counted again

    got = scrape(prometheus)
    ledger = "ledger.record"
    assert value(got, metrics.LEASE_WAITS, action=ledger) == 1
    assert value(got, metrics.PROBES, action=ledger, answer="done") == 1
    assert value(got, metrics.PROBES, action=ledger, answer="absent") == 1
    assert value(got, metrics.PROBES, answer="unknown") == 0
    assert value(got, metrics.LEFT_IN_DOUBT, action=ledger, error="TargetUnavailable") == 1
    assert value(got, metrics.STEPS_SETTLED, action=ledger, resolved_by="probe",
                 status="done") == 1
    assert value(got, metrics.STEPS_SETTLED, action=ledger, resolved_by="execute",
                 status="done") == 1
    # each outcome counted has its attempt's latency, with the same labels
    for resolved_by in ("probe", "execute"):
        assert value(got, f"{metrics.STEP_LATENCY}_count", action=ledger,
                     resolved_by=resolved_by, status="done") == 1
    assert value(got, f"{metrics.STEP_LATENCY}_count") == 2


def test_a_steps_latency_runs_from_its_attempts_start_to_its_outcome(
        store: JournalStore, tmp_path: Path, prometheus: str) -> None:
    """A step's latency runs from its attempt's start to its outcome.

    An attempt whose call is held 0.4 s records about that long or more (milliseconds, as
    the runtime exports durations, less the few that pass between the hold's timer starting
    and the attempt's), and no more than the whole call of run_step took."""
    hold = tmp_path / "hold"
    hold.write_text("")
    task = persist(store, SPECS, [ledger_step(tmp_path, "slow", hold_while=str(hold))])
    threading.Timer(0.4, hold.unlink).start()
    began = time.monotonic()
    assert run_step(store, Registry([LedgerRecord()]), task, 1).resolved_by == "execute"
    took_ms = (time.monotonic() - began) * 1000
    got = scrape(prometheus)
    assert value(got, f"{metrics.STEP_LATENCY}_count", action="ledger.record") == 1
    assert 390 <= value(got, f"{metrics.STEP_LATENCY}_sum", action="ledger.record") <= took_ms


def test_a_sink_that_fails_never_fails_the_step(store: JournalStore, tmp_path: Path) -> None:
    class Broken(metrics.Metrics):
        def count(self, name: str, labels: Any) -> None:
            raise RuntimeError("exporter gone")

        def observe(self, name: str, seconds: float, labels: Any) -> None:
            raise RuntimeError("exporter gone")

    previous = metrics.install(Broken())
    try:
        task = persist(store, SPECS, [ledger_step(tmp_path, "a")])
        result = run_step(store, Registry([LedgerRecord()]), task, 1)
    finally:
        metrics.install(previous)
    assert (result.status, result.resolved_by) == ("done", "execute")


def test_switches_read_from_the_environment() -> None:
    assert metrics_address({}) is None
    assert metrics_address({"TIDEMARK_METRICS_ADDRESS": "0.0.0.0:9464"}) == "0.0.0.0:9464"
    for bad in ("9464", "host:", "host:port", ":9464", "h:70000"):
        with pytest.raises(ConfigError, match="TIDEMARK_METRICS_ADDRESS"):
            metrics_address({"TIDEMARK_METRICS_ADDRESS": bad})
    assert not tracing_wanted({})
    assert tracing_wanted({"TIDEMARK_TRACING": "1"})
    assert tracing_wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert not tracing_wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
                               "TIDEMARK_TRACING": "0"})


def test_a_metrics_address_in_use_is_a_config_error(prometheus: str) -> None:
    with pytest.raises(ConfigError, match="choose a free port"), \
            telemetry({"TIDEMARK_METRICS_ADDRESS": prometheus}):
        pass


async def test_a_worker_with_metrics_on_serves_ours_and_the_sdks(
        temporal_env: WorkflowEnvironment, store: JournalStore, workers: Any, task_queue: str,
        tmp_path: Path) -> None:
    client = temporal_env.client
    address = f"127.0.0.1:{free_port()}"
    doomed = workers.start(**{CRASH_ENV: "after_execute:2"})  # dies with step 2 in doubt
    doc = {"task_id": "metrics-1", "steps": [ledger_step(tmp_path, f"e{i}") for i in (1, 2, 3)]}
    handle = await client.start_workflow("RunPlan", doc, id="tidemark-metrics-1",
                                         task_queue=task_queue, result_type=RunResult)
    assert await asyncio.to_thread(doomed.wait, 60) == -signal.SIGKILL
    workers.start(TIDEMARK_METRICS_ADDRESS=address)
    result = await asyncio.wait_for(run_result(handle), 60)
    assert (result.state, result.confirmed) == ("completed", 3)

    gated = {"task_id": "metrics-2",
             "steps": [ledger_step(tmp_path, "g", gate_file=str(tmp_path / "ledger"))]}
    refused = await asyncio.wait_for(run_result(await client.start_workflow(
        "RunPlan", gated, id="tidemark-metrics-2", task_queue=task_queue,
        result_type=RunResult)), 60)
    assert refused.state == "precondition_failed"
    halted = await asyncio.wait_for(run_result(await client.start_workflow(
        "RunPlan", {"task_id": "metrics-3", "steps": [ledger_step(tmp_path, "h")]},
        id="tidemark-metrics-3", task_queue=task_queue, result_type=RunResult,
        start_signal="halt", start_signal_args=["before it began"])), 60)
    assert halted.state == "halted"

    got = await asyncio.to_thread(scrape, address)
    ledger = "ledger.record"
    # Step 1 was settled by the worker that died (its counts died with it); this one settled
    # step 2 by its probe and executed step 3.
    assert value(got, metrics.STEPS_SETTLED, action=ledger, resolved_by="execute") == 1
    assert value(got, metrics.STEPS_SETTLED, action=ledger, resolved_by="probe") == 1
    assert value(got, metrics.PROBES, action=ledger, answer="done") == 1
    assert value(got, metrics.TASKS_STOPPED, reason="precondition_failed") == 1
    assert value(got, metrics.TASKS_STOPPED, reason="halt") == 1
    assert value(got, metrics.TASKS_STOPPED) == 2
    assert value(got, f"{metrics.STEP_LATENCY}_count", action=ledger) == 2
    # The SDK's own metrics on the same endpoint: the activities this worker ran.
    assert value(got, "temporal_activity_execution_latency_count",
                 activity_type=ActivityName.RUN_STEP, task_queue=task_queue) >= 2


async def test_a_worker_with_tracing_on_exports_spans_over_otlp(
        temporal_env: WorkflowEnvironment, store: JournalStore, workers: Any, task_queue: str,
        tmp_path: Path) -> None:
    from aiohttp import web
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
    )

    spans: list[Any] = []

    async def receive(request: web.Request) -> web.Response:  # an OTLP/HTTP collector
        export = ExportTraceServiceRequest.FromString(await request.read())
        spans.extend(span for resource in export.resource_spans
                     for scope in resource.scope_spans for span in scope.spans)
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", receive)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        workers.start(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
                      OTEL_BSP_SCHEDULE_DELAY="100")
        doc = {"task_id": "traced-1", "steps": [ledger_step(tmp_path, "e1")]}
        result = await asyncio.wait_for(run_result(await temporal_env.client.start_workflow(
            "RunPlan", doc, id="tidemark-traced-1", task_queue=task_queue,
            result_type=RunResult)), 60)
        assert result.state == "completed"
        for _ in range(100):
            names = {span.name for span in spans}
            if {"RunWorkflow:RunPlan", "StartActivity:run_step",
                    "RunActivity:run_step"} <= names:
                break
            await asyncio.sleep(0.1)
    finally:
        await runner.cleanup()
    by_name = {span.name: span for span in spans}
    assert {"RunWorkflow:RunPlan", "RunActivity:run_step"} <= set(by_name), sorted(by_name)
    # The step's span is the child of the workflow's StartActivity span, and every span names
    # the run, so a trace backend finds them all by workflow id.
    step, started = by_name["RunActivity:run_step"], by_name["StartActivity:run_step"]
    assert (step.trace_id, step.parent_span_id) == (started.trace_id, started.span_id)
    for span in (step, started, by_name["RunWorkflow:RunPlan"]):
        attributes = {a.key: a.value.string_value for a in span.attributes}
        assert attributes.get("temporalWorkflowID") == "tidemark-traced-1", attributes


def test_a_worker_with_a_malformed_metrics_address_stops_with_one_line(tmp_path: Path) -> None:
    """A worker with a malformed metrics address stops with one line.

    It is refused before the worker touches the database or Temporal (neither is reachable here)."""
    import subprocess
    import sys

    from worker import EXIT_CONFIG

    root = Path(__file__).resolve().parent.parent
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path),
           "DATABASE_URL": f"postgresql://nobody@127.0.0.1:{free_port()}/none",
           "TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}", "TIDEMARK_METRICS_ADDRESS": "9464"}
    done = subprocess.run([sys.executable, "worker.py"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == EXIT_CONFIG, done.stderr
    assert "cannot start: TIDEMARK_METRICS_ADDRESS='9464' is not host:port" in done.stderr
    assert "Traceback" not in done.stderr
