"""Who needs me, in the Temporal Web UI: the worklist link selects exactly those runs.

The worklist link `tidemark inbox` prints selects, on a real dev server with real worker processes,
exactly the runs that wait for a person among a completed, a halted, an awaiting-approval, a
needs-a-decision, a killed and an unwound task (tests/helpers/worklist.py reaches them); every run's
TidemarkNeeds says what its task needs; and every run that ends needing a person opens its failure,
as the Web UI shows it, with one plain sentence of what happened and what to do next, the line
`tidemark status T` prints first.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from helpers.steps import crash_at, run_one
from helpers.worklist import (
    NEEDS_A_PERSON,
    SPECS,
    attribute,
    awaiting,
    make_tasks,
    open_needs,
    plan,
    until,
)
from tidemark.activity_names import ActivityName
from tidemark.needs import Need, need_of, needs_query
from tidemark.needs_journal import entry_for
from tidemark.payloads import Prepared, RunResult, UnwindResult
from tidemark.plan import load_plan
from tidemark.store import JournalStore
from tools.operate.inbox import DEFAULT_UI
from workflows.outcome import run_result, unwind_result

# What each run's TidemarkNeeds says.
NEEDS = {"completed": "nothing", "halted": "halted", "awaiting_approval": "approval",
         "needs_decision": "decision", "killed": "killed", "unwound": "nothing",
         "resumed": "nothing"}
# The command the first line of an ended run's failure, and of `tidemark status`, names.
NEXT = {"halted": "tidemark resume {T}", "needs_decision": "tidemark resolve {T} --step 3",
        "killed": "tidemark release {T}"}


def printed_query(out: str) -> str:
    """The visibility query of the Web UI link the inbox's text output ends with."""
    link = out.rstrip("\n").splitlines()[-1].split(": ", 1)[1]
    assert link.startswith(f"{DEFAULT_UI}/namespaces/default/workflows?query="), link
    return urllib.parse.parse_qs(urllib.parse.urlsplit(link).query)["query"][0]


async def failure_of(env: WorkflowEnvironment, workflow_id: str) -> ApplicationError:
    with pytest.raises(WorkflowFailureError) as e:
        await env.client.get_workflow_handle(workflow_id).result()
    assert isinstance(e.value.cause, ApplicationError)
    return e.value.cause


async def test_the_printed_worklist_query_selects_exactly_the_runs_that_need_a_person(
        temporal_env: WorkflowEnvironment, store: JournalStore, workers: Any, task_queue: str,
        tmp_path: Path, cli: Any) -> None:
    workers.start()
    ids = await make_tasks(temporal_env.client, store, task_queue, tmp_path)
    client = temporal_env.client
    for state, task_id in ids.items():
        assert await attribute(client, f"tidemark-{task_id}", "TidemarkNeeds") == NEEDS[state]

    code, out, _ = await cli("inbox")
    assert code == 0
    query = printed_query(out)
    assert query == needs_query()
    ours = {f"{prefix}{t}" for t in ids.values()
            for prefix in ("tidemark-", "tidemark-unwind-", "tidemark-needs-")}
    listed = [w async for w in client.list_workflows(query) if w.id in ours]
    # one row per task that needs a person: the run waiting for approval itself, and for each
    # run that ended needing one its open row, which says what and why
    assert sorted(w.id for w in listed) == sorted(
        f"tidemark-needs-{ids[s]}" if s != "awaiting_approval" else f"tidemark-{ids[s]}"
        for s, needs in NEEDS_A_PERSON.items() if needs)
    for w in listed:
        attrs = dict((k.name, v) for k, v in w.typed_search_attributes)
        state = next(s for s, t in ids.items() if w.id.endswith(t))
        assert (attrs["TidemarkNeeds"], attrs["TidemarkTaskId"]) == (NEEDS[state], ids[state])
    # the resumed task's halted run still says what it needed when it ended, but it is closed
    # and its row was closed by the run that resumed it: the worklist does not list it
    resumed = [w async for w in client.list_workflows(
        f'WorkflowId = "tidemark-{ids["resumed"]}"')]
    assert sorted(w.status.name for w in resumed if w.status) == ["COMPLETED", "FAILED"]
    assert await attribute(client, f"tidemark-needs-{ids['resumed']}", "TidemarkNeeds") == \
        "nothing"
    # the unwound task's unwind completed, and says so
    assert await attribute(client, f"tidemark-unwind-{ids['unwound']}", "TidemarkNeeds") == \
        "nothing"

    for state, command in NEXT.items():
        t = ids[state]
        failure = await failure_of(temporal_env, f"tidemark-{t}") if state != "killed" else None
        if failure is not None:
            first, _, rest = (failure.message or "").partition("\n\n")
            assert "\n" not in first and first.endswith(".") and first.startswith(
                ("Task ", "Step ")), first
            assert command.format(T=t) in first, first
            assert f"{state}: " in rest  # the state and the error's own words, below it
            raw = failure.failure  # the failure as the server holds it and the Web UI shows it
            assert raw is not None and raw.message == failure.message and raw.stack_trace
        code, out, _ = await cli("status", t)
        assert code == 0 and command.format(T=t) in out.splitlines()[0], out
        assert out.splitlines()[1].startswith(f"task {t}  (")  # the report follows
    code, out, _ = await cli("status", ids["completed"])
    assert out.splitlines()[0] == f"Task {ids['completed']} needs nothing from a person " \
                                  "(completed)."

    for w in listed:  # the dev server is shared by the session's tests
        await client.get_workflow_handle(w.id).terminate("test over")


async def test_a_run_whose_input_is_wrong_opens_its_failure_with_one_sentence(
        temporal_env: WorkflowEnvironment, workers: Any, task_queue: str) -> None:
    """A run whose input is wrong opens its failure with one sentence.

    This is the quickest end of all (no plan stored). The Web UI's first line still says what
    happened and what to do, and the run's TidemarkNeeds says it failed. It names no task (only
    its workflow id does), so it opens no worklist row: the journal, and so the inbox, knows
    nothing of it either."""
    workers.start()
    handle = await temporal_env.client.start_workflow(
        "RunPlan", ["not", "a", "plan"], id="tidemark-wl-bad-input", task_queue=task_queue,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE)
    failure = await failure_of(temporal_env, handle.id)
    first = (failure.message or "").split("\n\n")[0]
    assert first.startswith("Task wl-bad-input failed before any step ran: the input must be "
                            "a plan object"), first
    assert "`tidemark plan check PLAN`" in first and "\n" not in first
    assert failure.type == "TidemarkFailed" and failure.non_retryable
    assert await attribute(temporal_env.client, handle.id, "TidemarkNeeds") == "failed"
    with pytest.raises(RPCError):  # no row was opened for the task its workflow id names
        await temporal_env.client.get_workflow_handle("tidemark-needs-wl-bad-input").describe()


def test_every_end_state_has_a_need_and_only_settled_runs_need_nothing() -> None:
    assert need_of("completed") == need_of("unwound") == need_of("running") == Need.NOTHING
    assert need_of("stopped", {"type": "Unwinding"}) == Need.NOTHING  # its unwind settles it
    assert need_of("stopped", {"type": "Rejected"}) == Need.UNWIND
    for state in ("halted", "stopped", "killed", "needs_decision", "failed", "blocked",
                  "precondition_failed", "verification_failed", "partly_unwound",
                  "awaiting_approval"):
        assert need_of(state) != Need.NOTHING, state
        assert f'"{need_of(state)}"' in needs_query()
    assert '"nothing"' not in needs_query()


def stopped_rename(store: JournalStore, prefix: str, root: Path) -> tuple[str, dict[str, Any]]:
    """A stopped task of one rename of ``root/a.txt``, named ``prefix-…``.

    It is stopped before any run. Returns its id and its plan."""
    task = f"{prefix}-{uuid.uuid4().hex[:8]}"
    target = root / "a.txt"
    target.write_text("a")
    doc = {"task_id": task, "steps": [{"action": "fs.rename",
                                       "args": {"path": str(target), "name": "b.txt"}}]}
    store.set_control(task, "stopped", "the wrong folder", "ops")
    return task, doc


async def holder_heard_the_release_first(client: Any, task: str) -> None:
    """The task's row took the second run's release before that run's own word.

    Waits (up to 10 s) until a run of the row's workflow took the ``settled`` signal, and
    checks that no ``need`` signal came before it in that run: a release answered late would
    close the row the run had just reopened."""
    async def heard() -> list[str] | None:
        async for w in client.list_workflows(f'WorkflowId = "tidemark-needs-{task}"'):
            names = [e.workflow_execution_signaled_event_attributes.signal_name async for e in
                     client.get_workflow_handle(w.id, run_id=w.run_id).fetch_history_events()
                     if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED]
            if "settled" in names:
                return names
        return None
    deadline = asyncio.get_running_loop().time() + 10
    names = await heard()
    while names is None and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.2)
        names = await heard()
    assert names is not None, "no run of the row took the release"
    assert "need" not in names[:names.index("settled")], names


async def reopened_after_its_release(run: Any, client: Any) -> None:
    """The release is done, as the history shows, before the row is opened again.

    The worker's prepare sends the release of the task's row and returns only once Temporal
    took it (worker.row_release), saying so in its result (Prepared.released). A run on a worker
    that cannot sends it itself and the history shows its result (signalled, or failed: no row
    was open). Either comes before the command that opens the row again (a child started, or the
    ``need`` signal to a row still open)."""
    events = [e async for e in run.fetch_history_events()]
    kinds = [e.event_type for e in events]
    E = EventType
    prepared = next(e for e in events if e.event_type == E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED)
    result = prepared.activity_task_completed_event_attributes.result.payloads
    by_prepare = (await client.data_converter.decode(result, [Prepared]))[0].released
    release_kinds = (E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED,) if by_prepare else (
        E.EVENT_TYPE_EXTERNAL_WORKFLOW_EXECUTION_SIGNALED,
        E.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_FAILED)
    released = next(i for i, k in enumerate(kinds) if k in release_kinds)
    opening = (E.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED,
               E.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED)
    reopened = [i for i, k in enumerate(kinds) if k in opening]
    if not by_prepare:
        reopened = reopened[1:]  # after the release's own signal
    assert reopened and released < min(reopened), [E.Name(k) for k in kinds]


async def test_a_run_that_ends_at_its_start_reopens_the_row_only_after_its_release_reached_it(
        temporal_env: WorkflowEnvironment, store: JournalStore, workers: Any, task_queue: str,
        tmp_path: Path) -> None:
    """A run that ends at its start reopens the row only after its release reached it.

    A new run sends the release of its task's open row without waiting for it, and goes on
    to its steps; a run that ends needing a person at once (its task is still stopped) must
    not let its own row's signal cross that release on the way to the holder, or the holder
    could close last and the worklist lose a task that needs a person. The history shows the
    order: the release's result before the row is opened again."""
    workers.start()
    task, doc = stopped_rename(store, "reopened", tmp_path)
    client = temporal_env.client
    for _ in range(2):  # the first run opens the row, the second releases it and reopens it
        handle = await client.start_workflow("RunPlan", doc, id=f"tidemark-{task}",
                                             task_queue=task_queue, result_type=RunResult,
                                             id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE)
        assert (await run_result(handle)).state == "stopped"
    await reopened_after_its_release(handle, client)
    await holder_heard_the_release_first(client, task)
    holder = client.get_workflow_handle(f"tidemark-needs-{task}")
    assert await attribute(client, holder.id, "TidemarkNeeds") == Need.STOPPED
    assert (await holder.describe()).status.name == "RUNNING"
    await holder.terminate("test over")


async def rows_say(client: Any, task: str, want: dict[str, str]) -> None:
    """Waits (up to 10 s) until the task's open rows of the worklist are ``want``.

    A command signals a row and returns; the row takes the signal in its own workflow task."""
    async def said() -> bool:
        return await open_needs(client, task) == want
    try:
        await until(said, timeout=10)
    except AssertionError:
        assert await open_needs(client, task) == want


async def held_in_step_2(client: Any, store: JournalStore, task: str, task_queue: str,
                         root: Path) -> Any:
    """Starts ``task`` and returns the run's handle once step 2 began.

    The task is a rename of ``root/docs/d0.txt``, then two lines of ``root/ledger``, the first
    held while ``root/hold`` exists."""
    docs = root / "docs"
    docs.mkdir(parents=True)
    (docs / "d0.txt").write_text("0")
    hold, ledger = root / "hold", root / "ledger"
    hold.write_text("")
    doc = {"task_id": task, "steps": [
        {"action": "fs.rename", "args": {"path": str(docs / "d0.txt"), "name": "f0.txt"}},
        {"action": "ledger.record", "args": {"ledger": str(ledger), "entry": "e",
                                             "hold_while": str(hold)}},
        {"action": "ledger.record", "args": {"ledger": str(ledger), "entry": "f"}}]}
    run = await client.start_workflow("RunPlan", doc, id=f"tidemark-{task}",
                                      task_queue=task_queue, result_type=RunResult)

    async def begun() -> bool:
        return store.step_row(task, 2) is not None
    await until(begun)
    return run


async def test_a_run_killed_as_it_starts_reopens_the_row_only_after_its_release_reached_it(
        temporal_env: WorkflowEnvironment, store: JournalStore, workers: Any, task_queue: str,
        tmp_path: Path) -> None:
    """A run killed as it starts reopens the row only after its release reached it.

    The same order for a killed run, which opens its row before it journals its end (a
    kill may terminate it at once): the run is started with the kill signal, so it ends
    ``killed`` in the workflow task that sees its prepare's result, the one that also sends
    the release of the row the first run opened. The row must be opened again only after the
    release's result: two signals crossing on their way to the row could leave it closed."""
    workers.start()
    task, doc = stopped_rename(store, "killed-start", tmp_path)
    client = temporal_env.client
    first = await client.start_workflow("RunPlan", doc, id=f"tidemark-{task}",
                                        task_queue=task_queue, result_type=RunResult)
    assert (await run_result(first)).state == "stopped"  # its row is open
    store.set_control(task, "released", "go on", "ops")
    second = await client.start_workflow(
        "RunPlan", {"task_id": task}, id=f"tidemark-{task}", task_queue=task_queue,
        result_type=RunResult, id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        start_signal="kill", start_signal_args=[{"by": "ops", "reason": "wrong folder"}])

    async def reopened() -> bool:  # the run waits for the kill to terminate it
        return await open_needs(client, task) == {f"tidemark-{task}": Need.KILLED,
                                                  f"tidemark-needs-{task}": Need.KILLED}
    await until(reopened)
    await reopened_after_its_release(second, client)
    await holder_heard_the_release_first(client, task)
    assert (tmp_path / "a.txt").read_text() == "a"  # nothing acted
    await second.terminate("killed")
    await client.get_workflow_handle(f"tidemark-needs-{task}").terminate("test over")


async def test_a_stop_and_unwind_during_a_step_leave_one_row_that_says_the_task_waits(
        temporal_env: WorkflowEnvironment, store: JournalStore, workers: Any, task_queue: str,
        tmp_path: Path, cli: Any) -> None:
    """A stop and unwind during a step leave one row, which says the task waits.

    A stop, then an unwind, while a step is under way. The unwind begins (it tells the run and
    releases the task's row), meets the step in doubt and ends ``failed``, opening the row and
    journaling that it did not finish; then the step completes and the run meets the stop at its
    next step and ends ``stopped``. The run was told the unwind began, so the row stays the
    unwind's: the task waits for its unwind, and `tidemark inbox` says the same from the journal.
    Nothing was undone, and nothing after the stop ran."""
    workers.start()
    task = f"crossed-{uuid.uuid4().hex[:8]}"
    docs, hold, ledger = tmp_path / "docs", tmp_path / "hold", tmp_path / "ledger"
    client = temporal_env.client
    run = await held_in_step_2(client, store, task, task_queue, tmp_path)
    store.set_control(task, "stopped", "wrong folder", "ops")
    unwind = await client.start_workflow("UnwindPlan", {"task_id": task},
                                         id=f"tidemark-unwind-{task}", task_queue=task_queue,
                                         result_type=UnwindResult)
    undone = await unwind_result(unwind)
    assert (undone.state, undone.error["type"], undone.undone) == (
        "failed", "InvariantViolation", []), undone
    hold.unlink()
    ran = await run_result(run)
    assert (ran.state, ran.error["type"], ran.confirmed) == ("stopped", "TaskStopped", 2), ran
    # the row is the unwind's: the run, told that the unwind began, left it as it was
    assert await open_needs(client, task) == {f"tidemark-needs-{task}": Need.UNWIND}
    assert [p.name for p in docs.iterdir()] == ["f0.txt"]
    assert len(ledger.read_text().splitlines()) == 1
    # and the journal says what the row says: the task waits for its unwind
    entry = entry_for(store, task)
    assert entry is not None and (entry.why, entry.command) == (
        "stopped", f"tidemark unwind {task} --yes"), entry
    assert f"unwind {unwind.id} ended failed (InvariantViolation)" in entry.detail, entry
    code, out, _ = await cli("status", task)
    assert code == 0 and f"settle it with `tidemark unwind {task} --yes`" in \
        out.splitlines()[0], out
    # A person releases it instead: the stop no longer holds, and the unwind with it; the run
    # ended before step 3, and nothing runs the task until it is resumed
    store.set_control(task, "released", "finish it instead", "ops")
    entry = entry_for(store, task)
    assert entry is not None and (entry.why, entry.command) == (
        "ended", f"tidemark resume {task}"), entry


async def test_an_unwind_that_ends_unwound_closes_a_row_opened_while_it_ran(
        temporal_env: WorkflowEnvironment, store: JournalStore, workers: Any, task_queue: str,
        tmp_path: Path, db_url: str) -> None:
    """An unwind that ends unwound closes a row opened while it ran.

    The unwind releases its task's row when it begins; a run of the task that ends while
    the unwind is still at work (a start the stop turns back, or a step that met the stop)
    opens the row again. Once the task is unwound nothing is left for a person, so the
    unwind's end closes that row too: the worklist never shows an unwound task."""
    workers.start()
    task = f"late-row-{uuid.uuid4().hex[:8]}"
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "d0.txt").write_text("0")
    doc = {"task_id": task, "steps": [
        {"action": "fs.rename", "args": {"path": str(docs / "d0.txt"), "name": "f0.txt"}}]}
    client = temporal_env.client
    run = await client.start_workflow("RunPlan", doc, id=f"tidemark-{task}",
                                      task_queue=task_queue, result_type=RunResult)
    assert (await run_result(run)).state == "completed"
    store.set_control(task, "stopped", "wrong folder", "ops")
    with psycopg.connect(db_url) as held:  # the unwind's last write waits here
        held.execute("LOCK TABLE tidemark.unwinds IN SHARE ROW EXCLUSIVE MODE")
        unwind = await client.start_workflow("UnwindPlan", {"task_id": task},
                                             id=f"tidemark-unwind-{task}",
                                             task_queue=task_queue, result_type=UnwindResult)

        async def recording() -> bool:  # step 1 is put back; recording the unwind waits
            return (docs / "d0.txt").exists() and ActivityName.RECORD_UNWOUND in [
                e.activity_task_scheduled_event_attributes.activity_type.name
                async for e in unwind.fetch_history_events()]
        await until(recording)
        again = await client.start_workflow(
            "RunPlan", {"task_id": task}, id=f"tidemark-{task}", task_queue=task_queue,
            result_type=RunResult, id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE)
        # it meets the compensation already journaled: the task needs its unwind finished
        assert (await run_result(again)).state == "partly_unwound"
        assert await open_needs(client, task) == {f"tidemark-needs-{task}": Need.UNWIND}
        # The row reads the journal once as it opens (NeedsPerson._check): that read must be
        # over while the task is still unwinding, or the row would close by it, not by the
        # unwind's end, whichever way the machine's load orders the two.
        row = client.get_workflow_handle(f"tidemark-needs-{task}")

        async def row_checked() -> bool:
            return EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED in [
                e.event_type async for e in row.fetch_history_events()]
        await until(row_checked)
    assert (await unwind_result(unwind)).state == "unwound"
    assert await open_needs(client, task) == {}


async def test_a_run_that_ended_stopped_then_released_waits_for_its_resume_in_row_and_inbox(
        temporal_env: WorkflowEnvironment, store: JournalStore, workers: Any, task_queue: str,
        tmp_path: Path, cli: Any) -> None:
    """A run that ended stopped, then released, waits for its resume in row and inbox.

    A stop comes during step 2. The run finishes the step and ends ``stopped`` at step 3, its row
    saying so. `tidemark release T` lifts the stop, but nothing runs the task: the run has ended.
    From the journal alone `tidemark inbox` and `status` must say that the task waits for its
    resume (its run journaled its end, and no run began since), and the row must stop asking for
    the release it already had. The resume then settles it everywhere."""
    workers.start()
    task = f"released-{uuid.uuid4().hex[:8]}"
    hold, ledger = tmp_path / "hold", tmp_path / "ledger"
    client = temporal_env.client
    run = await held_in_step_2(client, store, task, task_queue, tmp_path)
    code, _, err = await cli("stop", task, "--reason", "wrong folder", "--by", "ops")
    assert (code, err) == (0, ""), err
    hold.unlink()
    ran = await run_result(run)
    assert (ran.state, ran.confirmed) == ("stopped", 2), ran
    assert await open_needs(client, task) == {f"tidemark-needs-{task}": Need.STOPPED}

    code, _, err = await cli("release", task, "--by", "ops")
    assert (code, err) == (0, ""), err
    entry = entry_for(store, task)
    assert entry is not None and (entry.why, entry.command, entry.need) == (
        "ended", f"tidemark resume {task}", Need.RESUME), entry
    assert "its run ended stopped at step 3 (TaskStopped" in entry.detail, entry
    code, out, _ = await cli("inbox", "--json")
    listed = {e["task_id"]: e for e in json.loads(out)}
    assert listed[task]["why"] == "ended" and listed[task]["need"] == "resume", listed
    code, out, _ = await cli("status", task)
    assert code == 0 and f"`tidemark resume {task}`" in out.splitlines()[0], out
    # the row asks for what the journal asks for, in the same sentence
    await rows_say(client, task, {f"tidemark-needs-{task}": Need.RESUME})
    row = client.get_workflow_handle(f"tidemark-needs-{task}")
    assert (await row.query("status"))["sentence"] == out.splitlines()[0]

    code, out, err = await cli("resume", task, "--wait", "--task-queue", task_queue)
    assert code == 0, (out, err)
    await rows_say(client, task, {})
    assert entry_for(store, task) is None
    assert [line.split()[-1] for line in ledger.read_text().splitlines()] == ["e", "f"]


async def test_a_step_resolved_as_done_closes_the_row_its_run_opened_for_the_decision(
        temporal_env: WorkflowEnvironment, store: JournalStore, workers: Any, task_queue: str,
        tmp_path: Path, cli: Any) -> None:
    """A step resolved as done closes the row its run opened for the decision.

    The last step's intent has no outcome and its probe is blind: the run ends
    ``needs_decision`` and opens the row asking for a decision. A person looks and resolves
    the step as done: the task is completed, so nobody is needed any more, in the row as in
    the inbox. The decision is a journal command that starts no run, so no run would close
    the row: the command does."""
    workers.start()
    task = f"resolved-{uuid.uuid4().hex[:8]}"
    doc = plan(task, tmp_path, approval=False)
    (tmp_path / "blind").write_text("")
    store.persist_plan(load_plan(doc, SPECS))
    for step in (1, 2):
        assert run_one(store.conninfo, task, step).wait(timeout=60) == 0
    crash_at(store.conninfo, task, 3, "after_intent")
    client = temporal_env.client
    run = await client.start_workflow("RunPlan", {"task_id": task}, id=f"tidemark-{task}",
                                      task_queue=task_queue, result_type=RunResult)
    assert (await run_result(run)).state == "needs_decision"
    assert await open_needs(client, task) == {f"tidemark-needs-{task}": Need.DECISION}

    code, _, err = await cli("resolve", task, "--step", "3", "--as", "done", "--yes",
                             "--note", "the ledger has the line")
    assert code == 0 and err == f"next: Task {task} needs nothing from a person (completed).\n"
    assert store.progress(task).finished
    assert entry_for(store, task) is None
    await rows_say(client, task, {})
    desc = await client.get_workflow_handle(f"tidemark-needs-{task}").describe()
    assert desc.status is not None and desc.status.name == "COMPLETED"


async def test_a_run_killed_at_once_then_released_waits_for_its_resume(
        temporal_env: WorkflowEnvironment, store: JournalStore, workers: Any, task_queue: str,
        tmp_path: Path, cli: Any) -> None:
    """A run killed at once, then released, waits for its resume.

    `tidemark kill T --grace 0` terminates the run waiting for approval as soon as it took
    the signal: the run cannot journal its end, so the kill does. Once the kill is released,
    nothing runs the task: the journal says it waits for its resume, and so does its row."""
    workers.start()
    task = f"killed-{uuid.uuid4().hex[:8]}"
    doc = plan(task, tmp_path, approval=True)
    client = temporal_env.client
    await client.start_workflow("RunPlan", doc, id=f"tidemark-{task}", task_queue=task_queue,
                                result_type=RunResult)

    async def waits() -> bool:
        return await attribute(client, f"tidemark-{task}", "TidemarkState") == \
            "awaiting_approval"
    await until(waits)
    code, out, err = await cli("kill", task, "--yes", "--grace", "0")
    assert code == 0, (out, err)
    ended = store.run_ended(task)  # the kill's word, written after it terminated the run
    assert ended is not None and ended["detail"]["ended"] == "killed", ended
    # The kill's word when it terminated the run; the run's own when it took the kill's signal
    # and ended before the terminate reached it. Either may win that race; the end is killed.
    assert ended["actor"] == f"tidemark-{task}" or ended["actor"].startswith(
        "tidemark kill by "), ended
    code, _, err = await cli("release", task)
    assert (code, err) == (0, ""), err
    entry = entry_for(store, task)
    assert entry is not None and (entry.why, entry.command) == (
        "ended", f"tidemark resume {task}"), entry
    await rows_say(client, task, {f"tidemark-needs-{task}": Need.RESUME})


async def test_a_stop_holds_a_run_waiting_for_approval_and_it_says_so_until_released(
        temporal_env: WorkflowEnvironment, store: JournalStore, workers: Any, task_queue: str,
        tmp_path: Path, cli: Any) -> None:
    """A stop holds a run waiting for approval, and it says so until released.

    A run waits for approval at the boundary; a person stops the task. The run reads the
    stop and waits on, saying it is stopped (the open run is its own row of the worklist), and
    the inbox says the same with the one command that helps: the release (a resume would meet
    the open run). Released, the run asks for the approval again; approved, it completes."""
    workers.start()
    task = f"held-{uuid.uuid4().hex[:8]}"
    client = temporal_env.client
    run = await awaiting(client, plan(task, tmp_path, approval=True), task_queue)

    async def shows(need: Need) -> bool:
        return await open_needs(client, task) == {f"tidemark-{task}": need}
    code, _, err = await cli("stop", task, "--reason", "audit", "--by", "ops")
    assert (code, err) == (0, ""), err
    await until(lambda: shows(Need.STOPPED))
    assert await attribute(client, run.id, "TidemarkState") == "stopped"
    entry = entry_for(store, task)
    assert entry is not None and (entry.why, entry.need, entry.command) == (
        "stopped", Need.STOPPED, f"tidemark release {task}"), entry

    code, _, err = await cli("release", task, "--by", "ops")
    assert (code, err) == (0, ""), err
    await until(lambda: shows(Need.APPROVAL))
    entry = entry_for(store, task)
    assert entry is not None and entry.why == "awaiting_approval", entry
    code, out, err = await cli("approve", task, "--wait")
    assert code == 0, (out, err)
    assert (await run_result(run)).state == "completed"
    await rows_say(client, task, {})


async def test_a_resumed_run_waiting_for_approval_is_not_read_as_ended(
        temporal_env: WorkflowEnvironment, store: JournalStore, workers: Any, task_queue: str,
        tmp_path: Path, cli: Any) -> None:
    """A resumed run waiting for approval is not read as ended.

    A halted run journaled its end; `tidemark resume T` starts a new one, which waits for
    approval. Its beginning is journaled before anything else it does, so the journal reads a
    run going on: the inbox asks for the approval, not for a resume that would meet the open
    run."""
    workers.start()
    task = f"again-{uuid.uuid4().hex[:8]}"
    client = temporal_env.client
    run = await awaiting(client, plan(task, tmp_path, approval=True), task_queue)
    await run.signal("halt", "end of shift")
    assert (await run_result(run)).state == "halted"
    assert store.run_ended(task) is not None
    code, out, err = await cli("resume", task, "--task-queue", task_queue)
    assert code == 0, (out, err)

    async def waits() -> bool:
        return await attribute(client, f"tidemark-{task}", "TidemarkState") == \
            "awaiting_approval"
    await until(waits)
    assert store.run_ended(task) is None
    entry = entry_for(store, task)
    assert entry is not None and (entry.why, entry.command) == (
        "awaiting_approval", f"tidemark approve {task}"), entry
    await client.get_workflow_handle(f"tidemark-{task}").terminate("test over")


async def test_a_release_of_every_task_brings_each_row_of_this_journal_in_line(
        temporal_env: WorkflowEnvironment, store: JournalStore, workers: Any, task_queue: str,
        tmp_path: Path, cli: Any) -> None:
    """A release of every task brings each row of this journal in line.

    `tidemark stop --all` comes while two tasks are each in a step. Both runs end ``stopped`` at
    their next step, each with its row. `tidemark release --all` lifts the stop of every task:
    each row, found by listing the open rows, now asks for its resume, as the inbox does."""
    workers.start()
    tasks = [f"every-{i}-{uuid.uuid4().hex[:6]}" for i in range(2)]
    client = temporal_env.client
    runs = [await held_in_step_2(client, store, t, task_queue, tmp_path / t) for t in tasks]
    code, _, err = await cli("stop", "--all", "--reason", "incident", "--by", "ops")
    assert (code, err) == (0, ""), err
    for t, run in zip(tasks, runs, strict=True):
        (tmp_path / t / "hold").unlink()
        assert (await run_result(run)).state == "stopped"
        assert await open_needs(client, t) == {f"tidemark-needs-{t}": Need.STOPPED}
    code, _, err = await cli("release", "--all", "--by", "ops")
    assert (code, err) == (0, ""), err
    code, out, _ = await cli("inbox", "--json")
    listed = {e["task_id"]: e["need"] for e in json.loads(out)}
    for t in tasks:
        assert listed[t] == Need.RESUME, listed
        await rows_say(client, t, {f"tidemark-needs-{t}": Need.RESUME})


async def test_a_run_terminated_outside_tidemark_is_listed_as_ended_by_the_inbox(
        temporal_env: WorkflowEnvironment, store: JournalStore, workers: Any, task_queue: str,
        tmp_path: Path, cli: Any) -> None:
    """A run terminated outside tidemark is listed as ended by the inbox.

    A person terminates a run from the Web UI (or `temporal workflow terminate`) during its
    step 2: the run journals no end and opens no row. The journal alone reads a run going on;
    the inbox asks Temporal, finds the run closed, and lists the task as waiting for its
    resume, which then completes it, every step once."""
    workers.start()
    task = f"terminated-{uuid.uuid4().hex[:8]}"
    hold, ledger = tmp_path / "hold", tmp_path / "ledger"
    client = temporal_env.client
    run = await held_in_step_2(client, store, task, task_queue, tmp_path)
    await run.terminate("pressed Terminate in the Web UI")
    hold.unlink()
    assert store.run_ended(task) is None  # the journal cannot know
    assert entry_for(store, task) is None

    code, out, err = await cli("inbox", "--json")
    assert (code, err) == (0, ""), err
    listed = {e["task_id"]: e for e in json.loads(out)}
    assert (listed[task]["why"], listed[task]["command"]) == (
        "ended", f"tidemark resume {task}"), listed
    assert "is terminated in Temporal and journaled no end" in listed[task]["detail"]
    # `tidemark status` reads the journal alone: it does not say that nothing is needed, but
    # what the journal holds of the run, and where to ask whether it is still open.
    code, out, err = await cli("status", task)
    assert (code, err) == (0, ""), err
    first = out.splitlines()[0]
    assert first.startswith(f"Task {task} needs nothing from a person while its run goes on "
                            f"(partial): the journal has the beginning of tidemark-{task}"), first
    assert first.endswith("and no end of it; a run terminated outside tidemark journals none: "
                          "`tidemark inbox` asks Temporal whether it is open."), first

    code, out, err = await cli("resume", task, "--wait", "--task-queue", task_queue)
    assert code == 0, (out, err)
    code, out, err = await cli("inbox", "--json")
    assert task not in {e["task_id"] for e in json.loads(out)}
    assert [line.split()[-1] for line in ledger.read_text().splitlines()] == ["e", "f"]


async def test_a_row_opened_for_a_task_settled_meanwhile_closes_itself(
        temporal_env: WorkflowEnvironment, store: JournalStore, workers: Any, task_queue: str,
        tmp_path: Path) -> None:
    """A row opened for a task settled meanwhile closes itself.

    A row opens in the words of a run that read the journal a moment earlier; if its task
    was settled in between (an unwind ended `unwound` and sent its release before the row
    existed), nothing would ever close it. So a row reads the journal once it is open: for a
    completed task it closes by itself, for a task that needs a person it stays."""
    workers.start()
    client = temporal_env.client
    done = f"settled-{uuid.uuid4().hex[:8]}"
    completed = await client.start_workflow(
        "RunPlan", plan(done, tmp_path / "done", approval=False), id=f"tidemark-{done}",
        task_queue=task_queue, result_type=RunResult)
    assert (await run_result(completed)).state == "completed"
    waits = f"waits-{uuid.uuid4().hex[:8]}"
    store.persist_plan(load_plan(plan(waits, tmp_path / "waits", approval=False), SPECS))
    store.set_control(waits, "stopped", "audit", "ops")
    rows = {}
    for task in (done, waits):
        rows[task] = await client.start_workflow(
            "NeedsPerson", {"task_id": task, "state": "stopped", "need": "stopped",
                            "sentence": f"Task {task} is stopped."},
            id=f"tidemark-needs-{task}", task_queue=task_queue)
    assert await asyncio.wait_for(rows[done].result(), 30) == \
        "settled: the journal: its task is settled"

    async def checked() -> bool:  # the other row has read the journal too
        return EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED in [
            e.event_type async for e in rows[waits].fetch_history_events()]
    await until(checked)
    assert await open_needs(client, waits) == {f"tidemark-needs-{waits}": Need.STOPPED}
    await rows[waits].terminate("test over")
