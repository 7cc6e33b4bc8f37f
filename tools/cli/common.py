"""What the `tidemark` commands share.

That is the exit codes, the usage error, the journal's URL under the command's settings, JSON
output, and the Temporal flags."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tidemark.database import database_url

EXIT_ERROR = 1
EXIT_USAGE = 2
# `--wait` of resume, unwind, approve and reject: the run ended, but not in the command's
# success state (SUCCESS below); one line on stderr names the state it ended in.
EXIT_NOT_DONE = 3
# What each waiting command set out to reach. A reject succeeds when the run it told ends
# stopped with nothing irreversible done.
SUCCESS = {"start": "completed", "resume": "completed", "unwind": "unwound", "approve": "completed",
           "reject": "stopped"}
# The help of --json on the commands that change state (tools/operate/outcome.py).
JSON_HELP = ("print one JSON object: command, task, committed, run, next (docs/reference.md, "
             "\"--json of the commands that change state\")")


class UsageError(Exception):
    """A command line that names nothing to act on, or two things at once."""


def journal_url(a: argparse.Namespace) -> str:
    """The journal's URL under the command's settings."""
    return database_url(a.settings)


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True, default=str))


def add_temporal_arguments(parser: argparse.ArgumentParser) -> None:
    """--address and --namespace, which replace the configured ones.

    The configured ones are the temporal.toml profile of TEMPORAL_PROFILE, TEMPORAL_ADDRESS and
    TEMPORAL_NAMESPACE; TLS and API key stay."""
    parser.add_argument("--address", help="Temporal frontend host:port (default: the "
                        "configured profile or TEMPORAL_ADDRESS, else localhost:7233)")
    parser.add_argument("--namespace", help="Temporal namespace (default: the configured "
                        "profile or TEMPORAL_NAMESPACE, else default)")


async def temporal(a: argparse.Namespace) -> Any:
    """A client of the configured Temporal (TemporalUnavailable, one line, when unreachable)."""
    from tools.operate.starter import connect

    return await connect(a.settings)


def ended(command: str, workflow_id: str, state: str, error: dict[str, Any] | None) -> int:
    """The exit code of a waiting command whose run ended in ``state``.

    It is 0 for the command's success state. Otherwise: one line on stderr naming the end state,
    and EXIT_NOT_DONE, so that a script (or a person's `&&`) never takes a run that needs a
    person for done."""
    want = SUCCESS[command]
    if state == want:
        return 0
    err = error or {}
    why = f" ({err.get('type')}: {err.get('message')})" if err.get("type") else ""
    print(f"tidemark: {workflow_id} ended {state}, not {want}{why}".replace("\n", " "),
          file=sys.stderr)
    return EXIT_NOT_DONE
