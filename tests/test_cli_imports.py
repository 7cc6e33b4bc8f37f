"""What a command imports: only what it needs.

`tidemark status` and `tidemark --help` read the journal or print a page, so they load no provider's
client library (Google's, Microsoft Graph's with kiota and azure, msal, Stripe's, nor httpx or
requests) nor the staging servers' aiohttp; `status` loads the journal's driver and what reads the
journal, nothing of the actions or the Temporal SDK, and `--help` not even the driver; a plan check
imports the action modules its plan names and no other; a worker imports a target's module where it
binds it.

Each command runs as the operator runs it, in a fresh process (a test process has imported
everything already), which reports its ``sys.modules`` at exit. How long they take is measured
in bench/cli_start.py, not here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from activities import wiring
from activities.catalog import BUILTIN_ACTIONS, spec_registry
from activities.fs import FsRename
from activities.wiring import STAGING_URL, worker_registry
from probes.fs import ROOTS_ENV
from staging.core import StagingServer
from tidemark import staging_tokens
from tidemark.actions import Action, ActionRef, Arg, ProbeResult, Registry, StepContext
from tidemark.errors import PlanError
from tidemark.plan import load_plan
from tidemark.run_step import run_step
from tidemark.store import JournalStore
from tools.operate import commands

ROOT = Path(__file__).resolve().parent.parent
# Top-level packages of the providers' client libraries (and the staging servers' web server).
SDK_PACKAGES = ("googleapiclient", "google_auth_httplib2", "httplib2", "msgraph", "msgraph_core",
                "azure", "msal", "stripe", "aiohttp")
# What a command that reads the journal has no use for, each a noticeable share of a start-up:
# the action and probe modules (a plan check loads those its plan names), the Temporal SDK
# (the commands that connect load it), and the HTTP clients the providers' SDKs use.
NOT_FOR_READING = ("activities", "probes", "temporalio", "httpx", "requests")
# What --help has no use for beyond that: the journal's driver and the store built on it,
# asyncio (the commands that talk to Temporal load it) and the installed package's metadata
# (read for --version only; it pulls in email, zipfile and csv). A command that reads the
# journal loads those two all the same: psycopg imports asyncio, and psycopg_binary reads its
# own version with importlib.metadata.
NOT_FOR_HELP = (*NOT_FOR_READING, "psycopg", "psycopg_pool", "tidemark.store", "asyncio",
                "importlib.metadata")
SDK_PREFIXES = ("kiota_",)  # kiota_abstractions, kiota_http, kiota_serialization_*, ...

# Runs `tidemark ARGS` through tools.cli.main, as the console script does, then writes the
# exit code and every module loaded to the file named first.
RUNNER = """
import json, sys
from tools.cli.main import main
out, argv = sys.argv[1], sys.argv[2:]
try:
    code = main(argv)
except SystemExit as e:  # argparse's --help
    code = e.code
with open(out, "w") as f:
    json.dump({"code": code, "modules": sorted(sys.modules)}, f)
"""


def loaded_of(modules: set[str], names: tuple[str, ...]) -> list[str]:
    """The modules of ``modules`` that are one of ``names`` or inside one."""
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


def sdk_modules(modules: set[str]) -> list[str]:
    return sorted(m for m in modules
                  if m.split(".")[0] in SDK_PACKAGES or m.startswith(SDK_PREFIXES))


def run_fresh(tmp_path: Path, code: str, *args: str, env: dict[str, str] | None = None
              ) -> tuple[Any, str, set[str]]:
    """(what ``code`` reported as its result, stdout, modules loaded) of a fresh process."""
    out = tmp_path / "modules.json"
    done = subprocess.run([sys.executable, "-c", code, str(out), *args], cwd=ROOT,
                          env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    return report["code"], done.stdout, set(report["modules"])


def every_provider_plan(tmp_path: Path, task_id: str) -> dict[str, Any]:
    """A plan that names an action of every built-in target, a rename first."""
    (tmp_path / "draft.txt").write_text("draft")
    return {"task_id": task_id, "steps": [
        {"action": "fs.rename", "args": {"path": str(tmp_path / "draft.txt"),
                                         "name": "final.txt"}},
        {"action": "drive.rename", "args": {"file_id": "f-1", "name": "final"}},
        {"action": "gmail.send", "args": {"to": "ana@example.com", "subject": "s",
                                          "body": "b"}},
        {"action": "graph.send_mail", "args": {"to": "bo@example.com", "subject": "s",
                                               "body": "b"}},
        {"action": "stripe.payment_intent", "args": {"amount": 1200, "currency": "eur",
                                                     "customer": "cus_1"}},
    ]}


def test_status_of_a_task_of_every_provider_loads_no_provider_sdk(
        store: JournalStore, db_url: str, tmp_path: Path) -> None:
    plan = load_plan(every_provider_plan(tmp_path, "imports-1"), spec_registry())
    store.persist_plan(plan)
    run_step(store, Registry([FsRename([tmp_path])]), "imports-1", 1)
    code, out, modules = run_fresh(tmp_path, RUNNER, "status", "imports-1",
                                   env={"DATABASE_URL": db_url})
    assert code == 0
    assert "task imports-1" in out and "confirmed      1" in out, out
    assert "tools.cli.main" in modules and "psycopg" in modules  # it did read the journal
    assert sdk_modules(modules) == []
    assert loaded_of(modules, NOT_FOR_READING) == []


def test_help_loads_no_provider_sdk_nor_the_journals_driver(tmp_path: Path) -> None:
    code, out, modules = run_fresh(tmp_path, RUNNER, "--help")
    assert code == 0 and "status" in out
    assert sdk_modules(modules) == []
    assert loaded_of(modules, NOT_FOR_HELP) == []
    code, out, modules = run_fresh(tmp_path, RUNNER, "--version")  # what the metadata is for
    assert code == 0 and out.startswith("tidemark ") and "importlib.metadata" in modules


def test_status_reads_a_journal_it_may_not_write(store: JournalStore, db_url: str,
                                                 tmp_path: Path) -> None:
    """`status` only reads, so it answers from a database that refuses every write.

    Such a database is a hot standby or a read-only role. It does not bring the schema up to date
    on its way, which is `tidemark db migrate`'s and a worker's job."""
    doc = every_provider_plan(tmp_path, "imports-6")
    store.persist_plan(load_plan({**doc, "steps": doc["steps"][:2]}, spec_registry()))
    run_step(store, Registry([FsRename([tmp_path])]), "imports-6", 1)
    read_only = psycopg.conninfo.make_conninfo(db_url,
                                               options="-c default_transaction_read_only=on")
    done = subprocess.run([sys.executable, "-m", "tools.cli.main", "status", "imports-6"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "DATABASE_URL": read_only})
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert done.stdout.startswith("Task imports-6 needs nothing from a person (partial).\n")
    assert "confirmed      1" in done.stdout


def test_status_on_a_schema_older_than_the_command_reads_it_or_names_the_migration(
        store: JournalStore, db_url: str, tmp_path: Path) -> None:
    """`status` reads a schema older than the command, or names the migration it needs.

    A journal whose schema predates this version (workers of the old version still run) is
    not brought up to date by a read. `status` answers from it while what it reads is there (the
    newest migration's column is not); when a column it reads is missing it says in one line
    what brings the schema up to date, not a driver's traceback."""
    doc = every_provider_plan(tmp_path, "imports-7")
    store.persist_plan(load_plan({**doc, "steps": doc["steps"][:1]}, spec_registry()))
    run_step(store, Registry([FsRename([tmp_path])]), "imports-7", 1)
    status = [sys.executable, "-m", "tools.cli.main", "status", "imports-7"]
    env = {**os.environ, "DATABASE_URL": db_url}
    with psycopg.connect(db_url, autocommit=True) as conn:  # the schema as 0013 left it
        conn.execute("ALTER TABLE tidemark.journal DROP COLUMN owner")
        conn.execute("DELETE FROM tidemark.schema_migrations WHERE version = 14")
    done = subprocess.run(status, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert (done.returncode, done.stderr) == (0, "") and "confirmed      1" in done.stdout
    with psycopg.connect(db_url, autocommit=True) as conn:  # older still: no attempt lease
        conn.execute("ALTER TABLE tidemark.journal DROP COLUMN lease_until CASCADE")
    done = subprocess.run(status, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == ("tidemark: the journal database's schema is older than this "
                           "version of Tidemark: `tidemark db migrate` brings it up to date "
                           "(a worker does on start)\n")
    with psycopg.connect(db_url) as conn:  # and nothing was written on the way
        assert conn.execute("SELECT count(*) FROM tidemark.schema_migrations"
                            " WHERE version = 14").fetchone() == (0,)


def temporal_modules(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] == "temporalio")


# A Temporal profile that cannot be loaded: the file it names does not exist.
BAD_PROFILE = {"TEMPORAL_CONFIG_FILE": "/nonexistent/temporal.toml"}


def test_a_command_that_reads_the_journal_loads_no_temporal_sdk_nor_its_profile(
        store: JournalStore, db_url: str, tmp_path: Path) -> None:
    """A command that reads the journal loads neither the Temporal SDK nor its profile.

    `status` reads Postgres only. temporalio (a quarter of a command's start-up, for its profile
    loader) is not imported, and a profile that would not load does not stop it."""
    doc = every_provider_plan(tmp_path, "imports-4")
    store.persist_plan(load_plan({**doc, "steps": doc["steps"][:1]}, spec_registry()))
    run_step(store, Registry([FsRename([tmp_path])]), "imports-4", 1)
    code, out, modules = run_fresh(tmp_path, RUNNER, "status", "imports-4",
                                   env={"DATABASE_URL": db_url, **BAD_PROFILE})
    assert code == 0 and "confirmed      1" in out, out
    assert temporal_modules(modules) == []


def test_a_command_that_connects_refuses_a_bad_profile_before_it_changes_anything(
        store: JournalStore, db_url: str, tmp_path: Path) -> None:
    """A command that connects refuses a bad profile before it changes anything.

    `reject` journals the decision, then tells the waiting run through Temporal: its profile
    is loaded when the command starts, so a bad one is one line and a non-zero exit, and the
    decision is not journaled (loaded at the connection, it would be, and the run never told)."""
    doc = every_provider_plan(tmp_path, "imports-5")
    store.persist_plan(load_plan({**doc, "steps": [doc["steps"][0], doc["steps"][4]]},
                                 spec_registry()))
    store.ask_approval("imports-5", "every", [commands.os_user()], [2], ["a payment"])
    done = subprocess.run([sys.executable, "-m", "tools.cli.main", "reject", "imports-5",
                           "--reason", "test"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "DATABASE_URL": db_url, **BAD_PROFILE})
    assert done.returncode == 1
    assert done.stderr == (
        "tidemark: ConfigError: TEMPORAL_CONFIG_FILE names /nonexistent/temporal.toml, which "
        "is not a file: point it at your temporal.toml, or unset it to use the `temporal` "
        "CLI's default\n")
    assert store.current_decision("imports-5") is None


def test_a_plan_check_imports_the_modules_of_the_actions_it_names_only(tmp_path: Path) -> None:
    doc = every_provider_plan(tmp_path, "imports-2")
    renames = tmp_path / "renames.json"
    renames.write_text(json.dumps({**doc, "steps": doc["steps"][:1]}))
    code, out, modules = run_fresh(tmp_path, RUNNER, "plan", "check", str(renames))
    assert (code, out.split(",")[0]) == (0, "ok: task imports-2")
    assert sdk_modules(modules) == []
    assert "activities.stripe" not in modules and "tidemark_ledger.action" not in modules

    payment = tmp_path / "payment.json"
    payment.write_text(json.dumps({**doc, "steps": doc["steps"][4:]}))
    code, out, modules = run_fresh(tmp_path, RUNNER, "plan", "check", str(payment))
    assert (code, out.split(",")[0]) == (0, "ok: task imports-2")
    loaded = {m.split(".")[0] for m in sdk_modules(modules)}
    assert "stripe" in loaded and not loaded & {"googleapiclient", "msgraph", "msal"}, loaded


def test_an_unknown_action_is_refused_naming_every_known_one(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"task_id": "imports-3",
                                "steps": [{"action": "fs.shred", "args": {}}]}))
    with pytest.raises(PlanError) as e:
        commands.plan_check(path)
    assert str(e.value) == (
        "steps[0].action: unknown action 'fs.shred'; known: drive.rename, fs.rename, "
        "gmail.send, graph.send_mail, ledger.post_invoice, stripe.payment_intent")


WORKER = """
import json, os, sys
from activities.wiring import worker_registry
registry = worker_registry(os.environ)
with open(sys.argv[1], "w") as f:
    json.dump({"code": registry.names(), "modules": sorted(sys.modules)}, f)
"""


def test_a_worker_imports_a_targets_sdk_only_where_it_binds_it(server: StagingServer,
                                                               tmp_path: Path) -> None:
    names, _, modules = run_fresh(tmp_path, WORKER, env={ROOTS_ENV: str(tmp_path),
                                                         STAGING_URL: ""})
    assert names == sorted([*BUILTIN_ACTIONS, "ledger.post_invoice"])  # plans still validate
    assert sdk_modules(modules) == []
    names, _, modules = run_fresh(tmp_path, WORKER, env={
        "TIDEMARK_STRIPE_URL": server.url, STAGING_URL: "",
        "TIDEMARK_STRIPE_WRITE_TOKEN": staging_tokens.STRIPE_SECRET,
        "TIDEMARK_STRIPE_READ_TOKEN": staging_tokens.STRIPE_READ})
    assert "stripe.payment_intent" in names
    loaded = {m.split(".")[0] for m in sdk_modules(modules)}
    # Nor the Google transport: the worker's activities reach the grants through
    # activities.acting, which imports no client library.
    assert loaded == {"stripe"}, loaded
    assert not [m for m in modules if m.startswith(SDK_PREFIXES)]


def test_the_wirings_default_timeout_is_the_client_modules() -> None:
    from activities.stripe import DEFAULT_TIMEOUT
    from probes import google_http, graph

    assert wiring.DEFAULT_TIMEOUT_S == google_http.DEFAULT_TIMEOUT_S == graph.DEFAULT_TIMEOUT_S \
        == DEFAULT_TIMEOUT
    assert wiring.timeout_s({}, "stripe") == DEFAULT_TIMEOUT


def test_a_staging_worker_binds_every_action(server: StagingServer, tmp_path: Path) -> None:
    registry = worker_registry({STAGING_URL: server.url, ROOTS_ENV: str(tmp_path)})
    assert registry.names() == sorted([*BUILTIN_ACTIONS, "ledger.post_invoice"])
    for name in registry.names():
        bound = registry.bound(name)
        assert bound.name == name and registry.spec(name) is type(bound)


# -- the registry's references -----------------------------------------------------------------

class Probed(Action):
    name = "test.probed"
    irreversible = True
    args = {"n": Arg(int)}

    def probe(self, ctx: StepContext) -> ProbeResult:
        return ProbeResult.absent("never ran")

    def execute(self, ctx: StepContext) -> dict[str, Any]:
        return {}


class Unprobed(Action):
    name = "test.unprobed"
    irreversible = True

    def execute(self, ctx: StepContext) -> dict[str, Any]:
        return {}


def test_a_reference_is_loaded_once_and_checked_as_a_class_is() -> None:
    calls: list[str] = []

    def load() -> type[Action]:
        calls.append("load")
        return Probed

    registry = Registry([ActionRef("test.probed", load)])
    assert registry.names() == ["test.probed"] and calls == []  # known, not imported
    assert registry.spec("test.probed") is Probed
    assert registry.spec("test.probed") is Probed and calls == ["load"]
    assert registry.spec("test.other") is None
    with pytest.raises(TypeError, match="without a probe cannot be registered"):
        Registry([ActionRef("test.unprobed", lambda: Unprobed)]).spec("test.unprobed")
    with pytest.raises(TypeError, match=r"Probed is named 'test\.probed'"):
        Registry([ActionRef("test.renamed", lambda: Probed)]).spec("test.renamed")
    with pytest.raises(ModuleNotFoundError):
        Registry([ActionRef.at("test.gone", "activities.no_such_module:Gone")]).spec("test.gone")


def test_the_last_registration_of_a_name_stands() -> None:
    later = Registry([ActionRef("test.probed", lambda: Unprobed), Probed])
    assert later.spec("test.probed") is Probed  # the reference is never loaded
    earlier = Registry([Probed, ActionRef.at("fs.rename", "activities.fs:FsRename")])
    assert earlier.spec("fs.rename") is FsRename and earlier.names() == ["fs.rename",
                                                                         "test.probed"]
