"""Read-only side of ``fs.rename`` on the local filesystem.

It holds the roots the action is confined to, snapshot, gate and probe, and what an
operating-system error means for a step.

A file's identity is its (device, inode) pair recorded in before_state, never its name: a file
that merely has the target name may be somebody else's. Names are looked at with ``lstat``: a
symbolic link is a name of its own, never the file it points to.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from tidemark.actions import GateRefused, ProbeResult, StepContext
from tidemark.errors import ConfigError, PreconditionFailed, Refused, TargetUnavailable

ROOTS_ENV = "TIDEMARK_FS_ROOTS"

# Errors another attempt can heal: the disk or quota fills and is freed, a descriptor table or
# memory runs short, a network filesystem hiccups, a call is interrupted. EIO is here because
# it is ambiguous (the rename may have reached the disk): the step stays in doubt and the next
# attempt asks the probe, which finds the file by its inode. Every other errno — EACCES, EPERM,
# EROFS, ENAMETOOLONG, ENOTDIR, EISDIR, EINVAL, ELOOP, EXDEV, EEXIST, ENOENT, and any errno not
# listed — means this request cannot succeed as it stands; retrying it would loop for ever.
TRANSIENT_ERRNOS = frozenset({
    errno.EIO, errno.EAGAIN, errno.EINTR, errno.ENOSPC, errno.EDQUOT, errno.ENOMEM,
    errno.ENFILE, errno.EMFILE, errno.EBUSY, errno.ESTALE, errno.ETIMEDOUT,
})


def os_reason(e: OSError) -> str:
    """``Not a directory [ENOTDIR]: /a/file.txt/b``: the words, the errno's name, the path."""
    name = errno.errorcode.get(e.errno or 0, str(e.errno))
    where = f": {e.filename}" if e.filename is not None else ""
    return f"{e.strerror or e} [{name}]{where}"


def is_transient(e: OSError) -> bool:
    return e.errno in TRANSIENT_ERRNOS


def gate_error(e: OSError, what: str) -> Exception:
    """An OSError met before the intent: a refusal of the gate, or retryable if transient."""
    if is_transient(e):
        return TargetUnavailable(f"{what}: {os_reason(e)}")
    return GateRefused(f"{what}: {os_reason(e)}")


def action_error(e: OSError, what: str) -> Exception:
    """An OSError from the rename itself.

    A failed rename(2) changed nothing, so a permanent error is a refusal (the step fails for
    good); a transient one leaves it in doubt."""
    if is_transient(e):
        return TargetUnavailable(f"{what}: {os_reason(e)}")
    return Refused(f"{what}: {os_reason(e)}")


def parse_roots(value: str | None) -> list[str]:
    """The entries of ``TIDEMARK_FS_ROOTS`` (an ``os.pathsep``-separated list).

    Empty ones are ignored, so an empty or unset variable means no roots."""
    return [p for p in (value or "").split(os.pathsep) if p]


class Roots:
    """The directory trees ``fs.rename`` may touch, resolved with realpath once at start.

    A directory is inside when its real path (symbolic links resolved) is a root or lies under
    one, so a link that points out of a root does not carry a rename with it.
    """

    def __init__(self, roots: Iterable[str | os.PathLike[str]]) -> None:
        resolved: list[str] = []
        for raw in roots:
            path = os.fspath(raw)
            if not os.path.isabs(path):
                raise ConfigError(f"{ROOTS_ENV}: {path!r} is not an absolute path")
            real = os.path.realpath(path)
            if not os.path.isdir(real):
                raise ConfigError(f"{ROOTS_ENV}: {path} is not a directory")
            resolved.append(real)
        if not resolved:
            raise ConfigError(f"fs.rename needs at least one root directory ({ROOTS_ENV})")
        self.paths = tuple(dict.fromkeys(resolved))

    def __str__(self) -> str:
        return os.pathsep.join(self.paths)

    def contains(self, real: str) -> bool:
        return any(real == root or real.startswith(root.rstrip(os.sep) + os.sep)
                   for root in self.paths)

    def check(self, directory: str, *, strict: bool = True) -> str:
        """The real path of ``directory``; GateRefused if it lies outside every root.

        ``strict``: a missing directory raises its OSError (for the step's gate); without it,
        the path is resolved as far as it exists (for the plan gate, which runs early).
        """
        real = os.path.realpath(directory, strict=strict)
        if not self.contains(real):
            via = f" (it resolves to {real})" if real != directory else ""
            raise GateRefused(f"{directory} is outside the directories fs.rename may touch"
                              f"{via}; {ROOTS_ENV} is {self}")
        return real

    @contextlib.contextmanager
    def open_dir(self, directory: str) -> Iterator[int]:
        """A descriptor of ``directory``, proved inside a root after it was opened.

        Everything done through it (``*at`` calls with names that hold no '/') stays in that
        very directory, however the path's links change meanwhile. Raises Refused when the
        opened directory lies outside the roots (a link was swapped after the gate).
        """
        flags = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC
        fd = os.open(directory, flags)
        try:
            opened = _fd_path(fd) or os.path.realpath(directory)
            if not self.contains(opened):
                raise Refused(f"{directory} resolves to {opened}, outside the directories "
                              f"fs.rename may touch ({ROOTS_ENV} is {self})")
            yield fd
        finally:
            os.close(fd)


def _fd_path(fd: int) -> str | None:
    """The path the kernel holds for an open descriptor (Linux), or None where /proc has none."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


def target_path(args: dict[str, Any]) -> Path:
    return Path(args["path"]).with_name(args["name"])


def identity(st: os.stat_result) -> dict[str, int]:
    return {"dev": st.st_dev, "inode": st.st_ino}


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


class FsRenameProbe:
    """Gates, before_state and probe of a local rename inside ``roots``."""

    def __init__(self, roots: Roots) -> None:
        self.roots = roots

    def preconditions(self, ctx: StepContext) -> None:
        src, dst = Path(ctx.args["path"]), target_path(ctx.args)
        try:
            self.roots.check(str(src.parent))
            st = _lstat(src)
            if st is None:
                raise GateRefused(f"{src} does not exist")
            if stat.S_ISLNK(st.st_mode):
                raise GateRefused(f"{src} is a symbolic link; fs.rename renames regular files")
            if not stat.S_ISREG(st.st_mode):
                raise GateRefused(f"{src} is not a regular file")
            other = _lstat(dst)
        except FileNotFoundError as e:
            raise GateRefused(f"{src} does not exist ({os_reason(e)})") from None
        except OSError as e:
            raise gate_error(e, f"cannot look at {src}") from None
        if other is not None and identity(other) != identity(st):
            raise GateRefused(f"{dst} exists already; renaming would overwrite it")

    def snapshot(self, ctx: StepContext) -> dict[str, Any]:
        src = Path(ctx.args["path"])
        try:
            st = os.lstat(src)
        except OSError as e:  # the gate has just seen it: a permanent error ends the run
            if is_transient(e):
                raise TargetUnavailable(f"cannot look at {src}: {os_reason(e)}") from None
            raise PreconditionFailed(ctx.step, ctx.action,
                                     f"cannot look at {src}: {os_reason(e)}") from None
        return {"path": str(src), "name": src.name, **identity(st), "size": st.st_size}

    def probe(self, ctx: StepContext) -> ProbeResult:
        before = ctx.before_state or {}
        ours = {"dev": before.get("dev"), "inode": before.get("inode")}
        src, dst = Path(ctx.args["path"]), target_path(ctx.args)
        at_dst, at_src = _lstat(dst), _lstat(src)
        if at_dst is not None and identity(at_dst) == ours:
            return ProbeResult.done({"path": str(dst), **ours},
                                    f"{dst.name} is the file recorded in before_state")
        if at_src is not None and identity(at_src) == ours:
            return ProbeResult.absent(f"{src.name} is still the file recorded in before_state")
        seen = []
        if at_dst is not None:
            seen.append(f"{dst.name} exists but is another file (inode {at_dst.st_ino})")
        if at_src is None:
            seen.append(f"{src.name} is gone")
        return ProbeResult.unknown(
            f"our file (inode {ours['inode']}) is at neither name; " + "; ".join(seen),
            {"at_target": at_dst is not None, "at_source": at_src is not None})
