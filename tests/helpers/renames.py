"""A task of two fs.rename steps in a test's ``tmp_path``."""

from __future__ import annotations

from pathlib import Path

from activities.catalog import spec_registry
from activities.fs import FsRename
from helpers.fs_roots import FS_ROOTS
from helpers.steps import persist
from tidemark.actions import Registry
from tidemark.run_step import run_step
from tidemark.store import JournalStore

RENAME_SPECS = spec_registry(FsRename)
RENAMES = Registry([FsRename([FS_ROOTS])])


def two_renames(store: JournalStore, tmp_path: Path, task: str) -> str:
    """A task of two reversible renames (draft-i.txt to final-i.txt) whose step 1 is done."""
    steps = []
    for i in (1, 2):
        (tmp_path / f"draft-{i}.txt").write_text(str(i))
        steps.append({"action": "fs.rename", "args": {"path": str(tmp_path / f"draft-{i}.txt"),
                                                      "name": f"final-{i}.txt"}})
    persist(store, RENAME_SPECS, steps, task)
    run_step(store, RENAMES, task, 1)
    return task
