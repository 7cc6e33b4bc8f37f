"""``graph.send_mail`` against late wakes and late flags: exactly one mail leaves.

The process wakes late and the submitted flag shows late, with Graph's other switches at their worst
(a sent draft kept in Drafts, a second send of it sent again): whatever happens, exactly one mail
leaves.

* A worker frozen (SIGSTOP) after its fence read the draft, just before the send leaves: its
  twin takes the step over once the lease has passed and sends the draft; the frozen worker
  wakes and must not send it again.
* Graph documents no PR_MESSAGE_FLAGS submit bit during the window after the 202
  (``submitted_flag_after_s``): a draft whose send was requested shows as a plain draft for a
  while, and must not be read as never sent.

msgraph-sdk against the Graph staging server; real worker processes for the freeze."""

from __future__ import annotations

from typing import Any

import pytest

from activities.graph import GraphSendMail
from helpers.freeze import wait_stopped, wake
from helpers.staging_fixtures import CLIENT_TIMEOUT_S, arm, get, post
from helpers.steps import persist, run_one, wait_unlocked
from helpers.wait import assert_eventually
from probes.graph import graph_client
from staging.core import StagingServer
from staging.graph import READ_TOKEN, SEND_TOKEN
from tidemark.actions import Registry
from tidemark.errors import NeedsDecision, StepBusy, TargetUnavailable, TidemarkError
from tidemark.run_step import StepResult, run_step
from tidemark.store import JournalStore

ARGS = {"to": ["bob@example.com"], "subject": "Invoice 42", "body": "Details below."}
SPECS = Registry([GraphSendMail])
SECOND_SENDS = ("refused", "ignored", "sent_again")
UNFLAGGED_S = 3.0  # how long a sent draft shows no submit bit after its 202, in these tests


def action(server: StagingServer, timeout: float = CLIENT_TIMEOUT_S) -> GraphSendMail:
    return GraphSendMail(writer=graph_client(server.url, SEND_TOKEN, timeout=timeout),
                         reader=graph_client(server.url, READ_TOKEN, timeout=CLIENT_TIMEOUT_S),
                         confirm_s=1.0, late_s=5.0)


def switches(server: StagingServer, **values: Any) -> None:
    """Graph's switches: a sent draft stays in Drafts 120 s, and ``values``."""
    for name, value in {"submitted_stays_in_drafts_s": 120, **values}.items():
        post(server, "/_staging/switches", {"target": "graph", "name": name, "value": value})


def mails(server: StagingServer) -> list[dict[str, Any]]:
    """Every mail that left (a first send, or a second send that went out again)."""
    return [e for e in get(server, "/_staging/effects?target=graph&op=message.send")
            if not e["detail"].get("stalled")]


def sends(server: StagingServer) -> list[dict[str, Any]]:
    """Every POST .../messages/{id}/send the server received, whatever became of it.

    A send refused or ignored as a second send is still a send of the draft again."""
    return [r for r in get(server, "/_staging/requests?target=graph")
            if r["route"].endswith("/messages/{id}/send")]


def in_window(store: JournalStore, reg: Registry, task: str) -> str:
    """The step resumed inside the unflagged window: how it ended (an error's class name)."""
    try:
        return run_step(store, reg, task, 1).status
    except TidemarkError as e:
        return type(e).__name__


def settle(store: JournalStore, reg: Registry, task: str) -> StepResult | None:
    try:
        return run_step(store, reg, task, 1)
    except StepBusy:
        return None


def graph_env(server: StagingServer) -> dict[str, str]:
    """A worker's Graph configuration with waits short enough for its lease.

    The lease is the send's deadline, written before it, and must be waited out in a test. 4 s is
    what a new process's first calls through the SDK need on a loaded machine."""
    return {"TIDEMARK_GRAPH_URL": server.url, "TIDEMARK_GRAPH_WRITE_TOKEN": SEND_TOKEN,
            "TIDEMARK_GRAPH_READ_TOKEN": READ_TOKEN, "TIDEMARK_GRAPH_CONFIRM_S": "1",
            "TIDEMARK_GRAPH_TIMEOUT_S": "4", "TIDEMARK_GRAPH_LATE_S": "1"}


@pytest.mark.slow
def test_a_worker_frozen_after_its_fence_read_never_sends_the_draft_its_twin_sent(
        mail: StagingServer, store: JournalStore, db_url: str) -> None:
    switches(mail, second_send="sent_again")
    task = persist(store, SPECS, [{"action": "graph.send_mail", "args": ARGS}], "frozen-send")
    a = run_one(db_url, task, 1, TIDEMARK_FREEZE_AT="before_send:1", **graph_env(mail))
    reg = Registry([action(mail)])
    try:
        wait_stopped(a)  # the draft is staged and read unsent; the send is about to leave
        wait_unlocked(db_url, timeout=120)  # its lease (the send's deadline) has passed
        # Frozen before its mark (tidemark.faults): a mark would rightly make the twin ask a
        # person (NeedsDecision) instead of sending, which is another test's case.
        assert store.rows(task)[0].sent_at is None, "the frozen worker went on and marked"
        result = assert_eventually(lambda: settle(store, reg, task), timeout=60)
    finally:
        code, _, err = wake(a)
    assert result.status == "done"
    assert_eventually(lambda: not mail.staging.in_flight(), timeout=30)
    assert len(sends(mail)) == 1, f"the frozen worker sent the draft again " \
                                  f"(worker exit {code}: {err[-1500:]})"
    assert len(mails(mail)) == 1


def resumed(store: JournalStore, reg: Registry, task: str) -> StepResult | None:
    """The step resumed: its result, or None when it waits for a person."""
    try:
        return run_step(store, reg, task, 1)
    except NeedsDecision:
        return None


@pytest.mark.parametrize("second_send", SECOND_SENDS)
def test_a_send_whose_flag_shows_late_is_never_sent_again(
        mail: StagingServer, store: JournalStore, second_send: str) -> None:
    """A send whose flag shows late is never sent again.

    The send was accepted. The confirm gives up before the flag shows, so the step is in doubt.
    The resume, inside the unflagged window, sees a plain draft."""
    switches(mail, second_send=second_send, submitted_flag_after_s=UNFLAGGED_S)
    task = persist(store, SPECS, [{"action": "graph.send_mail", "args": ARGS}])
    reg = Registry([action(mail)])
    with pytest.raises(TargetUnavailable):  # accepted, not seen submitted within confirm_s
        run_step(store, reg, task, 1)
    ended = in_window(store, reg, task)
    assert len(sends(mail)) == 1, f"the draft was sent again (the resume: {ended})"
    assert ended == "NeedsDecision"
    result = assert_eventually(lambda: resumed(store, reg, task), timeout=UNFLAGGED_S + 10)
    assert result.status == "done" and result.resolved_by == "probe"  # once the flag shows
    assert len(mails(mail)) == 1


@pytest.mark.parametrize("second_send", SECOND_SENDS)
def test_a_lost_202_in_the_unflagged_window_sends_one_mail(
        mail: StagingServer, store: JournalStore, second_send: str) -> None:
    switches(mail, second_send=second_send, submitted_flag_after_s=UNFLAGGED_S)
    task = persist(store, SPECS, [{"action": "graph.send_mail", "args": ARGS}])
    reg = Registry([action(mail)])
    arm(mail, "graph", "message.send", "drop_after_commit")  # submitted; the 202 is lost
    with pytest.raises(TargetUnavailable):
        run_step(store, reg, task, 1)
    ended = in_window(store, reg, task)
    assert len(sends(mail)) == 1, f"the draft was sent again (the resume: {ended})"
    assert ended == "NeedsDecision"
    result = assert_eventually(lambda: resumed(store, reg, task), timeout=UNFLAGGED_S + 10)
    assert result.status == "done"
    assert len(mails(mail)) == 1


def test_a_send_answered_504_is_watched_like_one_that_went_unanswered(
        mail: StagingServer, store: JournalStore) -> None:
    """A send answered 504 is watched like an unanswered one, and sends once.

    Graph's gateway answers 504 while the mailbox goes on with the send, whose flag shows
    late: the send may still land, so execute watches the draft as after a send it got no
    answer to, sees it submitted, and the step is done by that attempt, with one send."""
    switches(mail, second_send="sent_again", submitted_flag_after_s=1.0)  # seen at one poll
    task = persist(store, SPECS, [{"action": "graph.send_mail", "args": ARGS}])
    reg = Registry([action(mail)])
    post(mail, "/_staging/graph/send_reply", {"status": 504, "retry_after": 0})
    first = in_window(store, reg, task)
    assert first == "done", f"a send answered 504 was not watched out (it ended {first})"
    assert len(sends(mail)) == 1 and len(mails(mail)) == 1


def test_a_send_that_went_unanswered_in_the_unflagged_window_sends_one_mail(
        mail: StagingServer, store: JournalStore) -> None:
    """A send unanswered in the unflagged window sends one mail.

    Our client gives up on the send; Graph applies it later, and its flag shows later
    still, after the late-send watch gave up."""
    switches(mail, second_send="sent_again", submitted_flag_after_s=8.0)
    task = persist(store, SPECS, [{"action": "graph.send_mail", "args": ARGS}])
    reg = Registry([GraphSendMail(writer=graph_client(mail.url, SEND_TOKEN, timeout=0.5),
                                  reader=graph_client(mail.url, READ_TOKEN,
                                                      timeout=CLIENT_TIMEOUT_S),
                                  confirm_s=1.0, late_s=2.0)])
    arm(mail, "graph", "message.send", "delay", seconds=1.0)
    with pytest.raises(TargetUnavailable):
        run_step(store, reg, task, 1)
    assert_eventually(lambda: not mail.staging.in_flight(), timeout=10)
    ended = in_window(store, reg, task)
    assert len(sends(mail)) == 1, f"the draft was sent again (the resume: {ended})"
    assert len(mails(mail)) == 1
    assert ended == "NeedsDecision"
