"""A run its series refused before its plan was stored, through status and the controls.

`tidemark status` says blocked and why, and every control of its id names the block (not a typo)
— one line, exit 1, nothing written; `--force-unknown` stops it all the same. Real Postgres, the
real CLI and the series' own admission (tidemark.series)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tidemark import series
from tidemark.series import SeriesBlocked
from tidemark.store import JournalStore
from tools.cli.main import main


@pytest.fixture
def blocked(store: JournalStore, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run nightly-7 of series nightly, refused: the series is stopped."""
    monkeypatch.setenv("DATABASE_URL", store.conninfo)
    store.declare_series("nightly", "ops", "ops")
    store.set_control("series:nightly", "stopped", "audit", "ops")
    with pytest.raises(SeriesBlocked):
        series.admit(store, "nightly-7", "nightly")
    return "nightly-7"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_status_of_a_blocked_run_says_blocked_and_why(
        blocked: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "status", blocked, "--json")
    assert (code, err) == (0, "")
    said: dict[str, Any] = json.loads(out)
    assert (said["state"], said["series"], said["blockers"]) == ("blocked", "nightly", [])
    assert said["stop"]["state"] == "stopped"
    code, out, err = run(capsys, "status", blocked)
    assert (code, err) == (0, "") and out.count("\n") == 1
    assert out.startswith(f"task {blocked}  (blocked)  the start of {blocked} was blocked "
                          "before its plan was stored (series nightly is stopped, at ")
    assert "`tidemark status --series nightly`" in out


@pytest.mark.parametrize("argv", [["stop"], ["release"], ["resume"], ["unwind", "--yes"],
                                  ["resolve", "--step", "1", "--as", "done", "--yes"],
                                  ["approve"], ["reject"], ["journal"]])
def test_every_control_of_a_blocked_run_names_the_block_and_writes_nothing(
        argv: list[str], blocked: str, store: JournalStore,
        capsys: pytest.CaptureFixture[str]) -> None:
    events = store.events(blocked)
    code, out, err = run(capsys, argv[0], blocked, *argv[1:], "--address", "127.0.0.1:1") \
        if argv[0] in ("resume", "unwind", "approve", "reject") else \
        run(capsys, argv[0], blocked, *argv[1:])
    assert (code, out) == (1, ""), err
    assert err.count("\n") == 1, err
    assert f"the start of {blocked} was blocked before its plan was stored" in err
    assert store.events(blocked) == events and store.stop_state(blocked) is None


def test_force_unknown_stops_a_blocked_run_and_an_unknown_id_stays_unknown(
        blocked: str, store: JournalStore, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "stop", blocked, "--force-unknown")
    assert (code, err) == (0, "") and f"task {blocked} is stopped" in out
    assert store.stop_state(blocked)["scope"] == blocked
    code, out, err = run(capsys, "status", "nightly-8", "--json")
    assert (code, out) == (1, "") and err == ("tidemark: UnknownTask: no plan is stored for "
                                              "task 'nightly-8'\n")
    code, out, err = run(capsys, "stop", "nightly-8")
    assert code == 1 and "the start of" not in err and "--force-unknown" in err
