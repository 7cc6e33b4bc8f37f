"""The agent's side: build a plan, submit it, and follow its run.

The client builds or loads a plan, validates it here, submits it, waits, reads its status and
halts it, without assembling Temporal calls by hand.

::

    async with await TidemarkClient.connect("localhost:7233") as tm:
        plan = PlanBuilder("invoices-2026-11").add("ledger.post_invoice", customer="acme",
                                                   amount=120000, currency="eur",
                                                   reference="2026-Q3 retainer")
        run = await tm.submit(plan)          # validated first; workflow id tidemark-<task_id>
        print(await run.status())            # {"state": "running", "current_step": 1, ...}
        result = await run.wait()            # RunResult: state completed | halted | ...

A run is the Temporal workflow ``tidemark-<task_id>`` on task queue ``tidemark`` (or the one
given), the convention the CLI and the worker follow; ``run(task_id)`` reattaches to one.
Validation uses every known action class (built-in and installed plugins), so a plan that
names an unknown action or a bad argument is refused before anything is sent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from tidemark.actions import Registry
from tidemark.errors import TidemarkError
from tidemark.needs import metadata
from tidemark.payloads import TASK_QUEUE, RunResult
from tidemark.plan import Plan, load_plan
from tidemark.settings import Settings, load_settings
from workflows.outcome import run_result
from workflows.shared import start_attributes


class RunNotFound(TidemarkError):
    """No run of this task is known to Temporal."""


class AlreadySubmitted(TidemarkError):
    """A run of this task is open already; a task runs once at a time."""


def workflow_id(task_id: str) -> str:
    """The workflow id of a task's run: ``tidemark-<task_id>``."""
    return f"tidemark-{task_id}"


@dataclass
class PlanBuilder:
    """A plan document, step by step: ``PlanBuilder("t").add("gmail.send", to=[...], ...)``."""

    task_id: str
    steps: list[dict[str, Any]] = field(default_factory=list)

    def add(self, action: str, **args: Any) -> PlanBuilder:
        self.steps.append({"action": action, "args": args})
        return self

    def document(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "steps": [dict(s) for s in self.steps]}


PlanLike = PlanBuilder | dict[str, Any] | str | Path


def plan_document(plan: PlanLike) -> dict[str, Any]:
    """A plan document from a builder, a dict, or a JSON file's path."""
    if isinstance(plan, PlanBuilder):
        return plan.document()
    if isinstance(plan, str | Path):
        return json.loads(Path(plan).read_text(encoding="utf-8"))
    return plan


def validate(plan: PlanLike, registry: Registry | None = None) -> Plan:
    """The validated Plan; raises PlanError naming the first bad field."""
    if registry is None:
        from activities.catalog import spec_registry

        registry = spec_registry()
    return load_plan(plan_document(plan), registry)


@dataclass
class Run:
    """One task's run: the workflow ``tidemark-<task_id>``."""

    task_id: str
    handle: WorkflowHandle[Any, RunResult]

    async def wait(self) -> RunResult:
        """Waits for the run to end and returns its RunResult.

        The state is completed, halted, failed, ... A run that needs a person ends its workflow
        Failed, and carries its RunResult there."""
        return await run_result(self.handle)

    async def status(self) -> dict[str, Any]:
        """Where the run stands.

        While it runs: the workflow's ``status`` query (task_id, state, current_step, steps,
        confirmed, ...). Once it has ended: its result's fields."""
        desc = await self.handle.describe()
        if desc.status is not None and desc.status.name != "RUNNING":
            result = await run_result(self.handle)
            return {"task_id": result.task_id, "state": result.state, "steps": result.steps,
                    "confirmed": result.confirmed, "executed": result.executed,
                    "resolved_by_probe": result.resolved_by_probe,
                    "stopped_at": result.stopped_at, "error": result.error}
        return dict(await self.handle.query("status"))

    async def halt(self, reason: str = "") -> None:
        """Stops the task durably: the step under way finishes, nothing after it starts."""
        await self.handle.signal("halt", reason)


class TidemarkClient:
    """Submits and follows plans on one Temporal namespace and task queue."""

    def __init__(self, client: Client, task_queue: str = TASK_QUEUE,
                 registry: Registry | None = None) -> None:
        self.client = client
        self.task_queue = task_queue
        self.registry = registry

    @classmethod
    async def connect(cls, address: str | None = None, namespace: str | None = None, *,
                      task_queue: str | None = None,
                      settings: Settings | None = None) -> TidemarkClient:
        """Connects as the worker and the `tidemark` command do.

        That is the SDK's environment configuration (``temporal.toml`` profile,
        TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, TEMPORAL_API_KEY, TLS) of ``settings`` (default:
        read from this process's environment). ``address``/``namespace`` replace the configured
        ones if given; the task queue is TIDEMARK_TASK_QUEUE's unless given."""
        from tools.operate.starter import connect

        settings = (settings or load_settings()).with_temporal(address=address,
                                                               namespace=namespace)
        return cls(await connect(settings), task_queue or settings.task_queue)

    async def __aenter__(self) -> TidemarkClient:
        return self

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType | None
                        ) -> None:
        return None

    def validate(self, plan: PlanLike) -> Plan:
        return validate(plan, self.registry)

    async def submit(self, plan: PlanLike) -> Run:
        """Validates the plan here, then starts ``tidemark-<task_id>``.

        Raises PlanError for a bad plan (nothing is sent) and AlreadySubmitted while a run of
        the task is open."""
        valid = self.validate(plan)
        summary, details = metadata("RunPlan", valid.task_id)
        try:
            handle = await self.client.start_workflow(
                "RunPlan", plan_document(plan), id=workflow_id(valid.task_id),
                task_queue=self.task_queue, result_type=RunResult,
                static_summary=summary, static_details=details,
                search_attributes=start_attributes(valid.task_id))
        except WorkflowAlreadyStartedError as e:
            raise AlreadySubmitted(f"{workflow_id(valid.task_id)} is running already") from e
        return Run(valid.task_id, handle)

    def run(self, task_id: str) -> Run:
        """The run of a task submitted earlier (by anyone)."""
        return Run(task_id, self.client.get_workflow_handle(workflow_id(task_id),
                                                            result_type=RunResult))

    async def status(self, task_id: str) -> dict[str, Any]:
        try:
            return await self.run(task_id).status()
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                raise RunNotFound(f"no run {workflow_id(task_id)}") from None
            raise

    async def halt(self, task_id: str, reason: str = "") -> None:
        await self.run(task_id).halt(reason)
