"""The worker compiles each workflow module once, not once per workflow run.

Temporal's sandbox imports a workflow's module anew for every run it starts; without a bytecode
cache beside the source (the image's PYTHONDONTWRITEBYTECODE) each of those imports compiled the
source again, which was most of a busy worker's CPU (docs/scaling.md). Counted here from the
interpreter's own ``compile`` audit events, through the sandbox runner of the worker as
``worker.build_worker`` builds it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from temporalio import workflow
from temporalio.testing import WorkflowEnvironment
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from tidemark.store import JournalStore

RUNS = 5
_compiled: list[str] = []  # source paths, while a test listens
_listening: list[bool] = []


def _on_audit(event: str, args: tuple[object, ...]) -> None:
    if _listening and event == "compile" and len(args) > 1 and isinstance(args[1], str):
        _compiled.append(args[1])


sys.addaudithook(_on_audit)  # an audit hook cannot be removed; it is silent unless listening


async def test_each_workflow_module_is_compiled_at_most_once_however_many_runs_start(
        temporal_env: WorkflowEnvironment, store: JournalStore) -> None:
    import worker
    from activities.wiring import worker_registry
    from tidemark.settings import load_settings

    settings = load_settings({"TIDEMARK_MAX_CONCURRENT_STEPS": "4"})
    with worker.step_executor(settings) as executor:
        built = worker.build_worker(temporal_env.client, store, worker_registry({}), executor,
                                    "tq-workflow-code", max_steps=4)
        runner = built.config()["workflow_runner"]
        assert isinstance(runner, SandboxedWorkflowRunner)
        for cls in worker.WORKFLOWS:
            source = str(Path(sys.modules[cls.__module__].__file__ or "").resolve())
            defn = workflow._Definition.must_from_class(cls)
            _compiled.clear()
            _listening.append(True)
            try:
                for _ in range(RUNS):  # what the sandbox does for each run it starts
                    runner.prepare_workflow(defn)
            finally:
                _listening.clear()
            compiles = [p for p in _compiled if str(Path(p).resolve()) == source]
            # Each sandbox import goes through the loader: the first may compile (nothing
            # compiled it yet in this process), none after it.
            assert len(compiles) <= 1, (cls.__name__, len(compiles), RUNS)
