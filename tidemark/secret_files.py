"""Reading a secret from a file named by a ``*_FILE`` variable, with errors that say what to fix.

Docker Compose mounts a file-based secret with the owner and mode it has on the host (its
``uid``/``gid``/``mode`` settings apply to Swarm only), so a key file kept ``0600`` by its owner
on the host is unreadable to a container that runs as another uid. The message says so, with the
numbers, instead of a bare "Permission denied".
"""

from __future__ import annotations

import os
from pathlib import Path

from tidemark.errors import ConfigError


def unreadable(variable: str, path: str, error: OSError) -> str:
    """The message for a secret file named by ``variable`` that could not be read."""
    if isinstance(error, PermissionError):
        uid = os.getuid()
        try:
            st = os.stat(path)
            held = f"it is owned by uid {st.st_uid} with mode {st.st_mode & 0o777:04o}"
        except OSError:
            held = "its directory cannot be searched"
        return (f"{variable}: cannot read {path}: permission denied to uid {uid} ({held}). "
                "A secret file mounted by docker compose keeps its owner and mode from the "
                f"host: make it readable by uid {uid} there, e.g. `chmod 0444` on the file with "
                f"its directory kept `chmod 0700`, or `chown {uid}` on the file")
    if isinstance(error, FileNotFoundError):
        return (f"{variable}: cannot read {path}: no such file; create it, or point {variable} "
                "at the file that holds the secret")
    return f"{variable}: cannot read {path}: {error.strerror or error}"


def read_secret_file(variable: str, path: str) -> str:
    """The stripped contents of ``path``.

    ConfigError saying what to fix if it cannot be read or is empty."""
    try:
        value = Path(path).read_text(encoding="utf-8").strip()
    except OSError as e:
        raise ConfigError(unreadable(variable, path, e)) from None
    if not value:
        raise ConfigError(f"{variable}: {path} is empty")
    return value
