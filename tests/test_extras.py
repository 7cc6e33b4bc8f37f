"""Install what you use: each provider's client library is an extra.

The extras are those of the distribution (docs/install.md), so a base install
(``pip install tidemark``) has none of them.

Each check runs in a fresh process in which the missing libraries are made absent the way Python
meets an absent package: a finder first on ``sys.meta_path`` raises ModuleNotFoundError for
their modules (nothing is uninstalled). It covers the three promises: a worker binds what is
installed and names the extra of what it left out, a plan that needs a missing library is
refused at its validation naming the extra, and a base install's commands and worker import no
provider's library at all.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from activities.fs import FsRename
from activities.wiring import STAGING_URL
from probes.fs import ROOTS_ENV
from staging.core import StagingServer
from tidemark.actions import Registry
from tidemark.plan import load_plan
from tidemark.run_step import run_step
from tidemark.store import JournalStore

ROOT = Path(__file__).resolve().parent.parent

# What a base install lacks that `pip install '.[all]'` has, by extra: the top-level modules (and
# the parts of the namespace package ``google`` beside protobuf's) found in a venv of the one
# and not of the other, compared once by listing their site-packages. SHARED come with more
# than one extra (requests: Google's, msal, Stripe's); HTTPX with Google's (the awaited
# requests, probes/google_async.py), Microsoft's (kiota) and Stripe's (its asynchronous client);
# AIOHTTP_OTEL with Microsoft's (kiota) and with the staging and otel extras.
GOOGLE_ONLY = (
    "googleapiclient", "apiclient", "google_auth_httplib2", "httplib2", "uritemplate",
    "google.auth", "google.oauth2", "google.api_core", "google.api", "google.cloud",
    "google.gapic", "google.logging", "google.longrunning", "google.rpc", "google.type", "proto",
    "pyasn1", "pyasn1_modules", "pyparsing")
MICROSOFT_ONLY = (
    "msgraph", "msgraph_core", "kiota_abstractions", "kiota_authentication_azure", "kiota_http",
    "kiota_serialization_form", "kiota_serialization_json", "kiota_serialization_multipart",
    "kiota_serialization_text", "stduritemplate", "azure", "msal", "msal_extensions", "jwt",
    "h2", "hpack", "hyperframe")
# cryptography (and its cffi) came with Microsoft's libraries; the payload codec
# (tidemark/codec.py) makes it part of a base install.
HTTPX = ("httpx", "httpcore", "h11", "anyio")
STRIPE_ONLY = ("stripe",)
SHARED = ("requests", "urllib3", "charset_normalizer", "idna", "certifi")
AIOHTTP_OTEL = ("aiohttp", "aiohappyeyeballs", "aiosignal", "attr", "attrs", "frozenlist",
                "multidict", "propcache", "yarl", "opentelemetry")
ABSENT_IN_A_BASE_INSTALL = (*GOOGLE_ONLY, *MICROSOFT_ONLY, *HTTPX, *STRIPE_ONLY, *SHARED,
                            *AIOHTTP_OTEL)

# Put first on sys.meta_path by every process below: BLOCKED (a JSON list in the environment)
# names the modules to make absent, with their submodules.
ABSENT_FINDER = """
import json, os, sys

class Absent:
    blocked = tuple(json.loads(os.environ.get("TIDEMARK_TEST_ABSENT", "[]")))

    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in self.blocked):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Absent())
"""

# `tidemark ARGS` as the console script runs it, reporting its exit code and every module
# loaded to the file named first.
CLI = ABSENT_FINDER + """
from tools.cli.main import main
out, argv = sys.argv[1], sys.argv[2:]
try:
    code = main(argv)
except SystemExit as e:  # --help, --version
    code = e.code
with open(out, "w") as f:
    json.dump({"code": code, "modules": sorted(sys.modules)}, f)
"""

# A worker's start as worker.py makes it: its modules, logging, then the registry of what the
# environment configures; reports the actions bound and known, and every module loaded.
WORKER = ABSENT_FINDER + """
import logging
import worker
from activities.wiring import worker_registry
from tidemark.errors import ActionNotConfigured
logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
registry = worker_registry(os.environ)

def is_bound(name):
    try:
        return registry.bound(name).name == name
    except ActionNotConfigured:
        return False

bound = [n for n in registry.names() if is_bound(n)]
with open(sys.argv[1], "w") as f:
    json.dump({"code": {"bound": bound, "known": registry.names()},
               "modules": sorted(sys.modules)}, f)
"""


def run_absent(tmp_path: Path, code: str, absent: tuple[str, ...], *args: str,
               env: dict[str, str] | None = None) -> tuple[Any, subprocess.CompletedProcess[str],
                                                           set[str]]:
    """(what ``code`` reported, the process, the modules it loaded), ``absent`` made so."""
    out = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-c", code, str(out), *args], cwd=ROOT, capture_output=True,
        text=True, timeout=120,
        env={**os.environ, **(env or {}), "TIDEMARK_TEST_ABSENT": json.dumps(absent)})
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    return report["code"], done, set(report["modules"])


def loaded(modules: set[str], absent: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == b or m.startswith(b + ".") for b in absent))


def payment_and_mail_plan(tmp_path: Path, task_id: str) -> dict[str, Any]:
    (tmp_path / "draft.txt").write_text("draft")
    return {"task_id": task_id, "steps": [
        {"action": "fs.rename", "args": {"path": str(tmp_path / "draft.txt"),
                                         "name": "final.txt"}},
        {"action": "drive.rename", "args": {"file_id": "f-1", "name": "final"}},
        {"action": "graph.send_mail", "args": {"to": "bo@example.com", "subject": "s",
                                               "body": "b"}},
        {"action": "stripe.payment_intent", "args": {"amount": 1200, "currency": "eur",
                                                     "customer": "cus_1"}},
    ]}


# -- a plan that needs a missing library is refused, naming the extra ---------------------

@pytest.mark.parametrize(("absent", "step", "line"), [
    (("stripe",), 3, "steps[3].action: action stripe.payment_intent needs the Stripe client: "
                     "pip install 'tidemark[stripe]'"),
    (("googleapiclient",), 1, "steps[1].action: action drive.rename needs Google's API "
                              "client: pip install 'tidemark[google]'"),
    # Drive and Gmail await their calls through httpx: it is part of the extra.
    (("httpx",), 1, "steps[1].action: action drive.rename needs Google's API client: pip "
                    "install 'tidemark[google]'"),
    (("msgraph",), 2, "steps[2].action: action graph.send_mail needs the Microsoft Graph "
                      "client: pip install 'tidemark[microsoft]'"),
])
def test_a_plan_naming_an_action_whose_client_is_missing_is_refused_with_the_extra(
        tmp_path: Path, absent: tuple[str, ...], step: int, line: str) -> None:
    doc = payment_and_mail_plan(tmp_path, "extras-1")
    # Only the step of the missing library and the rename: the others' libraries are here.
    doc["steps"] = [doc["steps"][0], *([{"action": "fs.rename", "args": {
        "path": str(tmp_path / f"x{i}.txt"), "name": f"y{i}.txt"}} for i in range(1, step)]),
        doc["steps"][step]]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    code, done, _ = run_absent(tmp_path, CLI, absent, "plan", "check", str(path))
    assert code == 1
    assert done.stdout == ""
    assert done.stderr == f"tidemark: PlanError: {line}\n"


def test_the_same_plan_is_accepted_where_the_client_is_installed(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(payment_and_mail_plan(tmp_path, "extras-2")))
    code, done, modules = run_absent(tmp_path, CLI, (), "plan", "check", str(path))
    assert (code, done.stdout.split(",")[0]) == (0, "ok: task extras-2")
    assert "stripe" in modules and "msgraph" in modules


def test_a_missing_module_of_our_own_is_not_told_as_a_missing_extra(tmp_path: Path) -> None:
    """A missing module of our own is not told as a missing extra.

    Only the library's own modules mean the extra is missing. A module of ours that fails to
    import is a bug, and surfaces as itself."""
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(payment_and_mail_plan(tmp_path, "extras-3")))
    out = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-c", CLI, str(out), "plan", "check", str(path)], cwd=ROOT,
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "TIDEMARK_TEST_ABSENT": json.dumps(["probes.stripe"])})
    assert done.returncode != 0
    assert "ModuleNotFoundError: No module named 'probes.stripe'" in done.stderr
    assert "pip install" not in done.stderr


def test_every_library_names_an_extra_of_the_distribution() -> None:
    """The extras the refusals name exist in pyproject.toml, and `all` holds each of them."""
    import tomllib

    from activities.catalog import BUILTIN_LIBRARIES, GOOGLE, MICROSOFT, STRIPE

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    named = {library.extra for library in BUILTIN_LIBRARIES.values()}
    assert named == {"google", "microsoft", "stripe"}
    assert set(extras["all"]) == {f"tidemark[{e}]" for e in named}
    assert "tidemark[all]" in extras["dev"]
    for library in (GOOGLE, MICROSOFT, STRIPE):
        assert library.installed()  # this environment has `dev`


# -- a worker binds what is installed ---------------------------------------------------------

def test_a_worker_leaves_out_the_providers_whose_client_is_missing_in_one_line_each(
        server: StagingServer, tmp_path: Path) -> None:
    """A worker leaves out the providers whose client is missing, in one line each.

    Every target is configured (the staging servers), and Google's and Microsoft's libraries are
    absent. The worker binds fs.rename and Stripe, names each extra once, and still knows every
    action, so that a plan naming a left-out one is refused by name."""
    absent = (*GOOGLE_ONLY, *MICROSOFT_ONLY)  # httpx stays: Stripe's extra brings it
    report, done, modules = run_absent(tmp_path, WORKER, absent,
                                       env={STAGING_URL: server.url, ROOTS_ENV: str(tmp_path)})
    assert report["bound"] == ["fs.rename", "ledger.post_invoice", "stripe.payment_intent"]
    assert report["known"] == ["drive.rename", "fs.rename", "gmail.send", "graph.send_mail",
                               "ledger.post_invoice", "stripe.payment_intent"]
    lines = [x for x in done.stderr.splitlines() if "left out" in x]
    assert lines == [
        "tidemark.worker WARNING drive.rename, gmail.send left out: Google's API client is not "
        "installed (pip install 'tidemark[google]')",
        "tidemark.worker WARNING graph.send_mail left out: the Microsoft Graph client is not "
        "installed (pip install 'tidemark[microsoft]')"], done.stderr
    assert loaded(modules, absent) == []
    assert "stripe" in modules


def test_a_worker_without_httpx_leaves_out_stripe_naming_its_extra(
        server: StagingServer, tmp_path: Path) -> None:
    """A worker without httpx leaves out Stripe, naming its extra.

    Stripe's client is awaited through httpx (the ``stripe`` extra brings it). Without it the
    worker leaves the action out in one line, as it does Graph's, instead of failing."""
    absent = ("httpx",)
    report, done, _ = run_absent(tmp_path, WORKER, absent,
                                 env={STAGING_URL: server.url, ROOTS_ENV: str(tmp_path)})
    assert "stripe.payment_intent" not in report["bound"]
    assert "graph.send_mail" not in report["bound"]
    lines = [x for x in done.stderr.splitlines() if "left out" in x]
    assert "tidemark.worker WARNING stripe.payment_intent left out: the Stripe client is not " \
           "installed (pip install 'tidemark[stripe]')" in lines, done.stderr


# -- a base install ---------------------------------------------------------------------------

def test_a_base_install_runs_the_commands_and_a_rename_worker_without_any_provider_library(
        store: JournalStore, db_url: str, tmp_path: Path) -> None:
    """A base install runs the commands and a rename worker without any provider library.

    Everything an extra brings is absent. `--version`, `--help`, `plan check` of renames and
    `status` of a task run, and a worker binding fs.rename (the staging URL unset, no target
    configured), importing none of it."""
    absent = ABSENT_IN_A_BASE_INSTALL
    code, done, modules = run_absent(tmp_path, CLI, absent, "--version")
    assert code == 0 and done.stdout.startswith("tidemark ")
    code, done, modules = run_absent(tmp_path, CLI, absent, "--help")
    assert code == 0 and "status" in done.stdout
    assert loaded(modules, absent) == []

    doc = payment_and_mail_plan(tmp_path, "extras-4")
    doc["steps"] = doc["steps"][:1]
    path = tmp_path / "renames.json"
    path.write_text(json.dumps(doc))
    code, done, modules = run_absent(tmp_path, CLI, absent, "plan", "check", str(path))
    assert (code, done.stdout.split(",")[0]) == (0, "ok: task extras-4"), done.stderr
    assert loaded(modules, absent) == []

    registry = Registry([FsRename([tmp_path])])
    store.persist_plan(load_plan(doc, registry))
    run_step(store, registry, "extras-4", 1)
    code, done, modules = run_absent(tmp_path, CLI, absent, "status", "extras-4",
                                     env={"DATABASE_URL": db_url})
    assert code == 0 and "confirmed      1" in done.stdout, done.stdout + done.stderr
    assert loaded(modules, absent) == []

    report, done, modules = run_absent(tmp_path, WORKER, absent,
                                       env={STAGING_URL: "", ROOTS_ENV: str(tmp_path)})
    assert "fs.rename" in report["bound"]
    assert "stripe.payment_intent" not in report["bound"]
    assert loaded(modules, absent) == []
    assert "worker" in modules and "activities.steps" in modules
    assert len([x for x in done.stderr.splitlines() if "left out" in x]) == 3, done.stderr


# -- the provider conformance kit -------------------------------------------------------------

@pytest.mark.parametrize(("absent", "args", "line"), [
    (("httpx",), ("--live",), "tidemark: ProvidersError: `tidemark providers verify` needs "
                              "httpx, the HTTP client its checks speak through: pip install "
                              "'tidemark[microsoft]'"),
    (("httpx",), (), "tidemark: ProvidersError: `tidemark providers verify` needs httpx, the "
                     "HTTP client its checks speak through: pip install 'tidemark[microsoft]'"),
    (("aiohttp",), (), "tidemark: ProvidersError: `tidemark providers verify` needs the staging "
                       "servers (or --live): pip install 'tidemark[staging]'"),
])
def test_providers_verify_without_its_library_says_which_extra_in_one_line(
        tmp_path: Path, absent: tuple[str, ...], args: tuple[str, ...], line: str) -> None:
    """`providers verify` without its library says which extra, in one line.

    The kit's checks speak plain HTTP through httpx (Microsoft Graph's SDK brings it). By default
    they run against the staging servers (aiohttp). Without them, one line naming the extra, a
    non-zero exit and nothing checked; `--live` needs no staging server. No test account is
    configured, so with httpx here `--live` would end at once, naming none."""
    env = {k: "" for k in ("CI", "TIDEMARK_LIVE_STRIPE_KEY")}
    code, done, _ = run_absent(tmp_path, CLI, absent, "providers", "verify", *args, env=env)
    assert (code, done.stdout, done.stderr) == (1, "", line + "\n")
