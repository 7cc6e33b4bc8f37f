"""Read-only side of ``fs.rename``: snapshot, gate and probe on the local filesystem.

A file's identity is its (device, inode) pair recorded in before_state, never its name: a file
that merely has the target name may be somebody else's.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tidemark.actions import GateRefused, ProbeResult, StepContext


def target_path(args: dict[str, Any]) -> Path:
    return Path(args["path"]).with_name(args["name"])


def _identity(st: os.stat_result) -> dict[str, int]:
    return {"dev": st.st_dev, "inode": st.st_ino}


def _stat(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except FileNotFoundError:
        return None


class FsRenameProbe:
    """Gates, before_state and probe of a local rename."""

    def preconditions(self, ctx: StepContext) -> None:
        src, dst = Path(ctx.args["path"]), target_path(ctx.args)
        st = _stat(src)
        if st is None:
            raise GateRefused(f"{src} does not exist")
        if not src.is_file():
            raise GateRefused(f"{src} is not a regular file")
        other = _stat(dst)
        if other is not None and _identity(other) != _identity(st):
            raise GateRefused(f"{dst} exists already; renaming would overwrite it")

    def snapshot(self, ctx: StepContext) -> dict[str, Any]:
        src = Path(ctx.args["path"])
        st = src.stat()
        return {"path": str(src), "name": src.name, **_identity(st), "size": st.st_size}

    def probe(self, ctx: StepContext) -> ProbeResult:
        before = ctx.before_state or {}
        ours = {"dev": before.get("dev"), "inode": before.get("inode")}
        src, dst = Path(ctx.args["path"]), target_path(ctx.args)
        at_dst, at_src = _stat(dst), _stat(src)
        if at_dst is not None and _identity(at_dst) == ours:
            return ProbeResult.done({"path": str(dst), **ours},
                                    f"{dst.name} is the file recorded in before_state")
        if at_src is not None and _identity(at_src) == ours:
            return ProbeResult.absent(f"{src.name} is still the file recorded in before_state")
        seen = []
        if at_dst is not None:
            seen.append(f"{dst.name} exists but is another file (inode {at_dst.st_ino})")
        if at_src is None:
            seen.append(f"{src.name} is gone")
        return ProbeResult.unknown(
            f"our file (inode {ours['inode']}) is at neither name; " + "; ".join(seen),
            {"at_target": at_dst is not None, "at_source": at_src is not None})
