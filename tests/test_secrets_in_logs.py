"""Secrets never reach a log, at any level, from the command or the worker.

This is case 5 of "Hostile input and the emergency controls". A database password holding ``%``,
a space, ``@`` and a quote, written into DATABASE_URL as it is (which no driver reads) or
percent-encoded (which connects), at every log level, through the `tidemark` command and the
worker. A URL that does not read is reported by naming DATABASE_URL, with no part of its value;
one that reads connects, and says nothing of its password either."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.parse
import uuid
from pathlib import Path

import psycopg
import pytest
from conftest import WORKER_MAIN
from temporalio.testing import WorkflowEnvironment

from tidemark.store import JournalStore
from tools.cli.main import main

PASSWORD = 'Tr0ub4d%r x@Q"zebra'
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def environment() -> dict[str, str]:
    """This process's environment without a journal of its own: each call names its URL."""
    return {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL",
                                                            "DATABASE_PASSWORD_FILE")}


def fragments(secret: str) -> set[str]:
    """Every piece of ``secret`` four characters long, as written and as percent-encoded.

    A log that holds one of them holds part of the password."""
    encoded = urllib.parse.quote(secret, safe="")
    return {s[i:i + 4] for s in (secret, encoded) for i in range(len(s) - 3)}


def leaked(text: str) -> set[str]:
    return {f for f in fragments(PASSWORD) if f in text}


def raw_url(host: str) -> str:
    """The password written into the URL as it is: no driver reads this URL."""
    return f"postgresql://tm_secret:{PASSWORD}@/postgres?host={host}"


def encoded_url(conninfo: str, role: str) -> str:
    """The password percent-encoded, on the test's database: this URL connects."""
    parts = psycopg.conninfo.conninfo_to_dict(conninfo)
    return (f"postgresql://{role}:{urllib.parse.quote(PASSWORD, safe='')}@/"
            f"{parts['dbname']}?host={urllib.parse.quote(str(parts['host']), safe='')}")


@pytest.fixture
def secret_role(store: JournalStore) -> str:
    """A role of its own whose password is PASSWORD, on the test's journal: its encoded URL."""
    role = f"tm_secret_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(store.conninfo, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("CREATE ROLE {} LOGIN SUPERUSER PASSWORD {}").format(
            psycopg.sql.Identifier(role), psycopg.sql.Literal(PASSWORD)))
    return encoded_url(store.conninfo, role)


def command(url: str, level: str, monkeypatch: pytest.MonkeyPatch,
            capsys: pytest.CaptureFixture[str],
            caplog: pytest.LogCaptureFixture) -> tuple[int, str]:
    """`tidemark status some-task` on ``url``, every log record at ``level`` and above caught.

    Returns its exit code and all it said (stdout, stderr, log)."""
    monkeypatch.setenv("DATABASE_URL", url)
    caplog.set_level(level)
    code = main(["status", "some-task"])
    out = capsys.readouterr()
    return code, out.out + out.err + caplog.text


@pytest.mark.parametrize("level", LEVELS)
def test_case5_the_command_names_the_setting_and_never_shows_the_password(
        level: str, tmp_path: Path, secret_role: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    code, said = command(raw_url(str(tmp_path)), level, monkeypatch, capsys, caplog)
    assert code == 1 and "DATABASE_URL is not a connection string" in said, said
    assert not leaked(said), said
    code, said = command(secret_role, level, monkeypatch, capsys, caplog)  # it connects
    assert code == 1 and "UnknownTask" in said, said
    assert not leaked(said), said


@pytest.mark.parametrize("level", LEVELS)
def test_case5_the_worker_names_the_setting_and_never_shows_the_password(
        level: str, tmp_path: Path) -> None:
    worker = subprocess.run([sys.executable, WORKER_MAIN], capture_output=True, text=True,
                            timeout=60, env={**environment(), "DATABASE_URL":
                                             raw_url(str(tmp_path)), "TIDEMARK_LOG_LEVEL": level})
    log = worker.stdout + worker.stderr
    assert worker.returncode == 78, log  # EXIT_CONFIG: it says what to fix and stops
    assert "cannot start: DATABASE_URL is not a connection string" in log, log
    assert not leaked(log), log


def test_case5_the_worker_log_holds_no_part_of_the_password_at_debug(
        secret_role: str, temporal_env: WorkflowEnvironment, task_queue: str) -> None:
    address = temporal_env.client.service_client.config.target_host
    worker = subprocess.Popen(
        [sys.executable, WORKER_MAIN], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, env={**environment(), "DATABASE_URL": secret_role, "TEMPORAL_ADDRESS": address,
                        "TIDEMARK_TASK_QUEUE": task_queue, "TIDEMARK_LOG_LEVEL": "DEBUG"})
    deadline = time.monotonic() + 60
    lines: list[str] = []
    assert worker.stdout is not None
    while time.monotonic() < deadline:  # it connected to the journal and to Temporal
        line = worker.stdout.readline()
        lines.append(line)
        if "worker on " in line or not line:
            break
    worker.send_signal(signal.SIGTERM)
    out, _ = worker.communicate(timeout=60)
    log = "".join(lines) + out
    assert any("worker on " in line for line in lines), log[-3000:]
    assert not leaked(log), sorted(leaked(log))

