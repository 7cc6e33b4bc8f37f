"""The embedded stack (`tidemark dev`): ports, addresses, clean stops and kept history.

A port in use is refused before anything starts; the stack answers on every address it prints;
stopping it leaves no process behind; and Temporal's history survives a restart. Real Temporal
dev server, real worker and `tidemark` processes, a fresh database per test on the test Postgres."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import urllib.request
import uuid
from pathlib import Path

import psycopg
import pytest
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client, WorkflowExecutionStatus

from helpers.ports import free_ports
from helpers.wait import assert_eventually
from tidemark.database import ENV_HOME, ENV_URL, EmbeddedPostgres, tidemark_home
from tidemark.errors import ConfigError
from tidemark.payloads import TASK_QUEUE, RunResult
from tidemark.settings import load_settings
from tidemark.web_ui import base_url
from tools.cli.main import main
from tools.operate.inbox import web_ui_url
from tools.operate.starter import connect
from tools.stack.devstack import DevStack, DevStackError, temporal_binary, wait_until_serving
from workflows.outcome import run_result

# Generous for a loaded 2-core box; the stack itself is up in well under a second here.
DEADLINE_S = 30.0
# One line of `tidemark dev`'s address block: "Web UI         http://127.0.0.1:8233".
ADDRESS_LINE = re.compile(
    r"(Temporal gRPC|Web UI|needs a person|Postgres|staging|worker|metrics) +(.+)$")


@pytest.fixture
def home(tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """TIDEMARK_HOME in a tmp dir and the journal in this test's own database.

    Both are set in the environment only (``db_url`` first: the test Postgres must not inherit
    this home)."""
    path = tmp_path / "home"
    monkeypatch.setenv(ENV_HOME, str(path))
    monkeypatch.setenv(ENV_URL, db_url)
    return path


def processes_of(home: Path) -> list[int]:
    """Live processes whose environment says ``TIDEMARK_HOME=home``.

    Everything a stack on that home started inherits it, and no other process has it (each test
    has its own tmp home)."""
    marker = f"{ENV_HOME}={home}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # exited meanwhile, or not ours to read
            continue
        if marker in environ.split(b"\0"):
            pids.append(int(entry.name))
    return pids


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # exited meanwhile
        return b""


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def http_get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.read()


async def wait_for_worker_poller(address: str) -> None:
    """Waits until a worker polls the workflow task queue "tidemark".

    That proves the worker process reached Temporal, not only that it was spawned."""
    client = await Client.connect(address)
    request = DescribeTaskQueueRequest(
        namespace="default", task_queue=TaskQueue(name=TASK_QUEUE),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while not (await client.workflow_service.describe_task_queue(request)).pollers:
        assert loop.time() < deadline, f"no worker polled {TASK_QUEUE!r} within {DEADLINE_S}s"
        await asyncio.sleep(0.1)


@pytest.mark.parametrize(("which", "flag"), [("port", "--port"), ("ui_port", "--ui-port"),
                                             ("staging_port", "--staging-port"),
                                             ("metrics_port", "--metrics-port")])
def test_a_port_in_use_is_named_with_its_flag_and_nothing_starts(
        which: str, flag: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv(ENV_HOME, str(home))
    # Without DATABASE_URL a premature start would leave an embedded Postgres in home/pgdata.
    monkeypatch.delenv(ENV_URL, raising=False)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        stack = DevStack(**{"port": 0, "ui_port": 0, "staging_port": 0, which: port})
        with pytest.raises(DevStackError) as e:
            stack.start()
    assert str(e.value).startswith(f"port {port} for the ")
    assert str(e.value).endswith(f"is in use; choose another with {flag}")
    assert stack.worker is None and stack.staging is None
    assert processes_of(home) == []
    assert not home.exists() or list(home.iterdir()) == []  # no pgdata, temporal.db, logs


def test_a_port_that_listens_is_not_taken_for_a_frontend_that_answers(tmp_path: Path) -> None:
    # A dev server's port listens before its frontend serves: a client connecting in between
    # is refused ("Frontend is not healthy yet"). The stack waits for the answer, not the port.
    log = tmp_path / "temporal.log"
    with socket.socket() as mute, subprocess.Popen(["sleep", "30"]) as server:
        mute.bind(("127.0.0.1", 0))
        mute.listen()
        address = f"127.0.0.1:{mute.getsockname()[1]}"
        with pytest.raises(DevStackError) as e:
            wait_until_serving(address, server, log, timeout_s=2.0)
        server.kill()
    assert str(e.value).startswith(f"the Temporal frontend at {address} did not answer within")
    assert str(e.value).endswith(f"see {log}")


async def test_the_stack_answers_and_stop_leaves_no_process(home: Path) -> None:
    stack = DevStack(port=0, ui_port=0, staging_port=0).start()
    assert stack.codec is not None
    ports = [stack.port, stack.ui_port, stack.staging_port, stack.codec.port]
    try:
        assert http_get(stack.ui_url)[0] == 200
        # The Web UI decodes payloads through the stack's codec server.
        ui = json.loads(http_get(f"{stack.ui_url}/api/v1/settings")[1])
        assert ui["Codec"]["Endpoint"] == stack.codec.url, ui
        # And the `temporal` CLI, through the profile the stack writes for other shells.
        shown = subprocess.run([temporal_binary(), "config", "get", "--prop", "codec.endpoint"],
                               env={**os.environ, "TEMPORAL_CONFIG_FILE": str(
                                   stack.temporal_config_file)},
                               capture_output=True, text=True, timeout=30)
        assert stack.codec.url in shown.stdout, shown
        assert stack.staging is not None
        status, body = http_get(f"{stack.staging.url}/_staging/effects")
        assert (status, json.loads(body)) == (200, [])
        assert stack.worker is not None
        await wait_for_worker_poller(stack.address)
        assert stack.worker.poll() is None
        running = processes_of(home)
        # The Temporal dev server and the worker, at least; seen, so the check below can fail.
        assert stack.worker.pid in running and len(running) >= 2
    finally:
        stack.stop()
    assert processes_of(home) == []
    assert [p for p in ports if listening(p)] == []


async def test_two_stacks_run_side_by_side_on_one_home(home: Path) -> None:
    """A stack with a data directory of its own (the demo's) runs beside `tidemark dev`.

    Every port is its own, and the first stack's profile and Web UI record stay as they were."""
    with DevStack(port=0, ui_port=0, staging_port=0, metrics_port=0, with_worker=False) as dev:
        profile = dev.temporal_config_file.read_text()
        with DevStack(port=0, ui_port=0, staging_port=0, metrics_port=0, with_worker=False,
                      data_dir=home / "demo") as other:
            ports = {s.port for s in (dev, other)} | {s.ui_port for s in (dev, other)} | {
                s.staging_port for s in (dev, other)} | {s.metrics_port for s in (dev, other)}
            assert len(ports) == 8
            assert http_get(dev.ui_url)[0] == http_get(other.ui_url)[0] == 200
        assert dev.temporal_config_file.read_text() == profile
        shell = load_settings({"TEMPORAL_CONFIG_FILE": str(dev.temporal_config_file),
                               ENV_HOME: str(home)})
        assert base_url(shell) == dev.ui_url
        assert http_get(dev.ui_url)[0] == 200  # the other's stop left this one up


async def test_temporal_history_survives_a_restart(home: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDEMARK_FS_ROOTS", str(tmp_path))  # the worker's fs.rename reaches it
    draft = tmp_path / "draft.txt"
    draft.write_text("x")
    plan = {"task_id": "restart-1", "steps": [
        {"action": "fs.rename", "args": {"path": str(draft), "name": "final.txt"}}]}
    with DevStack(port=0, ui_port=0, staging_port=0, with_worker=False) as stack:
        client = await connect(load_settings(stack.env()))  # with the stack's payload key
        handle = await client.start_workflow("RunPlan", plan, id="tidemark-restart-1",
                                             task_queue=TASK_QUEUE)
        run_id = (await handle.describe()).run_id
        key = stack.codec_keys_file.read_text()
        started = (await handle.fetch_history()).events[0]
        plan_in_history = started.workflow_execution_started_event_attributes.input.payloads[0]
        assert plan_in_history.metadata["encryption-key-id"] == b"dev"  # the codec is on
        assert b"final.txt" not in plan_in_history.data
    assert processes_of(home) == []

    # Same home (from the environment), new ports: the history is in home/temporal.db.
    with DevStack(port=0, ui_port=0, staging_port=0, with_worker=False) as stack:
        # The key was made on the first start and kept in the home: the history still reads.
        assert stack.codec_keys_file.read_text() == key
        client = await connect(load_settings(stack.env()))
        handle = client.get_workflow_handle("tidemark-restart-1", result_type=RunResult)
        desc = await handle.describe()
        assert (desc.run_id, desc.status) == (run_id, WorkflowExecutionStatus.RUNNING)
        stack.start_worker()
        result = await asyncio.wait_for(run_result(handle), DEADLINE_S)
        assert (result.state, result.confirmed) == ("completed", 1)
        attrs = {k.name: v for k, v in (await handle.describe()).typed_search_attributes}
        assert attrs["TidemarkState"] == "completed"  # registered again on the restart
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final.txt", "home"]


def test_tidemark_dev_prints_its_addresses_and_ctrl_c_stops_it(home: Path,
                                                               db_url: str) -> None:
    port, ui_port, staging_port, metrics_port = free_ports(4)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.cli.main", "dev", "--port", str(port), "--ui-port",
         str(ui_port), "--staging-port", str(staging_port), "--metrics-port", str(metrics_port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={k: v for k, v in os.environ.items() if k != "TIDEMARK_METRICS_ADDRESS"})
    lines: list[str] = []

    def read_stdout() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))

    reader = threading.Thread(target=read_stdout, daemon=True)
    reader.start()
    try:
        assert_eventually(lambda: proc.poll() is None and "Ctrl-C stops everything started "
                          "here." in lines, timeout=DEADLINE_S)
        printed = dict(m.groups() for m in map(ADDRESS_LINE.match, lines) if m)
        assert printed["Temporal gRPC"].split()[0] == f"127.0.0.1:{port}"
        assert printed["Web UI"] == f"http://127.0.0.1:{ui_port}"
        assert printed["needs a person"] == web_ui_url(f"http://127.0.0.1:{ui_port}", "default")
        dbname = psycopg.conninfo.conninfo_to_dict(db_url)["dbname"]
        assert f"dbname={dbname}" in printed["Postgres"]
        assert printed["staging"] == f"http://127.0.0.1:{staging_port}"
        worker_pid = int(printed["worker"].split()[1])
        assert http_get(f"http://127.0.0.1:{ui_port}")[0] == 200
        assert http_get(f"http://127.0.0.1:{staging_port}/_staging/effects")[0] == 200
        assert listening(port)
        assert worker_pid in processes_of(home)
        # Another shell reaches the stack through the profile it names: no other variable.
        config = printed["Temporal gRPC"].split("export TEMPORAL_CONFIG_FILE=")[1].rstrip(")")
        assert config == str(home / "temporal.toml") and mode(Path(config)) == 0o600
        other_shell = {k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")}
        listed = subprocess.run([sys.executable, "-m", "tools.cli.main", "schedule", "list",
                                 "--json"],
                                env={**other_shell, "TEMPORAL_CONFIG_FILE": config},
                                capture_output=True, text=True, timeout=60)
        assert (listed.returncode, json.loads(listed.stdout)) == (0, []), listed.stderr
        # ... and every Web UI link there is this stack's (tidemark/web_ui.py).
        there = load_settings({**other_shell, "TEMPORAL_CONFIG_FILE": config})
        assert base_url(there) == f"http://127.0.0.1:{ui_port}"
        assert printed["metrics"] == f"http://127.0.0.1:{metrics_port}/metrics"

        def scraped() -> bytes:  # the worker's endpoint, once it has started
            try:
                return http_get(printed["metrics"])[1]
            except OSError as e:
                raise AssertionError(f"no metrics yet: {e}") from e

        assert b"temporal_" in assert_eventually(scraped, timeout=DEADLINE_S)
        # Payloads are encrypted: the line names the key another shell exports to read them.
        codec = next(x for x in lines if x.startswith("codec server "))
        assert f"TIDEMARK_CODEC_KEYS_FILE={home / 'codec-keys'} TIDEMARK_CODEC_KEY_ID=dev" in codec
        # Another shell with what it says to export runs a plan and follows it to its end
        # (the README's first plan): the profile, and the key to read what the worker wrote.
        exports = dict(pair.split("=", 1) for found in re.findall(r"export ([^)]*)\)",
                                                                  "\n".join(lines))
                       for pair in found.split())
        assert {"TEMPORAL_CONFIG_FILE", "TIDEMARK_CODEC_KEYS_FILE"} <= set(exports), exports
        files = Path(next(x for x in lines if x.startswith("fs.rename in")).split()[2])
        (files / "draft.txt").write_text("draft")
        plan = home / "PLAN.json"
        plan.write_text(json.dumps({"task_id": "first-" + uuid.uuid4().hex[:8], "steps": [
            {"action": "fs.rename", "args": {"path": str(files / "draft.txt"),
                                             "name": "final.txt"}}]}))
        other_shell = {k: v for k, v in os.environ.items()
                       if not k.startswith(("TEMPORAL_", "TIDEMARK_CODEC_"))}
        followed = subprocess.run([sys.executable, "-m", "tools.cli.main", "start", str(plan),
                                   "--follow"], env={**other_shell, **exports},
                                  capture_output=True, text=True, timeout=DEADLINE_S)
        assert followed.returncode == 0, followed.stdout + followed.stderr
        assert (files / "final.txt").exists()

        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=DEADLINE_S) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=5)
    assert processes_of(home) == []
    assert [p for p in (port, ui_port, staging_port, metrics_port) if listening(p)] == []


def test_dev_and_demo_help_name_every_port_they_open(
        capsys: pytest.CaptureFixture[str]) -> None:
    helps = {}
    for cmd in ("dev", "demo"):
        with pytest.raises(SystemExit):
            main([cmd, "--help"])
        helps[cmd] = capsys.readouterr().out
    for cmd, text in helps.items():
        for flag in ("--port", "--ui-port", "--staging-port", "--metrics-port"):
            assert flag in text, (cmd, flag)
    assert "9464" in " ".join(helps["dev"].split())


def postgres_of(pgdata: Path) -> list[int]:
    """Live postgres processes whose command line names ``pgdata``."""
    return [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
            if b"postgres" in cmdline(pid) and str(pgdata).encode() in cmdline(pid)]


@pytest.mark.temporal  # `tidemark dev` with its own Postgres: no fixture says so
def test_ctrl_c_of_tidemark_dev_stops_its_embedded_postgres(tmp_path: Path) -> None:
    """Ctrl-C stops the embedded Postgres too, though a holder of it once died holding it.

    pgserver counts the processes that hold the server and stops it with the last one; a
    holder killed without letting go (SIGKILL, a closed terminal) stays counted."""
    home = tidemark_home(tmp_path / "home")
    pgdata = (home / "pgdata").resolve()
    env = {k: v for k, v in os.environ.items() if k != ENV_URL}
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pathlib import Path; from tidemark.database "
         "import EmbeddedPostgres; EmbeddedPostgres(Path(sys.argv[1])); print('up', flush=True);"
         " sys.stdin.read()", str(pgdata)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        env=env)
    assert holder.stdout is not None and holder.stdout.readline() == b"up\n"
    holder.kill()  # killed holding the server: it never lets go
    holder.wait()
    assert postgres_of(pgdata)
    port, ui_port, staging_port = free_ports(3)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.cli.main", "dev", "--no-worker", "--port", str(port),
         "--ui-port", str(ui_port), "--staging-port", str(staging_port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**env, ENV_HOME: str(home)})
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("Ctrl-C stops everything started here."):
                break
        assert postgres_of(pgdata) and (pgdata / "postmaster.pid").exists()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=DEADLINE_S) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        left = postgres_of(pgdata)
        for pid in left:  # stop what the test failed to see stopped
            os.kill(pid, signal.SIGQUIT)
    assert left == [] and not (pgdata / "postmaster.pid").exists()
    assert processes_of(home) == []
    assert [p for p in (port, ui_port, staging_port) if listening(p)] == []


def test_sigterm_during_start_up_leaves_no_process(home: Path) -> None:
    port, ui_port, staging_port = free_ports(3)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.cli.main", "dev", "--port", str(port), "--ui-port",
         str(ui_port), "--staging-port", str(staging_port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        # The dev server has exec'd but cannot be listening yet (that takes ~0.3 s here): the
        # signal lands while `tidemark dev` is still starting the stack.
        assert_eventually(lambda: [pid for pid in processes_of(home)
                                   if b"start-dev" in cmdline(pid)],
                          timeout=DEADLINE_S, interval=0.005)
        proc.send_signal(signal.SIGTERM)
        # 130 as for Ctrl-C; 0 only if a starved test let the start-up finish first.
        assert proc.wait(timeout=DEADLINE_S) in (0, 130), proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert processes_of(home) == []
    assert [p for p in (port, ui_port, staging_port) if listening(p)] == []


# -- TIDEMARK_HOME is private ---------------------------------------------------------------

def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_the_home_and_what_the_stack_writes_there_are_private(home: Path) -> None:
    home.mkdir(mode=0o755)
    home.chmod(0o755)  # as an earlier version left it, whatever the umask
    (home / "temporal.log").write_bytes(b"an earlier run's log\n")
    (home / "temporal.log").chmod(0o644)
    old_umask = os.umask(0o022)  # a usual shell's: files 0644, directories 0755
    try:
        with DevStack(port=0, ui_port=0, staging_port=0) as stack:
            assert stack.worker is not None
            await wait_for_worker_poller(stack.address)
            files = {p.name: mode(p) for p in home.iterdir() if p.is_file()}
            fs_root = Path(stack.fs_roots)
    finally:
        os.umask(old_umask)
    assert mode(home) == 0o700
    assert {"temporal.db", "temporal.log", "worker.log", "codec-keys"} <= set(files)
    assert {name: m for name, m in files.items() if m & 0o077} == {}, files
    assert fs_root == home / "files" and mode(fs_root) == 0o700


def test_a_home_of_another_user_is_refused(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give a directory to another user")
    other = tmp_path / "theirs"
    other.mkdir(mode=0o755)
    os.chown(other, 65534, 65534)
    monkeypatch.setenv(ENV_HOME, str(other))
    with pytest.raises(ConfigError, match=r"belongs to uid 65534, not to this user"):
        tidemark_home(load_settings().home)
    assert mode(other) == 0o755  # left as it was


def test_the_embedded_postgres_home_is_closed_to_others(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    """The embedded Postgres home is closed to others.

    Run as root, pgserver opens the directories above its data to everyone. The home is closed
    again, to all but the database's own processes, and the database still answers and stops
    cleanly (pg_ctl stop must reach its data directory)."""
    home = tmp_path / "pghome"
    monkeypatch.setenv(ENV_HOME, str(home))
    server = EmbeddedPostgres(tidemark_home(home) / "pgdata", delete=True)
    try:
        tidemark_home(home)
        data = (home / "pgdata").stat()
        if data.st_uid == os.geteuid():
            assert mode(home) == 0o700
        else:  # root: the server runs as its own system user with our group
            assert (mode(home), home.stat().st_gid) == (0o710, os.getegid())
        with psycopg.connect(server.url(), connect_timeout=10) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        with caplog.at_level(logging.ERROR, logger="pgserver"):
            server.close()  # pg_ctl stop, as the server's user
        assert [r.getMessage()[:80] for r in caplog.records] == []
    finally:
        server.close()
