"""`tidemark demo` end to end, with the figures read from `--json`.

It has its own embedded stack (Temporal dev server, staging servers, worker processes), the
journal in this test's database, the figures read from `--json`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import psycopg
import pytest

from activities.catalog import spec_registry
from helpers.ports import free_ports
from tidemark.database import ENV_HOME, ENV_URL
from tidemark.plan import load_plan_file
from tidemark.store import JournalStore
from tidemark.supplier_sync import effects_summary, supplier_sync_plan
from tools.cli.main import main
from tools.operate.inbox import inbox
from tools.stack.demo import DEMO_JOURNAL

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "supplier-sync.json"


@pytest.fixture
def home(tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "home"
    monkeypatch.setenv(ENV_HOME, str(path))
    monkeypatch.setenv(ENV_URL, db_url)
    return path


def demo_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[dict, str]:
    """The demo's --json document and its narration (stderr)."""
    code = main(["demo", "--json", *args])
    out = capsys.readouterr()
    assert code == 0, out.err[-3000:]
    return json.loads(out.out), out.err


def status_json(capsys: pytest.CaptureFixture[str], task_id: str) -> dict:
    """`tidemark status --json` of a demo task: in the demo's own journal."""
    with pytest.MonkeyPatch.context() as mp:
        demo_url = psycopg.conninfo.make_conninfo(os.environ[ENV_URL], dbname=DEMO_JOURNAL)
        mp.setenv(ENV_URL, demo_url)
        assert main(["status", task_id, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_checked_in_example_is_the_generator_output_and_the_essays_shape() -> None:
    doc = json.loads(EXAMPLE.read_text())
    assert doc == supplier_sync_plan()
    plan = load_plan_file(EXAMPLE, spec_registry())
    actions = [s.action for s in plan.steps]
    assert actions == ["drive.rename"] * 38 + ["gmail.send", "graph.send_mail",
                                               "stripe.payment_intent", "stripe.payment_intent"]
    assert plan.first_irreversible == 39


def test_demo_json_shows_the_morning_and_every_effect_once(
        home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    port, ui_port, staging_port, metrics_port = free_ports(4)
    data, said = demo_json(capsys, "--port", str(port), "--ui-port", str(ui_port),
                           "--staging-port", str(staging_port), "--metrics-port",
                           str(metrics_port))
    assert said.startswith(f"stack: Temporal 127.0.0.1:{port}, Web UI http://127.0.0.1:{ui_port}"
                           f", staging http://127.0.0.1:{staging_port}, metrics 127.0.0.1:"
                           f"{metrics_port}, "), said[:300]
    # Without --keep the stack is gone at the end: no link to it, but how to keep it.
    assert f":{ui_port}" not in said.split("\n", 1)[1], said
    assert said.rstrip("\n").splitlines()[-2:] == [
        "the stack is stopped now, its Web UI too: `tidemark demo --keep` keeps it up to read "
        "the run's history there", "demo: every check held"]
    interrupted, final, effects = data["interrupted"], data["final"], data["effects"]
    assert (interrupted["rows"], interrupted["confirmed"]) == (32, 31)
    assert interrupted["in_doubt"]["step"] == 32 and interrupted["state"] == "in_doubt"
    assert interrupted["not_started"] == 10 and interrupted["last_step"] == 32
    assert [(i["step"], i["action"], i["provably_not_attempted"])
            for i in interrupted["irreversible"]] == [
        (39, "gmail.send", True), (40, "graph.send_mail", True),
        (41, "stripe.payment_intent", True), (42, "stripe.payment_intent", True)]
    assert (final["state"], final["rows"], final["confirmed"]) == ("completed", 42, 42)
    assert final["in_doubt"] is None and final["verification"]["passed"] is True
    assert final["verification"]["verified"] == 38
    assert effects["duplicates"] == 0
    assert effects["by_target"]["drive"] == {"files.update": 38}
    assert effects["by_target"]["stripe"] == {"payment_intents.create": 2}
    # One step each for Gmail and Graph, and no (target, operation, key) twice: each mail
    # once, whatever operations the provider records for a send.
    assert set(effects["by_target"]) == {"drive", "gmail", "graph", "stripe"}
    # The status objects are exactly `tidemark status --json`.
    assert status_json(capsys, final["task_id"]) == final


def test_demo_third_party_rename_stops_the_task_at_the_gate_naming_the_file(
        home: Path, capsys: pytest.CaptureFixture[str], db_url: str) -> None:
    data, _ = demo_json(capsys, "--third-party")
    final, effects = data["final"], data["effects"]
    # A journal of its own: the inbox of the configured journal never lists the demo's task.
    with JournalStore(db_url) as store:
        store.migrate()  # as any journal in use is: the demo left it alone
        assert [e.task_id for e in inbox(store)] == []
    assert data["interrupted"]["in_doubt"]["step"] == 32
    assert final["state"] == "verification_failed"
    assert (final["rows"], final["confirmed"], final["last_step"]) == (38, 38, 38)
    [failure] = final["verification"]["failures"]
    assert failure["step"] == 7 and failure["args"]["file_id"] == "supplier-q3-scan-07"
    assert failure["observed"]["name"] == "2026-Q3 supplier 07 invoice (revised by supplier).pdf"
    assert all(i["provably_not_attempted"] for i in final["irreversible"])
    assert effects == {"total": 38, "duplicates": 0,
                       "by_target": {"drive": {"files.update": 38}}}
    assert status_json(capsys, final["task_id"]) == final


def test_effects_summary_counts_only_the_tasks_keys_and_each_repeat_as_a_duplicate() -> None:
    log = [{"target": "drive", "op": "files.update", "key": "k1"},
           {"target": "drive", "op": "files.update", "key": "k1"},  # the same effect twice
           {"target": "drive", "op": "third_party.rename", "key": None},
           {"target": "gmail", "op": "drafts.create", "key": "k2"},
           {"target": "gmail", "op": "messages.send", "key": "k2"},
           {"target": "stripe", "op": "payment_intents.create", "key": "other-task"}]
    assert effects_summary(log, {"k1", "k2"}) == {
        "total": 4, "duplicates": 1,
        "by_target": {"drive": {"files.update": 2},
                      "gmail": {"drafts.create": 1, "messages.send": 1}}}
