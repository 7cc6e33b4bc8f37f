"""Where the Temporal Web UI of the configured stack is: the base of every link we print.

The Temporal profile (temporal.toml) has no field for the Web UI, so the base is, in order:

1. ``TIDEMARK_UI_URL`` (``Settings.ui_url``), when set;
2. the record a `tidemark dev` stack writes beside its temporal.toml (``STACK_RECORD``), when
   its Temporal address is the configured one: found beside ``TEMPORAL_CONFIG_FILE`` or in
   ``$TIDEMARK_HOME``;
3. Temporal Cloud's Web UI, when the address is a Temporal Cloud endpoint;
4. ``DEFAULT_UI``, the Web UI of a dev server on its default port.

docs/reference.md (Configuration) says the same for the reader.
"""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path

from tidemark.database import private_file
from tidemark.settings import Settings

DEFAULT_UI = "http://localhost:8233"
# What `tidemark dev` writes beside its temporal.toml: {"address": ..., "ui_url": ...}.
STACK_RECORD = "temporal-ui.json"
# Temporal Cloud's namespace endpoints end so; its Web UI serves every namespace.
CLOUD_SUFFIX = ".tmprl.cloud"
CLOUD_UI = "https://cloud.temporal.io"


def write_stack_record(directory: Path, address: str, ui_url: str) -> Path:
    """Records beside a stack's temporal.toml where its Web UI answers."""
    path = directory / STACK_RECORD
    with private_file(path) as f:
        f.truncate(0)
        f.write((json.dumps({"address": address, "ui_url": ui_url}) + "\n").encode())
    return path


def _recorded(settings: Settings) -> str | None:
    """The Web UI a dev stack recorded for the configured address, if any."""
    places = [settings.home]
    if settings.temporal_config_file:
        places.insert(0, Path(settings.temporal_config_file).parent)
    for place in places:
        try:
            record = json.loads((place / STACK_RECORD).read_text(encoding="utf-8"))
        except (OSError, ValueError):  # none there, or not ours to read: look on
            continue
        if (isinstance(record, dict) and record.get("address") == settings.temporal_address
                and isinstance(record.get("ui_url"), str)):
            return str(record["ui_url"])
    return None


def base_url(settings: Settings) -> str:
    """The Web UI's base URL for the stack ``settings`` reach, with no trailing slash."""
    if settings.ui_url:
        return settings.ui_url
    recorded = _recorded(settings)
    if recorded:
        return recorded.rstrip("/")
    host = settings.temporal_address.rsplit(":", 1)[0]
    if host.endswith(CLOUD_SUFFIX):
        return CLOUD_UI
    return DEFAULT_UI


def workflow_url(base: str, namespace: str, workflow_id: str, run_id: str | None = None) -> str:
    """The Web UI's page of a workflow (of one run of it, when ``run_id`` is given)."""
    ns, wid = (urllib.parse.quote(x, safe="") for x in (namespace, workflow_id))
    url = f"{base.rstrip('/')}/namespaces/{ns}/workflows/{wid}"
    return f"{url}/{urllib.parse.quote(run_id, safe='')}/history" if run_id else url
