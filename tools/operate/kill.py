"""``tidemark kill``: stop a task (a series, everything) out of band, in layers, each reported.

1. the durable stop state ``killed`` on the task, ``series:<S>`` or ``*``: every later step and
   every start refuses until a person runs ``tidemark release`` (recorded with who and why);
2. every Temporal Schedule of the series is paused, so nothing restarts it;
3. every credential grant of the task is revoked (those of its steps and of its compensations),
   in the table and at the provider, so the next outbound call fails with Unauthorized, even
   from a wedged worker whose workflow is gone;
4. the task's workflows are terminated: its run ``tidemark-<T>``, its unwind
   ``tidemark-unwind-<T>`` and, for a series, the ``ScheduledRun`` workflows that the series'
   schedule started (matched by Temporal's ``TemporalScheduledById``, never by a prefix of the
   workflow id: series ``k`` is not series ``k-b``).

Before layer 1 each open workflow of the kill gets the ``kill`` signal: it shows
``TidemarkState = killed`` at once (a terminated workflow can no longer change its search
attributes, so this is the only moment to say it), lets the attempt under way finish and starts
nothing more, then waits to be terminated. Layer 4 waits up to ``grace_s`` for that (the state
says killed and no activity is pending), so the step under way is settled, not left in doubt,
and the run ends **Terminated** rather than Failed by meeting layer 1's stop state. A workflow
still busy after the grace is terminated all the same, and the report says so. Whatever the
grace (``--grace 0`` too), a workflow is not terminated before it took the signal, for up to
TOLD_S: terminated earlier, it would say ``running`` for ever.

Refused before anything is written or run, like ``tidemark stop``: a task id that names no task
(``force_unknown`` kills an id whose plan has not arrived yet), an invalid id, a series that
has no run, schedule nor stop, and two targets at once. A layer that fails is reported and the
next layers still run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from temporalio.api.enums.v1 import PendingActivityState, PendingWorkflowTaskState
from temporalio.client import Client, WorkflowExecutionDescription, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from tidemark.errors import TidemarkError
from tidemark.grants import revoke_task_grants
from tidemark.limits import ID_RE, LABEL_MAX, cut
from tidemark.payloads import KILLED
from tidemark.store import JournalStore
from tools.operate import schedules
from tools.operate.commands import check_scope

# How long layer 4 waits for the killed workflows to settle (the attempt under way finished)
# before it terminates them anyway. A step's own calls time out within 30 s, and layer 3 makes
# its next call fail at once, so most steps end well within it.
KILL_GRACE_S = 10.0
# A workflow whose pending workflow task no worker has started for this long has no live worker
# to take the signal: waiting out the grace would change nothing.
NO_WORKER_S = 2.0
# Layer 4 waits at least this long for a workflow to take the kill signal (its TidemarkState
# then says killed), whatever the grace: a terminated workflow can no longer change its search
# attributes, and a live worker takes a signal within milliseconds unless it is paused or
# starved. A workflow that takes it is terminated without waiting for its attempt under way
# when the grace is 0.
TOLD_S = 5.0
POLL_S = 0.1
STATE_ATTRIBUTE = "TidemarkState"


class KillError(TidemarkError):
    """A kill asked for in a way that cannot be done."""


class UnknownSeries(TidemarkError):
    """``kill --series S`` named a series that has no run, no schedule and no stop."""


@dataclass
class Target:
    """What a kill acts on: its stop scope, tasks, series (for schedules) and workflows."""

    scope: str
    tasks: list[str]
    series: list[str]
    everything: bool = False
    # workflow id -> type (RunPlan, UnwindPlan, ScheduledRun)
    workflows: dict[str, str] = field(default_factory=dict)


async def target_of(client: Client | None, store: JournalStore, *, task: str | None,
                    series: str | None, everything: bool, force_unknown: bool) -> Target:
    """Checks what the kill names and lists what it covers.

    A bad name raises KillError, UnknownStopTarget or UnknownSeries: nothing has been
    written."""
    if sum(x is not None for x in (task, series, everything or None)) != 1:
        raise KillError("kill exactly one of: a task, --series S, --all")
    if task is not None:
        if task.startswith("series:") or task == "*":
            raise KillError(f"{task!r} is not a task id; use --series S or --all")
        check_scope(store, task, "kill", force_unknown)
        named = store.series_of(task)
        return Target(task, [task], [named] if named else [])
    if series is not None:
        runs = [r["task_id"] for r in store.series_runs(series)]
        if not (runs or store.declared_series(series) is not None
                or store.task_known("series:" + series)
                or (client is not None and await schedules.describe(client, series))):
            raise UnknownSeries(f"no series {series!r} is known (not declared, no run, "
                                + ("no schedule" if client else "its schedule not checked: "
                                   "Temporal is unreachable")
                                + ", no stop); check the name with `tidemark schedule list`")
        return Target("series:" + series, runs, [series])
    listed = await schedules.list_all(client) if client is not None else []
    return Target("*", [], [s["series"] for s in listed], everything=True)


async def open_workflows(client: Client, t: Target) -> dict[str, str]:
    """The workflows the kill covers, by id, each with its type.

    They are the run and the unwind of each task (open or not: layer 4 says which it found),
    and the open ScheduledRuns."""
    found: dict[str, str] = {}
    queries: list[str] = []
    if t.everything:
        # not the NeedsPerson rows of the worklist (workflows/needs_person.py): they act on
        # nothing, and they are what says, after the kill, which tasks need a person
        queries = ['ExecutionStatus="Running" AND WorkflowId STARTS_WITH "tidemark-" '
                   'AND WorkflowType != "NeedsPerson"']
    elif t.scope.startswith("series:"):
        # Temporal stamps the schedule's id on every workflow a schedule starts: an exact match.
        queries = [f'ExecutionStatus="Running" AND TemporalScheduledById='
                   f'"{schedules.schedule_id(s)}"' for s in t.series]
    for q in queries:
        async for wf in client.list_workflows(q):
            found[wf.id] = wf.workflow_type
    for task in t.tasks:  # a run or an unwind, scheduled or started by hand
        found.setdefault(f"tidemark-{task}", "RunPlan")
        found.setdefault(f"tidemark-unwind-{task}", "UnwindPlan")
    if t.scope == (t.tasks[0] if t.tasks else None):  # one task: its ScheduledRun goes with it
        parent = await _scheduled_parent(client, f"tidemark-{t.scope}")
        if parent is not None:
            found.setdefault(parent, "ScheduledRun")
    return found


class _Kill:
    """One kill: what it covers, and its four layers, each returning its report's detail."""

    def __init__(self, client: Client | None, store: JournalStore, t: Target, reason: str,
                 by: str, grace_s: float, unreachable: str) -> None:
        self._client, self.store, self.t = client, store, t
        self.unreachable = unreachable
        self.reason, self.by, self.grace_s = reason, by, grace_s
        self.announced: list[str] = []
        self.unlisted: str | None = None

    @property
    def client(self) -> Client:
        """Temporal, for layers 2 and 4; KillError when it cannot be reached.

        Layers 1 and 3 need only Postgres and the providers: they still run."""
        if self._client is None:
            raise KillError(f"Temporal is unreachable ({self.unreachable}); not done")
        return self._client

    async def announce(self) -> None:
        """Lists the workflows and sends each the ``kill`` signal.

        This comes before layer 1, so that a run does not end itself on meeting the stop state
        before it hears of the kill."""
        t = self.t
        try:
            t.workflows = await open_workflows(self.client, t)  # KillError without Temporal
        except Exception as e:  # layers 1-3 need no Temporal: they run all the same
            self.unlisted = f"{type(e).__name__}: {e}"
            t.workflows = {f"tidemark{kind}-{x}": "" for x in t.tasks for kind in ("",
                                                                                  "-unwind")}
        if self._client is None:
            return
        note = {"by": self.by, "reason": self.reason}
        said = await asyncio.gather(*(_announce(self.client, w, note) for w in t.workflows),
                                    return_exceptions=True)
        self.announced = [w for w, ok in zip(t.workflows, said, strict=True) if ok is True]

    async def stop_state(self) -> Any:
        self.store.set_killed(self.t.scope, self.reason, self.by)
        return {"scope": self.t.scope, "state": "killed", "by": self.by, "reason": self.reason}

    async def pause(self) -> Any:
        text = f"killed by {self.by}: {self.reason}"
        return {s: ("paused" if await schedules.pause(self.client, s, text) else "no schedule")
                for s in self.t.series}

    async def grants(self) -> Any:
        revoked: list[dict[str, Any]] = []
        for one in (self.t.tasks if not self.t.everything else [None]):
            revoked += revoke_task_grants(self.store, one, self.by)
        return [{"task_id": g["task_id"], "target": g["target"], "scope": g["scope"],
                 "revoked": str(g["revoked"]), "revoked_by": g["revoked_by"],
                 "at_provider": g["at_provider"]} for g in revoked]

    async def terminate(self) -> Any:
        settled = await _settle(self.client, self.announced, self.grace_s)
        why = f"killed by {self.by}: {self.reason}"
        # Children first, each by the kill itself; a killed ScheduledRun waits for its own
        # termination, not its child's.
        kinds = self.t.workflows
        out: dict[str, str] = {}
        for group in ([w for w, k in kinds.items() if k != "ScheduledRun"],
                      [w for w, k in kinds.items() if k == "ScheduledRun"]):
            # One workflow Temporal does not let us end is reported; the others still end.
            ended = await asyncio.gather(*(_terminate(self.client, w, why, settled.get(w))
                                           for w in group), return_exceptions=True)
            out.update((w, e if isinstance(e, str) else f"not terminated: {type(e).__name__}: "
                        f"{e}") for w, e in zip(group, ended, strict=True))
        for wid, said in out.items():
            task_id = wid.removeprefix("tidemark-")
            if not ID_RE.fullmatch(task_id):  # a run under an id no task has: nothing to journal
                continue
            if kinds.get(wid) == "RunPlan" and said.startswith("terminated"):
                # A terminated run cannot journal its own end (record_run_end): the kill does,
                # so that once the kill is released the journal says that nothing runs it.
                self.store.record_run_ended(task_id, KILLED, {"type": "Killed", "message": why},
                                            cut(f"tidemark kill by {self.by}", LABEL_MAX))
        if self.unlisted is not None:  # the task's own workflows were tried; others may run on
            raise KillError(f"could not list the open workflows ({self.unlisted}); "
                            f"tried: {out}")
        return out


async def kill(client: Client | None, store: JournalStore, *, task: str | None = None,
               series: str | None = None, everything: bool = False, reason: str,
               by: str, force_unknown: bool = False, grace_s: float = KILL_GRACE_S,
               unreachable: str = "") -> list[dict[str, Any]]:
    """Runs the four layers and returns one report per layer.

    A report is ``{layer, what, done, detail}``. Without a client (Temporal is unreachable:
    ``unreachable`` says why) layers 1 and 3 still run, and layers 2 and 4 are reported as not
    done."""
    t = await target_of(client, store, task=task, series=series, everything=everything,
                        force_unknown=force_unknown)
    k = _Kill(client, store, t, reason or "killed", by, grace_s, unreachable)
    await k.announce()
    layers: list[dict[str, Any]] = []
    for n, what, fn in ((1, "durable stop state killed", k.stop_state),
                        (2, "pause the schedules of the series", k.pause),
                        (3, "revoke credential grants", k.grants),
                        (4, "terminate the workflows (run, unwind, scheduled runs)",
                         k.terminate)):
        layers.append(await _layer(n, what, fn))
    return layers


async def _layer(n: int, what: str, fn: Callable[[], Awaitable[Any]]) -> dict[str, Any]:
    try:
        return {"layer": n, "what": what, "done": True, "detail": await fn()}
    except Exception as e:  # report it; the next layers still run
        return {"layer": n, "what": what, "done": False, "detail": f"{type(e).__name__}: {e}"}


def stopped_workflows(layers: list[dict[str, Any]]) -> list[str]:
    """The workflows layer 4 terminated: what the kill stopped in Temporal."""
    detail = layers[3]["detail"] if len(layers) > 3 and layers[3]["done"] else {}
    return [wid for wid, said in detail.items() if said.startswith("terminated")]


async def _open(client: Client, workflow_id: str) -> WorkflowExecutionDescription | None:
    """The description of ``workflow_id`` while it runs; None once closed or if never started."""
    try:
        desc = await client.get_workflow_handle(workflow_id).describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    return desc if desc.status == WorkflowExecutionStatus.RUNNING else None


async def _scheduled_parent(client: Client, workflow_id: str) -> str | None:
    """The open ScheduledRun that started ``workflow_id`` as its child, if any."""
    desc = await _open(client, workflow_id)
    parent = desc.parent_id if desc is not None else None
    return parent if parent and parent.startswith("tidemark-sched-") else None


async def _announce(client: Client, workflow_id: str, note: dict[str, str]) -> bool:
    """Sends the ``kill`` signal to an open workflow; False when there is none."""
    try:
        await client.get_workflow_handle(workflow_id).signal("kill", note)
    except RPCError as e:
        if e.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.FAILED_PRECONDITION):
            return False
        raise
    return True


async def _settle(client: Client, workflow_ids: list[str],
                  grace_s: float) -> dict[str, str]:
    """Waits until each announced workflow shows ``killed`` with no activity pending.

    The wait lasts up to ``grace_s``; returns for each how it stood when the wait ended.

    The grace bounds the wait for the attempt under way, not for the signal: a workflow that
    has not yet taken the kill signal is waited for at least TOLD_S, even with ``--grace 0``,
    because once terminated it can no longer set ``TidemarkState = killed``."""
    since = time.monotonic()
    left = set(workflow_ids)
    busy: dict[str, str] = {}
    said: dict[str, str] = {}
    while left:
        for wid in sorted(left):
            waited = time.monotonic() - since
            try:
                stood = await _standing(client, wid, waited)
            except RPCError as e:  # one workflow that cannot be read holds up no other
                said[wid] = f"could not be read ({e.message}); terminated without waiting"
                left.discard(wid)
                continue
            if stood is not None and "busy: " in stood:
                busy.setdefault(wid, stood.split("busy: ", 1)[1])
            verdict = _settled_as(stood, busy.get(wid), waited, grace_s)
            if verdict is not None:
                said[wid] = verdict
                left.discard(wid)
        if left:
            await asyncio.sleep(POLL_S)
    return said


def _settled_as(stood: str | None, busy: str | None, waited: float,
                grace_s: float) -> str | None:
    """How a workflow stands for the report once the wait for it is over, or None to wait on."""
    if stood is None:
        return "ended meanwhile"
    if stood == "no worker":
        return "no worker took the kill signal; its TidemarkState still says what it said before"
    if stood == "settled":
        return ("killed; the attempt under way ended first: " + busy if busy
                else "killed; nothing was under way")
    told = stood.startswith("killed, busy: ")
    if told and grace_s == 0:
        return f"killed; the attempt under way was not waited for (--grace 0): {busy}"
    bound = grace_s if told else max(grace_s, TOLD_S)
    if waited < bound:
        return None
    return (f"still under way after {bound:g} s ({busy or 'the kill signal not yet taken'}): "
            "`tidemark status` tells whether its step is in doubt")


async def _standing(client: Client, workflow_id: str, waited: float) -> str | None:
    """How an announced workflow stands now, in a few words.

    ``settled``, ``killed, busy: <activities>`` (it took the kill signal), ``busy:
    <activities>``, ``waiting``, ``no worker``, or None (closed)."""
    desc = await _open(client, workflow_id)
    if desc is None:
        return None
    raw = desc.raw_description
    pending = [f"{a.activity_type.name} (attempt {a.attempt})" for a in raw.pending_activities]
    state = dict((k.name, v) for k, v in desc.typed_search_attributes).get(STATE_ATTRIBUTE)
    if state == KILLED:
        return "killed, busy: " + ", ".join(pending) if pending else "settled"
    task = raw.pending_workflow_task
    never_taken = (raw.HasField("pending_workflow_task") and task.state
                   == PendingWorkflowTaskState.PENDING_WORKFLOW_TASK_STATE_SCHEDULED)
    # An activity some worker is running says a worker lives (its workflow task may only be
    # waiting out a dead worker's sticky queue): then the grace is waited out.
    acting = any(a.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
                 for a in raw.pending_activities)
    if never_taken and waited >= NO_WORKER_S and not acting:
        return "no worker"
    return "busy: " + ", ".join(pending) if pending else "waiting"


async def _terminate(client: Client, workflow_id: str, reason: str,
                     settled: str | None) -> str:
    h = client.get_workflow_handle(workflow_id)
    try:
        desc = await h.describe()
        if desc.status != WorkflowExecutionStatus.RUNNING:
            return f"not running ({desc.status.name.lower() if desc.status else '?'})"
        await h.terminate(reason=reason)
    except RPCError as e:
        if e.status != RPCStatusCode.NOT_FOUND:
            raise
        try:  # it ended between the two calls, or never existed
            desc = await h.describe()
        except RPCError:
            return "no such workflow"
        return f"not running ({desc.status.name.lower() if desc.status else '?'}): {e.message}"
    return "terminated" + (f" ({settled})" if settled else "")
