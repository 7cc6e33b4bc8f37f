"""Where the Web UI links point: TIDEMARK_UI_URL, the dev stack's record, Cloud, the default.

tidemark/web_ui.py's order, read from settings as every command reads them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemark.errors import ConfigError
from tidemark.settings import Settings, load_settings
from tidemark.web_ui import DEFAULT_UI, base_url, workflow_url, write_stack_record


def settings_of(tmp_path: Path, **env: str) -> Settings:
    profile = tmp_path / "temporal.toml"
    if not profile.exists():
        profile.write_text("")
    return load_settings({"TIDEMARK_HOME": str(tmp_path / "home"),
                          "TEMPORAL_CONFIG_FILE": str(profile), **env})


def test_the_web_ui_follows_the_setting_then_the_stack_then_the_default(tmp_path: Path) -> None:
    assert base_url(settings_of(tmp_path)) == DEFAULT_UI
    assert base_url(settings_of(tmp_path, TIDEMARK_UI_URL="https://ui.example/temporal/")) == (
        "https://ui.example/temporal")
    # A `tidemark dev` stack records its Web UI beside the temporal.toml it writes: it counts
    # for its own address only.
    write_stack_record(tmp_path, "127.0.0.1:17233", "http://127.0.0.1:18233")
    assert base_url(settings_of(tmp_path, TEMPORAL_ADDRESS="127.0.0.1:17233")) == (
        "http://127.0.0.1:18233")
    assert base_url(settings_of(tmp_path, TEMPORAL_ADDRESS="127.0.0.1:7233")) == DEFAULT_UI
    assert base_url(settings_of(tmp_path, TEMPORAL_ADDRESS="127.0.0.1:17233",
                                TIDEMARK_UI_URL="http://10.0.0.5:8080")) == "http://10.0.0.5:8080"
    cloud = settings_of(tmp_path, TEMPORAL_ADDRESS="billing.a2b3c.tmprl.cloud:7233")
    assert base_url(cloud) == "https://cloud.temporal.io"
    assert workflow_url("http://h:1/", "default", "tidemark-t 1", "r1") == (
        "http://h:1/namespaces/default/workflows/tidemark-t%201/r1/history")


@pytest.mark.parametrize("bad", ["localhost:8233", "ftp://h/x", "http://", "http://h:port",
                                 "http://h/?q=1", "http://h /x"])
def test_a_bad_ui_url_is_one_line_naming_the_variable(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ConfigError) as e:
        settings_of(tmp_path, TIDEMARK_UI_URL=bad)
    assert str(e.value).startswith("TIDEMARK_UI_URL must be the Temporal Web UI's address, like "
                                   "http://127.0.0.1:8233")
    assert str(e.value).endswith(f"got {bad!r}") and "\n" not in str(e.value)
