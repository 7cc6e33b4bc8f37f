"""The `tidemark` command: one-line errors, non-zero exits, --json, and the three decisions.

One-line errors, non-zero exits, --json where output is data, and the three decisions (resume,
unwind, stop) against a real Temporal dev server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from activities.catalog import spec_registry
from helpers.ledger import LedgerRecord, ledger_lines
from helpers.steps import crash_at
from tidemark.actions import Registry
from tidemark.errors import NeedsDecision
from tidemark.payloads import RunResult
from tidemark.plan import load_plan
from tidemark.run_step import run_step
from tidemark.store import JournalStore
from tools.cli.main import main
from workflows.outcome import run_result


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, db_url: str) -> str:
    monkeypatch.setenv("DATABASE_URL", db_url)
    return db_url


def write_plan(tmp_path: Path, doc: object) -> str:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    return str(path)


def renames(tmp_path: Path, n: int, task_id: str = "cli-1") -> dict:
    for i in range(n):
        (tmp_path / f"d{i}.txt").write_text(str(i))
    return {"task_id": task_id, "steps": [
        {"action": "fs.rename", "args": {"path": str(tmp_path / f"d{i}.txt"),
                                         "name": f"f{i}.txt"}} for i in range(n)]}


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for command in ("db", "plan", "status", "stop", "release", "resume", "unwind", "dev",
                    "staging", "demo", "approve", "reject"):
        assert command in out


def test_db_migrate_then_up_to_date(env: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db", "migrate"]) == 0
    assert "applied: 0001_journal.sql" in capsys.readouterr().out
    assert main(["db", "migrate", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"applied": []}


def test_plan_check_text_json_and_sort(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    doc = {"task_id": "p1", "steps": [
        {"action": "gmail.send", "args": {"to": "a@example.com", "subject": "s", "body": "b"}},
        {"action": "fs.rename", "args": {"path": "/d/a.txt", "name": "b.txt"}}]}
    path = write_plan(tmp_path, doc)
    assert main(["plan", "check", path]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tidemark: PlanError: steps[1]: reversible")
    assert main(["plan", "check", path, "--sort"]) == 0
    sorted_plan = json.loads(capsys.readouterr().out)
    assert [s["action"] for s in sorted_plan["steps"]] == ["fs.rename", "gmail.send"]
    assert sorted_plan["steps"][1]["args"]["to"] == ["a@example.com"]  # normalised
    path2 = write_plan(tmp_path, sorted_plan)
    assert main(["plan", "check", path2]) == 0
    assert capsys.readouterr().out.startswith("ok: task p1, 2 steps")
    assert main(["plan", "check", path2, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["steps"], summary["first_irreversible"]) == (2, 2)


@pytest.mark.parametrize(("doc", "message", "code"), [
    # a file that is not JSON is bad input, refused where it enters (tidemark.limits): exit 2
    ("{not json", "tidemark: plan: not JSON: Expecting property name", 2),
    ({"steps": [{"action": "fs.frobnicate", "args": {}}]}, "unknown action 'fs.frobnicate'", 1),
    ({"steps": []}, "steps: the plan is empty", 1),
])
def test_bad_plans_give_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                 doc: object, message: str, code: int) -> None:
    path = tmp_path / "bad.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    assert main(["plan", "check", str(path)]) == code
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_traceback_flag_shows_the_trace(tmp_path: Path) -> None:
    path = write_plan(tmp_path, {"steps": []})
    with pytest.raises(Exception, match="the plan is empty"):
        main(["--traceback", "plan", "check", path])


def test_status_stop_release(env: str, store: JournalStore, tmp_path: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "nope"]) == 1
    assert "UnknownTask: no plan is stored for task 'nope'" in capsys.readouterr().err
    store.persist_plan(load_plan(renames(tmp_path, 2), spec_registry()))
    assert main(["status", "cli-1"]) == 0
    text = capsys.readouterr().out
    assert "task cli-1  (not_started)" in text and "not started    2 (steps 1-2)" in text
    # Temporal is not there: the stop is journaled all the same, and one line says that the
    # task's row of the Web UI's worklist (if it has one) was not told
    assert main(["stop", "cli-1", "--reason", "audit", "--by", "alice",
                 "--address", "127.0.0.1:1"]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "tidemark: the Web UI's worklist rows of cli-1 were not brought in line "
        "(TemporalUnavailable: cannot reach Temporal at 127.0.0.1:1"), err
    assert "`tidemark inbox` reads the journal, which has the decision" in err
    assert main(["status", "cli-1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["state"] == "stopped" and report["stop"]["set_by"] == "alice"
    assert main(["release", "cli-1", "--by", "bob"]) == 0
    assert store.progress("cli-1").stop is None
    assert [e["actor"] for e in store.events("cli-1") if e["kind"] in ("stop", "release")] == [
        "alice", "bob"]


async def test_resume_and_unwind_through_temporal(
        env: str, store: JournalStore, temporal_env: WorkflowEnvironment, workers,
        task_queue: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    workers.start()
    address = workers.env["TEMPORAL_ADDRESS"]
    doc = renames(tmp_path, 3, "cli-2")
    doc["steps"].append({"action": "ledger.record",
                         "args": {"ledger": str(tmp_path / "ledger"), "entry": "mail"}})
    handle = await temporal_env.client.start_workflow(
        "RunPlan", doc, id="tidemark-cli-2", task_queue=task_queue, result_type=RunResult)
    assert (await run_result(handle)).state == "completed"
    flags = ["--address", address, "--task-queue", task_queue, "--wait"]

    # Without --yes, unwind only shows what it would do, and changes nothing.
    assert main(["unwind", "cli-2", *flags]) == 2
    preview = json.loads(capsys.readouterr().out)
    assert preview["undo_steps"] == [3, 2, 1]
    assert preview["irreversible_done"] == [{"step": 4, "action": "ledger.record"}]
    assert store.progress("cli-2").stop is None

    # A completed task resumed acts on nothing.
    # The CLI runs its own event loop, so it is called from a thread here.
    assert await asyncio.to_thread(main, ["resume", "cli-2", *flags]) == 0
    assert json.loads(capsys.readouterr().out)["executed"] == 0

    assert await asyncio.to_thread(main, ["unwind", "cli-2", "--yes", *flags]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["state"] == "unwound" and result["undone"] == [3, 2, 1]
    assert result["irreversible_done"] == ["4 ledger.record"]
    assert sorted(p.name for p in tmp_path.glob("*.txt")) == ["d0.txt", "d1.txt", "d2.txt"]
    assert len(ledger_lines(tmp_path / "ledger")) == 1  # the mail is reported, not recalled
    assert store.progress("cli-2").stop is not None  # an unwound task stays stopped


def test_temporal_unreachable_is_one_line(env: str, store: JournalStore, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    store.persist_plan(load_plan(renames(tmp_path, 1, "cli-3"), spec_registry()))
    assert main(["resume", "cli-3", "--address", "127.0.0.1:1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tidemark: TemporalUnavailable: cannot reach Temporal at 127.0.0.1:1")


def _in_doubt_with_unreadable_target(store: JournalStore, db_url: str, tmp_path: Path,
                                     task_id: str) -> Path:
    """A ledger step in doubt whose probe cannot tell while the returned file exists."""
    blind = tmp_path / f"{task_id}-blind"
    blind.write_text("")
    doc = {"task_id": task_id, "steps": [{"action": "ledger.record", "args": {
        "ledger": str(tmp_path / f"{task_id}-ledger"), "entry": "e", "blind_while": str(blind)}}]}
    store.persist_plan(load_plan(doc, spec_registry(LedgerRecord)))
    crash_at(db_url, task_id, 1, "after_intent")  # fails unless it was killed there
    return blind


def test_resolve_absent_lets_a_person_unblock_an_undecidable_step(
        env: str, store: JournalStore, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    _in_doubt_with_unreadable_target(store, env, tmp_path, "cli-4")
    registry = Registry([LedgerRecord()])
    with pytest.raises(NeedsDecision):
        run_step(store, registry, "cli-4", 1)
    assert main(["resolve", "cli-4", "--step", "1", "--as", "absent"]) == 2  # needs --yes
    assert main(["resolve", "cli-4", "--step", "2", "--as", "absent", "--yes"]) == 1
    assert "step 2 is not in doubt (step 1 (do) is)" in capsys.readouterr().err
    assert main(["resolve", "cli-4", "--step", "1", "--as", "absent", "--yes", "--by", "carol",
                 "--note", "checked the ledger host: nothing written"]) == 0
    capsys.readouterr()
    result = run_step(store, registry, "cli-4", 1)  # the probe still cannot tell: her word
    assert (result.status, result.resolved_by) == ("done", "execute")
    assert len(ledger_lines(tmp_path / "cli-4-ledger")) == 1
    assert main(["journal", "cli-4"]) == 0
    out = capsys.readouterr().out
    assert "decision" in out and "(carol)" in out and "probe" in out


def test_resolve_done_records_the_operator_as_resolver(
        env: str, store: JournalStore, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    _in_doubt_with_unreadable_target(store, env, tmp_path, "cli-5")
    assert main(["resolve", "cli-5", "--step", "1", "--as", "done", "--yes", "--by", "dan"]) == 0
    row = store.step_row("cli-5", 1)
    assert row is not None and (row.status, row.resolved_by) == ("done", "operator")
    assert row.outcome == {"operator": "dan", "note": ""}
    capsys.readouterr()
    assert main(["journal", "cli-5", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["resolved_by"] for r in data["rows"]] == ["operator"]
    assert [(e["kind"], e["actor"]) for e in data["events"]][-1] == ("decision", "dan")


# -- stop and release name a task that exists, or --all -------------------------------------

def test_stop_refuses_a_task_id_that_names_no_task(env: str, store: JournalStore,
                                                   tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    store.persist_plan(load_plan(renames(tmp_path, 1, "sync-7"), spec_registry()))
    assert main(["stop", "sync-l"]) == 1  # a typo of sync-7
    err = capsys.readouterr().err
    assert err.startswith("tidemark: UnknownStopTarget: no task 'sync-l' is known")
    assert "--force-unknown" in err and err.count("\n") == 1
    assert store.stop_state("sync-l") is None and store.stop_state("sync-7") is None
    assert main(["release", "sync-l"]) == 1
    assert "no task 'sync-l'" in capsys.readouterr().err


def test_an_unquoted_star_expanded_by_the_shell_is_refused(
        env: str, store: JournalStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    store.persist_plan(load_plan(renames(tmp_path, 1, "sync-8"), spec_registry()))
    work = tmp_path / "cwd"
    work.mkdir()
    (work / "plan.json").write_text("{}")
    monkeypatch.chdir(work)
    assert main(["stop", "plan.json"]) == 1  # `tidemark stop *` in a folder with one file
    err = capsys.readouterr().err
    assert "'plan.json' is a file here: did the shell expand an unquoted *?" in err
    assert "tidemark stop --all" in err
    assert store.stop_state("plan.json") is None and store.stop_state("*") is None
    with pytest.raises(SystemExit) as e:  # two files: argparse refuses the extra argument
        main(["stop", "plan.json", "notes.txt"])
    assert e.value.code == 2


def test_stop_all_and_force_unknown(env: str, store: JournalStore, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    store.persist_plan(load_plan(renames(tmp_path, 1, "sync-9"), spec_registry()))
    assert main(["stop"]) == 2  # neither a task nor --all
    assert main(["stop", "sync-9", "--all"]) == 2
    assert "not both" in capsys.readouterr().err
    assert main(["stop", "--all", "--reason", "incident 12"]) == 0
    assert "every task is stopped" in capsys.readouterr().out
    stop = store.stop_state("sync-9")
    assert stop is not None and (stop["scope"], stop["reason"]) == ("*", "incident 12")
    assert main(["release", "--all"]) == 0
    assert store.stop_state("sync-9") is None
    assert main(["stop", "*"]) == 0  # '*' quoted still means every task
    assert store.stop_state("anything") is not None
    assert main(["release", "*"]) == 0

    # A task whose plan has not arrived yet can be stopped on purpose, then released by name.
    assert main(["stop", "not-yet-1", "--force-unknown"]) == 0
    assert store.stop_state("not-yet-1") is not None
    assert main(["stop", "bad id!", "--force-unknown"]) == 1
    assert "not a valid task id" in capsys.readouterr().err
    assert main(["release", "not-yet-1"]) == 0
    assert store.stop_state("not-yet-1") is None


def test_resume_under_a_global_stop_refuses_and_releases_nothing(
        env: str, store: JournalStore, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    store.persist_plan(load_plan(renames(tmp_path, 1, "sync-10"), spec_registry()))
    assert main(["stop", "sync-10", "--reason", "mine"]) == 0
    assert main(["stop", "--all", "--reason", "incident 12", "--by", "erin"]) == 0
    capsys.readouterr()
    assert main(["resume", "sync-10", "--address", "127.0.0.1:1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tidemark: GloballyStopped: every task is stopped (by erin: "
                          "incident 12); nothing was released or started")
    assert "release --all" in err
    own = [e for e in store.events("sync-10") if e["kind"] == "release"]
    assert own == []  # the task's own stop was not released either
    assert main(["release", "--all"]) == 0
    stop = store.stop_state("sync-10")
    assert stop is not None and stop["scope"] == "sync-10"
