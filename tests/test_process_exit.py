"""The command line and the worker end through tidemark.process_exit.exit_now.

What atexit holds still runs (the embedded Postgres lets go of its server there), what was
printed is not lost, and the exit code is the command's."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""
    import atexit, sys
    from tidemark.process_exit import exit_now
    atexit.register(lambda: open(sys.argv[1], "w").write("ran"))
    sys.stdout.write("answer without a newline")  # buffered: only a flush writes it
    exit_now(int(sys.argv[2]))
    print("never")
""")


def test_exit_now_runs_atexit_flushes_and_keeps_the_code(tmp_path: Path) -> None:
    marker = tmp_path / "atexit"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(marker), "3"],
                          capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (3, "answer without a newline", "")
    assert marker.read_text() == "ran"


def test_the_tidemark_command_exits_with_mains_code() -> None:
    usage = subprocess.run([sys.executable, "-m", "tools.cli.main", "no-such-command"],
                           capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and "invalid choice" in usage.stderr
    helped = subprocess.run([sys.executable, "-m", "tools.cli.main", "--help"],
                            capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and helped.stdout.startswith("usage: tidemark")
