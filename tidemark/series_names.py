"""The names of a series' scheduled runs, apart from the series' rules.

The names of a series' scheduled runs, apart from the series' rules (tidemark/series.py):
workflow code (workflows/scheduled_run.py) derives its task id from them, and must import
nothing that reaches the journal store.

Task ids of scheduled runs: ``sched-<series>-<YYYYMMDDTHHMMSSZ>``. Only a series' ScheduledRun
(workflow id ``tidemark-sched-<series>-…``) may start a plan under one, so a plan submitted by
hand cannot take tomorrow's id and make tomorrow's run fail as a changed plan.
"""

from __future__ import annotations

SCHEDULED_PREFIX = "sched-"


def scheduled_task_id(series: str, stamp: str) -> str:
    return f"{SCHEDULED_PREFIX}{series}-{stamp}"
