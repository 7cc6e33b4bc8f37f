"""What a user installs: the product, and none of the developers' harnesses.

The wheel built from the tracked tree holds the product (the core, the worker's packages, the
staging emulators, the command and the harnesses a user runs against their own stack) and none of
the developers' harnesses (dev/), tests or benchmarks; the worker image copies no developer tool."""
from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tidemark.import_names import OURS

ROOT = Path(__file__).parent.parent
PRODUCT = {"tidemark", "workflows", "activities", "probes", "staging", "tools", "worker.py"}
DEV_HARNESSES = {"mutation_check", "mutants", "rule_map", "record_histories", "screenshots",
                 "fuzz"}


def built_wheel(tmp: Path) -> zipfile.ZipFile:
    """Builds the wheel from a copy of the files git tracks, as a clean clone would."""
    tree = tmp / "tree"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout.decode().split("\0")
    for name in filter(None, tracked):
        if (ROOT / name).is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, tree / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "--no-cache-dir", "-w", str(tmp / "dist"),
                    str(tree)], check=True, capture_output=True, timeout=240)
    [wheel] = (tmp / "dist").glob("tidemark-*.whl")
    return zipfile.ZipFile(wheel)


def test_the_wheel_holds_the_product_and_no_developer_harness(tmp_path: Path) -> None:
    with built_wheel(tmp_path) as wheel:
        names = wheel.namelist()
        info = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        entry_points = configparser.ConfigParser()
        entry_points.read_string(wheel.read(info).decode())
    top = {n.split("/")[0] for n in names if ".dist-info/" not in n}
    assert top == PRODUCT, top
    # The names the start-up check holds to be ours (tidemark.import_names) are these.
    assert {n.removesuffix(".py") for n in PRODUCT} == {"tidemark", *OURS}
    assert not [n for n in names if set(re.split(r"[/.]", n)) & DEV_HARNESSES]
    assert not [n for n in names if n.startswith(("dev/", "tests/", "bench/", "examples/"))]
    # The command, the operator's controls and the harnesses a user runs are installed.
    for module in ("tools/cli/main.py", "tools/operate/kill.py", "tools/chaos/run.py",
                   "tools/kit/testing.py", "tools/fleet.py", "tools/stack/devstack.py",
                   "tidemark/migrations/0001_journal.sql"):
        assert module in names, module
    assert entry_points["console_scripts"]["tidemark"] == "tools.cli.main:run"
    assert entry_points["pytest11"]["tidemark"] == "tools.kit.testing"


def test_the_worker_image_copies_no_developer_tool() -> None:
    copied = set()
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            copied |= {w.rstrip("/") for w in line.split()[1:-1]}
    assert "dev" not in copied and "tests" not in copied and "bench" not in copied, copied
    assert {"tidemark", "workflows", "activities", "probes", "tools", "worker.py"} <= copied
