"""``graph.send_mail`` when the world misbehaves.

A provider slower than our client, a message that stays in Drafts, a sent copy moved anywhere in
the mailbox, credentials for two mailboxes, a forged inbound copy. msgraph-sdk over HTTP against
the Graph staging server, run_step with a real Postgres journal; the staging effect log counts
the mails that left."""

from __future__ import annotations

import contextlib
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import pytest
from msgraph.generated.models.mail_folder import MailFolder
from msgraph.generated.users.item.messages.item.move.move_post_request_body import (
    MovePostRequestBody,
)

from activities.graph import (
    DEFAULT_CONFIRM_S,
    DEFAULT_LATE_S,
    GraphSendMail,
    build_request,
    confirm_timeout,
    late_timeout,
)
from activities.wiring import bound_actions
from helpers.staging_fixtures import CLIENT_TIMEOUT_S, arm, effects, get, post, target_of
from helpers.steps import persist, run_one, step_context, wait_unlocked
from helpers.wait import assert_eventually
from probes.graph import (
    DEFAULT_TIMEOUT_S,
    KEY_HEADER,
    KEY_PROPERTY_ID,
    client_timeout,
    graph_client,
)
from staging.core import StagingServer
from staging.graph import MAILBOX, READ_TOKEN, SEND_TOKEN, GraphTarget
from tidemark.actions import ProbeStatus, Registry
from tidemark.errors import ConfigError, NeedsDecision, TargetUnavailable
from tidemark.reads import ENV_READ_RETRY
from tidemark.run_step import run_step
from tidemark.store import JournalStore

ARGS = {"to": ["bob@example.com"], "subject": "Invoice 42", "body": "Details below."}
SPECS = Registry([GraphSendMail])
SEND_OPS = ("sendMail", "message.send")  # the old step used sendMail, the fenced one sends drafts
LATE_S = 5.0


def action(server: StagingServer, *, timeout: float = CLIENT_TIMEOUT_S,
           read_token: str = READ_TOKEN, send_token: str = SEND_TOKEN) -> GraphSendMail:
    # A message not seen submitted a second after its send is left in doubt; a send that got
    # no answer is watched for five seconds (longer than any delay these tests arm).
    return GraphSendMail(writer=graph_client(server.url, send_token, timeout=timeout),
                         reader=graph_client(server.url, read_token, timeout=CLIENT_TIMEOUT_S),
                         confirm_s=1.0, late_s=LATE_S)


def graph(server: StagingServer) -> GraphTarget:
    return target_of(server.staging, GraphTarget)


def mails_sent(server: StagingServer) -> list[dict[str, Any]]:
    """Every submission that left Drafts (a stalled one did not)."""
    return [e for op in SEND_OPS for e in effects(server, "graph", op)
            if not e["detail"].get("stalled")]


def mailbox(server: StagingServer) -> dict[str, Any]:
    return dict(get(server, "/_staging/graph/mailbox"))


def arm_all(server: StagingServer, kind: str, **extra: Any) -> None:
    for op in SEND_OPS:
        arm(server, "graph", op, kind, **extra)


def persist_step(store: JournalStore) -> str:
    return persist(store, SPECS, [{"action": "graph.send_mail", "args": ARGS}])


def sent_copy(server: StagingServer) -> str:
    """Delivers what waits in the Outbox; returns the id of the one copy in Sent Items."""
    post(server, "/_staging/graph/deliver")
    [m] = graph(server).messages_in("sentitems")
    return m.id


# -- 1: the provider commits after our client gave up -----------------------------------------

@pytest.mark.parametrize("world", ["default", "window, sent again"])
def test_a_send_slower_than_the_client_is_waited_out_not_sent_again(
        mail: StagingServer, store: JournalStore, world: str) -> None:
    """A send slower than the client is waited out, not sent again.

    Graph works on the send long after our client gave up. Sending the draft again at once
    was safe only while a send moved it out of Drafts; where it stays there, submitted, and a
    second send goes out too, the late send and the next one would be two mails."""
    if world != "default":
        submission_window(mail, "sent_again")
    task = persist_step(store)
    registry = Registry([action(mail, timeout=1.0)])
    arm(mail, "graph", "message.send", "delay", seconds=3.0)
    with contextlib.suppress(TargetUnavailable):
        run_step(store, registry, task, 1)
    result = run_step(store, registry, task, 1)
    assert result.status == "done"
    assert_eventually(lambda: all(r["status"] is not None for r in sends_requested(mail)),
                      timeout=10)  # the held send has been worked on
    assert len(sends_requested(mail)) == 1, "the draft was sent again"
    assert len(mails_sent(mail)) == 1
    staged = store.step_row(task, 1).staged
    assert staged is not None
    assert result.outcome["internetMessageId"] == staged["internetMessageId"]


def test_a_send_that_never_lands_is_watched_for_late_s_then_in_doubt(
        mail: StagingServer, store: JournalStore) -> None:
    task = persist_step(store)
    registry = Registry([action(mail, timeout=0.5)])
    arm(mail, "graph", "message.send", "delay", seconds=LATE_S + 3)  # lands after the watch
    started = time.monotonic()
    with pytest.raises(TargetUnavailable):
        run_step(store, registry, task, 1)
    assert time.monotonic() - started >= LATE_S
    # The held send lands now, on a draft nobody sent meanwhile: one mail.
    assert_eventually(lambda: len(mails_sent(mail)) == 1, timeout=10)
    result = run_step(store, registry, task, 1)
    assert result.status == "done" and result.resolved_by == "probe"
    assert len(sends_requested(mail)) == 1


def test_deadline_follows_the_client_timeout_and_horizon_is_zero(mail: StagingServer) -> None:
    fast, slow = action(mail, timeout=0.3), action(mail, timeout=20)
    assert GraphSendMail.horizon_s == 0.0 and fast.horizon_s == 0.0
    assert fast.deadline_s < slow.deadline_s
    assert slow.deadline_s >= 20 + CLIENT_TIMEOUT_S + slow.confirm_s + slow.late_s


# -- 7: a message that never left Drafts ------------------------------------------------------

def test_a_sendmail_draft_stuck_in_drafts_is_not_done(mail: StagingServer) -> None:
    """A sendMail draft stuck in Drafts is not done.

    Microsoft documents that sendMail saves a draft first. One that stays there was never
    submitted. (An intent written before drafts fenced the step: no staged draft.)"""
    post(mail, "/_staging/graph/settings", {"stall": 1})
    writer = graph_client(mail.url, SEND_TOKEN, timeout=CLIENT_TIMEOUT_S)
    ctx = step_context("graph.send_mail", ARGS)
    body = build_request(ARGS, ctx.key)
    writer.call(lambda g: g.me.send_mail.post(body))  # 202, and it stays a draft
    [draft] = graph(mail).messages_in("drafts")
    assert draft.fields["isDraft"] is True
    probed = action(mail).probe(ctx)
    assert probed.status is ProbeStatus.ABSENT, probed


# -- a sent draft waits in Drafts until transport takes it (the submission window) ------------

WINDOW_S = 120  # the documented wait has no bound: far longer than the confirm wait (1 s here)
SECOND_SENDS = ("refused", "ignored", "sent_again")


def submission_window(server: StagingServer, second_send: str) -> None:
    """A sent draft stays in Drafts, flagged submitted, for WINDOW_S.

    A second send of it does what ``second_send`` says."""
    for name, value in (("submitted_stays_in_drafts_s", WINDOW_S),
                        ("second_send", second_send)):
        post(server, "/_staging/switches", {"target": "graph", "name": name, "value": value})


def sends_requested(server: StagingServer) -> list[dict[str, Any]]:
    """Every POST .../messages/{id}/send the server received, whatever became of it."""
    return [r for r in get(server, "/_staging/requests?target=graph")
            if r["route"].endswith("/messages/{id}/send")]


def assert_sent_once(server: StagingServer, store: JournalStore, task: str) -> None:
    assert len(mails_sent(server)) == 1
    assert len(sends_requested(server)) == 1, "the draft was sent again"
    post(server, "/_staging/graph/deliver")  # transport takes it at last: one copy, ours
    [copy] = graph(server).messages_in("sentitems")
    staged = store.step_row(task, 1).staged
    assert staged is not None
    assert copy.fields["internetMessageId"] == staged["internetMessageId"]


@pytest.mark.parametrize("second_send", SECOND_SENDS)
def test_a_sent_draft_still_in_drafts_is_done_and_not_sent_again(
        mail: StagingServer, store: JournalStore, second_send: str) -> None:
    """A sent draft still in Drafts is done and not sent again.

    Graph keeps a sent draft in Drafts (isDraft true) until transport moves it, for longer
    than the confirm wait; only its PR_MESSAGE_FLAGS say it was submitted."""
    submission_window(mail, second_send)
    task = persist_step(store)
    registry = Registry([action(mail)])
    with contextlib.suppress(TargetUnavailable):  # a confirm that gave up leaves it in doubt
        run_step(store, registry, task, 1)
    result = run_step(store, registry, task, 1)
    assert result.status == "done"
    assert result.outcome["state"] == "submitted" and result.outcome["folder"] == "drafts"
    [waiting] = graph(mail).messages_in("drafts")
    assert waiting.submitted and waiting.fields["isDraft"] is True  # still in the window
    assert_sent_once(mail, store, task)


@pytest.mark.parametrize("second_send", SECOND_SENDS)
def test_a_lost_202_in_the_window_resolves_by_probe_as_done(
        mail: StagingServer, store: JournalStore, second_send: str) -> None:
    submission_window(mail, second_send)
    task = persist_step(store)
    registry = Registry([action(mail)])
    arm(mail, "graph", "message.send", "drop_after_commit")  # submitted; the 202 is lost
    with pytest.raises(TargetUnavailable):
        run_step(store, registry, task, 1)
    result = run_step(store, registry, task, 1)
    assert result.status == "done" and result.resolved_by == "probe"
    assert result.outcome["state"] == "submitted"
    assert_sent_once(mail, store, task)


def graph_env(server: StagingServer) -> dict[str, str]:
    """A worker's Graph configuration, with short timeouts.

    Short timeouts keep the killed attempt's lease (its deadline, written before the send) short
    enough to wait out. The client's 6 s is what the worker's first calls need on a loaded
    machine (the check that both tokens are the same mailbox's is a new process's first request
    through the SDK); 3 s timed out under the full suite."""
    return {"TIDEMARK_GRAPH_URL": server.url, "TIDEMARK_GRAPH_WRITE_TOKEN": SEND_TOKEN,
            "TIDEMARK_GRAPH_READ_TOKEN": READ_TOKEN, "TIDEMARK_GRAPH_CONFIRM_S": "1",
            "TIDEMARK_GRAPH_TIMEOUT_S": "6", "TIDEMARK_GRAPH_LATE_S": "1"}


def test_a_worker_killed_between_the_202_and_the_move_resumes_as_done(
        mail: StagingServer, store: JournalStore, db_url: str) -> None:
    """A worker killed after the 202, with the mail still in Drafts, resumes as done by probe.

    SIGKILL after the send was accepted and before the outcome was journaled; the resumed step
    probes the draft: done, nothing sent again. The draft answers a second send with a second
    mail, the worst of SECOND_SENDS: a resume that sent it again would show two sends and two
    mails. (Every position fails that check the same way, by a second send requested, so one
    run, which waits out the killed attempt's lease of about 50 s, stands for the three.)"""
    submission_window(mail, "sent_again")
    task = persist_step(store)
    proc = run_one(db_url, task, 1, TIDEMARK_CRASH_AT="after_execute:1", **graph_env(mail))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, (out, err[-2000:])
    wait_unlocked(db_url, timeout=90)  # the lease: the killed attempt's deadline
    assert store.step_row(task, 1).outcome is None  # in doubt
    assert graph(mail).messages_in("drafts")[0].submitted  # between the 202 and the move
    result = run_step(store, Registry([action(mail)]), task, 1)
    assert result.status == "done" and result.resolved_by == "probe"
    assert_sent_once(mail, store, task)


def test_a_refused_send_of_a_draft_submitted_meanwhile_is_in_doubt_not_failed(
        mail: StagingServer) -> None:
    """A refused send of a draft submitted meanwhile is in doubt, not failed.

    Two sends of one draft race. The first is held up at Graph before it looks at the draft, the
    second passes the unsent check and is submitted meanwhile; when the first is worked on it is
    refused. That refusal is not the target refusing the step: the mail is out."""
    submission_window(mail, "refused")
    a, ctx = staged_step(mail)
    arm(mail, "graph", "message.send", "delay", seconds=4.0)  # taken by the first send only
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(a.execute, ctx)
        assert_eventually(lambda: len(sends_requested(mail)) == 1, timeout=5)
        assert a.execute(ctx)["state"] == "submitted"  # the second send goes through
        with pytest.raises(TargetUnavailable) as e:
            slow.result(timeout=30)
    assert "may have been sent" in str(e.value)
    assert [r["status"] for r in sends_requested(mail)] == [400, 202]
    assert len(mails_sent(mail)) == 1
    assert a.probe(ctx).status is ProbeStatus.DONE


# -- 2: the sent copy moved out of the folders a probe used to read ---------------------------

def move_with_graph(server: StagingServer, message_id: str, destination: str) -> str:
    """Moves a message through Graph's own API as Outlook would.

    It posts to /me/messages/{id}/move. A user folder is created first when ``destination`` is
    not well-known."""
    rw = graph_client(server.url, SEND_TOKEN, timeout=CLIENT_TIMEOUT_S)  # has Mail.ReadWrite
    if destination not in ("archive", "deleteditems", "inbox"):
        made = rw.call(lambda g: g.me.mail_folders.post(MailFolder(display_name=destination)))
        assert made is not None and made.id
        destination = made.id
    body = MovePostRequestBody(destination_id=destination)
    moved = rw.call(lambda g: g.me.messages.by_message_id(message_id).move.post(body))
    assert moved is not None and moved.id and moved.id != message_id
    return moved.id


@pytest.mark.parametrize("where", ["archive", "user folder", "inbox rule", "recoverable items"])
def test_sent_copy_moved_anywhere_is_found(mail: StagingServer, store: JournalStore,
                                           where: str) -> None:
    task = persist_step(store)
    registry = Registry([action(mail)])
    if where == "inbox rule":
        graph(mail).create_folder("Receipts")
        post(mail, "/_staging/graph/settings", {"sent_rule": "Receipts"})
    arm_all(mail, "drop_after_commit")  # sent, but the answer is lost
    with pytest.raises(TargetUnavailable):
        run_step(store, registry, task, 1)
    if where == "archive":
        move_with_graph(mail, sent_copy(mail), "archive")
    elif where == "user folder":
        move_with_graph(mail, sent_copy(mail), "Projects")
    elif where == "inbox rule":
        post(mail, "/_staging/graph/deliver")
        assert graph(mail).messages_in("sentitems") == []
        assert len(graph(mail).messages_in("Receipts")) == 1
    else:  # deleted, then Deleted Items emptied (by a person or a retention policy)
        move_with_graph(mail, sent_copy(mail), "deleteditems")
        assert post(mail, "/_staging/graph/empty_deleted") == {"moved": 1}
        assert len(graph(mail).messages_in("recoverableitemsdeletions")) == 1
    result = run_step(store, registry, task, 1)
    assert result.resolved_by == "probe" and result.outcome["state"] == "sent"
    assert len(mails_sent(mail)) == 1


# -- what a probe with a journaled draft says -------------------------------------------------

def staged_step(server: StagingServer) -> tuple[GraphSendMail, Any]:
    a = action(server)
    ctx = step_context("graph.send_mail", ARGS, before_state={"fence": "draft"})
    return a, replace(ctx, staged=a.stage(ctx))


def test_probe_with_a_staged_draft(mail: StagingServer) -> None:
    post(mail, "/_staging/graph/settings", {"send_delay": 60})
    a, ctx = staged_step(mail)
    # The draft is in Drafts and nothing was submitted: sending it is safe.
    assert a.probe(ctx).status is ProbeStatus.ABSENT
    a.execute(ctx)
    assert a.probe(ctx).observed["state"] == "submitted"
    move_with_graph(mail, sent_copy(mail), "archive")
    probed = a.probe(ctx)
    assert probed.status is ProbeStatus.DONE and probed.observed["folder"] == "archive"
    assert probed.observed["internetMessageId"] == ctx.staged["internetMessageId"]


def test_probe_is_unknown_when_the_staged_draft_is_gone_unsent(mail: StagingServer,
                                                               store: JournalStore) -> None:
    a, ctx = staged_step(mail)
    graph(mail).move(ctx.staged["id"], "recoverableitemsdeletions")  # deleted by a person
    probed = a.probe(ctx)
    assert probed.status is ProbeStatus.UNKNOWN and "a person decides" in probed.reason


def test_a_draft_moved_out_of_drafts_unsent_is_not_done(mail: StagingServer) -> None:
    a, ctx = staged_step(mail)
    move_with_graph(mail, ctx.staged["id"], "Later")
    assert a.probe(ctx).status is ProbeStatus.UNKNOWN


def test_a_late_send_of_a_consumed_draft_is_refused(mail: StagingServer) -> None:
    a, ctx = staged_step(mail)
    a.execute(ctx)
    with pytest.raises(TargetUnavailable) as e:  # in doubt: the probe decides
        a.execute(ctx)
    assert "ErrorItemNotFound" in str(e.value)
    assert len(mails_sent(mail)) == 1
    assert a.probe(ctx).status is ProbeStatus.DONE


@pytest.mark.parametrize("second_send", SECOND_SENDS)
def test_execute_sends_nothing_for_a_draft_already_submitted(mail: StagingServer,
                                                             second_send: str) -> None:
    """``execute`` sends nothing for a draft already submitted.

    The send path itself reads the draft before sending. One flagged submitted (waiting in Drafts
    for transport) is never sent a second time, whatever Graph would do with it."""
    submission_window(mail, second_send)
    a, ctx = staged_step(mail)
    assert a.execute(ctx)["state"] == "submitted"
    with pytest.raises(TargetUnavailable) as e:  # in doubt: the probe decides
        a.execute(ctx)
    assert "already submitted" in str(e.value)
    assert len(sends_requested(mail)) == 1 and len(mails_sent(mail)) == 1
    assert a.probe(ctx).status is ProbeStatus.DONE


# -- 5: read and write credentials of different mailboxes -------------------------------------

def add_mailbox_b(server: StagingServer) -> None:
    post(server, "/_staging/graph/mailboxes", {"account": "b", "address": "b@staging.example"})
    post(server, "/_staging/tokens", {"token": "read-b", "target": "graph", "account": "b",
                                      "scopes": ["Mail.Read", "User.Read"]})


def test_worker_refuses_credentials_of_two_mailboxes(mail: StagingServer) -> None:
    add_mailbox_b(mail)
    with pytest.raises(ConfigError) as e:
        action(mail, read_token="read-b").check_identity()
    assert "b@staging.example" in str(e.value) and MAILBOX in str(e.value)
    env = {"TIDEMARK_GRAPH_URL": mail.url, "TIDEMARK_GRAPH_WRITE_TOKEN": SEND_TOKEN,
           "TIDEMARK_GRAPH_READ_TOKEN": "read-b"}
    with pytest.raises(ConfigError) as e:
        bound_actions(env)
    assert "b@staging.example" in str(e.value) and "read-b" not in str(e.value)


def test_identity_of_matching_credentials_and_a_token_without_user_read(
        mail: StagingServer) -> None:
    assert action(mail).check_identity()["mailbox"] == MAILBOX
    post(mail, "/_staging/tokens", {"token": "no-profile", "target": "graph",
                                    "scopes": ["Mail.Read"]})
    with pytest.raises(ConfigError) as e:
        action(mail, read_token="no-profile").check_identity()
    assert "User.Read" in str(e.value)


def test_mailboxes_are_apart(mail: StagingServer) -> None:
    add_mailbox_b(mail)
    a = action(mail)
    a_ctx = step_context("graph.send_mail", ARGS)
    a.execute(replace(a_ctx, staged=a.stage(a_ctx)))
    b = action(mail, read_token="read-b")
    assert b.probe(a_ctx).status is not ProbeStatus.DONE  # B's mailbox has none of A's mail
    assert graph(mail).messages_in("outbox", account="b") == []


# -- 6: a forged copy delivered to the mailbox ------------------------------------------------

def forge(server: StagingServer, key: str, folder: str) -> None:
    """Mails the mailbox a message carrying our key, with our own address as its From."""
    post(server, "/_staging/graph/inbound", {
        "from": MAILBOX, "subject": ARGS["subject"], "folder": folder,
        "internetMessageHeaders": [{"name": KEY_HEADER, "value": key}],
        "singleValueExtendedProperties": [{"id": KEY_PROPERTY_ID, "value": key}]})


def test_a_forged_inbound_copy_does_not_count(mail: StagingServer,
                                              store: JournalStore) -> None:
    task = persist_step(store)
    registry = Registry([action(mail)])
    arm(mail, "graph", "messages.get", "fail_before_commit")  # the fence's read: nothing sent
    with pytest.raises(TargetUnavailable):
        run_step(store, registry, task, 1)
    key = store.step_row(task, 1).idem_key
    forge(mail, key, "deleteditems")  # binned as spam by a person
    forge(mail, key, "archive")
    result = run_step(store, registry, task, 1)
    assert result.resolved_by == "execute"
    assert len(mails_sent(mail)) == 1


def test_forged_copy_without_a_journaled_draft_is_absent(mail: StagingServer,
                                                         store: JournalStore) -> None:
    task = persist_step(store)
    registry = Registry([action(mail)])
    arm(mail, "graph", "messages.create", "fail_before_commit")
    with pytest.raises(TargetUnavailable):
        run_step(store, registry, task, 1)
    assert store.step_row(task, 1).staged is None
    forge(mail, store.step_row(task, 1).idem_key, "inbox")
    result = run_step(store, registry, task, 1)
    assert result.resolved_by == "execute" and len(mails_sent(mail)) == 1


def test_unreadable_mailbox_is_unknown_and_nothing_is_sent(
        mail: StagingServer, store: JournalStore, monkeypatch: pytest.MonkeyPatch) -> None:
    # A mailbox unreadable past the probe's budget (here a short one): its read stands.
    monkeypatch.setenv(ENV_READ_RETRY, "0.5")
    task = persist_step(store)
    registry = Registry([action(mail)])
    arm_all(mail, "fail_before_commit")
    with pytest.raises(TargetUnavailable):
        run_step(store, registry, task, 1)
    arm(mail, "graph", "messages.list", "fail_before_commit", times=1000)
    with pytest.raises(NeedsDecision):
        run_step(store, registry, task, 1)
    assert mails_sent(mail) == []


def test_a_lost_draft_answer_leaves_an_unsent_orphan_and_one_mail(mail: StagingServer,
                                                                  store: JournalStore) -> None:
    """A lost draft answer leaves an unsent orphan and one mail.

    The draft was created but its id never reached the journal. The next attempt makes a new
    draft and sends that; the orphan stays in Drafts, unsent (docs/reference.md, graph.send_mail:
    what still needs a person)."""
    task = persist_step(store)
    registry = Registry([action(mail)])
    arm(mail, "graph", "messages.create", "drop_after_commit")
    with pytest.raises(TargetUnavailable):
        run_step(store, registry, task, 1)
    result = run_step(store, registry, task, 1)
    assert result.resolved_by == "execute" and len(mails_sent(mail)) == 1
    [orphan] = graph(mail).messages_in("drafts")
    assert orphan.fields["isDraft"] is True
    assert orphan.fields["internetMessageId"] != result.outcome["internetMessageId"]


def test_an_intent_from_before_the_fence_is_probed_by_sender(mail: StagingServer) -> None:
    """An intent from before the fence is probed by sender.

    An intent without a journaled draft and without the fence mark was sent with sendMail. A
    submitted copy from our own address counts, one from anybody else does not."""
    post(mail, "/_staging/graph/settings", {"send_delay": 60})
    ctx = step_context("graph.send_mail", ARGS)  # before_state None: written by older code
    a = action(mail)
    post(mail, "/_staging/graph/inbound", {
        "from": "mallory@example.net",
        "singleValueExtendedProperties": [{"id": KEY_PROPERTY_ID, "value": ctx.key}]})
    assert a.probe(ctx).status is ProbeStatus.ABSENT
    body = build_request(ARGS, ctx.key)
    graph_client(mail.url, SEND_TOKEN).call(lambda g: g.me.send_mail.post(body))
    probed = a.probe(ctx)
    assert probed.status is ProbeStatus.DONE and probed.observed["folder"] == "outbox"
    assert probed.observed["ignored"] == 1


def test_client_timeout_and_confirm_wait_come_from_the_environment() -> None:
    assert client_timeout({}) == DEFAULT_TIMEOUT_S
    assert client_timeout({"TIDEMARK_GRAPH_TIMEOUT_S": "2.5"}) == 2.5
    assert confirm_timeout({}) == DEFAULT_CONFIRM_S
    assert confirm_timeout({"TIDEMARK_GRAPH_CONFIRM_S": "0.5"}) == 0.5
    assert late_timeout({}) == DEFAULT_LATE_S
    assert late_timeout({"TIDEMARK_GRAPH_LATE_S": "7"}) == 7.0
    for bad in ("0", "-1", "soon"):
        with pytest.raises(ConfigError):
            client_timeout({"TIDEMARK_GRAPH_TIMEOUT_S": bad})
    for name, read in (("TIDEMARK_GRAPH_CONFIRM_S", confirm_timeout),
                       ("TIDEMARK_GRAPH_LATE_S", late_timeout)):
        for bad in ("-1", "soon"):
            with pytest.raises(ConfigError) as e:
                read({name: bad})
            assert name in str(e.value)


def test_the_worker_takes_the_watch_and_confirm_waits_from_its_configuration(
        mail: StagingServer) -> None:
    env = {"TIDEMARK_GRAPH_URL": mail.url, "TIDEMARK_GRAPH_WRITE_TOKEN": SEND_TOKEN,
           "TIDEMARK_GRAPH_READ_TOKEN": READ_TOKEN, "TIDEMARK_GRAPH_CONFIRM_S": "0.5",
           "TIDEMARK_GRAPH_LATE_S": "7"}
    [bound] = [a for a in bound_actions(env) if isinstance(a, GraphSendMail)]
    assert (bound.confirm_s, bound.late_s) == (0.5, 7.0)
    with pytest.raises(ConfigError) as e:
        bound_actions({**env, "TIDEMARK_GRAPH_LATE_S": "soon"})
    assert "TIDEMARK_GRAPH_LATE_S" in str(e.value)
