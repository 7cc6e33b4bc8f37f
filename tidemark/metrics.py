"""What the journal settles, counted: the seam between the core and a metrics exporter.

The core (run_step, the activities) reports facts here as they become known; by default nothing
is recorded. A worker with metrics on installs a sink over a meter (``install(MeterMetrics(m))``)
— the Temporal runtime's ``MetricMeter`` (activities/telemetry.py), so that our counters are
served on the same Prometheus endpoint as the SDK's own. The core names no exporter and
imports no Temporal: a meter is anything with ``create_counter(name, description, unit) ->
counter`` and ``counter.add(value, attributes)``.

Recording never fails a step: a sink that raises is logged and ignored.

The counters (labels in brackets; docs/operate.md lists them too, under Metrics and traces):

- ``tidemark_steps_settled`` [action, resolved_by, status]: a step's outcome written by this
  attempt (an outcome read back from the journal is not counted again).
- ``tidemark_probes`` [action, answer]: a step in doubt probed: done, absent or unknown.
- ``tidemark_steps_left_in_doubt`` [action, error]: an action failed without a definite
  answer; its intent stays open for the next attempt's probe.
- ``tidemark_tasks_stopped`` [reason]: a run stops for a person: halt, stopped,
  needs_decision, precondition_failed, unauthorized.
- ``tidemark_lease_waits`` [action]: a step in doubt left alone because its last attempt's
  lease was still fresh.

And one histogram:

- ``tidemark_step_latency`` [action, resolved_by, status]: for each outcome counted in
  ``tidemark_steps_settled``, the time from its attempt's start (the read of its step) to the
  outcome written: the journal's statements, gates, snapshot and probe, and the call itself.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Protocol

log = logging.getLogger(__name__)

# host:port of the worker's Prometheus endpoint; unset, the worker serves no metrics.
METRICS_ENV = "TIDEMARK_METRICS_ADDRESS"
# `tidemark dev`'s default: the port OpenTelemetry's Prometheus exporters use.
DEV_PORT = 9464

STEPS_SETTLED = "tidemark_steps_settled"
PROBES = "tidemark_probes"
LEFT_IN_DOUBT = "tidemark_steps_left_in_doubt"
TASKS_STOPPED = "tidemark_tasks_stopped"
LEASE_WAITS = "tidemark_lease_waits"
STEP_LATENCY = "tidemark_step_latency"

COUNTERS: dict[str, str] = {
    STEPS_SETTLED: "Steps whose outcome this worker wrote, by action, resolved_by and status",
    PROBES: "Probes of steps in doubt, by action and answer (done, absent, unknown)",
    LEFT_IN_DOUBT: "Actions that failed without a definite answer, leaving the step in doubt",
    TASKS_STOPPED: "Runs that stopped to wait for a person, by reason",
    LEASE_WAITS: "Attempts that waited because an earlier attempt's lease was still fresh",
}
HISTOGRAMS: dict[str, str] = {
    STEP_LATENCY: "Time from an attempt's start to the outcome it wrote, by action, "
                  "resolved_by and status",
}


class Counter(Protocol):
    def add(self, value: int, additional_attributes: Mapping[str, str] | None = None,
            /) -> None: ...


class Histogram(Protocol):
    def record(self, value: timedelta, additional_attributes: Mapping[str, str] | None = None,
               /) -> None: ...


class Meter(Protocol):
    def create_counter(self, name: str, description: str | None = None,
                       unit: str | None = None, /) -> Counter: ...

    def create_histogram_timedelta(self, name: str, description: str | None = None,
                                   unit: str | None = None, /) -> Histogram: ...


class Metrics:
    """The default sink: records nothing."""

    def count(self, name: str, labels: Mapping[str, str]) -> None:
        """Adds one to counter ``name`` with ``labels``."""

    def observe(self, name: str, seconds: float, labels: Mapping[str, str]) -> None:
        """Records a duration of ``seconds`` on histogram ``name`` with ``labels``."""


class MeterMetrics(Metrics):
    """Counts on a meter's counters and records on its histograms, made once here.

    The meter's durations are whole milliseconds, exported as the runtime exports its own (ms, or
    seconds with ``durations_as_seconds``)."""

    def __init__(self, meter: Meter) -> None:
        self._counters = {name: meter.create_counter(name, description, None)
                          for name, description in COUNTERS.items()}
        self._histograms = {name: meter.create_histogram_timedelta(name, description,
                                                                   "duration")
                            for name, description in HISTOGRAMS.items()}

    def count(self, name: str, labels: Mapping[str, str]) -> None:
        self._counters[name].add(1, dict(labels))

    def observe(self, name: str, seconds: float, labels: Mapping[str, str]) -> None:
        self._histograms[name].record(timedelta(seconds=seconds), dict(labels))


_sink: Metrics = Metrics()


def install(sink: Metrics) -> Metrics:
    """Makes ``sink`` record from now on, in this process; returns the one it replaces."""
    global _sink
    previous, _sink = _sink, sink
    return previous


def _count(name: str, **labels: str) -> None:
    try:
        _sink.count(name, labels)
    except Exception as e:  # a metric is never worth a step
        log.warning("metric %s not recorded: %r", name, e)


def _observe(name: str, seconds: float, **labels: str) -> None:
    try:
        _sink.observe(name, seconds, labels)
    except Exception as e:  # a metric is never worth a step
        log.warning("metric %s not recorded: %r", name, e)


def step_settled(action: str, resolved_by: str, status: str, began: float) -> None:
    """An outcome written by an attempt that began at ``began`` (time.monotonic())."""
    _count(STEPS_SETTLED, action=action, resolved_by=resolved_by, status=status)
    _observe(STEP_LATENCY, time.monotonic() - began, action=action, resolved_by=resolved_by,
             status=status)


def probe_answered(action: str, answer: str) -> None:
    _count(PROBES, action=action, answer=answer)


def left_in_doubt(action: str, error: str) -> None:
    _count(LEFT_IN_DOUBT, action=action, error=error)


def task_stopped(reason: str) -> None:
    _count(TASKS_STOPPED, reason=reason)


def lease_wait(action: str) -> None:
    _count(LEASE_WAITS, action=action)


def dev_address(env: Mapping[str, str]) -> str:
    """Where `tidemark dev`'s worker serves metrics.

    ``TIDEMARK_METRICS_ADDRESS`` if set, else 127.0.0.1:9464, or any free port of 127.0.0.1 when
    that one is taken."""
    if env.get(METRICS_ENV):
        return env[METRICS_ENV]
    for port in (DEV_PORT, 0):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return f"127.0.0.1:{s.getsockname()[1]}"
    raise OSError("no free port on 127.0.0.1 for the metrics endpoint")
