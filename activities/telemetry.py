"""The worker's telemetry, each part switched on by its environment variable.

- ``TIDEMARK_METRICS_ADDRESS=host:port``: Prometheus metrics at ``http://host:port/metrics``,
  served by the Temporal SDK's runtime: its own worker and client metrics (``temporal_*``) and
  ours (``tidemark_*``, tidemark/metrics.py), counted on the runtime's meter so that one
  endpoint, one scrape job and one set of labels cover both.
- ``TIDEMARK_TRACING=1``, or ``OTEL_EXPORTER_OTLP_ENDPOINT`` /
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` set: OpenTelemetry traces through the SDK's
  ``TracingInterceptor`` (a span per workflow, activity, signal and query), exported over
  OTLP/HTTP to the endpoint the standard ``OTEL_*`` variables name (default
  ``http://localhost:4318``). Needs the ``otel`` extra. ``TIDEMARK_TRACING=0`` turns it off
  whatever else is set.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from temporalio.client import Interceptor
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from tidemark import metrics
from tidemark.errors import ConfigError

if TYPE_CHECKING:  # the otel extra: imported only when tracing is on
    from opentelemetry.sdk.trace import TracerProvider

METRICS_ENV = metrics.METRICS_ENV
TRACING_ENV = "TIDEMARK_TRACING"
OTLP_ENVS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
SERVICE_NAME = "tidemark-worker"


@dataclass
class Telemetry:
    """What Client.connect needs: the runtime and the interceptors.

    A runtime of None is the SDK's default, with no metrics endpoint."""

    runtime: Runtime | None = None
    interceptors: list[Interceptor] = field(default_factory=list)
    metrics_address: str | None = None
    tracing: bool = False


def tracing_wanted(env: Mapping[str, str]) -> bool:
    switch = env.get(TRACING_ENV, "").strip().lower()
    if switch in ("0", "false", "no", "off"):
        return False
    return switch in ("1", "true", "yes", "on") or any(env.get(name) for name in OTLP_ENVS)


def metrics_address(env: Mapping[str, str]) -> str | None:
    """The metrics endpoint's bind address, or None; a malformed one is a ConfigError."""
    address = env.get(METRICS_ENV, "").strip()
    if not address:
        return None
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{METRICS_ENV}={address!r} is not host:port (for example "
                          "127.0.0.1:9464, or 0.0.0.0:9464 to serve every interface)")
    return address


@contextlib.contextmanager
def telemetry(env: Mapping[str, str]) -> Iterator[Telemetry]:
    """Sets up what ``env`` switches on for the block.

    At its end, spans still buffered are flushed and our counters are uninstalled."""
    out = Telemetry(metrics_address=metrics_address(env), tracing=tracing_wanted(env))
    if out.metrics_address:
        try:
            out.runtime = Runtime(telemetry=TelemetryConfig(
                metrics=PrometheusConfig(bind_address=out.metrics_address)))
        except ValueError as e:  # the address is taken or not ours to bind
            raise ConfigError(f"{METRICS_ENV}={out.metrics_address}: {e}; choose a free "
                              "port, or unset it to serve no metrics") from None
    provider = _tracer_provider(env) if out.tracing else None
    if provider is not None:
        from temporalio.contrib.opentelemetry import TracingInterceptor

        # Runs are started by the CLI, an agent or a schedule, with no span of ours to
        # continue: the worker opens the workflow's span itself.
        out.interceptors.append(TracingInterceptor(provider.get_tracer(__name__),
                                                   always_create_workflow_spans=True))
    previous = metrics.install(metrics.MeterMetrics(out.runtime.metric_meter)) \
        if out.runtime is not None else None
    try:
        yield out
    finally:
        if previous is not None:
            metrics.install(previous)
        if provider is not None:
            provider.shutdown()


def _tracer_provider(env: Mapping[str, str]) -> TracerProvider:
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as e:
        raise ConfigError(f"tracing is on ({TRACING_ENV} or OTEL_EXPORTER_OTLP_ENDPOINT) but "
                          f"the OpenTelemetry exporter is not installed ({e.name}): "
                          "pip install 'tidemark[otel]', or set TIDEMARK_TRACING=0") from None
    provider = TracerProvider(resource=Resource.create(
        {"service.name": env.get("OTEL_SERVICE_NAME") or SERVICE_NAME}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider
