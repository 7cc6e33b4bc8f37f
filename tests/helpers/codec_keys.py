"""The suite's payload keys: two ids, so a run can be encrypted half under each (a rotation).

Fixed bytes, for tests only. The session's sandbox replay (helpers/sandbox_replay.py) decodes
with them, so the runs the codec tests encrypt replay there like every other."""

from __future__ import annotations

import base64
from pathlib import Path

from temporalio.converter import DataConverter

from tidemark.codec import FileKeys, data_converter

KEYS = {"key-a": bytes(range(32)), "key-b": bytes(range(100, 132))}


def key_line(key_id: str) -> str:
    return f"{key_id}={base64.b64encode(KEYS[key_id]).decode()}"


def key_file(path: Path, *ids: str) -> Path:
    """Writes a key file of ``ids`` (0600) at ``path``."""
    path.write_text("".join(f"{key_line(i)}\n" for i in ids))
    path.chmod(0o600)
    return path


def suite_converter() -> DataConverter:
    """A data converter holding every suite key: it decodes any run the suite encrypted."""
    return data_converter(FileKeys("key-a", KEYS))
