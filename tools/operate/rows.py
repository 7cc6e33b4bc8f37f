"""After a person's command, the task's row of the Web UI's worklist says what the journal says.

A row (workflows/needs_person.py) is opened by the run that ended needing a person, in the
journal's words of that moment, and closed by the task's next run when it starts. A command
that changes what the task needs without starting a run (`tidemark stop`, `release`, `resolve`,
`kill`, an `approve` or `reject` that no open run takes) would leave the row saying what no
longer holds: a released task's row would still ask for its release, a step
resolved as done would still ask for a decision. So such a command, once its journal write
is done, reads each task it touched as `tidemark inbox` reads it (tidemark.needs_journal.task_need)
and tells the task's open row:

- the task waits for a person: the row says why and the one command (the ``refresh`` signal,
  which never reopens a row that a new run of the task released meanwhile);
- the task is completed or unwound: the row closes (``settled``);
- otherwise a run goes on with the task: the row is left as it is (the run's start closed it,
  or its end says what the task needs).

A stop or a release also reaches a run that waits at the boundary (the ``recheck`` signal): it
runs its gate again and reads the stop state, so that the open run itself says what holds it:
``stopped`` while the stop holds (it waits on: nothing irreversible runs), ``approval`` again
once released.

Best effort: the journal write is the decision, and `tidemark inbox` reads the journal. When
Temporal does not answer, one line on stderr says the rows were not brought in line; they say
what they said until the task's next run starts.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from typing import TYPE_CHECKING

from tidemark.errors import TidemarkError, UnknownTask
from tidemark.limits import ID_RE, ID_RULE
from tidemark.needs import Need
from tidemark.needs_journal import task_need
from tidemark.settings import Settings
from tools.operate.commands import ALL_TASKS, open_store
from tools.operate.inbox import ROW_PREFIX, ROWS_OPEN, TEMPORAL_WAIT_S

if TYPE_CHECKING:
    from temporalio.client import Client

    from tidemark.payloads import TaskNeed
    from tidemark.store import JournalStore

# The runs waiting at the boundary (RunPlan: TidemarkNeeds says approval, or stopped while it
# waits; a run that ended is not open).
WAITING_RUNS = ('WorkflowType = "RunPlan" AND ExecutionStatus = "Running" AND '
                'TidemarkNeeds IN ("approval", "stopped")')
RUN_PREFIX = "tidemark-"
WAIT = timedelta(seconds=TEMPORAL_WAIT_S)  # each call to Temporal, however many rows


async def _in_scope(client: Client, store: JournalStore, scope: str, query: str,
                    prefix: str) -> list[str]:
    """The tasks of this journal in ``scope`` that may have an open workflow.

    ``scope`` is a task id, ``series:S`` or ``*``; the workflow is ``prefix<task>`` among those
    ``query`` lists. A namespace may serve other journals too: their tasks are left alone. A
    workflow whose id names no task the journal could hold (a NUL, a control character, too
    long: started by hand, or by a version that took any id) is skipped with one line: it is no
    task of a journal."""
    if _one_task(scope):
        return [scope]
    listed = client.list_workflows(query, rpc_timeout=WAIT)
    tasks = []
    async for w in listed:
        if not w.id.startswith(prefix):
            continue
        task_id = w.id.removeprefix(prefix)
        if ID_RE.fullmatch(task_id):
            tasks.append(task_id)
        else:
            skipped(f"the workflow {ascii(w.id)[:120]}", "its id names no task the journal "
                    f"can hold ({ID_RULE})")
    if scope == ALL_TASKS:
        return [t for t in tasks if store.task_known(t)]
    series = scope.removeprefix("series:")
    return [t for t in tasks if store.series_of(t) == series]


def skipped(what: str, why: str) -> None:
    """One line on stderr: a row a command over many could not handle, and went on without."""
    print(f"tidemark: skipped {what}: {why}".replace("\n", " "), file=sys.stderr)


async def _signal(client: Client, workflow_id: str, name: str, arg: object) -> None:
    """Sends a signal to a workflow, skipping those that cannot take it.

    A workflow that is not open (no row, no waiting run) is left alone. One that Temporal
    refuses the signal for is skipped with one line: the others are still told."""
    from temporalio.service import RPCError, RPCStatusCode

    try:
        await client.get_workflow_handle(workflow_id).signal(
            name, arg, rpc_timeout=WAIT)
    except RPCError as e:
        if e.status != RPCStatusCode.NOT_FOUND:
            skipped(f"telling {workflow_id}", f"{type(e).__name__}: {e}")


async def _bring_in_line(settings: Settings, url: str, scope: str, by: str,
                         wake: bool) -> None:
    import asyncio  # with the Temporal client: `--help` registers the commands without it

    from tools.operate.starter import connect  # the Temporal client: loaded by these commands only

    with open_store(url) as store:
        one = _need(store, scope) if _one_task(scope) else None
        if _one_task(scope) and one is None:
            return  # no plan stored (a start refused, an id stopped ahead): no run, no row
        client = await asyncio.wait_for(connect(settings), TEMPORAL_WAIT_S)
        if wake:  # a stop or release: a run waiting at the boundary reads it (RunPlan.recheck)
            for task_id in await _in_scope(client, store, scope, WAITING_RUNS, RUN_PREFIX):
                await _signal(client, RUN_PREFIX + task_id, "recheck", by)
        words = {scope: one} if one is not None else {
            t: word for t in await _in_scope(client, store, scope, ROWS_OPEN, ROW_PREFIX)
            if (word := _need(store, t)) is not None}
    for task_id, word in words.items():
        if word.need != Need.NOTHING:
            await _signal(client, ROW_PREFIX + task_id, "refresh", {
                "task_id": task_id, "state": word.state, "need": word.need,
                "sentence": word.sentence, "by": by})
        elif word.settled:
            await _signal(client, ROW_PREFIX + task_id, "settled", by)


def _need(store: JournalStore, task_id: str) -> TaskNeed | None:
    """What the journal says the task needs now.

    None for an id with no stored plan, and for a task whose reading fails (skipped with one
    line: the others are still brought in line)."""
    try:
        return task_need(store, task_id)
    except UnknownTask:
        return None
    except TidemarkError as e:
        skipped(f"the worklist row of {task_id}", f"{type(e).__name__}: {e}")
        return None


def _one_task(scope: str) -> bool:
    return scope != ALL_TASKS and not scope.startswith("series:")


def bring_rows_in_line(settings: Settings, url: str, scope: str, by: str, *,
                       wake: bool = False) -> None:
    """Tells the open worklist rows of the tasks in ``scope`` what they need now.

    What they need is what the journal says (module docstring); ``by`` names the command and the
    person. ``wake`` (a stop or a release): the runs of those tasks that wait at the boundary
    read the stop state first. One line on stderr, nothing raised, when Temporal does not answer
    in time."""
    import asyncio

    from temporalio.service import RPCError

    try:  # each call to Temporal waits TEMPORAL_WAIT_S at most, however many rows there are
        asyncio.run(_bring_in_line(settings, url, scope, by, wake))
    except (TidemarkError, TimeoutError, RuntimeError, RPCError) as e:
        print(f"tidemark: the Web UI's worklist rows of {scope} were not brought in line "
              f"({type(e).__name__}: {e}); `tidemark inbox` reads the journal, which has the "
              "decision".replace("\n", " "), file=sys.stderr)
