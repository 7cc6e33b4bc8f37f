"""One configuration, read once.

The Temporal connection through the SDK's environment configuration (a temporal.toml profile,
TLS, API key) for the worker, the CLI and the agent client; the embedded Postgres only where
asked for; a command line without library warnings."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client
from temporalio.service import TLSConfig
from temporalio.testing import WorkflowEnvironment

from activities.catalog import spec_registry
from helpers.fs_roots import FS_ROOTS
from tidemark.database import database_url
from tidemark.errors import ConfigError
from tidemark.plan import load_plan
from tidemark.settings import load_settings
from tidemark.store import JournalStore
from tools.cli.main import main
from tools.operate.client import TidemarkClient
from tools.stack.devstack import DevStack, dev_server_args, temporal_binary
from workflows.shared import SEARCH_ATTRIBUTES

ROOT = Path(__file__).resolve().parent.parent
WORKER_MAIN = str(Path(__file__).parent / "helpers" / "worker_main.py")
NAMESPACE = "tidemark-profile"  # exists on this module's dev server only
# conftest.py drops every TEMPORAL_* variable but TEMPORAL_CONFIG_FILE, which names an empty
# profile file: each test sets what it needs.

@pytest.fixture(scope="module")
async def profiled_server() -> AsyncIterator[WorkflowEnvironment]:
    """A dev server whose only workflow namespace besides ``default`` is NAMESPACE.

    A client that ignores the profile's namespace finds nothing there."""
    env = await WorkflowEnvironment.start_local(
        namespace=NAMESPACE, dev_server_existing_path=temporal_binary(),
        search_attributes=SEARCH_ATTRIBUTES, dev_server_log_level="error",
        dev_server_extra_args=dev_server_args())
    yield env
    await env.shutdown()


@pytest.fixture
def profile_file(tmp_path: Path, profiled_server: WorkflowEnvironment) -> Path:
    """temporal.toml as the `temporal` CLI writes it.

    The default profile leads nowhere, the ``tidemark`` profile to this module's server and
    namespace."""
    address = profiled_server.client.service_client.config.target_host
    path = tmp_path / "temporal.toml"
    path.write_text('[profile.default]\naddress = "127.0.0.1:1"\n\n'
                    f'[profile.tidemark]\naddress = "{address}"\nnamespace = "{NAMESPACE}"\n')
    return path


async def connect_when_healthy(address: str) -> Client:
    """A client of a dev server that listens already but may not serve yet."""
    for _ in range(100):
        try:
            return await Client.connect(address)
        except RuntimeError:  # "Frontend is not healthy yet"
            await asyncio.sleep(0.2)
    return await Client.connect(address)


async def wait_for_poller(client: Client, task_queue: str, namespace: str = NAMESPACE) -> None:
    request = DescribeTaskQueueRequest(
        namespace=namespace, task_queue=TaskQueue(name=task_queue),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW)
    for _ in range(300):
        if (await client.workflow_service.describe_task_queue(request)).pollers:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"no worker polled {task_queue!r} in namespace {namespace}")


async def test_a_temporal_profile_is_honoured_by_the_worker_the_cli_and_the_agent_client(
        profile_file: Path, profiled_server: WorkflowEnvironment, db_url: str,
        store: JournalStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A Temporal profile is honoured by the worker, the CLI and the agent client.

    There is no TEMPORAL_ADDRESS anywhere: only TEMPORAL_CONFIG_FILE and TEMPORAL_PROFILE name
    the server and the namespace. The worker polls there, `tidemark resume` starts the run there
    and the worker completes it, and the agent client reads its status there."""
    task_queue = "tq-profile"
    env = {**os.environ, "TEMPORAL_CONFIG_FILE": str(profile_file),
           "TEMPORAL_PROFILE": "tidemark", "DATABASE_URL": db_url,
           "TIDEMARK_TASK_QUEUE": task_queue, "TIDEMARK_FS_ROOTS": FS_ROOTS,
           "TIDEMARK_LOG_LEVEL": "WARNING"}
    worker = subprocess.Popen([sys.executable, WORKER_MAIN], env=env, cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        client = await Client.connect(profiled_server.client.service_client.config.target_host,
                                      namespace=NAMESPACE)
        await wait_for_poller(client, task_queue)

        (tmp_path / "a.txt").write_text("a")
        plan = {"task_id": "profile-1", "steps": [{"action": "fs.rename", "args": {
            "path": str(tmp_path / "a.txt"), "name": "b.txt"}}]}
        store.persist_plan(load_plan(plan, spec_registry()))
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        assert await asyncio.to_thread(main, ["resume", "profile-1", "--wait"]) == 0
        assert json.loads(capsys.readouterr().out)["state"] == "completed"
        assert (tmp_path / "b.txt").read_text() == "a"
        described = await client.get_workflow_handle("tidemark-profile-1").describe()
        assert described.namespace == NAMESPACE

        agent = await TidemarkClient.connect(settings=load_settings(env))
        assert agent.client.namespace == NAMESPACE and agent.task_queue == task_queue
        assert (await agent.status("profile-1"))["state"] == "completed"
    finally:
        worker.terminate()
        _, err = worker.communicate(timeout=30)
    assert "cannot start" not in err, err


def test_tls_and_the_api_key_reach_the_connect_options(tmp_path: Path) -> None:
    cert = tmp_path / "cert.pem"
    key = tmp_path / "key.pem"
    cert.write_bytes(b"-----BEGIN CERTIFICATE-----\nnot checked here\n")
    key.write_bytes(b"-----BEGIN PRIVATE KEY-----\nnot checked here\n")
    profile = tmp_path / "temporal.toml"
    profile.write_text('[profile.cloud]\naddress = "acme.a1b2c.tmprl.cloud:7233"\n'
                       'namespace = "acme.a1b2c"\napi_key = "key-from-the-profile"\n'
                       '[profile.mtls]\naddress = "temporal.internal:7233"\n'
                       f'[profile.mtls.tls]\nclient_cert_path = "{cert}"\n'
                       f'client_key_path = "{key}"\nserver_name = "temporal"\n')

    cloud = load_settings({"TEMPORAL_CONFIG_FILE": str(profile), "TEMPORAL_PROFILE": "cloud"})
    options = cloud.temporal_connect()
    assert options.pop("data_converter").payload_codec is not None  # tests/test_codec.py
    assert options == {"target_host": "acme.a1b2c.tmprl.cloud:7233",
                       "namespace": "acme.a1b2c", "api_key": "key-from-the-profile",
                       "tls": True}
    # The variables override the profile, as for the `temporal` CLI.
    overridden = load_settings({"TEMPORAL_CONFIG_FILE": str(profile),
                                "TEMPORAL_PROFILE": "cloud", "TEMPORAL_API_KEY": "key-from-env",
                                "TEMPORAL_NAMESPACE": "other.a1b2c"}).temporal_connect()
    assert (overridden["api_key"], overridden["namespace"]) == ("key-from-env", "other.a1b2c")
    # The key is never in the settings' repr nor in what is logged about the connection; nor
    # is a password of DATABASE_URL.
    assert "key-from-the-profile" not in repr(cloud)
    assert "pw-in-url" not in repr(load_settings({"DATABASE_URL": "postgresql://u:pw-in-url@h/d"}))
    assert "key-from-the-profile" not in cloud.describe_temporal()
    assert cloud.describe_temporal().endswith("(TLS, API key)")

    mtls = load_settings({"TEMPORAL_CONFIG_FILE": str(profile), "TEMPORAL_PROFILE": "mtls"})
    tls = mtls.temporal_connect()["tls"]
    assert isinstance(tls, TLSConfig)
    assert (tls.client_cert, tls.client_private_key, tls.domain) == (
        cert.read_bytes(), key.read_bytes(), "temporal")
    # The command line's --address replaces the address only: TLS stays.
    flagged = mtls.with_temporal(address="10.0.0.5:7233").temporal_connect()
    assert flagged["target_host"] == "10.0.0.5:7233" and flagged["tls"] == tls

    key.unlink()
    with pytest.raises(ConfigError, match=f"cannot read {key}: no such file"):
        mtls.temporal_connect()


def test_the_cli_connects_with_the_profiles_tls(
        tmp_path: Path, temporal_env: WorkflowEnvironment, db_url: str,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI connects with the profile's TLS.

    The dev server speaks clear text only. `tidemark schedule list` reaches it as configured, and
    fails once the environment's API key turns TLS on (the key itself is not printed). The
    journal is given too: the session's dev server may hold an earlier test's schedule, whose
    series the listing reads there."""
    address = temporal_env.client.service_client.config.target_host
    monkeypatch.setenv("TEMPORAL_ADDRESS", address)
    monkeypatch.setenv("DATABASE_URL", db_url)
    assert main(["schedule", "list"]) == 0
    capsys.readouterr()
    monkeypatch.setenv("TEMPORAL_API_KEY", "sekrit-api-key")
    assert main(["schedule", "list"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"tidemark: TemporalUnavailable: cannot reach Temporal at {address} "
                          "namespace default (TLS, API key)"), err
    assert "sekrit-api-key" not in err


@pytest.mark.parametrize(("env", "message"), [
    ({"TEMPORAL_CONFIG_FILE": "/nonexistent/temporal.toml"},
     "TEMPORAL_CONFIG_FILE names /nonexistent/temporal.toml, which is not a file"),
    ({"TEMPORAL_PROFILE": "nosuch"}, "profile nosuch"),
    ({"TIDEMARK_EMBEDDED_DB": "maybe"}, "TIDEMARK_EMBEDDED_DB must be 1 or 0"),
    ({"TIDEMARK_LOG_LEVEL": "loud"}, "TIDEMARK_LOG_LEVEL must be one of"),
    ({"TIDEMARK_MAX_CONCURRENT_STEPS": "0"}, "TIDEMARK_MAX_CONCURRENT_STEPS must be a whole"),
    ({"TIDEMARK_MAX_CONCURRENT_STEPS": "-4"}, "TIDEMARK_MAX_CONCURRENT_STEPS must be a whole"),
    ({"TIDEMARK_MAX_CONCURRENT_STEPS": "2.5"}, "TIDEMARK_MAX_CONCURRENT_STEPS must be a whole"),
    ({"TIDEMARK_MAX_CONCURRENT_STEPS": "many"}, "TIDEMARK_MAX_CONCURRENT_STEPS must be a whole"),
    ({"TIDEMARK_DB_POOL_MAX": "1"}, "TIDEMARK_DB_POOL_MAX must be a whole number of 2 or more"),
    ({"TIDEMARK_DB_POOL_MAX": "0"}, "TIDEMARK_DB_POOL_MAX must be a whole number of 2 or more"),
    ({"TIDEMARK_DB_POOL_MAX": "eight"}, "TIDEMARK_DB_POOL_MAX must be a whole number of 2 or"),
    ({"TIDEMARK_STEP_THREADS": "0"}, "TIDEMARK_STEP_THREADS must be a whole number of 1 or more"),
])
def test_bad_configuration_is_one_clear_error(env: dict[str, str], message: str,
                                              tmp_path: Path) -> None:
    """Bad configuration is one clear error.

    A TEMPORAL_CONFIG_FILE that does not exist would otherwise be ignored by the SDK. The worker
    would go to localhost:7233 instead of the cluster the file names."""
    if "TEMPORAL_PROFILE" in env:
        (tmp_path / "temporal.toml").write_text('[profile.default]\naddress = "a:1"\n')
        env = {**env, "TEMPORAL_CONFIG_FILE": str(tmp_path / "temporal.toml")}
    with pytest.raises(ConfigError, match=message):
        load_settings(env)


def test_the_workers_concurrency_and_pool_are_settings_with_the_old_defaults(
        db_url: str) -> None:
    import worker
    from tidemark.store import POOL_MAX

    default = load_settings({})
    assert (default.max_concurrent_steps, default.db_pool_max) == (128, POOL_MAX)
    assert default.max_concurrent_steps == worker.MAX_CONCURRENT_STEPS
    assert default.step_threads == 32
    set_ = load_settings({"TIDEMARK_MAX_CONCURRENT_STEPS": " 256 ", "TIDEMARK_DB_POOL_MAX": "8",
                          "TIDEMARK_STEP_THREADS": "6", "DATABASE_URL": db_url})
    assert (set_.max_concurrent_steps, set_.db_pool_max, set_.step_threads) == (256, 8, 6)
    # What serve() opens: the journal's pool sized by the setting.
    store = worker.journal_store(set_)
    try:
        assert store._pool.max_size == 8
    finally:
        store.close()


async def test_the_worker_runs_as_many_steps_as_the_setting_says(
        temporal_env: WorkflowEnvironment, store: JournalStore) -> None:
    import worker
    from activities.wiring import worker_registry

    settings = load_settings({"TIDEMARK_MAX_CONCURRENT_STEPS": "40"})
    with worker.step_executor(settings) as executor:
        built = worker.build_worker(temporal_env.client, store, worker_registry({}), executor,
                                    "tq-settings", max_steps=settings.max_concurrent_steps)
        assert built.config()["max_concurrent_activities"] == 40
        assert executor._max_workers == 40


@pytest.mark.parametrize(("name", "value"), [("TIDEMARK_MAX_CONCURRENT_STEPS", "0"),
                                             ("TIDEMARK_DB_POOL_MAX", "1"),
                                             ("TIDEMARK_STEP_THREADS", "none")])
def test_the_worker_refuses_a_bad_concurrency_or_pool_at_start_in_one_line(
        name: str, value: str, home: Path) -> None:
    from worker import EXIT_CONFIG

    env = {**bare_env(home), "TEMPORAL_ADDRESS": "127.0.0.1:1",
           "DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none", name: value}
    worker = subprocess.run([sys.executable, "worker.py"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert worker.returncode == EXIT_CONFIG, worker.stderr
    lines = worker.stderr.strip().splitlines()
    assert len(lines) == 1 and f"cannot start: {name} must be" in lines[0], worker.stderr


# -- the embedded database only where asked for -----------------------------------------------

@pytest.fixture
def home() -> Iterator[Path]:
    """A TIDEMARK_HOME outside pytest's root (as root, pgserver's own user must reach it)."""
    path = Path(tempfile.mkdtemp(prefix="tidemark-settings-"))
    yield path / "home"
    shutil.rmtree(path, ignore_errors=True)


def cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tools.cli.main", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)


def bare_env(home: Path) -> dict[str, str]:
    """This environment without a database or XDG_RUNTIME_DIR setting."""
    env = dict(os.environ)
    for name in ("DATABASE_URL", "TIDEMARK_EMBEDDED_DB", "XDG_RUNTIME_DIR"):
        env.pop(name, None)
    return {**env, "TIDEMARK_HOME": str(home)}


def test_without_database_url_the_worker_and_the_cli_refuse_and_say_how_to_fix_it(
        home: Path) -> None:
    from worker import EXIT_CONFIG

    env = {**bare_env(home), "TEMPORAL_ADDRESS": "127.0.0.1:1"}
    worker = subprocess.run([sys.executable, "worker.py"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert worker.returncode == EXIT_CONFIG, worker.stderr
    assert "cannot start: DATABASE_URL is not set" in worker.stderr
    assert "TIDEMARK_EMBEDDED_DB=1" in worker.stderr and "Traceback" not in worker.stderr
    status = cli(["status", "t-1"], env)
    assert status.returncode == 1
    assert status.stderr.startswith("tidemark: ConfigError: DATABASE_URL is not set")
    assert not (home / "pgdata").exists()  # no database was started anywhere

    with pytest.raises(ConfigError, match="DATABASE_URL is not set"):
        database_url(load_settings(env))


def test_an_embedded_db_command_prints_no_library_warning(home: Path) -> None:
    """An embedded-database command prints no library warning.

    Asked for explicitly, the embedded Postgres starts (in $TIDEMARK_HOME) and the command prints
    its answer and nothing else. XDG_RUNTIME_DIR unset (root shells, cron, CI) made platformdirs
    warn on stderr at every start."""
    fresh = cli(["--embedded-db", "status", "t-1"], bare_env(home))
    assert (fresh.returncode, fresh.stdout) == (1, "")
    assert fresh.stderr == ("tidemark: the journal database has no Tidemark schema yet: "
                            "`tidemark db migrate` creates it (a worker does on start)\n")
    done = cli(["--embedded-db", "db", "migrate"], bare_env(home))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("applied: 0001_journal")
    assert done.stderr == ""
    assert (home / "pgdata").is_dir()
    again = cli(["db", "migrate"], {**bare_env(home), "TIDEMARK_EMBEDDED_DB": "1"})
    assert (again.returncode, again.stdout, again.stderr) == (0, "schema is up to date\n", "")


async def test_the_dev_stacks_worker_is_not_sent_to_the_callers_cluster(
        home: Path, db_url: str, tmp_path: Path) -> None:
    """The dev stack's worker is not sent to the caller's cluster.

    A shell set up for Temporal Cloud (a profile, an API key, a namespace) runs `tidemark dev`.
    Its worker reaches the dev server, in namespace default, without TLS; and the profile the
    stack writes says the same to the `temporal` CLI and the commands."""
    cloud = tmp_path / "temporal.toml"
    cloud.write_text('[profile.default]\naddress = "acme.a1b2c.tmprl.cloud:7233"\n'
                     'namespace = "acme.a1b2c"\n')
    env = {**bare_env(home), "DATABASE_URL": db_url, "TEMPORAL_CONFIG_FILE": str(cloud),
           "TEMPORAL_API_KEY": "for-the-cloud", "TEMPORAL_NAMESPACE": "acme.a1b2c"}
    with DevStack(port=0, ui_port=0, staging_port=0, settings=load_settings(env)) as stack:
        worker_settings = load_settings(stack.env())
        options = worker_settings.temporal_connect()
        assert options.pop("data_converter").payload_codec.source is not None  # the stack's key
        assert options == {"target_host": stack.address,
                                                      "namespace": "default"}
        await wait_for_poller(await connect_when_healthy(stack.address),
                              worker_settings.task_queue, "default")
