"""The Tidemark worker: ``python worker.py``.

Reads its configuration once (tidemark.settings): Temporal through the SDK's environment
configuration (the ``temporal.toml`` profile named by TEMPORAL_PROFILE, overridden by
TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, TEMPORAL_API_KEY and the TEMPORAL_TLS* variables, as the
``temporal`` CLI reads them), the journal in DATABASE_URL (the embedded Postgres only with
TIDEMARK_EMBEDDED_DB=1; without either it refuses to start and says so), applies the journal's
migrations, registers RunPlan and the step activities on task queue "tidemark"
(TIDEMARK_TASK_QUEUE), and shuts down cleanly on SIGTERM or SIGINT: running steps get
GRACEFUL_SHUTDOWN to finish. Prometheus metrics and OpenTelemetry traces are switched on by
TIDEMARK_METRICS_ADDRESS and TIDEMARK_TRACING / OTEL_EXPORTER_OTLP_ENDPOINT
(activities/telemetry.py).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities.boundary import BoundaryActivities
from activities.planner import PlannerActivities
from activities.steps import StepActivities
from activities.telemetry import metrics_address, telemetry
from activities.wiring import worker_registry
from tidemark import installed_version
from tidemark.actions import Registry
from tidemark.approval import ApprovalPolicy
from tidemark.database import database_url
from tidemark.errors import ConfigError
from tidemark.grants import GrantBroker
from tidemark.import_names import check_import_names
from tidemark.payloads import TASK_QUEUE
from tidemark.process_exit import exit_now
from tidemark.settings import (
    DEFAULT_MAX_CONCURRENT_STEPS,
    DEFAULT_STEP_THREADS,
    Settings,
    load_settings,
)
from tidemark.store import JournalStore
from workflows.needs_person import NeedsPerson, holder_id
from workflows.run_plan import RunPlan
from workflows.scheduled_run import ScheduledRun
from workflows.shared import SEARCH_ATTRIBUTES
from workflows.unwind_plan import UnwindPlan

log = logging.getLogger("tidemark.worker")

# Steps of different tasks run in parallel; steps of one task never do. The default;
# TIDEMARK_MAX_CONCURRENT_STEPS sets it (and TIDEMARK_DB_POOL_MAX the journal's pool). A step
# whose action awaits its call holds a step thread only for its journal statements and reads,
# not while it waits on the target (tidemark.step_threads).
MAX_CONCURRENT_STEPS = DEFAULT_MAX_CONCURRENT_STEPS
# After a worker dies, its workflow tasks wait this long on its sticky queue before any other
# worker may take them (the SDK's default is 10 s): after a SIGKILL, the step after the one
# taken over waits this long (bench/recovery.py). Short, so a crash costs about a second; the
# price is a full-history replay on another worker (a run stays under about 1,500 events, see
# STEPS_PER_RUN) when a live worker leaves a workflow task waiting this long.
STICKY_TO_START = timedelta(seconds=1)
# On SIGTERM a running step gets this long to finish before it is cancelled (and left to the
# journal's probe on the next attempt). Steps normally take well under a second.
GRACEFUL_SHUTDOWN = timedelta(seconds=20)
# How long prepare waits for Temporal to take a worklist row's release (row_release); past it
# the attempt fails and prepare is retried, as after any failed call.
RELEASE_TIMEOUT_S = 20.0
# The workflows every worker runs.
WORKFLOWS = [RunPlan, UnwindPlan, ScheduledRun, NeedsPerson]
# The worker runs them outside Temporal's workflow sandbox. The sandbox enters a restricted
# namespace for every activation and imports the workflow's module anew for every run: about
# 3 ms of a step's 25-30 ms on the activity path, most of what a step cost beyond a bare
# activity and the journal (bench/path_breakdown.py --before, docs/benchmarks.md). What the
# sandbox guards at run time, a workflow calling something non-deterministic, is checked
# before a worker ever runs the code instead: the suite replays every run it made, of every
# path it drives, in the sandbox at its end (tests/conftest.py, temporal_env), and
# tests/test_replay.py replays the recorded histories there.
WORKFLOW_RUNNER = UnsandboxedWorkflowRunner()
# Exit status for a configuration the worker cannot start with (sysexits' EX_CONFIG).
EXIT_CONFIG = 78


def build_id() -> str:
    """The worker's build id in Temporal's history: the installed release, ``tidemark-0.1.0``.

    Named here, not left to the SDK's default, which hashes the code of every loaded module:
    0.3 s of CPU at each start, for an id no person can read."""
    return f"tidemark-{installed_version()}"


def build_worker(client: Client, store: JournalStore, registry: Registry,
                 executor: ThreadPoolExecutor, task_queue: str = TASK_QUEUE,
                 approval: ApprovalPolicy | None = None, *,
                 max_steps: int = MAX_CONCURRENT_STEPS,
                 step_threads: int = DEFAULT_STEP_THREADS) -> Worker:
    """The worker with every workflow and activity.

    Tests build it the same way. ``approval`` is the operator's policy (default: every irreversible
    step waits for a person); ``max_steps`` the steps it runs at once (``executor``, for the
    synchronous activities, must have as many threads); ``step_threads`` the threads for the
    blocking parts of run_step, a coroutine (tidemark.step_threads), started as they are needed and
    kept for the process's life."""
    grants = GrantBroker(store)  # one broker: every call of a task presents its grant
    parts = ThreadPoolExecutor(step_threads, thread_name_prefix="step-part")
    boundary = BoundaryActivities(store, registry, grants, approval)
    activities = StepActivities(store, registry, grants, executor=parts,
                                boundary=boundary.outcome, release_row=row_release(client))
    planning = PlannerActivities(store, registry, grants)
    return Worker(
        client, task_queue=task_queue, workflows=WORKFLOWS, workflow_runner=WORKFLOW_RUNNER,
        activities=[*activities.all(), *boundary.all(), *planning.all()],
        activity_executor=executor, max_concurrent_activities=max_steps,
        sticky_queue_schedule_to_start_timeout=STICKY_TO_START,
        graceful_shutdown_timeout=GRACEFUL_SHUTDOWN, build_id=build_id())


def row_release(client: Client) -> Callable[[str, str], None]:
    """Closes a task's open worklist row (NeedsPerson), from prepare's thread.

    A new run of the task began. The signal goes from the worker's client on its event loop
    (the loop build_worker runs on), and prepare returns only once Temporal took it: the row
    hears it before anything this run opens. A task with no open row (none, or closed) is the
    common case; it costs one refused call, where a signal from the workflow would cost a
    command, an event and a workflow task of its answer."""
    loop = asyncio.get_running_loop()

    async def settle(task_id: str, by: str) -> None:
        try:
            await client.get_workflow_handle(holder_id(task_id)).signal(NeedsPerson.settled, by)
        except RPCError as e:
            if e.status != RPCStatusCode.NOT_FOUND:
                raise

    def release(task_id: str, by: str) -> None:
        asyncio.run_coroutine_threadsafe(settle(task_id, by), loop).result(RELEASE_TIMEOUT_S)
    return release


def journal_store(settings: Settings) -> JournalStore:
    """The journal, opened, on a pool of ``settings.db_pool_max`` connections."""
    return JournalStore(database_url(settings), max_size=settings.db_pool_max).open()


def step_executor(settings: Settings) -> ThreadPoolExecutor:
    """One thread per step the worker may run at once, for its synchronous activities.

    That is all but run_step, whose blocking parts have threads of their own (build_worker's
    ``step_threads``). Threads are started as they are needed."""
    return ThreadPoolExecutor(settings.max_concurrent_steps, thread_name_prefix="step")


def temporal_connect_config(env: Mapping[str, str]) -> dict[str, Any]:
    """``Client.connect`` arguments for ``env``, as the worker would use them."""
    return load_settings(env).temporal_connect()


async def check_search_attributes(client: Client) -> None:
    """Refuses to start on a namespace that lacks a search attribute we upsert.

    Refuses to start, in one line, on a namespace that lacks a search attribute the workflows
    upsert: Temporal would fail every workflow task that upserts it, and every run would hang,
    retried, with nothing said but the worker's warnings. A server that does not let us read the
    list (an API key without operator rights) is not a reason to refuse: it is logged."""
    request = ListSearchAttributesRequest(namespace=client.namespace)
    try:
        known = (await client.operator_service.list_search_attributes(request)).custom_attributes
    except RPCError as e:
        log.warning("cannot read the search attributes of namespace %s (%s); the workflows "
                    "upsert %s", client.namespace, e.message,
                    ", ".join(a.name for a in SEARCH_ATTRIBUTES))
        return
    missing = [a.name for a in SEARCH_ATTRIBUTES if a.name not in known]
    if missing:
        raise ConfigError(
            f"namespace {client.namespace!r} lacks the search attribute(s) {', '.join(missing)}"
            " that the workflows upsert: register each with `temporal operator "
            f"search-attribute create --namespace {client.namespace} --name NAME --type "
            "Keyword` (docker/temporal-setup.sh does it for the compose stack)")


async def serve(settings: Settings | Mapping[str, str], stop: asyncio.Event,
                registry: Registry | None = None) -> None:
    """Runs the worker until ``stop`` is set.

    ``settings`` may be given as an environment mapping; ``registry`` defaults to the one its
    target variables configure."""
    if not isinstance(settings, Settings):
        settings = load_settings(settings)
    connect = settings.temporal_connect()
    # Credentials first: a file that cannot be read is reported before anything connects.
    registry = registry or worker_registry(settings.env)
    metrics_address(settings.env)  # a malformed metrics address is refused before connecting
    store = journal_store(settings)
    applied = store.migrate()
    if applied:
        log.info("journal migrations applied: %s", ", ".join(applied))
    with telemetry(settings.env) as seen, step_executor(settings) as executor:
        client = await Client.connect(**connect, runtime=seen.runtime,
                                      interceptors=seen.interceptors)
        await check_search_attributes(client)
        worker = build_worker(client, store, registry, executor, settings.task_queue,
                              settings.approval, max_steps=settings.max_concurrent_steps,
                              step_threads=settings.step_threads)
        log.info("worker on %s task queue %s; actions: %s", settings.describe_temporal(),
                 settings.task_queue, ", ".join(registry.names()))
        log.info("steps at once: %d; threads for their blocking parts: %d; journal pool: %d "
                 "connections", settings.max_concurrent_steps, settings.step_threads,
                 settings.db_pool_max)
        log.info("approval before irreversible steps: %s; approvers: %s",
                 settings.approval.text, ", ".join(settings.approval.approvers) or "nobody")
        if seen.metrics_address:
            log.info("metrics on http://%s/metrics", seen.metrics_address)
        async with worker:
            await stop.wait()
            log.info("shutting down: letting running steps finish")
    store.close()


def main(registry: Registry | None = None) -> None:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    async def run(settings: Settings) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(settings, stop, registry)

    try:
        check_import_names()
        settings = load_settings()
        logging.getLogger().setLevel(settings.log_level)
        asyncio.run(run(settings))
    except ConfigError as e:
        # The message says what to fix (a file the worker's uid cannot read, a missing
        # credential); a traceback would only bury it. Critical: a worker that does not start
        # must say why at every TIDEMARK_LOG_LEVEL.
        log.critical("cannot start: %s", e)
        exit_now(EXIT_CONFIG)
    exit_now(0)  # see tidemark.process_exit: the SDK's threads may outlive the interpreter


# The guard matters: Temporal's workflow sandbox re-imports modules, and must not start a worker.
if __name__ == "__main__":
    main()
