"""``gmail.send`` when the world misbehaves.

Through run_step, a real journal and the Gmail staging server: a send slower than the client (the
draft fence), sends the search index does not show yet, Google's clock behind ours, a sent copy
deleted for good, a forged inbound copy, and credentials of two different mailboxes."""

from __future__ import annotations

import base64
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest

from activities.gmail import DEFAULT_HORIZON_S, GmailSend
from activities.wiring import bound_actions, worker_registry
from helpers.staging_fixtures import CLIENT_TIMEOUT_S, add_token, arm, effects, post, target_of
from helpers.steps import persist, step_context, wait_unlocked
from probes.gmail import KEY_HEADER, gmail_client, message_id_for
from staging.core import StagingServer, Token
from staging.gmail import (
    COMPOSE_SCOPE,
    COMPOSE_TOKEN,
    FULL_SCOPE,
    INSERT_SCOPE,
    READ_TOKEN,
    READONLY_SCOPE,
    SEND_TOKEN,
    GmailTarget,
)
from tidemark.actions import ProbeStatus, Registry
from tidemark.errors import ConfigError, NeedsDecision, Refused, StepBusy, TargetUnavailable
from tidemark.faults import CRASH_ENV
from tidemark.keys import key_for
from tidemark.run_step import run_step
from tidemark.store import JournalStore

ARGS = {"to": ["bob@example.com"], "subject": "Q3 report", "body": "Attached in spirit."}
SPECS = Registry([GmailSend])
SEND_OPS = ("drafts.send", "messages.send")  # whichever call sends the mail
RUNNER = str(Path(__file__).parent / "helpers" / "run_plan_local.py")


def action(server: StagingServer, *, timeout: float = CLIENT_TIMEOUT_S,
           horizon_s: float = 0.0) -> GmailSend:
    """The action over staging, with a horizon of 0 unless a test sets one.

    Staging sends within the request unless a delay is armed, and the tests of the probe's
    answers retry at once."""
    return GmailSend(gmail_client(server.url, COMPOSE_TOKEN, timeout=timeout),
                     gmail_client(server.url, READ_TOKEN, timeout=CLIENT_TIMEOUT_S),
                     timeout=timeout, horizon_s=horizon_s)


def gmail(server: StagingServer) -> GmailTarget:
    return target_of(server.staging, GmailTarget)


def sent_copies(server: StagingServer, key: str) -> list[str]:
    """Ids of the messages carrying ``key`` that the mailbox holds as sent."""
    return [m.id for m in gmail(server).messages()
            if m.header(KEY_HEADER) == key and "SENT" in m.label_ids]


def sends(server: StagingServer) -> int:
    return sum(len(effects(server, "gmail", op)) for op in SEND_OPS)


def new_task(store: JournalStore) -> tuple[str, str]:
    task = persist(store, SPECS, [{"action": "gmail.send", "args": ARGS}])
    return task, key_for(task, 1, "gmail.send", ARGS)


def fail_every_send(server: StagingServer, kind: str, **extra: Any) -> None:
    for op in SEND_OPS:
        arm(server, "gmail", op, kind, **extra)


def disarm(server: StagingServer) -> None:
    """Forgets the faults the step's own send did not use (the other SEND_OPS one)."""
    with server.staging.lock:
        server.staging.faults.clear()


def send_others(server: StagingServer, n: int) -> None:
    disarm(server)
    sender = gmail_client(server.url, SEND_TOKEN, timeout=CLIENT_TIMEOUT_S).users().messages()
    for i in range(n):
        msg = EmailMessage()
        msg["To"] = "someone@example.com"
        msg["Subject"] = f"later {i}"
        msg.set_content("unrelated")
        raw = base64.urlsafe_b64encode(msg.as_bytes()).decode()
        sender.send(userId="me", body={"raw": raw}).execute(num_retries=0)


def raw_of(key: str, **headers: str) -> str:
    msg = EmailMessage()
    msg["From"] = "mallory@example.net"
    msg["To"] = "agent@staging.example"
    msg["Subject"] = "Q3 report"
    msg["Message-ID"] = message_id_for(key)
    msg[KEY_HEADER] = key
    for name, value in headers.items():
        msg[name] = value
    msg.set_content("forged")
    return base64.urlsafe_b64encode(msg.as_bytes()).decode()


# -- case 1: the provider commits after our client gave up --------------------------------------

def test_a_send_slower_than_the_client_goes_out_once(mail: StagingServer,
                                                     store: JournalStore) -> None:
    task, key = new_task(store)
    # The first send must reach Gmail (and take the delay) before our client gives up on it, on
    # a loaded machine too: a second of timeout, and a delay well beyond it.
    registry = Registry([action(mail, timeout=1.0)])
    late = 3.0
    fail_every_send(mail, "delay", seconds=late)
    started = time.monotonic()
    with pytest.raises(TargetUnavailable):
        run_step(store, registry, task, 1)  # the client gives up; Gmail is still working
    result = run_step(store, registry, task, 1)  # probes and acts without waiting
    assert time.monotonic() - started < late, "the retry waited for the late commit"
    assert result.status == "done" and result.resolved_by == "execute"
    time.sleep(max(0.0, started + late + 0.5 - time.monotonic()))  # now let the late one land
    assert sent_copies(mail, key) == [result.outcome["id"]]
    assert sends(mail) == 1  # the late drafts.send found its draft consumed: a 404
    assert gmail(mail).drafts() == {}
    [probed] = [e["detail"] for e in store.events(task) if e["kind"] == "probe"]
    assert probed["status"] == "absent" and "still in Drafts" in probed["reason"]


def test_a_worker_killed_after_staging_resumes_by_sending_that_draft(
        mail: StagingServer, store: JournalStore, db_url: str) -> None:
    task, key = new_task(store)
    proc = subprocess.run([sys.executable, RUNNER, db_url, task, mail.url],
                          env={**os.environ, CRASH_ENV: "after_stage:1"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    wait_unlocked(db_url)
    row = store.step_row(task, 1)
    assert row is not None and row.outcome is None and row.staged is not None
    assert list(gmail(mail).drafts()) == [row.staged["draft_id"]] and sends(mail) == 0
    result = run_step(store, worker_registry({"TIDEMARK_STAGING_URL": mail.url}), task, 1)
    assert result.resolved_by == "execute" and result.outcome["draft_id"] == row.staged[
        "draft_id"]
    assert len(sent_copies(mail, key)) == 1 and sends(mail) == 1
    assert len(effects(mail, "gmail", "drafts.create")) == 1  # the draft was not made again


def test_sending_a_consumed_draft_leaves_the_step_in_doubt_and_the_probe_finds_it(
        mail: StagingServer, store: JournalStore) -> None:
    """Sending a consumed draft leaves the step in doubt, and the probe finds it.

    An earlier attempt's send landed after a later attempt's probe. The later send gets Gmail's
    404, which must not close the step as failed."""
    a = action(mail)
    ctx = step_context("gmail.send", ARGS, before_state=a.snapshot(step_context(
        "gmail.send", ARGS)))
    ctx = replace(ctx, staged=a.stage(ctx))
    first = a.execute(ctx)
    with pytest.raises(TargetUnavailable, match="no longer there"):
        a.execute(ctx)
    probed = a.probe(ctx)
    assert probed.status is ProbeStatus.DONE and probed.observed["id"] == first["id"]
    assert sends(mail) == 1


def switch(server: StagingServer, name: str, value: object) -> None:
    post(server, "/_staging/switches", {"target": "gmail", "name": name, "value": value})


def test_overlapping_sends_that_both_go_out_still_send_once(mail: StagingServer,
                                                            store: JournalStore) -> None:
    """Overlapping sends that both go out still send once.

    Gmail does not document that two drafts.send of one draft send once. With both going
    out, the draft fence alone sends twice when a retry sends while a slow first send is still
    under way; the horizon keeps the retry from sending until the first can no longer act."""
    switch(mail, "concurrent_draft_send", "both")
    task, key = new_task(store)
    late, horizon = 2.0, 3.0
    a = GmailSend.from_env({"TIDEMARK_GMAIL_TIMEOUT_S": "0.3",
                            "TIDEMARK_GMAIL_HORIZON_S": str(horizon)},
                           mail.url, COMPOSE_TOKEN, READ_TOKEN)
    registry = Registry([a])
    fail_every_send(mail, "delay", seconds=late)
    started = time.monotonic()
    with pytest.raises(TargetUnavailable):
        run_step(store, registry, task, 1)  # the client gives up; Gmail is still sending
    disarm(mail)
    result = None
    while result is None and time.monotonic() - started < late + horizon + 10:
        try:
            result = run_step(store, registry, task, 1)
        except StepBusy:
            time.sleep(0.2)
    assert result is not None and result.status == "done"
    time.sleep(max(0.0, started + late + 0.5 - time.monotonic()))  # the late send has landed
    assert sends(mail) == 1 and len(sent_copies(mail, key)) == 1
    assert result.resolved_by == "probe" and result.outcome["id"] == sent_copies(mail, key)[0]


@pytest.mark.parametrize("status", [404, 400, 500])
def test_any_error_answer_to_a_send_of_a_consumed_draft_leaves_the_step_in_doubt(
        mail: StagingServer, store: JournalStore, status: int) -> None:
    """Any error answer to a send of a consumed draft leaves the step in doubt.

    What the send of a draft that was already sent gets is undocumented. Whatever it is, the step
    is never closed as failed without the probe, which finds the sent copy."""
    switch(mail, "gone_draft_send_status", status)
    task, key = new_task(store)
    registry = Registry([action(mail)])
    fail_every_send(mail, "drop_after_commit")  # sent; the answer is lost
    with pytest.raises(TargetUnavailable):
        run_step(store, registry, task, 1)
    row = store.step_row(task, 1)
    assert row is not None and row.staged is not None
    a = action(mail)
    ctx = replace(step_context("gmail.send", ARGS, task_id=task), before_state=row.before_state,
                  staged=row.staged)
    try:  # a later attempt's send of the consumed draft, as when a probe ran too early
        outcome = a.execute(ctx)
    except TargetUnavailable:
        outcome = None
    if outcome is not None:  # a 400 that the mailbox shows was a send that went out
        assert status == 400 and outcome["id"] == sent_copies(mail, key)[0]
    result = run_step(store, registry, task, 1)
    assert (result.status, result.resolved_by) == ("done", "probe")
    assert sends(mail) == 1 and result.outcome["id"] == sent_copies(mail, key)[0]


def test_a_400_for_a_draft_still_unsent_is_a_refusal(mail: StagingServer) -> None:
    """A 400 for a draft still unsent is a refusal.

    A 400 closes the step only when the mailbox shows the request refused: our draft still
    there, nothing sent (here a draft that names no recipient)."""
    a = action(mail)
    ctx = replace(step_context("gmail.send", ARGS), before_state=a.snapshot(
        step_context("gmail.send", ARGS)))
    msg = EmailMessage()
    msg["Subject"] = "Q3 report"
    msg[KEY_HEADER] = ctx.key
    msg.set_content("nobody to send to")
    draft = gmail_client(mail.url, COMPOSE_TOKEN).users().drafts().create(
        userId="me", body={"message": {"raw": base64.urlsafe_b64encode(
            msg.as_bytes()).decode()}}).execute(num_retries=0)
    with pytest.raises(Refused, match="still in Drafts"):
        a.execute(replace(ctx, staged={"draft_id": draft["id"]}))
    assert sends(mail) == 0 and list(gmail(mail).drafts()) == [draft["id"]]


def test_a_deleted_draft_without_a_sent_copy_needs_a_person(mail: StagingServer,
                                                            store: JournalStore) -> None:
    task, _ = new_task(store)
    registry = Registry([action(mail)])
    fail_every_send(mail, "fail_before_commit")
    with pytest.raises(TargetUnavailable):
        run_step(store, registry, task, 1)
    row = store.step_row(task, 1)
    assert row is not None and row.staged is not None
    gmail_client(mail.url, COMPOSE_TOKEN).users().drafts().delete(
        userId="me", id=row.staged["draft_id"]).execute(num_retries=0)
    with pytest.raises(NeedsDecision, match="is gone"):
        run_step(store, registry, task, 1)
    assert sends(mail) == 0


def test_an_orphan_draft_is_not_a_sent_mail(mail: StagingServer) -> None:
    """An orphan draft is not a sent mail.

    A crash between drafts.create and its journal write leaves a draft with our key and no
    journaled handle. The probe still answers absent."""
    a = action(mail)
    ctx = step_context("gmail.send", ARGS, before_state=a.snapshot(step_context(
        "gmail.send", ARGS)))
    a.stage(ctx)  # never journaled: ctx.staged stays None
    assert a.probe(ctx).status is ProbeStatus.ABSENT


# -- case 4: the probe's windows -------------------------------------------------------------

def test_more_than_fifty_later_sends_inside_the_search_lag(mail: StagingServer,
                                                           store: JournalStore) -> None:
    post(mail, "/_staging/gmail/settings", {"search_lag": 600})
    task, key = new_task(store)
    registry = Registry([action(mail)])
    fail_every_send(mail, "drop_after_commit")
    with pytest.raises(TargetUnavailable):
        run_step(store, registry, task, 1)  # sent; the answer was lost
    send_others(mail, 60)
    result = run_step(store, registry, task, 1)
    assert result.resolved_by == "probe" and result.status == "done"
    assert result.outcome["found_by"] == "history"
    assert len(sent_copies(mail, key)) == 1 and sends(mail) == 61


def test_a_sent_draft_that_keeps_its_message_id_is_found(mail: StagingServer,
                                                          store: JournalStore) -> None:
    """A sent draft that keeps its message id is found.

    Gmail may turn the draft's own message into the sent one (DRAFT -> SENT) instead of
    storing a new message: the history shows a label change, not an added message."""
    post(mail, "/_staging/gmail/settings", {"draft_send": "relabel", "search_lag": 600})
    task, key = new_task(store)
    registry = Registry([action(mail)])
    fail_every_send(mail, "drop_after_commit")
    with pytest.raises(TargetUnavailable):
        run_step(store, registry, task, 1)
    row = store.step_row(task, 1)
    assert row is not None and row.staged is not None
    result = run_step(store, registry, task, 1)
    assert result.resolved_by == "probe" and result.outcome["id"] == row.staged["message_id"]
    assert len(sent_copies(mail, key)) == 1


def test_googles_clock_behind_the_database(mail: StagingServer, store: JournalStore) -> None:
    """started_at (the database's clock) is 15 minutes ahead of the mailbox's internalDate."""
    post(mail, "/_staging/gmail/settings", {"clock_offset": -900})
    task, key = new_task(store)
    registry = Registry([action(mail)])
    fail_every_send(mail, "drop_after_commit")
    with pytest.raises(TargetUnavailable):
        run_step(store, registry, task, 1)
    send_others(mail, 60)
    result = run_step(store, registry, task, 1)
    assert result.resolved_by == "probe" and result.status == "done"
    assert len(sent_copies(mail, key)) == 1


def test_a_sent_copy_deleted_for_good_is_not_absent(mail: StagingServer,
                                                    store: JournalStore) -> None:
    task, key = new_task(store)
    registry = Registry([action(mail)])
    fail_every_send(mail, "drop_after_commit")
    with pytest.raises(TargetUnavailable):
        run_step(store, registry, task, 1)
    add_token(mail, "full", "gmail", [FULL_SCOPE])
    [copy] = sent_copies(mail, key)
    gmail_client(mail.url, "full").users().messages().delete(userId="me", id=copy).execute()
    # The probe names the deleted copy it could not rule out, not merely the generic "the
    # draft is gone ... or the sent copy was deleted for good".
    with pytest.raises(NeedsDecision, match=rf"1 message\(s\) sent since historyId \d+ were "
                       rf"deleted for good \(e\.g\. {re.escape(copy)}\); one may have been ours"):
        run_step(store, registry, task, 1)
    assert sends(mail) == 1


def test_an_unsent_draft_outweighs_another_message_deleted_for_good(
        mail: StagingServer, store: JournalStore) -> None:
    task, key = new_task(store)
    registry = Registry([action(mail)])
    fail_every_send(mail, "fail_before_commit")
    with pytest.raises(TargetUnavailable):
        run_step(store, registry, task, 1)
    send_others(mail, 1)
    add_token(mail, "full", "gmail", [FULL_SCOPE])
    [other] = [m.id for m in gmail(mail).messages() if "SENT" in m.label_ids]
    gmail_client(mail.url, "full").users().messages().delete(userId="me", id=other).execute()
    result = run_step(store, registry, task, 1)
    assert result.resolved_by == "execute" and len(sent_copies(mail, key)) == 1


def test_expired_history_with_the_draft_gone_is_found_by_a_search_of_sent(
        mail: StagingServer, store: JournalStore) -> None:
    # Gmail no longer keeps the history since the snapshot: the probe searches SENT for the
    # copy the lost send made (a draft gone with no copy there is a person's: test_gmail_send).
    task, _ = new_task(store)
    registry = Registry([action(mail)])
    fail_every_send(mail, "drop_after_commit")
    with pytest.raises(TargetUnavailable):
        run_step(store, registry, task, 1)
    post(mail, "/_staging/gmail/settings", {"expire_history": True})
    resumed = run_step(store, registry, task, 1)
    assert (resumed.status, resumed.outcome["found_by"]) == ("done", "sent search")
    assert sends(mail) == 1


# -- case 6: a forged inbound copy ---------------------------------------------------------

def test_an_inbound_copy_with_our_key_does_not_make_an_unsent_mail_done(
        mail: StagingServer, store: JournalStore) -> None:
    task, key = new_task(store)
    registry = Registry([action(mail)])
    fail_every_send(mail, "fail_before_commit")
    with pytest.raises(TargetUnavailable):
        run_step(store, registry, task, 1)  # nothing sent
    add_token(mail, "inbound", "gmail", [INSERT_SCOPE])
    gmail_client(mail.url, "inbound").users().messages().insert(
        userId="me", body={"raw": raw_of(key), "labelIds": ["INBOX", "UNREAD"]}).execute()
    result = run_step(store, registry, task, 1)
    assert result.resolved_by == "execute"
    assert len(sent_copies(mail, key)) == 1 and sends(mail) == 1


def test_a_copy_labelled_sent_next_to_our_unsent_draft_needs_a_person(
        mail: StagingServer, store: JournalStore) -> None:
    task, key = new_task(store)
    registry = Registry([action(mail)])
    fail_every_send(mail, "fail_before_commit")
    with pytest.raises(TargetUnavailable):
        run_step(store, registry, task, 1)
    add_token(mail, "inbound", "gmail", [INSERT_SCOPE])
    gmail_client(mail.url, "inbound").users().messages().insert(
        userId="me", body={"raw": raw_of(key), "labelIds": ["SENT"]}).execute()
    with pytest.raises(NeedsDecision, match="not ours"):
        run_step(store, registry, task, 1)
    assert sends(mail) == 0


# -- case 5: foreign credentials -------------------------------------------------------------

def gmail_env(server: StagingServer, write: str, read: str, **extra: str) -> dict[str, str]:
    return {"TIDEMARK_GMAIL_URL": server.url, "TIDEMARK_GMAIL_WRITE_TOKEN": write,
            "TIDEMARK_GMAIL_READ_TOKEN": read, **extra}


def test_a_read_token_of_another_mailbox_refuses_to_bind(mail: StagingServer) -> None:
    staging = mail.staging
    staging.add_token(Token("a-compose", "gmail", [COMPOSE_SCOPE], account="a@staging.example"))
    staging.add_token(Token("b-read", "gmail", [READONLY_SCOPE], account="b@staging.example"))
    staging.add_token(Token("a-read", "gmail", [READONLY_SCOPE], account="a@staging.example"))
    with pytest.raises(ConfigError) as e:
        bound_actions(gmail_env(mail, "a-compose", "b-read"))
    assert "b@staging.example" in str(e.value) and "a@staging.example" in str(e.value)
    assert "a-compose" not in str(e.value) and "b-read" not in str(e.value)  # no secrets
    [bound] = [a for a in bound_actions(gmail_env(mail, "a-compose", "a-read"))
               if isinstance(a, GmailSend)]
    assert bound.check_identity() == {"mailbox": "a@staging.example"}
    with pytest.raises(ConfigError, match="TIDEMARK_GMAIL_USER"):
        bound_actions(gmail_env(mail, "a-compose", "a-read",
                                TIDEMARK_GMAIL_USER="c@staging.example"))


def test_a_send_only_write_token_refuses_to_bind(mail: StagingServer) -> None:
    with pytest.raises(ConfigError, match=r"gmail\.compose"):
        bound_actions(gmail_env(mail, SEND_TOKEN, READ_TOKEN))


def test_worker_configuration_sets_the_timeout_and_the_deadline(mail: StagingServer) -> None:
    [bound] = [a for a in bound_actions(gmail_env(mail, COMPOSE_TOKEN, READ_TOKEN,
                                                  TIDEMARK_GMAIL_TIMEOUT_S="2.5"))
               if isinstance(a, GmailSend)]
    assert bound.deadline_s == 2 * 2.5 + 5 and bound.horizon_s == DEFAULT_HORIZON_S > 0
    [bound] = [a for a in bound_actions(gmail_env(mail, COMPOSE_TOKEN, READ_TOKEN,
                                                  TIDEMARK_GMAIL_HORIZON_S="7"))
               if isinstance(a, GmailSend)]
    assert bound.horizon_s == 7
    with pytest.raises(ConfigError, match="TIDEMARK_GMAIL_TIMEOUT_S"):
        bound_actions(gmail_env(mail, COMPOSE_TOKEN, READ_TOKEN, TIDEMARK_GMAIL_TIMEOUT_S="x"))
    for bad in ("x", "-1", "601"):
        with pytest.raises(ConfigError, match="TIDEMARK_GMAIL_HORIZON_S"):
            bound_actions(gmail_env(mail, COMPOSE_TOKEN, READ_TOKEN,
                                    TIDEMARK_GMAIL_HORIZON_S=bad))
