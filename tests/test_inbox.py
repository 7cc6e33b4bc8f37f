"""`tidemark inbox`: every task that waits for a person, from the journal.

Through the real CLI, a real worker process, the Temporal dev server and Postgres.

The states are reached as tests/test_control_matrix.py reaches them (its Task and helpers): a
completed run, a run under way whose irreversible step holds, a run waiting for approval, a
step in doubt left by a killed process, a halted run, a failed run of a series and the refused
start of its next run, a completed run whose unwind was cut short (partly unwound), a run
whose verification gate failed, a plain stop and a kill set with the store's own methods, and a
stopped task whose unwind is under way. The settled and the healthy tasks must not appear; the
others appear once each, oldest first, with why, since when, what is at stake and the command
that decides it."""

from __future__ import annotations

import json
import os
import urllib.parse
from datetime import datetime
from pathlib import Path
from typing import Any

from temporalio.testing import WorkflowEnvironment
from test_control_matrix import (
    SPECS,
    Task,
    blocked,
    reach,
    tidemark_state,
    undo_queue,
    until,
    verification_failed,
)

from helpers.steps import crash_at, run_one
from tidemark.plan import load_plan
from tidemark.store import JournalStore
from tidemark.web_ui import write_stack_record
from tools.operate.inbox import DEFAULT_UI, web_ui_url
from tools.operate.starter import start_plan
from workflows.outcome import run_result

YEN = {"amount": 50000, "currency": "jpy", "description": "Q3 supplier run"}
KEYS = {"task_id", "why", "need", "since", "detail", "command", "at_stake", "fix"}


def entries(out: str) -> dict[str, str]:
    """The text output's entries by task id: each entry's lines as one string."""
    found: dict[str, str] = {}
    for block in out.split("\n\n")[1:-1]:  # after the count, before the Web UI link
        head = block.split("  ", 1)[0]
        found[head] = block
    return found


async def test_an_empty_inbox_is_one_line_and_exit_0(cli: Any) -> None:
    assert await cli("inbox") == (0, "inbox empty: no task waits for a person\n", "")
    code, out, err = await cli("inbox", "--json")
    assert (code, json.loads(out), err) == (0, [], "")


async def test_the_inbox_lists_each_waiting_task_once_oldest_first_and_never_a_settled_one(
        temporal_env: WorkflowEnvironment, store: JournalStore, workers: Any, task_queue: str,
        tmp_path: Path, cli: Any) -> None:
    client = temporal_env.client
    workers.start()
    tasks: dict[str, Task] = {}
    for name in ("completed", "stopped", "killed", "in_doubt", "awaiting", "halted", "blocked",
                 "partly_unwound", "verification_failed", "running", "unwinding"):
        (tmp_path / name).mkdir()
        tasks[name] = Task(tmp_path / name)

    done = await start_plan(client, tasks["completed"].doc, tasks["completed"].id, task_queue)
    assert (await run_result(done)).state == "completed"
    # a stopped task whose plan also pays 50,000 JPY: at stake in the yen's own units
    stopped = tasks["stopped"]
    stopped.doc["steps"].append({"action": "stripe.payment_intent", "args": YEN})
    store.persist_plan(load_plan(stopped.doc, SPECS))
    store.set_control(stopped.id, "stopped", "incident 42", "ops")
    killed = tasks["killed"]
    store.persist_plan(load_plan(killed.doc, SPECS))
    store.set_killed(killed.id, "runaway", "ops")
    doubt = tasks["in_doubt"]  # the process of the irreversible step died after its intent
    doubt.blind.write_text("")
    store.persist_plan(load_plan(doubt.doc, SPECS))
    for step in (1, 2):
        assert run_one(store.conninfo, doubt.id, step).wait(timeout=60) == 0
    crash_at(store.conninfo, doubt.id, 3, "after_intent")
    awaiting = tasks["awaiting"]
    awaiting.doc["approval"] = {"required": True}
    await start_plan(client, awaiting.doc, awaiting.id, task_queue)

    halted = tasks["halted"]  # waited at the boundary, then took the halt signal
    halted.doc["approval"] = {"required": True}
    halting = await start_plan(client, halted.doc, halted.id, task_queue)

    async def waits() -> bool:
        return all([(await tidemark_state(temporal_env, t.id))[1] == "awaiting_approval"
                    for t in (awaiting, halted)])
    await until(waits)
    await halting.signal("halt", "end of shift")
    assert (await run_result(halting)).state == "halted"
    # a run of a series whose earlier run failed: the earlier one waits (failed), the later
    # one's start was refused before its plan was stored (blocked)
    refused = tasks["blocked"]
    await blocked(refused, store, temporal_env, workers, task_queue)
    earlier = refused.id + "-e"
    # completed, then an unwind whose compensation of step 2 was refused
    partly = tasks["partly_unwound"]
    await reach("partly_unwound", partly, store, temporal_env, workers, task_queue)
    # somebody renamed step 1's file while it waited at the boundary; the next run's gate saw it
    moved = tasks["verification_failed"]
    await verification_failed(moved, store, temporal_env, workers, task_queue)
    running = tasks["running"]  # its irreversible step has begun and holds: a healthy run
    running.hold.write_text("")
    held = await start_plan(client, running.doc, running.id, task_queue)

    async def begun() -> bool:
        return store.task_known(running.id) and store.step_row(running.id, 3) is not None
    await until(begun)
    # a stopped task a person is unwinding: its unwind is open (no worker polls its queue yet)
    unwinding = tasks["unwinding"]
    store.persist_plan(load_plan(unwinding.doc, SPECS))
    store.set_control(unwinding.id, "stopped", "wrong supplier", "ops")
    assert (await cli("unwind", unwinding.id, "--yes", "--task-queue",
                      undo_queue(task_queue, unwinding)))[0] == 0

    try:
        code, out, err = await cli("inbox")
        assert (code, err) == (0, "")
        listed = entries(out)
        waiting = [*(tasks[n].id for n in ("stopped", "killed", "in_doubt", "awaiting",
                                           "halted")), earlier, refused.id, partly.id, moved.id]
        assert list(listed) == waiting, out  # once each, oldest first, nothing else
        assert out.startswith("9 task(s) wait for a person, oldest first:\n"), out
        for healthy in (tasks["completed"], running, unwinding):
            assert healthy.id not in out

        s = listed[stopped.id]
        assert f"{stopped.id}  stopped  since " in s and "by ops: incident 42" in s
        assert f"decide    tidemark resume {stopped.id}" in s
        assert "amount 50,000 JPY (50000 minor units)" in s and "500.00" not in s
        assert "step 3 ledger.record" in s  # every irreversible step not done is at stake
        k = listed[killed.id]
        assert "killed" in k and f"decide    tidemark release {killed.id}" in k
        d = listed[doubt.id]
        assert f"{doubt.id}  in doubt  since " in d and "step 3 ledger.record" in d
        assert (f"decide    tidemark resolve {doubt.id} --step 3 --as done|absent|never --yes"
                in d)
        a = listed[awaiting.id]
        asked = store.approval_request(awaiting.id)
        assert asked is not None and asked["lines"]
        for line in asked["lines"]:  # what `tidemark approve` shows, as it shows it
            assert f"at stake  {line}" in a
        assert f"decide    tidemark approve {awaiting.id}" in a
        h = listed[halted.id]
        assert "halted: end of shift" in h and f"decide    tidemark resume {halted.id}" in h
        f = listed[earlier]
        # a step refused for good never runs again: putting the rest back is what works now
        assert f"{earlier}  failed  since " in f and f"decide    tidemark unwind {earlier} --yes" \
            in f
        b = listed[refused.id]
        series = refused.doc["series"]
        assert f"earlier run(s) {earlier} of series {series} not settled" in b
        assert f"decide    tidemark status --series {series}" in b and "at stake" not in b
        u = listed[partly.id]  # every step of it is done, yet it is not settled
        assert f"{partly.id}  partly unwound  since " in u
        assert f"decide    tidemark unwind {partly.id} --yes" in u and "at stake" not in u
        v = listed[moved.id]
        assert f"{moved.id}  verification failed  since " in v
        assert "before step 3, 1 reversible step(s) no longer hold: step 1 fs.rename" in v
        assert "  first     put back what the gate found changed" in v
        assert f"decide    tidemark resume {moved.id}" in v and "step 3 ledger.record" in v

        # the Web UI list of the same runs: a URL whose query Temporal's visibility accepts,
        # listing the run that waits and neither the completed nor the healthy one
        ui = out.rstrip("\n").rsplit("\n", 1)[-1]
        assert ui.startswith("Web UI: http://localhost:8233/namespaces/default/workflows?query=")
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(ui.split(" ", 2)[2]).query)["query"]
        ids = {w.id async for w in client.list_workflows(query[0])}
        # the run that waits is open itself; each run that ended waiting opened its task's
        # NeedsPerson row (workflows/needs_person.py)
        assert {f"tidemark-{awaiting.id}"} | {
            f"tidemark-needs-{t}" for t in (halted.id, earlier, refused.id)} <= ids
        assert not ids & {f"tidemark-{tasks['completed'].id}", f"tidemark-{running.id}"}

        code, out, err = await cli("inbox", "--json")
        assert (code, err) == (0, "")
        data = json.loads(out)
        assert [e["task_id"] for e in data] == waiting
        assert all(set(e) == KEYS for e in data)
        assert [e["why"] for e in data] == ["stopped", "killed", "in_doubt", "awaiting_approval",
                                            "halted", "failed", "blocked", "partly_unwound",
                                            "verification_failed"]
        since = [datetime.fromisoformat(e["since"]) for e in data]
        assert since == sorted(since) and all(t.tzinfo is not None for t in since)
        assert data[3]["at_stake"] == asked["lines"]
        assert data[2]["command"] == (f"tidemark resolve {doubt.id} --step 3 "
                                      "--as done|absent|never --yes")

        # the command it names decides it: the task leaves the inbox
        assert (await cli("resolve", doubt.id, "--step", "3", "--as", "done", "--yes"))[0] == 0
        code, out, _ = await cli("inbox", "--json")
        assert [e["task_id"] for e in json.loads(out)] == [w for w in waiting if w != doubt.id]
    finally:
        running.let_go()
        assert (await run_result(held)).state == "completed"
        for wid in (f"tidemark-{awaiting.id}", f"tidemark-unwind-{unwinding.id}"):
            await client.get_workflow_handle(wid).terminate("test over")


def test_the_runbook_links_the_web_ui_list_the_command_prints() -> None:
    """The runbook links the Web UI list the command prints.

    The runbook's link (docs/operate.md) is the one `tidemark inbox` ends with on the dev stack."""
    runbook = (Path(__file__).resolve().parent.parent / "docs" / "operate.md").read_text(
        encoding="utf-8")
    assert f"]({web_ui_url(DEFAULT_UI, 'default')})" in runbook


def test_the_who_needs_me_doc_links_the_web_ui_list_the_command_prints() -> None:
    """The who-needs-me page links the Web UI list the command prints.

    The link of docs/who-needs-me.md (which the runbook points at) is the one `tidemark inbox`
    ends with on the dev stack."""
    doc = Path(__file__).resolve().parent.parent / "docs" / "who-needs-me.md"
    assert f"]({web_ui_url(DEFAULT_UI, 'default')})" in doc.read_text(encoding="utf-8")


async def test_without_temporal_the_inbox_answers_from_the_journal_and_says_so(
        store: JournalStore, tmp_path: Path, cli: Any, monkeypatch: Any) -> None:
    """Without Temporal, the inbox answers from the journal and says so.

    Temporal is down at 03:14: the journal's list all the same, exit 0, and one line on stderr
    saying what it could not tell (an unwind under way, a run ended outside tidemark)."""
    task = Task(tmp_path)
    store.persist_plan(load_plan(task.doc, SPECS))
    store.set_control(task.id, "stopped", "incident", "ops")
    monkeypatch.setenv("TEMPORAL_ADDRESS", "localhost:1")  # nothing listens there
    code, out, err = await cli("inbox")
    assert code == 0 and f"{task.id}  stopped  since " in out
    assert err.startswith("tidemark: could not ask Temporal which unwinds and runs are under "
                          "way (")
    assert err.endswith("a task being unwound is listed as stopped, and a run ended outside "
                        "tidemark is not seen\n") and err.count("\n") == 1


async def test_the_inbox_links_the_web_ui_of_the_stack_it_reads(
        store: JournalStore, tmp_path: Path, cli: Any, monkeypatch: Any) -> None:
    """The inbox's Web UI link follows TIDEMARK_UI_URL, else the dev stack's record.

    A bad TIDEMARK_UI_URL is one line and exit 1 (tidemark/web_ui.py)."""
    task = Task(tmp_path)
    store.persist_plan(load_plan(task.doc, SPECS))
    store.set_control(task.id, "stopped", "incident", "ops")
    list_link = "/namespaces/default/workflows?query="

    monkeypatch.setenv("TIDEMARK_UI_URL", "http://ui.example:8080/temporal/")
    code, out, _ = await cli("inbox")
    assert code == 0 and out.rstrip("\n").rsplit("\n", 1)[-1].startswith(
        f"Web UI: http://ui.example:8080/temporal{list_link}"), out

    # A `tidemark dev` stack on other ports records its Web UI beside its temporal.toml.
    monkeypatch.delenv("TIDEMARK_UI_URL")
    stack = tmp_path / "stack"
    stack.mkdir()
    (stack / "temporal.toml").write_text("")
    write_stack_record(stack, os.environ["TEMPORAL_ADDRESS"], "http://127.0.0.1:18233")
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(stack / "temporal.toml"))
    code, out, _ = await cli("inbox")
    assert code == 0 and out.rstrip("\n").rsplit("\n", 1)[-1].startswith(
        f"Web UI: http://127.0.0.1:18233{list_link}"), out

    monkeypatch.setenv("TIDEMARK_UI_URL", "localhost:8233")
    code, out, err = await cli("inbox")
    assert (code, out) == (1, "") and err.count("\n") == 1, err
    assert err.startswith("tidemark: ConfigError: TIDEMARK_UI_URL must be the Temporal Web UI's "
                          "address")
