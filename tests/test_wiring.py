"""How a worker binds its targets from the environment.

Credentials never go where they do not belong, and fs.rename reaches only the roots it was given."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from activities.fs import FsRename
from activities.wiring import (
    STAGING_URL,
    Credentials,
    bound_actions,
    credentials,
    worker_registry,
)
from probes.fs import ROOTS_ENV
from staging import gmail as staging_gmail
from tidemark.errors import ActionNotConfigured, ConfigError

STAGING = "http://127.0.0.1:8900"


def test_real_tokens_without_their_own_url_are_refused_under_a_staging_url() -> None:
    env = {STAGING_URL: STAGING, "TIDEMARK_GMAIL_WRITE_TOKEN": "ya29.real-send",
           "TIDEMARK_GMAIL_READ_TOKEN": "ya29.real-read"}
    with pytest.raises(ConfigError) as e:
        credentials(env, "gmail")
    message = str(e.value)
    assert message.startswith("gmail: TIDEMARK_GMAIL_WRITE_TOKEN and TIDEMARK_GMAIL_READ_TOKEN "
                              "are set but TIDEMARK_GMAIL_URL is not")
    assert STAGING in message and "https://gmail.googleapis.com" in message
    assert "ya29" not in message  # the secret is not repeated
    with pytest.raises(ConfigError, match="gmail"):  # refused at start, before any client
        bound_actions(env)


def test_tokens_with_their_own_url_or_the_staging_tokens_are_accepted() -> None:
    env = {STAGING_URL: STAGING, "TIDEMARK_GMAIL_WRITE_TOKEN": "ya29.real-send",
           "TIDEMARK_GMAIL_READ_TOKEN": "ya29.real-read",
           "TIDEMARK_GMAIL_URL": "https://gmail.googleapis.com"}
    assert tokens(credentials(env, "gmail")) == ("https://gmail.googleapis.com",
                                                 "ya29.real-send", "ya29.real-read")
    # The staging servers' own tokens may go to the staging URL.
    env = {STAGING_URL: STAGING, "TIDEMARK_GMAIL_WRITE_TOKEN": staging_gmail.COMPOSE_TOKEN,
           "TIDEMARK_GMAIL_READ_TOKEN": staging_gmail.READ_TOKEN}
    assert tokens(credentials(env, "gmail")) == (STAGING, staging_gmail.COMPOSE_TOKEN,
                                                 staging_gmail.READ_TOKEN)
    # Without a staging URL, real tokens go to the real service.
    env = {"TIDEMARK_GMAIL_WRITE_TOKEN": "w", "TIDEMARK_GMAIL_READ_TOKEN": "r"}
    assert tokens(credentials(env, "gmail")) == ("https://gmail.googleapis.com", "w", "r")


def tokens(c: Credentials | None) -> tuple[str, str, str]:
    assert c is not None
    return c.url, c.write.token(), c.read.token()


def test_fs_rename_is_bound_only_with_roots(tmp_path: Path) -> None:
    with pytest.raises(ActionNotConfigured, match=r"'fs\.rename' is not configured"):
        worker_registry({}).bound("fs.rename")
    with pytest.raises(ActionNotConfigured):
        worker_registry({ROOTS_ENV: ""}).bound("fs.rename")
    other = tmp_path / "b"
    other.mkdir()
    (tmp_path / "link").symlink_to(other)
    action = worker_registry({ROOTS_ENV: os.pathsep.join([str(tmp_path / "link"), ""])}
                             ).bound("fs.rename")
    assert isinstance(action, FsRename)
    assert action.roots.paths == (os.path.realpath(other),)  # resolved once, at start
    with pytest.raises(ConfigError, match="not a directory"):
        worker_registry({ROOTS_ENV: str(tmp_path / "missing")})



def test_worker_code_never_imports_the_staging_servers() -> None:
    """Worker code never imports the staging servers.

    activities/, probes/ and worker.py reach staging only over HTTP. The staging default tokens
    they need live in tidemark/staging_tokens.py."""
    import ast
    root = Path(__file__).resolve().parent.parent
    files = [root / "worker.py", *(root / "activities").glob("*.py"),
             *(root / "probes").glob("*.py")]
    offenders = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            offenders += [f"{path.relative_to(root)}: {n}" for n in names
                          if n == "staging" or n.startswith("staging.")]
    assert offenders == []
