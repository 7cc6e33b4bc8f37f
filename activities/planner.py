"""The activities of a scheduled run: the stop and series state, then the plan.

They read the stop and series state first, then ask the planner for tonight's plan and validate
it like any plan.

A planner is ``module:function``, importable by the worker, called as
``function(args, scheduled)`` with the schedule's ``--args`` (a dict) and the scheduled time
(an aware datetime). It returns a plan document (``{"steps": [...]}``); it is where an agent
turns tonight's request into a plan. Its ``task_id`` and ``series`` are set here: the task id
is derived from the series and the scheduled time, so a retried planner call is the same task.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.acting import acting_for
from activities.steps import _as_application_error
from tidemark import series as series_rules
from tidemark.actions import Registry
from tidemark.activity_names import ActivityName
from tidemark.errors import PlanError, TidemarkError
from tidemark.grants import GrantBroker
from tidemark.limits import check_size
from tidemark.payloads import PlannerInput
from tidemark.plan import load_plan
from tidemark.store import JournalStore


def load_planner(ref: str) -> Any:
    """The function ``module:function`` names; PlanError if it cannot be imported."""
    module, sep, name = ref.partition(":")
    if not sep or not module or not name:
        raise PlanError("planner", f"must be MODULE:FUNCTION, got {ref!r}")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise PlanError("planner", f"cannot import {ref}: {e}") from None
    if not callable(fn):
        raise PlanError("planner", f"{ref} is not callable")
    return fn


class PlannerActivities:
    def __init__(self, store: JournalStore, registry: Registry,
                 grants: GrantBroker | None = None) -> None:
        self.store = store
        self.registry = registry
        self.grants = grants  # the planner's reads present the scheduled task's grant

    @activity.defn(name=ActivityName.SERIES_GATE)
    def series_gate(self, inp: PlannerInput) -> None:
        """Raises SeriesBlocked while anything says stop.

        That is the series' or the global stop state, or an earlier run of the series that is
        not settled."""
        try:
            series_rules.check_started_by_schedule(inp.series, inp.scheduled_by,
                                                   datetime.fromisoformat(inp.scheduled),
                                                   datetime.now(UTC))
            series_rules.check_declared(self.store, inp.series)
            series_rules.check(self.store, inp.series, inp.task_id)
        except TidemarkError as e:
            raise _as_application_error(e) from e

    @activity.defn(name=ActivityName.CALL_PLANNER)
    def call_planner(self, inp: PlannerInput) -> dict[str, Any]:
        """Calls the planner and returns its plan, validated, with task id and series set."""
        try:
            fn = load_planner(inp.planner)
            # What the planner reads of the targets goes through the task's grant, like every
            # call the task makes: a kill of the task cuts its planner off too.
            with acting_for(self.grants, inp.task_id):
                doc = fn(dict(inp.args), datetime.fromisoformat(inp.scheduled))
            if not isinstance(doc, dict):
                raise PlanError("planner", f"{inp.planner} returned {type(doc).__name__}, "
                                           "not a plan object")
            named = doc.get("series")
            if named is not None and named != inp.series:
                raise PlanError("series", f"the planner named series {named!r}; this schedule "
                                          f"runs {inp.series!r}")
            plan = load_plan({**doc, "task_id": inp.task_id, "series": inp.series},
                             self.registry)
            check_size("the planner's plan", plan.canonical())  # it crosses Temporal whole
        except TidemarkError as e:
            raise _as_application_error(e) from e
        except Exception as e:  # the planner's own failure: retried by the workflow's policy
            raise ApplicationError(f"planner {inp.planner} failed: {type(e).__name__}: {e}",
                                   type="PlannerFailed") from e
        return plan.canonical()

    def all(self) -> list[Callable[..., Any]]:
        return [self.series_gate, self.call_planner]
