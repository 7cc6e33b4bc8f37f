"""``tidemark demo``: the essay's morning on the embedded stack.

The supplier sync (tidemark/supplier_sync.py): 38 renames on the staging Drive, a Gmail mail
(39), a Microsoft Graph mail (40) and two Stripe payments (41, 42). The worker is SIGKILLed
during step 32, after the staging Drive applied the rename and before its outcome is journaled.
The demo prints the interruption report (32 rows, 31 confirmed, 1 in doubt, 39-42 provably not
attempted), starts a new worker, and checks from the staging effect log that every effect
happened exactly once. With ``third_party``, somebody renames an already-renamed file on the
Drive between the kill and the resume: the verification gate stops the task before any mail or
payment, naming that file.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tidemark.database import redacted
from tidemark.faults import CRASH_ENV
from tidemark.keys import key_for
from tidemark.needs import Act, command
from tidemark.report import build_report
from tidemark.settings import Settings, load_settings
from tidemark.store import JournalStore
from tidemark.supplier_sync import (
    RENAMES,
    effects_summary,
    file_id,
    final_name,
    seed_requests,
    supplier_sync_plan,
)
from tidemark.web_ui import workflow_url
from tidemark.words import TaskState
from tools.operate.commands import decide_approval
from tools.operate.starter import connect, start_plan
from tools.stack.devstack import DevStack
from workflows.outcome import run_result

# The demo's journal: a database of its own on the same Postgres server, so that its tasks never
# show in the inbox of the configured journal (rows are never deleted: the journal is also the
# audit trail).
DEMO_JOURNAL = "tidemark_demo"
KILL_AT = 32  # the essay's step: 31 confirmed, one in doubt, steps 39-42 provably not attempted
THIRD_PARTY_STEP = 7  # the file the supplier renames between the kill and the resume
THIRD_PARTY_NAME = "2026-Q3 supplier 07 invoice (revised by supplier).pdf"


@dataclass
class DemoOutcome:
    ok: bool
    task_id: str
    interrupted: dict[str, Any] = field(default_factory=dict)
    final: dict[str, Any] = field(default_factory=dict)
    effects: dict[str, Any] = field(default_factory=dict)
    checks: dict[str, bool] = field(default_factory=dict)
    run_url: str = ""  # the run's page in the Web UI, while the stack is up

    def as_json(self) -> dict[str, Any]:
        return {"interrupted": self.interrupted, "final": self.final, "effects": self.effects}


def _call(base: str, path: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method="GET" if body is None else "POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)


def _checks(third_party: bool, final: dict[str, Any], state: str, effects: dict[str, Any],
            names: dict[str, str]) -> dict[str, bool]:
    by = effects["by_target"]
    renamed_once = by.get("drive", {}).get("files.update") == RENAMES
    checks = {"no effect happened twice": effects["duplicates"] == 0,
              f"each of the {RENAMES} files renamed exactly once": renamed_once}
    if not third_party:
        checks["completed"] = state == TaskState.COMPLETED and final["confirmed"] == 42
        checks["every file has its final name"] = all(
            names[file_id(i)] == final_name(i) for i in range(1, RENAMES + 1))
        # One step per mail target: present, and no (target, operation, key) twice.
        checks["each mail sent once"] = bool(by.get("gmail")) and bool(by.get("graph"))
        checks["each payment created once"] = (
            by.get("stripe", {}).get("payment_intents.create") == 2)
    else:
        failures = ((final.get("verification") or {}).get("failures") or [])
        checks["the gate stopped the task"] = state == TaskState.VERIFICATION_FAILED
        checks[f"the gate named step {THIRD_PARTY_STEP} and only it"] = (
            [f["step"] for f in failures] == [THIRD_PARTY_STEP])
        checks["no mail and no payment"] = not ({"gmail", "graph", "stripe"} & set(by))
        checks["steps 39-42 provably not attempted"] = all(
            i["provably_not_attempted"] for i in final["irreversible"])
    return checks


async def _demo(stack: DevStack, kill_at: int, third_party: bool,
                say: Callable[[str], None]) -> DemoOutcome:
    assert stack.staging is not None
    base = stack.staging.url
    for path, body in seed_requests():
        _call(base, path, body)
    task_id = f"demo-{time.strftime('%Y%m%d-%H%M%S')}-{time.time_ns() % 10**6:06d}"
    doc = supplier_sync_plan(task_id)
    run_dir = stack.home / "demo" / task_id
    run_dir.mkdir(parents=True)
    (run_dir / "plan.json").write_text(json.dumps(doc, indent=2))
    say(f"plan: 42 steps ({RENAMES} renames on the staging Drive, a Gmail and a Graph mail, two "
        f"Stripe payments); saved as {run_dir / 'plan.json'}")

    doomed = stack.start_worker(**{CRASH_ENV: f"after_execute:{kill_at}"})
    client = await connect(load_settings(stack.env()))  # the worker's codec too
    handle = await start_plan(client, doc, task_id)
    say(f"started workflow tidemark-{task_id}; the worker will be SIGKILLed during step "
        f"{kill_at}, after the Drive renamed its file and before the outcome is journaled")
    t0 = time.monotonic()
    while doomed.poll() is None:
        await asyncio.sleep(0.05)
    killed_at = time.monotonic()
    with JournalStore(stack.db_url) as store:
        report = build_report(store, task_id)
        say(f"worker killed (exit {doomed.returncode}) after {killed_at - t0:.1f}s. The "
            f"journal, read by `tidemark status {task_id}`:")
        say(report.text())
        interrupted = report.as_json()
        if third_party:
            fid = file_id(THIRD_PARTY_STEP)
            _call(base, f"/_staging/drive/files/{fid}/third_party_rename",
                  {"name": THIRD_PARTY_NAME})
            say(f"meanwhile the supplier renames {fid} (step {THIRD_PARTY_STEP}, renamed by us "
                f"already) to {THIRD_PARTY_NAME!r}")
        stack.start_worker()
        say(f"a new worker started; Temporal retries step {kill_at}, whose probe finds the "
            "file renamed and stamped with our key; before step 39 the gate re-probes steps "
            "1-38")
        if await _reaches_approval(handle):
            approved = decide_approval(stack.db_url, task_id, "approve", "demo",
                                       "the demo's morning")
            await handle.signal("approval", {"decision": "approve", "by": approved["by"]})
            say(f"the gate passed and the run waits for a person to approve its irreversible "
                f"steps ({approved['glance']}); the demo approves as you, the journal's "
                f"approver on this stack (`{command(Act.APPROVE, task_id)}`)")
        result = await run_result(handle)
        say(f"workflow ended: {result.state}, {result.confirmed}/{result.steps} confirmed, "
            f"{result.resolved_by_probe} resolved by probe, {time.monotonic() - killed_at:.1f}s "
            "after the kill" + (f"\n  {result.error.get('message')}" if result.error else ""))
        final_report = build_report(store, task_id)
        say(final_report.text())
        final = final_report.as_json()
        keys = {key_for(task_id, n, s["action"], s["args"])
                for n, s in enumerate(doc["steps"], start=1)}
    effects = effects_summary(_call(base, "/_staging/effects"), keys)
    names = {f["id"]: f["name"] for f in _list_drive(base)}
    checks = _checks(third_party, final, result.state, effects, names)
    say(f"effects on the staging servers: {json.dumps(effects, sort_keys=True)}")
    for what, held in checks.items():
        say(f"  {'ok    ' if held else 'FAILED'} {what}")
    run_url = workflow_url(stack.ui_url, "default", f"tidemark-{task_id}",
                           (await handle.describe()).run_id)  # the Web UI's page is per run
    return DemoOutcome(ok=all(checks.values()), task_id=task_id, interrupted=interrupted,
                       final=final, effects=effects, checks=checks, run_url=run_url)


async def _reaches_approval(handle: Any) -> bool:
    """Waits until the run waits for approval (True) or has ended (False)."""
    while True:
        desc = await handle.describe()
        if desc.status is not None and desc.status.name != "RUNNING":
            return False
        if (await handle.query("status"))["state"] == TaskState.AWAITING_APPROVAL:
            return True
        await asyncio.sleep(0.2)


def _list_drive(base: str) -> list[dict[str, Any]]:
    """Every file on the staging Drive, through the Drive API with the read token."""
    from activities.drive import drive_client
    from staging.drive import DEFAULT_READ_TOKEN

    reader = drive_client(base, DEFAULT_READ_TOKEN)
    files: list[dict[str, Any]] = []
    token = None
    while True:
        page = reader.files().list(pageSize=1000, pageToken=token,
                                   fields="nextPageToken,files(id,name)").execute()
        files += page.get("files", [])
        token = page.get("nextPageToken")
        if not token:
            return files


def run_demo(*, kill_at: int = KILL_AT, third_party: bool = False, keep: bool = False,
             say: Callable[[str], None] = print, settings: Settings | None = None,
             ports: dict[str, int | None] | None = None) -> DemoOutcome:
    """Runs the demo on a stack of its own, in a journal of its own (DEMO_JOURNAL).

    It runs under ``settings`` (default: this process's environment's), on ``ports``
    (DevStack's port, ui_port, staging_port, codec_port and metrics_port; default: any free
    ports, no metrics). Its history and logs are in ``$TIDEMARK_HOME/demo``, beside a `tidemark
    dev` on the same home."""
    if not 1 <= kill_at <= RENAMES:
        raise ValueError(f"--kill-at must be a rename step, 1..{RENAMES}")
    if third_party and kill_at <= THIRD_PARTY_STEP:
        raise ValueError(f"--third-party renames step {THIRD_PARTY_STEP}'s file: --kill-at "
                         f"must come after it")
    # The essay's morning mails and pays once the gate passes and a person approved: the demo
    # approves as the person running it, who is the journal's approver on this stack.
    settings = settings or load_settings()
    chosen = {"port": 0, "ui_port": 0, "staging_port": 0, **(ports or {})}
    with DevStack(**chosen, with_worker=False, settings=settings,  # type: ignore[arg-type]
                  data_dir=settings.home / "demo", journal_name=DEMO_JOURNAL) as stack:
        metrics = f", metrics {stack.metrics_address}" if stack.metrics_address else ""
        say(f"stack: Temporal {stack.address}, Web UI {stack.ui_url}, staging "
            f"{stack.staging.url if stack.staging else '-'}{metrics}, journal (the demo's own) "
            f"{redacted(stack.db_url)}")
        outcome = asyncio.run(_demo(stack, kill_at, third_party, say))
        say(f"the demo's journal is its own, so no later inbox lists its task: "
            f"DATABASE_URL='{redacted(stack.db_url)}' tidemark status {outcome.task_id}")
        if keep:
            say(f"history in the Web UI: {outcome.run_url}")
            say("stack kept running for the Web UI; Ctrl-C stops it")
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
        else:
            say("the stack is stopped now, its Web UI too: `tidemark demo --keep` keeps it up to "
                "read the run's history there")
    return outcome

