"""``fs.rename`` {path, name}: the file now at ``path`` should be named ``name`` in the same
directory. Reversible; an end state, so applying it twice is harmless."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

from probes.fs import FsRenameProbe, target_path
from tidemark.actions import Action, Arg, ProbeResult, StepContext, nonempty_str
from tidemark.errors import Refused


def _absolute(path: str) -> str:
    if not os.path.isabs(path):
        raise ValueError(f"must be an absolute path, got {path!r}")
    return os.path.normpath(path)


def _file_name(name: str) -> str:
    nonempty_str(name)
    if "/" in name or name in (".", ".."):
        raise ValueError(f"must be a file name without '/', got {name!r}")
    return name


class FsRename(Action):
    name: ClassVar[str] = "fs.rename"
    irreversible: ClassVar[bool] = False
    args: ClassVar[dict[str, Arg]] = {
        "path": Arg(str, check=_absolute),
        "name": Arg(str, check=_file_name),
    }
    # A local rename is one system call in this process: it cannot outlive its attempt by more
    # than a moment, and nothing applies it later.
    deadline_s = 2.0
    horizon_s = 0.0

    def __init__(self) -> None:
        self.reader = FsRenameProbe()

    @classmethod
    def describe(cls, args: dict[str, Any]) -> str:
        return f"{Path(args['path']).name} -> {args['name']}"

    def preconditions(self, ctx: StepContext) -> None:
        self.reader.preconditions(ctx)

    def snapshot(self, ctx: StepContext) -> dict[str, Any]:
        return self.reader.snapshot(ctx)

    def probe(self, ctx: StepContext) -> ProbeResult:
        return self.reader.probe(ctx)

    def execute(self, ctx: StepContext) -> dict[str, Any]:
        src, dst = Path(ctx.args["path"]), target_path(ctx.args)
        if src != dst:
            try:
                # The gate checked dst is free; os.rename would silently replace a file that
                # appeared since, so refuse instead.
                if dst.exists():
                    raise Refused(f"{dst} appeared since the gate ran; not overwriting it")
                os.rename(src, dst)
            except FileNotFoundError as e:
                raise Refused(f"{src} is gone: {e.strerror}") from e
        st = dst.stat()
        return {"path": str(dst), "dev": st.st_dev, "inode": st.st_ino}

    def compensate(self, ctx: StepContext) -> dict[str, Any]:
        """Moves the file back to its before_state name if it is still ours at the target."""
        before = ctx.before_state or {}
        original, dst = Path(before["path"]), target_path(ctx.args)
        probed = self.reader.probe(ctx)
        if probed.status == "absent":
            return {"path": str(original), "note": "already at its original name"}
        if probed.status != "done":
            raise Refused(f"cannot restore {original.name}: {probed.reason}")
        if original.exists():
            raise Refused(f"cannot restore {original.name}: another file took that name")
        os.rename(dst, original)
        return {"path": str(original), "restored_from": str(dst)}
