"""``fs.rename`` on the real local filesystem: confined, never replacing, always ending.

It is confined to its roots, never replacing a file, and every operating-system error ends the
step in a named state instead of retrying for ever. What can be known from the plan alone is
refused when the plan is checked."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from activities.catalog import spec_registry
from activities.fs import FsRename
from helpers.fs_roots import FS_ROOTS
from helpers.steps import persist, step_context
from probes.fs import action_error, gate_error, is_transient
from tidemark.actions import GateRefused, Registry
from tidemark.errors import (
    PlanError,
    PreconditionFailed,
    Refused,
    StepFailed,
    TargetUnavailable,
    UnknownTask,
)
from tidemark.payloads import RunResult
from tidemark.plan import load_plan
from tidemark.run_step import check_plan_gates, run_step
from tidemark.store import JournalStore
from tools.cli.main import main
from workflows.outcome import run_result


def rename(path: str, name: str) -> dict[str, Any]:
    return {"action": "fs.rename", "args": {"path": path, "name": name}}


# -- refused when the plan is checked, before anything is stored ---------------------------

@pytest.mark.parametrize(("path", "name", "field", "why"), [
    ("/d/a.txt", "n" * 256, "name", "longer than 255 bytes"),
    ("/d/a.txt", "é" * 128, "name", "longer than 255 bytes"),  # 256 bytes in UTF-8
    ("/d/" + "p" * 256 + "/a.txt", "b.txt", "path", "longer than 255 bytes"),
    ("/d/a.txt", "x/y", "name", "without '/'"),
    ("/d/a.txt", "..", "name", "without '/'"),
    ("/d/a.txt", ".", "name", "without '/'"),
    ("/d/a.txt", "a\x00b", "name", "NUL"),
    ("d/a.txt", "b.txt", "path", "absolute"),
    ("/", "b.txt", "path", "not the root directory"),
    ("//", "b.txt", "path", "not the root directory"),
    ("/d/..", "b.txt", "path", "not the root directory"),
    ("/d/" + "q/" * 2100 + "a", "b.txt", "path", "longer than 4095 bytes"),
])
def test_bad_paths_and_names_are_refused_at_plan_time(path: str, name: str, field: str,
                                                      why: str) -> None:
    with pytest.raises(PlanError) as e:
        load_plan({"steps": [rename(path, name)]}, spec_registry())
    assert e.value.field.endswith(f".{field}") and why in e.value.message


def test_plan_check_refuses_a_too_long_name_in_one_line(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"steps": [rename("/d/a.txt", "n" * 300)]}))
    assert main(["plan", "check", str(plan)]) == 1
    err = capsys.readouterr().err
    assert "steps[0].args.name" in err and "longer than 255 bytes" in err
    assert err.count("\n") == 1


def test_plan_check_applies_the_roots_set_in_its_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "root"
    root.mkdir()
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"steps": [rename(str(root / "a.txt"), "b.txt"),
                                          rename(str(Path.home() / ".ssh" / "id_rsa"), "x")]}))
    assert main(["plan", "check", str(plan)]) == 0  # no roots here: a worker decides
    capsys.readouterr()
    monkeypatch.setenv("TIDEMARK_FS_ROOTS", str(root))
    assert main(["plan", "check", str(plan)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tidemark: PlanError: steps[1].args.path: step 2 (")
    assert "is outside the directories fs.rename may touch" in err


# -- operating-system errors end in a named state -------------------------------------------

PERMANENT = [errno.ENAMETOOLONG, errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EPERM,
             errno.EINVAL, errno.EROFS, errno.ELOOP, errno.EXDEV, errno.ENOTEMPTY]
TRANSIENT = [errno.EIO, errno.EAGAIN, errno.EINTR, errno.ENOSPC, errno.EDQUOT, errno.ESTALE]


@pytest.mark.parametrize("code", PERMANENT + TRANSIENT)
def test_each_errno_is_final_or_retryable(code: int) -> None:
    e = OSError(code, os.strerror(code), "/r/a.txt")
    gate, act = gate_error(e, "cannot look"), action_error(e, "cannot rename")
    if code in TRANSIENT:
        assert is_transient(e)
        assert type(gate) is TargetUnavailable and type(act) is TargetUnavailable
        assert act.retryable
    else:
        assert not is_transient(e)
        assert type(gate) is GateRefused and type(act) is Refused
        assert not act.retryable
    assert errno.errorcode[code] in str(act) and "/r/a.txt" in str(act)


def test_a_path_through_a_file_fails_its_gate_with_nothing_journaled(
        store: JournalStore, tmp_path: Path) -> None:
    (tmp_path / "file.txt").write_text("x")
    task = persist(store, spec_registry(), [rename(str(tmp_path / "file.txt" / "a.txt"), "b")])
    with pytest.raises(PreconditionFailed, match=r"ENOTDIR"):
        run_step(store, Registry([FsRename([FS_ROOTS])]), task, 1)
    assert store.rows(task) == []


def test_a_directory_in_place_of_the_file_fails_its_gate(store: JournalStore,
                                                         tmp_path: Path) -> None:
    (tmp_path / "adir").mkdir()
    task = persist(store, spec_registry(), [rename(str(tmp_path / "adir"), "b")])
    with pytest.raises(PreconditionFailed, match="not a regular file"):
        run_step(store, Registry([FsRename([FS_ROOTS])]), task, 1)


async def test_an_os_error_ends_the_run_instead_of_retrying(
        temporal_env: WorkflowEnvironment, store: JournalStore, workers, task_queue: str,
        tmp_path: Path) -> None:
    workers.start()
    (tmp_path / "file.txt").write_text("x")
    doc = {"task_id": "enotdir-1", "steps": [rename(str(tmp_path / "file.txt" / "a"), "b")]}
    handle = await temporal_env.client.start_workflow(
        "RunPlan", doc, id="tidemark-enotdir-1", task_queue=task_queue, result_type=RunResult)
    result = await asyncio.wait_for(run_result(handle), 30)
    assert (result.state, result.error["type"]) == ("precondition_failed", "PreconditionFailed")
    assert "ENOTDIR" in result.error["message"]
    assert store.rows("enotdir-1") == []

    # What the plan alone shows is refused before the plan is stored.
    doc = {"task_id": "toolong-1", "steps": [rename(str(tmp_path / "file.txt"), "n" * 256)]}
    handle = await temporal_env.client.start_workflow(
        "RunPlan", doc, id="tidemark-toolong-1", task_queue=task_queue, result_type=RunResult)
    result = await asyncio.wait_for(run_result(handle), 30)
    assert (result.state, result.error["type"]) == ("failed", "PlanError")
    assert "steps[0].args.name" in result.error["message"]
    with pytest.raises(UnknownTask):
        store.progress("toolong-1")


# -- confined to the roots --------------------------------------------------------------------

async def test_without_roots_a_plan_using_fs_rename_is_refused_and_nothing_stored(
        temporal_env: WorkflowEnvironment, store: JournalStore, workers, task_queue: str,
        tmp_path: Path) -> None:
    workers.start(TIDEMARK_FS_ROOTS="")
    (tmp_path / "a.txt").write_text("a")
    doc = {"task_id": "noroots-1", "steps": [rename(str(tmp_path / "a.txt"), "b.txt")]}
    handle = await temporal_env.client.start_workflow(
        "RunPlan", doc, id="tidemark-noroots-1", task_queue=task_queue, result_type=RunResult)
    result = await asyncio.wait_for(run_result(handle), 30)
    assert (result.state, result.error["type"]) == ("failed", "ActionNotConfigured")
    assert "'fs.rename' is not configured" in result.error["message"]
    with pytest.raises(UnknownTask):
        store.progress("noroots-1")
    assert (tmp_path / "a.txt").exists()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "root"
    path.mkdir()
    return path


def test_a_path_outside_the_roots_is_refused_before_the_first_step(
        store: JournalStore, tmp_path: Path, root: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    (root / "in.txt").write_text("in")
    doc = {"task_id": "roots-1", "steps": [rename(str(root / "in.txt"), "in2.txt"),
                                           rename(str(outside), "moved.txt")]}
    plan = load_plan(doc, spec_registry())
    store.persist_plan(plan)
    registry = Registry([FsRename([root])])
    with pytest.raises(PreconditionFailed, match=r"step 2 \(.*outside.txt\): .* is outside"):
        check_plan_gates(store, registry, plan)
    # And the step's own gate, should it be reached some other way.
    with pytest.raises(PreconditionFailed, match="is outside the directories"):
        run_step(store, registry, "roots-1", 2)
    assert outside.read_text() == "keep" and not (tmp_path / "moved.txt").exists()


def test_a_symlink_out_of_a_root_is_refused(store: JournalStore, tmp_path: Path,
                                            root: Path) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "id_rsa").write_text("key")
    (root / "link").symlink_to(secret)
    task = persist(store, spec_registry(), [rename(str(root / "link" / "id_rsa"), "x")])
    with pytest.raises(PreconditionFailed, match=r"resolves to .*secret"):
        run_step(store, Registry([FsRename([root])]), task, 1)
    assert (secret / "id_rsa").read_text() == "key"


def test_a_symlink_swapped_in_after_the_gate_is_refused_at_the_rename(
        store: JournalStore, tmp_path: Path, root: Path) -> None:
    """A symlink swapped in after the gate is refused at the rename.

    The directory passes the gate, then becomes a link out of the root. The rename opens the
    directory and checks what it opened, not the name it looked at earlier."""
    work, secret = root / "work", tmp_path / "secret"
    work.mkdir()
    secret.mkdir()
    (work / "a.txt").write_text("ours")
    (secret / "a.txt").write_text("theirs")
    task = persist(store, spec_registry(), [rename(str(work / "a.txt"), "b.txt")])

    class Swapped(FsRename):
        def snapshot(self, ctx: Any) -> dict[str, Any]:
            state = super().snapshot(ctx)
            work.rename(root / "work-old")
            work.symlink_to(secret)
            return {**state, "dev": os.stat(secret / "a.txt").st_dev,
                    "inode": os.stat(secret / "a.txt").st_ino}

    with pytest.raises(StepFailed, match=r"outside the directories"):
        run_step(store, Registry([Swapped([root])]), task, 1)
    assert sorted(p.name for p in secret.iterdir()) == ["a.txt"]


def test_roots_must_be_existing_absolute_directories(tmp_path: Path) -> None:
    from tidemark.errors import ConfigError

    with pytest.raises(ConfigError, match="not an absolute path"):
        FsRename(["relative/dir"])
    with pytest.raises(ConfigError, match="not a directory"):
        FsRename([str(tmp_path / "missing")])
    with pytest.raises(ConfigError, match="at least one root"):
        FsRename([])


# -- never replaces a file --------------------------------------------------------------------

def test_a_file_that_appears_after_the_gate_is_not_replaced(store: JournalStore,
                                                           tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("ours")
    task = persist(store, spec_registry(), [rename(str(tmp_path / "a.txt"), "b.txt")])

    class Raced(FsRename):
        def snapshot(self, ctx: Any) -> dict[str, Any]:
            state = super().snapshot(ctx)
            (tmp_path / "b.txt").write_text("theirs")  # after the gate looked
            return state

    with pytest.raises(StepFailed, match="appeared after the gate ran"):
        run_step(store, Registry([Raced([FS_ROOTS])]), task, 1)
    assert (tmp_path / "b.txt").read_text() == "theirs"
    assert (tmp_path / "a.txt").read_text() == "ours"


RACER = textwrap.dedent("""
    import os, sys, time
    target, stop = sys.argv[1], sys.argv[2]
    open(stop + ".ready", "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(stop) and time.monotonic() < deadline:
        for _ in range(200):
            try:
                fd = os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            except FileExistsError:
                continue
            os.close(fd)
            os.unlink(target)  # removes its own file, or whatever replaced it
""")


def test_a_file_created_between_check_and_rename_is_never_replaced(tmp_path: Path) -> None:
    """A file created between check and rename is never replaced.

    Another process creates and removes the target name as fast as it can. A rename that
    checks and then renames replaces the racer's file now and then, and the racer's unlink
    then takes our file with it; a rename that cannot replace loses nothing."""
    work, done = tmp_path / "work", tmp_path / "done"
    work.mkdir()
    done.mkdir()
    stop = tmp_path / "stop"
    racer = subprocess.Popen([sys.executable, "-c", RACER, str(work / "b.txt"), str(stop)])
    action = FsRename([FS_ROOTS])
    rounds, renamed, refused = 1500, 0, 0
    try:
        deadline = time.monotonic() + 10
        while not Path(str(stop) + ".ready").exists():
            assert time.monotonic() < deadline, "the racer did not start"
            time.sleep(0.01)
        for i in range(rounds):
            src = work / f"a{i}.txt"
            src.write_text(f"ours {i}")
            args = {"path": str(src), "name": "b.txt"}
            before = action.snapshot(step_context("fs.rename", args))
            try:
                action.execute(step_context("fs.rename", args, before_state=before))
            except Refused:
                refused += 1
                src.rename(done / f"a{i}.txt")
                continue
            renamed += 1
            # Ours holds the name now: the racer cannot create it, only we move it. Gone already
            # if the racer's unlink took it: counted as lost below.
            with contextlib.suppress(FileNotFoundError):
                (work / "b.txt").rename(done / f"a{i}.txt")
    finally:
        stop.write_text("")
        racer.wait(timeout=30)
    kept = {p.read_text() for p in done.iterdir()} | {
        p.read_text() for p in work.iterdir() if p.name.startswith("a")}
    lost = [i for i in range(rounds) if f"ours {i}" not in kept]
    assert lost == [], f"{len(lost)} of {renamed} renamed files were lost ({refused} refused)"
    assert renamed > 0


UNPRIVILEGED = textwrap.dedent("""
    import json, sys
    from activities.fs import FsRename
    from tidemark.actions import GateRefused, StepContext
    from tidemark.errors import ActionError

    root, path, name = sys.argv[1:4]
    action = FsRename([root])
    ctx = StepContext(task_id="t", step=1, action="fs.rename",
                      args={"path": path, "name": name}, key="k")
    out = {}
    try:
        action.preconditions(ctx)
        out["gate"] = "passed"
    except GateRefused as e:
        out["gate"] = "GateRefused: " + str(e)
    if out["gate"] == "passed":
        try:
            action.execute(ctx)
            out["execute"] = "renamed"
        except ActionError as e:
            out["execute"] = f"{type(e).__name__} retryable={e.retryable}: {e}"
    print(json.dumps(out))
""")


@pytest.fixture
def shared_dir() -> Any:
    """A directory every user may traverse (pytest's own are private to root)."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="tidemark-fs-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


NOBODY = {"user": 65534, "group": 65534, "extra_groups": []}


def interpreter_for_nobody() -> tuple[str, dict[str, str]]:
    """A Python the user nobody may run, with this environment's packages.

    It is this one, or, when it lives under a home closed to others (pyenv under a 0700 /root),
    the system's Python of the same version given this environment's site-packages."""
    try:
        subprocess.run([sys.executable, "-c", "pass"], check=True, timeout=30, **NOBODY)
        return sys.executable, {}
    except PermissionError:
        pass
    system = shutil.which(f"python{sys.version_info.major}.{sys.version_info.minor}",
                          path="/usr/local/bin:/usr/bin")
    if system is None:
        pytest.skip("this Python is not reachable by the user nobody, and the system has no "
                    f"Python {sys.version_info.major}.{sys.version_info.minor}")
    paths = sysconfig.get_paths()
    return system, {"PYTHONPATH": os.pathsep.join([paths["purelib"], paths["platlib"]])}


def run_as_nobody(*args: str) -> dict[str, str]:
    if os.geteuid() != 0:
        pytest.skip("needs root to run a check as another user")
    python, env = interpreter_for_nobody()
    repo = Path(__file__).resolve().parent.parent
    proc = subprocess.run([python, "-c", UNPRIVILEGED, *args], capture_output=True, text=True,
                          timeout=60, cwd=repo, env={**os.environ, **env}, **NOBODY)
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def test_an_unreadable_directory_is_a_gate_refusal(shared_dir: Path) -> None:
    locked = shared_dir / "locked"
    locked.mkdir(mode=0o700)  # root's; the worker here runs as nobody
    (locked / "a.txt").write_text("a")
    out = run_as_nobody(str(shared_dir), str(locked / "a.txt"), "b.txt")
    assert out["gate"].startswith("GateRefused: cannot look at") and "[EACCES]" in out["gate"]


def test_an_unwritable_directory_is_a_refusal_of_the_rename(shared_dir: Path) -> None:
    readonly = shared_dir / "readonly"
    readonly.mkdir(mode=0o755)  # nobody may look, not write
    (readonly / "a.txt").write_text("a")
    out = run_as_nobody(str(shared_dir), str(readonly / "a.txt"), "b.txt")
    assert out["gate"] == "passed"
    assert out["execute"].startswith("Refused retryable=False: cannot rename")
    assert "[EACCES]" in out["execute"]
    assert sorted(p.name for p in readonly.iterdir()) == ["a.txt"]
