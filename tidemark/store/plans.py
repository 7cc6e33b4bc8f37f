"""Plans: stored once before their first step, read back whole, by window or by action."""

from __future__ import annotations

from psycopg.types.json import Jsonb

from tidemark.errors import PlanChanged, UnknownTask
from tidemark.plan import Plan, Step
from tidemark.store.base import StoreBase


class PlansMixin(StoreBase):
    """The stored plans."""

    def persist_plan(self, plan: Plan, actor: str = "tidemark") -> bool:
        """Stores the plan before its first step. Returns True if it was new.

        The same task id with the same hash is a no-op; a different hash raises PlanChanged.
        """
        new_hash = plan.plan_hash
        with self._conn() as conn, conn.transaction():
            inserted = conn.execute(
                "INSERT INTO tidemark.plans (task_id, plan_hash, step_count, approval)"
                " VALUES (%s, %s, %s, %s) ON CONFLICT (task_id) DO NOTHING RETURNING task_id",
                (plan.task_id, new_hash, len(plan.steps),
                 Jsonb(plan.approval) if plan.approval is not None else None)).fetchone()
            if inserted is None:
                row = conn.execute("SELECT plan_hash FROM tidemark.plans WHERE task_id = %s",
                                   (plan.task_id,)).fetchone()
                assert row is not None
                if row["plan_hash"] != new_hash:
                    raise PlanChanged(plan.task_id, row["plan_hash"], new_hash)
                return False
            # One statement for every step, however many (a row each would be a statement each,
            # pipelined but parsed and executed one by one).
            conn.execute(
                "INSERT INTO tidemark.plan_steps (task_id, step, action, args, irreversible)"
                " SELECT %s, s.step, s.action, s.args, s.irreversible"
                " FROM unnest(%s::int[], %s::text[], %s::jsonb[], %s::bool[])"
                "   AS s(step, action, args, irreversible)",
                (plan.task_id, [s.number for s in plan.steps], [s.action for s in plan.steps],
                 [Jsonb(s.args) for s in plan.steps], [s.irreversible for s in plan.steps]))
            conn.execute("INSERT INTO tidemark.events (task_id, kind, detail, actor)"
                         " VALUES (%s, 'plan', %s, %s)",
                         (plan.task_id, Jsonb({"plan_hash": new_hash,
                                               "steps": len(plan.steps)}), actor))
            return True

    def load_plan(self, task_id: str) -> Plan:
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT step, action, args, irreversible FROM tidemark.plan_steps"
                " WHERE task_id = %s ORDER BY step", (task_id,)).fetchall()
            approval = conn.execute("SELECT approval FROM tidemark.plans WHERE task_id = %s",
                                    (task_id,)).fetchone()
        if not rows or approval is None:
            raise UnknownTask(task_id)
        return Plan(task_id, tuple(Step(r["step"], r["action"], r["args"], r["irreversible"])
                                   for r in rows), approval["approval"])

    def load_window(self, task_id: str, first: int, last: int) -> list[Step]:
        """Steps first..last of a stored plan (a continue-as-new window)."""
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT step, action, args, irreversible FROM tidemark.plan_steps"
                " WHERE task_id = %s AND step BETWEEN %s AND %s ORDER BY step",
                (task_id, first, last)).fetchall()
        return [Step(r["step"], r["action"], r["args"], r["irreversible"]) for r in rows]

    def plan_actions(self, task_id: str) -> list[str]:
        """The distinct actions of a stored plan (one index scan, no step is transferred)."""
        with self._conn() as conn:
            rows = conn.execute("SELECT DISTINCT action FROM tidemark.plan_steps"
                                " WHERE task_id = %s ORDER BY action", (task_id,)).fetchall()
        return [r["action"] for r in rows]

    def load_steps_of(self, task_id: str, actions: list[str]) -> list[Step]:
        """The steps of a stored plan whose action is one of ``actions``, in order."""
        if not actions:
            return []
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT step, action, args, irreversible FROM tidemark.plan_steps"
                " WHERE task_id = %s AND action = ANY(%s) ORDER BY step",
                (task_id, actions)).fetchall()
        return [Step(r["step"], r["action"], r["args"], r["irreversible"]) for r in rows]
