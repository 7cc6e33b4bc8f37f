"""A decider: the process through which a RunPlan update (``approve``, ``reject``) decides.

It serves the decisions task queue of the runs' task queue (workflows.shared.decisions_queue)
with one activity (activities/decisions.py) on a journal it connects to as its own login role:
an approver's or operator's, granted by an operator. Temporal's own access control says who may
send an update; the journal says whether the decision holds, as for `tidemark approve`. Without
a decider, an update is refused within workflows.shared.DECIDER_WAIT.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from temporalio.client import Client
from temporalio.worker import Worker

from activities.decisions import DecisionActivities
from tidemark.store import JournalStore
from workflows.shared import decisions_queue

# Decisions are rare and each is one statement: two threads keep one waiting behind another
# short, and the journal serialises decisions on one task anyway.
DECIDER_THREADS = 2


async def run_decider(client: Client, db_url: str, task_queue: str,
                      stop: asyncio.Event | None = None) -> None:
    """Serves decisions for the runs of ``task_queue`` until ``stop`` is set (or cancelled)."""
    with JournalStore(db_url, max_size=DECIDER_THREADS) as store, \
            ThreadPoolExecutor(DECIDER_THREADS, thread_name_prefix="decider") as threads:
        worker = Worker(client, task_queue=decisions_queue(task_queue),
                        activities=DecisionActivities(store).all(),
                        activity_executor=threads)
        async with worker:
            await (stop or asyncio.Event()).wait()
