"""Puts the example plugin (examples/ledger-plugin) on the path without installing it.

It is on the path of the tests and of every process they start, so that the README's test command is
the whole of it.

A plugin is found by its entry points (``tidemark.actions``, ``tidemark.staging``), which
importlib.metadata reads from a distribution's metadata on ``sys.path``. This writes that
metadata from the plugin's own pyproject.toml (its one source) into a directory of this test
process, and puts that directory and the plugin's package directory first on ``sys.path`` and on
``PYTHONPATH``, which the workers, commands and copies the tests start inherit. Where the plugin
is installed as well, the one here comes first: importlib.metadata takes the first distribution
of a name on the path, and the package is this tree's, not another checkout's.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import tomllib
from pathlib import Path

PLUGIN = Path(__file__).resolve().parents[2] / "examples" / "ledger-plugin"


def write_dist_info(pyproject: Path, into: Path) -> Path:
    """Writes the ``NAME-VERSION.dist-info`` directory of the project ``pyproject`` describes.

    It holds the metadata importlib.metadata reads: its name, version and entry points."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    name, version = project["name"], project["version"]
    dist = into / f"{name.replace('-', '_')}-{version}.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8")
    lines: list[str] = []
    for group, points in project.get("entry-points", {}).items():
        lines += [f"[{group}]", *(f"{key} = {value}" for key, value in points.items()), ""]
    (dist / "entry_points.txt").write_text("\n".join(lines), encoding="utf-8")
    return dist


def put_on_path() -> None:
    """The plugin's package and metadata first on this process's path and its children's."""
    meta = Path(tempfile.mkdtemp(prefix="tidemark-plugin-"))
    atexit.register(shutil.rmtree, meta, ignore_errors=True)
    write_dist_info(PLUGIN / "pyproject.toml", meta)
    entries = [str(PLUGIN), str(meta)]
    sys.path[:0] = entries
    inherited = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([*entries, *([inherited] if inherited else [])])
