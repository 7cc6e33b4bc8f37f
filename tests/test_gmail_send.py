"""``gmail.send`` through google-api-python-client against the Gmail staging server.

Directly, then through run_step and a real Postgres journal."""

from __future__ import annotations

import base64
import json
import time
from dataclasses import replace
from email.message import EmailMessage
from email.utils import parseaddr
from typing import Any

import httplib2
import pytest
from googleapiclient.errors import HttpError

from activities.catalog import spec_registry
from activities.gmail import GmailSend
from helpers.staging_fixtures import (
    CLIENT_TIMEOUT_S,
    add_token,
    arm,
    effects,
    post,
    revoke,
    target_of,
)
from helpers.steps import persist, step_context
from helpers.wait import assert_eventually
from probes.gmail import KEY_HEADER, gmail_client, message_id_for
from probes.google_http import google_error
from staging.core import StagingServer
from staging.gmail import (
    COMPOSE_SCOPE,
    COMPOSE_TOKEN,
    METADATA_TOKEN,
    READ_TOKEN,
    SEND_TOKEN,
    GmailTarget,
)
from tidemark.actions import ProbeStatus, Registry, StepContext
from tidemark.errors import (
    NeedsDecision,
    PlanError,
    Refused,
    TargetUnavailable,
    Throttled,
    Unauthorized,
)
from tidemark.plan import load_plan
from tidemark.reads import ENV_READ_RETRY, patient_reads
from tidemark.run_step import run_step
from tidemark.store import JournalStore

ARGS = {"to": ["bob@example.com"], "cc": "carol@example.com", "subject": "Q3 report",
        "body": "Attached in spirit."}
SPECS = Registry([GmailSend])


def action(server: StagingServer, *, send_token: str = COMPOSE_TOKEN,
           read_token: str = READ_TOKEN, timeout: float = CLIENT_TIMEOUT_S) -> GmailSend:
    # Horizon 0: staging sends within the request, and these tests retry at once.
    return GmailSend(writer=gmail_client(server.url, send_token, timeout=timeout),
                     reader=gmail_client(server.url, read_token, timeout=CLIENT_TIMEOUT_S),
                     horizon_s=0.0)


def gmail(server: StagingServer) -> GmailTarget:
    return target_of(server.staging, GmailTarget)


def sent_keys(server: StagingServer) -> list[str | None]:
    """The keys of the sent messages (drafts are not sent)."""
    return [m.header(KEY_HEADER) for m in gmail(server).messages() if "SENT" in m.label_ids]


def begun(a: GmailSend, args: dict[str, Any] = ARGS) -> StepContext:
    """The context of a step whose intent exists (before_state from the snapshot)."""
    return replace(step_context("gmail.send", args),
                   before_state=a.snapshot(step_context("gmail.send", args)))


def staged(a: GmailSend, ctx: StepContext) -> StepContext:
    """``ctx`` after ``stage`` created the draft and run_step journaled it."""
    return replace(ctx, staged=a.stage(ctx))


def send(a: GmailSend, args: dict[str, Any] = ARGS) -> tuple[StepContext, dict[str, Any]]:
    ctx = staged(a, begun(a, args))
    return ctx, a.execute(ctx)


def raw_message(subject: str) -> str:
    msg = EmailMessage()
    msg["To"] = "someone@example.com"
    msg["Subject"] = subject
    msg.set_content("unrelated")
    return base64.urlsafe_b64encode(msg.as_bytes()).decode()


def step(args: dict[str, Any] = ARGS) -> list[dict[str, Any]]:
    return [{"action": "gmail.send", "args": args}]


# -- the action on its own -------------------------------------------------------------------

def test_execute_sends_the_staged_draft_stamped_with_the_key(mail: StagingServer) -> None:
    a = action(mail)
    ctx = staged(a, begun(a))
    [(draft_id, draft_msg)] = gmail(mail).drafts().items()
    assert ctx.staged == {"draft_id": draft_id, "message_id": draft_msg}
    assert sent_keys(mail) == []  # a draft is not a sent mail
    out = a.execute(ctx)
    [stored] = gmail(mail).messages()
    assert out == {"id": stored.id, "threadId": stored.thread_id, "labelIds": ["SENT"],
                   "draft_id": draft_id}
    assert stored.id != draft_msg and gmail(mail).drafts() == {}
    assert stored.header(KEY_HEADER) == ctx.key
    assert stored.header("To") == "bob@example.com"
    assert stored.header("Cc") == "carol@example.com"
    assert stored.header("Subject") == "Q3 report"
    [effect] = effects(mail, "gmail", "drafts.send")
    assert effect["key"] == ctx.key


def test_execute_without_a_staged_draft_sends_nothing(mail: StagingServer) -> None:
    a = action(mail)
    with pytest.raises(ValueError, match="stage"):
        a.execute(begun(a))
    assert gmail(mail).messages() == []


def test_snapshot_records_the_mailbox_and_its_history_id(mail: StagingServer) -> None:
    a = action(mail)
    first = a.snapshot(step_context("gmail.send", ARGS))
    send(a, {**ARGS, "subject": "other"})
    second = a.snapshot(step_context("gmail.send", ARGS))
    assert first["mailbox"] == "agent@staging.example"
    assert int(second["history_id"]) > int(first["history_id"])


def test_probe_finds_the_message_although_gmail_replaced_its_message_id(
        mail: StagingServer) -> None:
    a = action(mail)
    ctx = staged(a, begun(a))
    assert a.probe(ctx).status is ProbeStatus.ABSENT
    out = a.execute(ctx)
    [stored] = gmail(mail).messages()
    assert stored.header("Message-ID") != message_id_for(ctx.key)  # rewritten by "Gmail"
    probed = a.probe(ctx)
    assert probed.status is ProbeStatus.DONE
    assert probed.observed["id"] == out["id"] and probed.observed["labelIds"] == ["SENT"]
    assert probed.observed["message_id"] == stored.header("Message-ID")
    assert probed.observed["found_by"] == "history"


def test_probe_reads_every_page_of_history(mail: StagingServer,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    a = action(mail)
    ctx = begun(a)
    sender = gmail_client(mail.url, SEND_TOKEN).users().messages()
    for i in range(5):  # sent before ours: ours is on the last page
        sender.send(userId="me", body={"raw": raw_message(f"earlier {i}")}).execute()
    ctx = staged(a, ctx)
    out = a.execute(ctx)
    monkeypatch.setattr("probes.gmail.HISTORY_PAGE", 2)
    assert a.probe(ctx).observed["id"] == out["id"]


def test_probe_is_unknown_past_its_candidate_limit(mail: StagingServer,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    a = action(mail)
    ctx = begun(a)
    sender = gmail_client(mail.url, SEND_TOKEN).users().messages()
    for i in range(4):
        sender.send(userId="me", body={"raw": raw_message(f"other {i}")}).execute()
    monkeypatch.setattr("probes.gmail.MAX_CANDIDATES", 3)
    probed = a.probe(ctx)
    assert probed.status is ProbeStatus.UNKNOWN and "more than 3" in probed.reason


def test_probe_ignores_other_messages_and_finds_ours_among_them(mail: StagingServer) -> None:
    a = action(mail)
    ours = begun(a)
    send(a, {**ARGS, "subject": "another"})
    assert a.probe(ours).status is ProbeStatus.ABSENT
    ours = staged(a, ours)
    a.execute(ours)
    send(a, {**ARGS, "subject": "later"})
    probed = a.probe(ours)
    assert probed.status is ProbeStatus.DONE
    assert gmail(mail).messages()[1].id == probed.observed["id"]


def test_probe_still_finds_a_sent_message_that_was_trashed(mail: StagingServer) -> None:
    a = action(mail)
    ctx, out = send(a)
    add_token(mail, "modify", "gmail", ["https://www.googleapis.com/auth/gmail.modify"])
    gmail_client(mail.url, "modify").users().messages().trash(userId="me",
                                                               id=out["id"]).execute()
    assert a.probe(ctx).status is ProbeStatus.DONE


def test_probe_is_unknown_when_search_is_unavailable(mail: StagingServer) -> None:
    a = action(mail)
    ctx = begun(a)
    for op in ("messages.list", "history.list", "messages.get"):
        send(a, {**ARGS, "subject": op})
        arm(mail, "gmail", op, "fail_before_commit")
        probed = a.probe(ctx)
        assert probed.status is ProbeStatus.UNKNOWN and "503" in probed.reason, op


def test_probe_with_a_metadata_scope_reader_is_unknown(mail: StagingServer) -> None:
    a = action(mail)
    probed = action(mail, read_token=METADATA_TOKEN).probe(begun(a))
    assert probed.status is ProbeStatus.UNKNOWN and "403" in probed.reason


def test_timeout_is_target_unavailable_and_the_probe_sees_the_late_commit(
        mail: StagingServer) -> None:
    a = action(mail, timeout=0.2)
    ctx = staged(a, begun(a))
    arm(mail, "gmail", "drafts.send", "delay", seconds=0.6)
    with pytest.raises(TargetUnavailable):
        a.execute(ctx)
    assert_eventually(lambda: a.probe(ctx).status is ProbeStatus.DONE, timeout=5)
    assert sent_keys(mail) == [ctx.key]


def test_server_error_before_commit_is_target_unavailable(mail: StagingServer) -> None:
    a = action(mail)
    ctx = staged(a, begun(a))
    arm(mail, "gmail", "drafts.send", "fail_before_commit")
    with pytest.raises(TargetUnavailable):
        a.execute(ctx)
    assert sent_keys(mail) == []
    assert a.probe(ctx).status is ProbeStatus.ABSENT  # the draft is still there, unsent


def test_revoked_or_wrong_scope_token_is_unauthorized(mail: StagingServer) -> None:
    with pytest.raises(Unauthorized):
        action(mail, send_token=READ_TOKEN).stage(step_context("gmail.send", ARGS))
    with pytest.raises(Unauthorized):  # gmail.send alone cannot create drafts
        action(mail, send_token=SEND_TOKEN).stage(step_context("gmail.send", ARGS))
    revoke(mail, COMPOSE_TOKEN)
    with pytest.raises(Unauthorized) as e:
        action(mail).stage(step_context("gmail.send", ARGS))
    assert COMPOSE_TOKEN not in str(e.value)
    assert sent_keys(mail) == []


def _http_error(status: int, reason: str) -> HttpError:
    resp = httplib2.Response({"status": str(status)})
    body = {"error": {"code": status, "message": reason,
                      "errors": [{"reason": reason, "domain": "global", "message": reason}]}}
    return HttpError(resp, json.dumps(body).encode(), uri="https://gmail.googleapis.com/x")


@pytest.mark.parametrize(("status", "reason", "expected"), [
    (400, "invalidArgument", Refused),
    (404, "notFound", Refused),
    (401, "authError", Unauthorized),
    (403, "insufficientPermissions", Unauthorized),
    (403, "userRateLimitExceeded", Throttled),
    (403, "dailyLimitExceeded", Throttled),
    (429, "rateLimitExceeded", Throttled),
    (500, "backendError", TargetUnavailable),
    (503, "backendError", TargetUnavailable),
])
def test_error_mapping(status: int, reason: str, expected: type) -> None:
    assert type(google_error(_http_error(status, reason), "gmail.send")) is expected
    assert type(google_error(TimeoutError("timed out"), "gmail.send")) is TargetUnavailable


def test_describe_and_args() -> None:
    args = GmailSend.validate_args(ARGS, "steps[0].args")
    assert args["cc"] == ["carol@example.com"]
    assert GmailSend.describe(args) == "'Q3 report' to bob@example.com (+1 cc)"


# -- headers and addresses are checked when the plan is -------------------------------------

@pytest.mark.parametrize("brk", list("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"))
def test_a_subject_with_any_line_break_is_refused_at_plan_time(brk: str) -> None:
    assert len(f"a{brk}b".splitlines()) == 2  # each is a line break to str.splitlines()
    with pytest.raises(PlanError) as e:
        load_plan({"steps": step({**ARGS, "subject": f"Q3{brk}Bcc: eve@evil.example"})},
                  spec_registry())
    assert e.value.field == "steps[0].args.subject" and "line break" in e.value.message


@pytest.mark.parametrize(("address", "why"), [
    ('a"b@example.com', "not a mail address"),
    ('"a b"@example.com', "not one bare address"),
    ('"a..b"@example.com', "would be sent as 'a..b@example.com'"),
    ('"a@b"@example.com', "quoted local parts"),
    ('"ab"@example.com', "would be sent as 'ab@example.com'"),
    ("team:bob@example.com;", "not a mail address"),
    ("Bob<bob@example.com>", "not a mail address"),
    ("bob@example.com,eve@evil.example", "not a mail address"),
    ("bob(eve@evil.example)@example.com", "would be sent as 'bob@example.com'"),
    ("bob@bücher.example", "e.g. bob@xn--bcher-kva.example"),
    ("bøb@example.com", "not a mail address"),
    ("bob@[192.0.2.1]", "host name"),
    ("bob@-example.com", "host name"),
    ("bob@example.com\u2028", "not one bare address"),
])
def test_addresses_are_parsed_strictly_at_plan_time(address: str, why: str) -> None:
    for field in ("to", "cc"):
        with pytest.raises(PlanError) as e:
            load_plan({"steps": step({**ARGS, field: [address]})}, spec_registry())
        assert e.value.field == f"steps[0].args.{field}" and why in e.value.message


SENT_AS_WRITTEN = ["o'brien+q3@mail.example.com", "A.B-C@Example.COM",
                   "x_y@sub-1.xn--bcher-kva.example", "#!$%&*=?^`{|}~@example.org"]


def test_what_is_sent_is_what_the_plan_says(mail: StagingServer) -> None:
    args = load_plan({"steps": step({**ARGS, "to": SENT_AS_WRITTEN[:2],
                                     "cc": SENT_AS_WRITTEN[2:]})},
                     spec_registry()).steps[0].args
    a = action(mail)
    a.execute(staged(a, begun(a, args)))
    [stored] = [m for m in gmail(mail).messages() if "SENT" in m.label_ids]
    to = [parseaddr(part)[1] for part in stored.header("To").split(", ")]
    cc = [parseaddr(part)[1] for part in stored.header("Cc").split(", ")]
    assert (to, cc) == (SENT_AS_WRITTEN[:2], SENT_AS_WRITTEN[2:])
    assert stored.header("To") == ", ".join(SENT_AS_WRITTEN[:2])  # byte for byte, no encoding


# -- through run_step ----------------------------------------------------------------------

def test_run_step_happy_path_then_skip(mail: StagingServer, store: JournalStore) -> None:
    task = persist(store, SPECS, step())
    registry = Registry([action(mail)])
    result = run_step(store, registry, task, 1)
    assert result.status == "done" and result.resolved_by == "execute"
    assert sent_keys(mail) == [result.key]
    again = run_step(store, registry, task, 1)
    assert again.skipped and sent_keys(mail) == [result.key]


def test_run_step_dropped_response_resolves_by_probe(mail: StagingServer,
                                                     store: JournalStore) -> None:
    task = persist(store, SPECS, step())
    registry = Registry([action(mail)])
    arm(mail, "gmail", "drafts.send", "drop_after_commit")
    with pytest.raises(TargetUnavailable):
        run_step(store, registry, task, 1)
    result = run_step(store, registry, task, 1)
    assert result.resolved_by == "probe" and result.status == "done"
    [stored] = gmail(mail).messages()
    assert result.outcome["id"] == stored.id
    assert sent_keys(mail) == [result.key]  # exactly one message


def test_run_step_unknown_probe_stops_without_sending(mail: StagingServer,
                                                      store: JournalStore,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # No waiting out here (its budget is 0): the probe's failed read stands, as one does once
    # the budget is spent (tests/test_provider_moments.py).
    monkeypatch.setenv(ENV_READ_RETRY, "0")
    task = persist(store, SPECS, step())
    registry = Registry([action(mail)])
    arm(mail, "gmail", "drafts.send", "fail_before_commit")
    with pytest.raises(TargetUnavailable):
        run_step(store, registry, task, 1)  # intent open, nothing sent
    arm(mail, "gmail", "messages.list", "fail_before_commit")
    with pytest.raises(NeedsDecision):
        run_step(store, registry, task, 1)
    assert sent_keys(mail) == []
    assert store.step_row(task, 1).outcome is None  # still in doubt, for a person


def test_run_step_revoked_token_then_restored(mail: StagingServer, store: JournalStore) -> None:
    task = persist(store, SPECS, step())
    revoke(mail, COMPOSE_TOKEN)
    with pytest.raises(Unauthorized):
        run_step(store, Registry([action(mail)]), task, 1)
    assert sent_keys(mail) == []
    add_token(mail, "restored", "gmail", [COMPOSE_SCOPE])
    result = run_step(store, Registry([action(mail, send_token="restored")]), task, 1)
    assert result.resolved_by == "execute"  # the probe found nothing, so it sent once
    assert sent_keys(mail) == [result.key]


# -- history kept for hours, not a week --------------------------------------------------------

def expire_history_after(mail: StagingServer, seconds: float) -> None:
    post(mail, "/_staging/switches", {"target": "gmail", "name": "history_kept_s",
                                      "value": seconds})


def test_a_sent_mail_whose_history_expired_is_found_in_sent_not_left_unknown(
        mail: StagingServer, store: JournalStore) -> None:
    # The answer to the send is lost, and by the resume Gmail no longer keeps the history since
    # the snapshot (history.list answers 404; "in some rare circumstances" a historyId is valid
    # "only a few hours"): the probe searches SENT and finds the mail it sent.
    expire_history_after(mail, 1)
    task = persist(store, SPECS, step())
    registry = Registry([action(mail)])
    arm(mail, "gmail", "drafts.send", "drop_after_commit")
    with pytest.raises(TargetUnavailable):
        run_step(store, registry, task, 1)
    time.sleep(1.2)  # the send's history records are older than Gmail keeps them
    resumed = run_step(store, registry, task, 1)
    assert (resumed.status, resumed.resolved_by) == ("done", "probe")
    assert resumed.outcome["found_by"] == "sent search"
    assert sent_keys(mail) == [resumed.key]


def test_expired_history_with_our_draft_unsent_is_absent_and_with_it_gone_unknown(
        mail: StagingServer) -> None:
    expire_history_after(mail, 1)
    a = action(mail)
    ctx = begun(a)
    send(a, {**ARGS, "subject": "someone else's mail since"})  # a change after the snapshot
    ctx = staged(a, ctx)
    time.sleep(1.2)
    with patient_reads(0):
        assert a.probe(ctx).status is ProbeStatus.ABSENT  # the draft is there: never sent
        a.writer.users().drafts().delete(userId="me", id=ctx.staged["draft_id"]).execute()
        probed = a.probe(ctx)  # the draft gone and no sent copy: a person decides
    assert probed.status is ProbeStatus.UNKNOWN and "no longer kept" in probed.reason
