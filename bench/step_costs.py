"""What a step and a task cost, beside the floor: CPU, Temporal actions, WAL and statements.

Part ``costs`` of bench/run_all.py. Keys:

* ``task_cpu_ms``: the CPU of the real worker (bench/bench_worker.py) plus the Temporal dev
  server's, per one-step RunPlan task on the activity path, over ``n`` tasks (``concurrency``
  at once); ``task_cpu_ms_bare_workflow`` the same for a workflow with one no-op activity,
  hosted by a worker process of its own (bench/bare_workflow.py) on the same dev server. They
  alternate in rounds (the median of each); ``task_cpu_vs_bare_workflow`` is the ratio, and
  ``task_cpu_ms_parts`` splits each into worker, server and (RunPlan) Postgres.
* ``temporal_actions_per_task`` (a one-step task), ``temporal_actions_per_step`` (each step
  past the first: a K-step task's actions less a one-step task's, over K - 1), their ``_fast``
  (fast path) and ``temporal_actions_per_task_bare_workflow``, counted over the histories as
  Temporal Cloud bills them (bench/temporal_actions.py says what is counted and what is not);
  ``temporal_actions_by_kind`` the K-step tasks' counts by kind. Beside them, the dev server's
  own ``action`` counter (its Prometheus metrics, by ``action_type``; Temporal's migration guide
  estimates Cloud actions from it, and it sees heartbeats and queries, which a history does
  not): ``temporal_server_actions_per_task`` / ``_per_step`` and ``temporal_server_actions``
  (the K-step tasks' by type).
* ``wal_bytes_per_task`` / ``wal_bytes_per_step``: pg_wal_lsn_diff of pg_current_wal_lsn()
  around the same one-step and K-step runs (the whole cluster's WAL: nothing else writes to
  it meanwhile but the worker's lease keeper, which is part of the cost);
  ``statements_per_task`` / ``statements_per_step``: statements the server ran on the journal's
  database, counted in its log with ``log_statement = 'all'`` set for those runs alone
  (pg_stat_statements is not in the embedded Postgres's build; pg_stat_database counts
  transactions, not statements, and a backend flushes its counts to that view only now and
  then, an idle one seconds later, so a run's share cannot be told from it). Each with a
  ``_fast`` variant. Statements are counted with the embedded Postgres only (its log is in its
  data directory); with DATABASE_URL they are None.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from bench_actions import bench_plan
from psycopg import sql
from temporal_actions import billable_actions
from temporalio.client import Client, WorkflowHandle

from workflows.outcome import run_result
from workflows.shared import start_attributes

BENCH = Path(__file__).resolve().parent
LOG_PREFIX = "%m [%p] db=%d "  # the database on each line: the journal's statements alone


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- the bare workflow's worker -----------------------------------------------------------------

class BareWorker:
    """A worker process of the bare workflow alone (bench/bare_workflow.py)."""

    def __init__(self, client: Client, queue: str) -> None:
        env = {**os.environ, "TEMPORAL_ADDRESS": client.service_client.config.target_host,
               "TIDEMARK_TASK_QUEUE": queue}
        self.queue = queue
        self.proc = subprocess.Popen([sys.executable, str(BENCH / "bare_workflow.py")], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


async def _gather_in(n: int, concurrency: int, one: Any) -> list[Any]:
    """``one(i)`` for i below ``n``, ``concurrency`` at once."""
    gate = asyncio.Semaphore(concurrency)

    async def gated(i: int) -> Any:
        async with gate:
            return await one(i)
    return await asyncio.gather(*(gated(i) for i in range(n)))


async def _bare_tasks(client: Client, queue: str, n: int, concurrency: int
                      ) -> list[WorkflowHandle[Any, Any]]:
    async def one(_: int) -> WorkflowHandle[Any, Any]:
        h: WorkflowHandle[Any, Any] = await client.start_workflow(
            "BareActivities", [1, False], id=f"bare1-{uuid.uuid4().hex}", task_queue=queue)
        await h.result()
        return h
    return await _gather_in(n, concurrency, one)


async def _plan_tasks(client: Client, queue: str, n: int, steps: int, mode: str,
                      concurrency: int) -> list[WorkflowHandle[Any, Any]]:
    async def one(_: int) -> WorkflowHandle[Any, Any]:
        doc = bench_plan(f"cost-{mode}-{steps}-{uuid.uuid4().hex[:8]}", steps, execution=mode)
        h: WorkflowHandle[Any, Any] = await client.start_workflow(
            "RunPlan", doc, id=f"tidemark-{doc['task_id']}", task_queue=queue,
            search_attributes=start_attributes(doc["task_id"]))
        res = await run_result(h)
        assert res.state == "completed" and res.executed == steps, res
        return h
    return await _gather_in(n, concurrency, one)


async def actions_of(handle: WorkflowHandle[Any, Any]) -> Counter[str]:
    """A run's billable actions, through its continue-as-new successors."""
    total: Counter[str] = Counter()
    client, run_id = handle._client, handle.first_execution_run_id or handle.run_id
    while run_id:
        h = client.get_workflow_handle(handle.id, run_id=run_id)
        events = [e async for e in h.fetch_history_events()]
        total += billable_actions(events)
        last = events[-1] if events else None
        run_id = (last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
                  if last is not None and last.HasField(
                      "workflow_execution_continued_as_new_event_attributes") else None)
    return total


# -- CPU -----------------------------------------------------------------------------------------

async def measure_task_cpu(client: Client, queue: str, pids: dict[str, int | None], n: int,
                           rounds: int, concurrency: int, cpu_s: Callable[[int], float]
                           ) -> dict[str, Any]:
    """One-step RunPlan tasks against bare one-activity workflows: CPU per task, side by side.

    ``pids`` has ``worker``, ``temporal`` and ``postgres`` (None when outside); ``cpu_s`` reads
    a process tree's CPU seconds (run_all.cpu_s)."""
    bare = BareWorker(client, f"bare-cpu-{uuid.uuid4().hex[:6]}")
    try:
        await _bare_tasks(client, bare.queue, 3, 1)  # warm: the worker polls, caches settle
        await _plan_tasks(client, queue, 3, 1, "activity", 1)
        pids = {**pids, "bare_worker": bare.proc.pid}
        per: dict[str, list[dict[str, float]]] = {"plan": [], "bare": []}
        for r in range(rounds):
            for name in ("bare", "plan"):
                before = {k: cpu_s(p) for k, p in pids.items() if p}
                t0 = time.perf_counter()
                if name == "bare":
                    await _bare_tasks(client, bare.queue, n, concurrency)
                else:
                    await _plan_tasks(client, queue, n, 1, "activity", concurrency)
                wall = time.perf_counter() - t0
                used = {k: (cpu_s(p) - before[k]) * 1000 / n for k, p in pids.items() if p}
                worker = used["bare_worker" if name == "bare" else "worker"]
                part = {"worker": worker, "temporal": used["temporal"],
                        "total": worker + used["temporal"], "wall_ms": wall * 1000 / n}
                if name == "plan" and "postgres" in used:
                    part["postgres"] = used["postgres"]
                per[name].append(part)
            _log(f"task CPU round {r + 1}: one-step RunPlan {per['plan'][-1]['total']:.1f} ms "
                 f"(worker {per['plan'][-1]['worker']:.1f}, server "
                 f"{per['plan'][-1]['temporal']:.1f}), bare workflow "
                 f"{per['bare'][-1]['total']:.1f} ms (worker {per['bare'][-1]['worker']:.1f}, "
                 f"server {per['bare'][-1]['temporal']:.1f})")
        bare_handles = await _bare_tasks(client, bare.queue, 2, 1)
        bare_actions = await actions_of(bare_handles[0])
    finally:
        bare.stop()

    def med(name: str) -> dict[str, float]:
        return {k: round(statistics.median(p[k] for p in per[name]), 2) for k in per[name][0]}
    plan, bare_ = med("plan"), med("bare")
    return {"task_cpu_ms": plan["total"], "task_cpu_ms_bare_workflow": bare_["total"],
            "task_cpu_vs_bare_workflow": round(plan["total"] / bare_["total"], 2),
            "task_cpu_ms_parts": {"run_plan": plan, "bare_workflow": bare_,
                                  "tasks_per_round": n, "rounds": rounds,
                                  "concurrency": concurrency},
            "temporal_actions_per_task_bare_workflow": sum(bare_actions.values())}


# -- Postgres ------------------------------------------------------------------------------------

class PostgresCounters:
    """WAL position and (embedded Postgres) logged statements of one database.

    The statements are read from the server's log: ``log_statement = 'all'`` is set with ALTER
    SYSTEM and a reload while the counters are open, and reset when they close."""

    def __init__(self, admin_url: str, db_url: str, embedded: bool) -> None:
        self.admin_url, self.db_url, self.embedded = admin_url, db_url, embedded
        self.dbname = str(psycopg.conninfo.conninfo_to_dict(db_url)["dbname"])
        self.log: Path | None = None

    def __enter__(self) -> PostgresCounters:
        if self.embedded:
            with psycopg.connect(self.admin_url, autocommit=True) as conn:
                row = conn.execute("SHOW data_directory").fetchone()
                log = Path(str(row[0])) / "log" if row else None
                if log is not None and log.exists():
                    self.log = log
                    conn.execute("ALTER SYSTEM SET log_statement = 'all'")
                    # A utility statement takes no bind parameters: a quoted literal.
                    conn.execute(sql.SQL("ALTER SYSTEM SET log_line_prefix = {}").format(
                        sql.Literal(LOG_PREFIX)))
                    conn.execute("SELECT pg_reload_conf()")
            time.sleep(0.5)  # the backends read the new settings at their next statement
        return self

    def __exit__(self, *exc: object) -> None:
        if self.log is not None:
            with psycopg.connect(self.admin_url, autocommit=True) as conn:
                conn.execute("ALTER SYSTEM RESET log_statement")
                conn.execute("ALTER SYSTEM RESET log_line_prefix")
                conn.execute("SELECT pg_reload_conf()")

    def read(self) -> dict[str, Any]:
        """The WAL position, the log's size and the database's size now."""
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
            size = conn.execute("SELECT pg_database_size(%s)", (self.dbname,)).fetchone()
        assert row is not None and size is not None
        return {"lsn": row[0], "log_at": self.log.stat().st_size if self.log else 0,
                "size": int(size[0])}

    def since(self, before: dict[str, Any]) -> dict[str, float | None]:
        """WAL bytes, statements and the database's growth on disk since ``before``.

        The growth is in whole pages (8 KiB): read it over many steps."""
        time.sleep(0.5)  # the server writes its log lines a moment after the statements
        after = self.read()
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            row = conn.execute("SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)",
                               (after["lsn"], before["lsn"])).fetchone()
        wal = float(row[0]) if row else 0.0
        disk = float(after["size"] - before["size"])
        statements: float | None = None
        if self.log is not None:
            with open(self.log, "rb") as f:
                f.seek(before["log_at"])
                text = f.read(after["log_at"] - before["log_at"]).decode(errors="replace")
            mark = f" db={self.dbname} "
            statements = sum(1 for line in text.splitlines() if mark in line and (
                "LOG:  statement: " in line or "LOG:  execute " in line))
        return {"wal": wal, "statements": statements, "disk": disk}


def server_actions(metrics_url: str) -> Counter[str]:
    """The dev server's ``action`` counter in the default namespace, by action type."""
    from urllib.request import urlopen

    with urlopen(metrics_url, timeout=10) as r:  # the dev server, on loopback
        text = r.read().decode()
    out: Counter[str] = Counter()
    for line in text.splitlines():
        if line.startswith("action{") and 'namespace="default"' in line:
            kind = line.split('action_type="', 1)[1].split('"', 1)[0]
            out[kind] += int(float(line.rsplit(" ", 1)[1]))
    return out


def settled_actions(metrics_url: str, tries: int = 8) -> Counter[str]:
    """server_actions once two reads a second apart agree: the server exports them late."""
    last = server_actions(metrics_url)
    for _ in range(tries):
        time.sleep(1.0)
        now = server_actions(metrics_url)
        if now == last:
            break
        last = now
    return last


async def measure_step_costs(client: Client, queue: str, admin_url: str, db_url: str,
                             embedded: bool, k: int, metrics_url: str) -> dict[str, Any]:
    """Actions, WAL and statements of a one-step and a ``k``-step task, on both paths."""
    out: dict[str, Any] = {}
    kinds: dict[str, dict[str, int]] = {}
    by_server: dict[str, dict[str, int]] = {}
    with PostgresCounters(admin_url, db_url, embedded) as pg:
        for mode in ("activity", "fast"):
            sfx = "" if mode == "activity" else "_fast"
            got: dict[int, dict[str, Any]] = {}
            for steps in (1, k):
                before, counted = pg.read(), settled_actions(metrics_url)
                (handle,) = await _plan_tasks(client, queue, 1, steps, mode, 1)
                costs = pg.since(before)
                served = settled_actions(metrics_url) - counted
                actions = await actions_of(handle)
                got[steps] = {**costs, "actions": sum(actions.values()),
                              "served": sum(served.values())}
                if steps == k:
                    kinds[mode], by_server[mode] = dict(actions), dict(served)

            def per_step(key: str, got: dict[int, dict[str, Any]] = got) -> float | None:
                a, b = got[1][key], got[k][key]
                return None if a is None or b is None else round((b - a) / (k - 1), 2)
            out[f"temporal_actions_per_task{sfx}"] = got[1]["actions"]
            out[f"temporal_actions_per_step{sfx}"] = per_step("actions")
            out[f"temporal_server_actions_per_task{sfx}"] = got[1]["served"]
            out[f"temporal_server_actions_per_step{sfx}"] = per_step("served")
            for key, name in (("wal", "wal_bytes"), ("statements", "statements"),
                              ("disk", "disk_bytes")):
                out[f"{name}_per_task{sfx}"] = got[1][key]
                out[f"{name}_per_step{sfx}"] = per_step(key)
            _log(f"{mode} path: {got[1]['actions']} actions for a one-step task, "
                 f"{out[f'temporal_actions_per_step{sfx}']} per step (the server's counter: "
                 f"{got[1]['served']}, {out[f'temporal_server_actions_per_step{sfx}']}); WAL "
                 f"{out[f'wal_bytes_per_step{sfx}']} bytes, statements "
                 f"{out[f'statements_per_step{sfx}']} per step ({k}-step task)")
    out["temporal_actions_by_kind"] = {**kinds, "steps": k}
    out["temporal_server_actions"] = {**by_server, "steps": k}
    out["step_costs_steps"] = k
    return out
