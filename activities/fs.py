"""``fs.rename`` {path, name}: the file at ``path`` gets the name ``name``.

The file now at ``path`` should be named ``name`` in the same directory. Reversible; an end
state, so applying it twice is harmless.

Confined to the directories a worker is given (``TIDEMARK_FS_ROOTS``): without them the action
is not bound, and a plan using it is refused before its first step. The rename never replaces a
file. ``renameat2(RENAME_NOREPLACE)`` on Linux is one atomic call that fails with EEXIST when
the target name is taken, so a file that appears after the gate looked is never overwritten.
Where the kernel or filesystem lacks the flag, ``link`` + ``unlink`` gives the same refusal (the
link fails on a taken name). A crash between its two calls leaves the file under both names,
which the probe reads as done.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

from probes.fs import FsRenameProbe, Roots, action_error, identity, target_path
from tidemark.actions import (
    Action,
    Arg,
    GateRefused,
    ProbeResult,
    ProbeStatus,
    StepContext,
    nonempty_str,
)
from tidemark.errors import Refused

NAME_MAX = 255  # bytes in one path component (Linux, and the usual filesystems elsewhere)
PATH_MAX = 4095  # bytes in a whole path, without its terminating NUL

RENAME_NOREPLACE = 1  # <linux/fs.h>


def _load_renameat2() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    fn = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)  # glibc >= 2.28
    if fn is not None:
        fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                       ctypes.c_uint]
        fn.restype = ctypes.c_int
    return fn


_renameat2 = _load_renameat2()


def rename_noreplace(dir_fd: int, old: str, new: str) -> None:
    """Renames ``old`` to ``new`` inside the directory ``dir_fd``, never replacing ``new``.

    Raises FileExistsError if ``new`` exists at the moment of the call, or the OSError of the
    failed call; nothing changed in either case.
    """
    if _renameat2 is not None:
        if _renameat2(dir_fd, os.fsencode(old), dir_fd, os.fsencode(new), RENAME_NOREPLACE) == 0:
            return
        err = ctypes.get_errno()
        # EINVAL: this filesystem does not support the flag; ENOSYS: nor does the kernel.
        if err not in (errno.EINVAL, errno.ENOSYS):
            raise OSError(err, os.strerror(err), old, None, new)
    os.link(old, new, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
    os.unlink(old, dir_fd=dir_fd)


def _component(value: str, what: str) -> None:
    if len(value.encode("utf-8")) > NAME_MAX:
        raise ValueError(f"{what} {value[:40]!r}… is longer than {NAME_MAX} bytes")


def _absolute(path: str) -> str:
    if not os.path.isabs(path):
        raise ValueError(f"must be an absolute path, got {path!r}")
    path = os.path.normpath(path)
    if path.strip("/") == "":
        raise ValueError("must name a file, not the root directory '/'")
    if len(path.encode("utf-8")) > PATH_MAX:
        raise ValueError(f"is longer than {PATH_MAX} bytes")
    for part in path.split("/"):
        _component(part, "the path component")
    return path


def _file_name(name: str) -> str:
    nonempty_str(name)
    if "/" in name or name in (".", ".."):
        raise ValueError(f"must be a file name without '/', got {name!r}")
    _component(name, "the name")
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

    def __init__(self, roots: Roots | Iterable[str | os.PathLike[str]]) -> None:
        """Confines the action to ``roots``.

        Args:
            roots: The directories it may touch (``Roots``, or paths to resolve into one).
        """
        self.roots = roots if isinstance(roots, Roots) else Roots(roots)
        self.reader = FsRenameProbe(self.roots)

    @classmethod
    def describe(cls, args: dict[str, Any]) -> str:
        return f"{Path(args['path']).name} -> {args['name']}"

    def plan_gate(self, task_id: str, steps: list[tuple[int, dict[str, Any]]]) -> None:
        """Refuses, before the first step, a plan with any path outside the roots."""
        for number, args in steps:
            try:
                self.roots.check(os.path.dirname(args["path"]), strict=False)
            except GateRefused as e:
                raise GateRefused(f"step {number} ({args['path']}): {e}") from None

    def preconditions(self, ctx: StepContext) -> None:
        self.reader.preconditions(ctx)

    def snapshot(self, ctx: StepContext) -> dict[str, Any]:
        return self.reader.snapshot(ctx)

    def probe(self, ctx: StepContext) -> ProbeResult:
        return self.reader.probe(ctx)

    def execute(self, ctx: StepContext) -> dict[str, Any]:
        src, dst = Path(ctx.args["path"]), target_path(ctx.args)
        before = ctx.before_state or {}
        try:
            with self.roots.open_dir(str(src.parent)) as dir_fd:
                st = os.stat(src.name, dir_fd=dir_fd, follow_symlinks=False)
                if "inode" in before and identity(st) != {"dev": before["dev"],
                                                          "inode": before["inode"]}:
                    raise Refused(f"{src} is no longer the file recorded in before_state "
                                  f"(inode {st.st_ino}, not {before['inode']}); not renaming")
                if src != dst:
                    rename_noreplace(dir_fd, src.name, dst.name)
        except FileExistsError as e:
            raise Refused(f"{dst} appeared after the gate ran; not overwriting it") from e
        except FileNotFoundError as e:
            raise Refused(f"{src} is gone: {e.strerror}") from e
        except OSError as e:
            raise action_error(e, f"cannot rename {src} to {dst.name}") from e
        return {"path": str(dst), **identity(st)}

    def compensate(self, ctx: StepContext) -> dict[str, Any]:
        """Moves the file back to its before_state name if it is still ours at the target."""
        before = ctx.before_state or {}
        original, dst = Path(before["path"]), target_path(ctx.args)
        probed = self.reader.probe(ctx)
        if probed.status is ProbeStatus.ABSENT:
            return {"path": str(original), "note": "already at its original name"}
        if probed.status is not ProbeStatus.DONE:
            raise Refused(f"cannot restore {original.name}: {probed.reason}")
        try:
            with self.roots.open_dir(str(dst.parent)) as dir_fd:
                rename_noreplace(dir_fd, dst.name, original.name)
        except FileExistsError as e:
            raise Refused(f"cannot restore {original.name}: another file took that name") from e
        except OSError as e:
            raise action_error(e, f"cannot restore {original.name}") from e
        return {"path": str(original), "restored_from": str(dst)}
