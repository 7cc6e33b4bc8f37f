"""Screenshots of the Temporal Web UI for docs/who-needs-me.md (a documentation tool, not CI).

Starts the embedded stack (tools/stack/devstack.py: dev server and Web UI, Postgres, staging
servers) with the test worker (tests/helpers/worker_main.py, which binds the test action
``ledger.record``), brings seven tasks to a completed, a halted, an awaiting-approval, a
needs-a-decision, a killed, an unwound and a resumed-then-completed state
(tests/helpers/worklist.py), and photographs
with headless Chromium the workflow list (all runs), the worklist (the runs that need a
person), the details of the run that waits for approval, a halted run's failure and the
worklist row of the task that needs a decision. Run it from the repository root::

    python -m dev.screenshots --browser-python /tmp/shots-venv/bin/python

The browser is driven by the ``playwright`` package in whichever Python ``--browser-python``
names (a venv of its own: ``python -m venv /tmp/shots-venv && /tmp/shots-venv/bin/pip install
playwright``), with the system's Chromium (``apt-get install chromium``), so neither is a
dependency of Tidemark. The PNGs go to docs/img/.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
OUT = ROOT / "docs" / "img"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1600, "height": 1000}
# The worklist's columns, as the Web UI's column settings keep them once a person added them:
# in the browser's local storage, per namespace (the link and a saved view carry the filter
# only; docs/who-needs-me.md). The shots after the worklist's have them too.
WORKLIST_COLUMNS = ["Status", "Workflow ID", "TidemarkNeeds", "TidemarkState", "TidemarkTaskId",
                    "Start"]
COLUMNS_KEY = "namespace-workflow-table-columns"
# The browser half runs in the other Python: standard library and playwright only.
SHOOT = """
import json, sys
from playwright.sync_api import sync_playwright
job = json.loads(sys.argv[1])
with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=job["chromium"], args=job["args"])
    page = browser.new_page(viewport=job["viewport"])
    for shot in job["shots"]:
        for key, value in shot.get("storage", {}).items():  # before the page's own scripts
            page.add_init_script(
                f"window.localStorage.setItem({json.dumps(key)}, {json.dumps(value)});")
        page.goto(shot["url"], wait_until="networkidle")
        page.wait_for_timeout(shot.get("settle_ms", 2500))
        if shot.get("click"):
            page.get_by_text(shot["click"], exact=True).first.click()
            page.wait_for_timeout(1500)
        page.screenshot(path=shot["path"], full_page=False)
        print("wrote", shot["path"])
    browser.close()
"""


def shoot(browser_python: str, shots: list[dict[str, Any]]) -> None:
    job = {"chromium": CHROMIUM, "args": CHROMIUM_ARGS, "viewport": VIEWPORT, "shots": shots}
    subprocess.run([browser_python, "-c", SHOOT, json.dumps(job)], check=True, timeout=300)


async def scene(stack: Any, home: Path) -> dict[str, str]:
    """The seven tasks on the stack; returns their ids by state."""
    from helpers.worklist import make_tasks
    from tidemark.approval import unattended
    from tidemark.settings import load_settings
    from tidemark.store import JournalStore
    from tools.operate.starter import connect

    client = await connect(load_settings(stack.env()))  # the stack's payload key
    store = JournalStore(stack.db_url).open()
    try:
        store.migrate()
        unattended(store, "screenshots")  # a scratch journal: unattended
        return await make_tasks(client, store, "tidemark", home / "tasks", prefix="q3")
    finally:
        store.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--browser-python", default=sys.executable,
                    help="a Python with the playwright package (default: this one)")
    ap.add_argument("--keep", action="store_true", help="keep the stack up until Ctrl-C")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(TESTS))  # tests/helpers: the worklist scene and the test worker
    from psycopg.conninfo import conninfo_to_dict

    from tidemark.settings import load_settings
    from tools.operate.inbox import web_ui_url
    from tools.stack.devstack import DevStack

    home = Path(tempfile.mkdtemp(prefix="tidemark-shots-"))
    env = {**os.environ, "TIDEMARK_HOME": str(home), "TIDEMARK_EMBEDDED_DB": "1"}
    stack = DevStack(port=0, ui_port=0, staging_port=0, with_worker=False,
                     settings=load_settings(env), home=home,
                     worker_env={"TIDEMARK_APPROVAL": "none",
                                 "TIDEMARK_LOG_LEVEL": "WARNING",
                                 "TIDEMARK_FS_ROOTS": str(home), "PYTHONPATH": str(ROOT)})
    with stack:
        # `tidemark approve` of the scene decides as the journal's login role (postgres, when
        # the embedded Postgres runs as root): the approver the worker names.
        stack.worker_env["TIDEMARK_APPROVERS"] = str(
            conninfo_to_dict(stack.db_url).get("user") or getpass.getuser())
        stack.worker = subprocess.Popen(
            [sys.executable, str(TESTS / "helpers" / "worker_main.py")], env=stack.env(),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        stack._procs.append(stack.worker)
        # `tidemark kill|unwind` and the step processes of the scene
        os.environ.update({"DATABASE_URL": stack.db_url, "TIDEMARK_FS_ROOTS": str(home)})
        ids = asyncio.run(scene(stack, home))
        OUT.mkdir(parents=True, exist_ok=True)
        waiting = f"tidemark-{ids['awaiting_approval']}"
        base = f"{stack.ui_url}/namespaces/default/workflows"
        shoot(a.browser_python, [  # a fresh server: the list holds this scene's runs only
            {"url": base,
             "path": str(OUT / "web-ui-all-runs.png")},
            {"url": stack.needs_url, "path": str(OUT / "web-ui-needs-a-person.png"),
             "storage": {COLUMNS_KEY: json.dumps(
                 {"default": [{"label": c} for c in WORKLIST_COLUMNS]})}},
            # the run's current details (the one sentence first) are on its User Metadata tab
            {"url": f"{base}/{waiting}", "click": "User Metadata",
             "path": str(OUT / "web-ui-awaiting-approval-details.png")},
            {"url": f"{base}/tidemark-{ids['halted']}",
             "path": str(OUT / "web-ui-halted.png")},
            # the worklist row of the task that needs a decision: its summary is the sentence
            {"url": f"{base}/tidemark-needs-{ids['needs_decision']}", "click": "User Metadata",
             "path": str(OUT / "web-ui-needs-decision-row.png")},
        ])
        print(json.dumps(ids, indent=2))
        print("worklist:", web_ui_url(stack.ui_url, "default"))
        if a.keep:
            with contextlib.suppress(EOFError, KeyboardInterrupt):
                input("stack up; Enter stops it\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
