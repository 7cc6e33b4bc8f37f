"""Every argument of a `tidemark` command, checked where it enters.

Each is checked against the journal's limits (tidemark.limits), before the command reads or
writes anything.

A task id, a series name, a reason, a note or a ``--by`` label that is too long, holds a
character the journal or one line of output cannot hold (NUL and the other control characters,
a line separator, a byte that is not UTF-8), or JSON that cannot be decoded is refused with
one line naming the argument and the limit, exit 2 (tools.cli.main), and nothing written. What the
journal can hold but names nothing (a task id with a space, say) is left to the command, which
says that no such task is known.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from tidemark.limits import (
    ID_MAX,
    LABEL_MAX,
    NOTE_MAX,
    POLICY_MAX,
    REASON_MAX,
    SCOPE_MAX,
    bad_character,
    check_text,
    decode_json,
)

# `tidemark schedule create --args`: the planner's arguments, handed to it in the schedule's
# action (a Temporal payload); far more than a planner needs, far less than a payload may hold.
PLANNER_ARGS_BYTES_MAX = 64 * 1024
# Arguments that name files or directories on this machine: any name the filesystem holds is
# the user's to give (nothing of it is journaled); the command says when it cannot be read.
PATHS = frozenset({"file", "plan", "record"})


def _task(field: str, value: str) -> None:
    # `stop '*'` and `stop series:S` name a scope: the controls table holds up to SCOPE_MAX.
    scope = value == "*" or value.startswith("series:")
    check_text(field, value, SCOPE_MAX if scope else ID_MAX, min_chars=1)


CHECKS: dict[str, Callable[[str, str], Any]] = {
    "task": _task,
    "series": lambda f, v: check_text(f, v, ID_MAX, min_chars=1),
    "reason": lambda f, v: check_text(f, v, REASON_MAX),
    "note": lambda f, v: check_text(f, v, NOTE_MAX),
    "by": lambda f, v: check_text(f, v, LABEL_MAX, min_chars=1),
    "approval": lambda f, v: check_text(f, v, POLICY_MAX, min_chars=1),
    "args": lambda f, v: decode_json(v, f, max_bytes=PLANNER_ARGS_BYTES_MAX),
}
# How a line names each argument: as it is typed.
NAMES = {"task": "task id", "as_": "--as"}


def check_arguments(a: argparse.Namespace) -> None:
    """Refuses (InputError) the first argument of ``a`` that the journal cannot take."""
    for dest, value in vars(a).items():
        if dest in PATHS or not isinstance(value, str):
            continue
        field = NAMES.get(dest, "--" + dest.replace("_", "-"))
        check = CHECKS.get(dest)
        if check is not None:
            check(field, value)
        elif bad_character(value) is not None:  # any other text: one printable line at least
            check_text(field, value, len(value))
