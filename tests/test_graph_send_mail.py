"""``graph.send_mail`` through msgraph-sdk against the Graph staging server.

Directly, then through run_step and a real Postgres journal."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import pytest
from kiota_abstractions.api_error import APIError
from msgraph.generated.models.message import Message
from msgraph.generated.models.single_value_legacy_extended_property import (
    SingleValueLegacyExtendedProperty,
)

from activities.catalog import spec_registry
from activities.graph import GraphSendMail, graph_error
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
from probes.graph import (
    BLOCKING,
    KEY_PROPERTY_ID,
    Copy,
    GraphSendMailProbe,
    StaticTokenProvider,
    blocking,
    graph_client,
    message_flags,
)
from staging.core import StagingServer
from staging.graph import READ_TOKEN, SEND_TOKEN, GraphTarget
from tidemark.actions import ProbeStatus, Registry, StepContext
from tidemark.errors import (
    NeedsDecision,
    NotSent,
    PlanError,
    Refused,
    TargetUnavailable,
    Throttled,
    Unauthorized,
)
from tidemark.plan import load_plan
from tidemark.reads import ENV_READ_RETRY
from tidemark.run_step import run_step
from tidemark.store import JournalStore

ARGS = {"to": "bob@example.com", "cc": ["carol@example.com", "dan@example.com"],
        "subject": "Invoice 42", "body": "Please find the details below."}
SPECS = Registry([GraphSendMail])
HOLD = 60  # seconds a message waits in the Outbox when a test wants to see it queued


def action(server: StagingServer, *, send_token: str = SEND_TOKEN,
           read_token: str = READ_TOKEN, timeout: float = CLIENT_TIMEOUT_S) -> GraphSendMail:
    return GraphSendMail(writer=graph_client(server.url, send_token, timeout=timeout),
                         reader=graph_client(server.url, read_token, timeout=CLIENT_TIMEOUT_S))


def graph(server: StagingServer) -> GraphTarget:
    return target_of(server.staging, GraphTarget)


def keys_sent(server: StagingServer) -> list[str | None]:
    """The key of every draft the server sent, in order."""
    return [e["key"] for e in effects(server, "graph", "message.send")]


def hold_in_outbox(server: StagingServer, seconds: float = HOLD) -> None:
    post(server, "/_staging/graph/settings", {"send_delay": seconds})


def step(args: dict[str, Any] = ARGS) -> list[dict[str, Any]]:
    return [{"action": "graph.send_mail", "args": args}]


# -- the action on its own -------------------------------------------------------------------

def staged(a: GraphSendMail, args: dict[str, Any] = ARGS, **kw: Any) -> StepContext:
    """The context of a step whose draft was created and journaled, as run_step builds it."""
    ctx = step_context("graph.send_mail", args, before_state={"fence": "draft"}, **kw)
    return replace(ctx, staged=a.stage(ctx))


def test_stage_creates_a_draft_stamped_with_the_key(mail: StagingServer) -> None:
    a = action(mail)
    ctx = staged(a)
    [draft] = graph(mail).messages_in("drafts")
    assert ctx.staged == {"id": draft.id,
                          "internetMessageId": draft.fields["internetMessageId"]}
    assert draft.fields["isDraft"] is True
    assert draft.headers == [{"name": "x-tidemark-key", "value": ctx.key}]
    assert draft.properties == [{"id": KEY_PROPERTY_ID, "value": ctx.key}]
    assert [r["emailAddress"]["address"] for r in draft.fields["toRecipients"]] == [
        "bob@example.com"]
    assert len(draft.fields["ccRecipients"]) == 2
    assert draft.fields["body"] == {"contentType": "text", "content": ARGS["body"]}
    assert keys_sent(mail) == []  # a draft is not a mail


def test_execute_sends_exactly_the_staged_draft(mail: StagingServer) -> None:
    hold_in_outbox(mail)
    a = action(mail)
    ctx = staged(a)
    outcome = a.execute(ctx)
    assert outcome["state"] == "submitted" and outcome["folder"] == "outbox"
    assert outcome["internetMessageId"] == ctx.staged["internetMessageId"]
    assert graph(mail).messages_in("drafts") == []
    [queued] = graph(mail).messages_in("outbox")
    assert queued.id != ctx.staged["id"]  # it left Drafts under a new id
    assert keys_sent(mail) == [ctx.key]


def test_probe_tells_submitted_from_sent_across_the_id_change(mail: StagingServer) -> None:
    hold_in_outbox(mail)
    a = action(mail)
    ctx = staged(a)
    assert a.probe(ctx).status is ProbeStatus.ABSENT
    a.execute(ctx)
    queued = a.probe(ctx)
    assert queued.status is ProbeStatus.DONE
    assert queued.observed["state"] == "submitted" and queued.observed["folder"] == "outbox"
    post(mail, "/_staging/graph/deliver")
    sent = a.probe(ctx)
    assert sent.observed["state"] == "sent" and sent.observed["folder"] == "sentitems"
    assert sent.observed["id"] != queued.observed["id"]
    assert sent.observed["internetMessageId"] == queued.observed["internetMessageId"]


def test_probe_moves_from_submitted_to_sent_after_the_delay(mail: StagingServer) -> None:
    hold_in_outbox(mail, 0.3)
    a = action(mail)
    ctx = staged(a)
    a.execute(ctx)
    assert_eventually(lambda: a.probe(ctx).observed.get("state") == "sent", timeout=5)


def test_probe_ignores_messages_with_other_keys(mail: StagingServer) -> None:
    hold_in_outbox(mail)
    a = action(mail)
    a.execute(staged(a, {**ARGS, "subject": "other"}))
    post(mail, "/_staging/graph/deliver")
    a.execute(staged(a, {**ARGS, "subject": "other 2"}))
    ctx = step_context("graph.send_mail", ARGS, before_state={"fence": "draft"})
    assert a.probe(ctx).status is ProbeStatus.ABSENT
    assert a.probe(replace(ctx, before_state=None)).status is ProbeStatus.ABSENT


@pytest.mark.parametrize("failing_read", [1, 2])
def test_probe_is_unknown_when_the_mailbox_cannot_be_read(mail: StagingServer,
                                                          failing_read: int) -> None:
    # The n-th message listing fails (the whole mailbox, then Recoverable Items): faults are
    # taken in the order armed, so n-1 no-op delays let the earlier reads through.
    a = action(mail)
    ctx = staged(a)
    if failing_read > 1:
        arm(mail, "graph", "messages.list", "delay", seconds=0, times=failing_read - 1)
    arm(mail, "graph", "messages.list", "fail_before_commit")
    probed = a.probe(ctx)
    assert probed.status is ProbeStatus.UNKNOWN and "cannot read the mailbox" in probed.reason


def test_dropped_response_is_target_unavailable_and_submits_once(mail: StagingServer) -> None:
    hold_in_outbox(mail)
    a = action(mail)
    ctx = staged(a)
    arm(mail, "graph", "message.send", "drop_after_commit")
    with pytest.raises(TargetUnavailable):
        a.execute(ctx)
    assert keys_sent(mail) == [ctx.key]
    assert a.probe(ctx).observed["state"] == "submitted"


def test_a_send_that_times_out_is_watched_until_it_lands(mail: StagingServer) -> None:
    ctx = staged(action(mail))
    a = action(mail, timeout=0.3)
    arm(mail, "graph", "message.send", "delay", seconds=1.0)
    assert a.execute(ctx)["internetMessageId"] == ctx.staged["internetMessageId"]
    assert a.probe(ctx).status is ProbeStatus.DONE
    assert keys_sent(mail) == [ctx.key]


def test_revoked_or_wrong_scope_token_is_unauthorized(mail: StagingServer) -> None:
    with pytest.raises(Unauthorized):
        staged(action(mail, send_token=READ_TOKEN))
    a = action(mail)
    ctx = staged(a)
    revoke(mail, SEND_TOKEN)
    with pytest.raises(Unauthorized) as e:
        a.execute(ctx)
    assert SEND_TOKEN not in str(e.value)
    assert keys_sent(mail) == []


def test_token_is_only_handed_out_for_the_configured_host() -> None:
    provider = StaticTokenProvider("secret", ["127.0.0.1"])
    assert asyncio.run(provider.get_authorization_token("http://127.0.0.1:8/v1.0/me")) == "secret"
    assert asyncio.run(provider.get_authorization_token("https://evil.example/v1.0/me")) == ""


def test_works_from_threads_and_inside_a_running_event_loop(mail: StagingServer) -> None:
    a = action(mail)
    contexts = [staged(a, {**ARGS, "subject": f"s{i}"}) for i in range(4)]
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(a.execute, contexts))
    assert all(o["state"] in ("submitted", "sent") for o in outs)

    async def caller_with_its_own_loop() -> str:
        ctx = staged(a, {**ARGS, "subject": "in a loop"})
        a.execute(ctx)  # blocking on purpose, as a sync activity would in a loop's thread
        return ctx.key

    result: list[str] = []
    t = threading.Thread(target=lambda: result.append(asyncio.run(caller_with_its_own_loop())))
    t.start()
    t.join(timeout=10)
    assert sorted(keys_sent(mail)) == sorted([c.key for c in contexts] + result)


def _api_error(status: int) -> APIError:
    e = APIError(f"status {status}")
    e.response_status_code = status
    return e


@pytest.mark.parametrize(("status", "expected"), [
    (400, Refused), (404, Refused), (401, Unauthorized), (403, Unauthorized),
    (429, Throttled), (500, TargetUnavailable), (503, TargetUnavailable),
    (504, TargetUnavailable),
])
def test_error_mapping(status: int, expected: type) -> None:
    assert type(graph_error(_api_error(status), "graph.send_mail")) is expected
    assert type(graph_error(TimeoutError(), "graph.send_mail")) is TargetUnavailable


def test_describe_and_args() -> None:
    args = GraphSendMail.validate_args(ARGS, "steps[0].args")
    assert args["to"] == ["bob@example.com"]
    assert GraphSendMail.describe(args) == "'Invoice 42' to bob@example.com (+2 cc)"


def test_what_is_sent_is_what_the_plan_says(mail: StagingServer) -> None:
    sent_as_written = ["o'brien+q3@mail.example.com", "A.B-C@Example.COM",
                       "x_y@sub-1.xn--bcher-kva.example"]
    args = load_plan({"steps": step({**ARGS, "to": sent_as_written[:1],
                                     "cc": sent_as_written[1:],
                                     "subject": "Q3 \u00fcbersicht \t(tab kept)"})},
                     spec_registry()).steps[0].args
    hold_in_outbox(mail)
    a = action(mail)
    a.execute(staged(a, args))
    [queued] = graph(mail).messages_in("outbox")
    assert [r["emailAddress"]["address"] for r in queued.fields["toRecipients"]
            + queued.fields["ccRecipients"]] == sent_as_written
    assert queued.fields["subject"] == args["subject"]


@pytest.mark.parametrize("subject", ["Q3\u2028Bcc: eve@evil.example", "Q3\x85x", "Q3\x0bx"])
def test_a_subject_with_a_unicode_line_break_is_refused_at_plan_time(subject: str) -> None:
    with pytest.raises(PlanError, match="line break"):
        load_plan({"steps": step({**ARGS, "subject": subject})}, spec_registry())


# -- through run_step ----------------------------------------------------------------------

def test_run_step_happy_path_then_skip(mail: StagingServer, store: JournalStore) -> None:
    task = persist(store, SPECS, step())
    registry = Registry([action(mail)])
    result = run_step(store, registry, task, 1)
    assert result.resolved_by == "execute" and result.outcome["state"] == "submitted"
    row = store.step_row(task, 1)
    assert row.before_state == {"fence": "draft"}
    assert row.staged is not None and result.outcome["draft"] == row.staged
    assert keys_sent(mail) == [result.key]
    assert run_step(store, registry, task, 1).skipped
    assert keys_sent(mail) == [result.key]


def test_run_step_dropped_response_while_queued_resolves_submitted_then_sent(
        mail: StagingServer, store: JournalStore) -> None:
    hold_in_outbox(mail)
    task = persist(store, SPECS, step())
    registry = Registry([action(mail)])
    arm(mail, "graph", "message.send", "drop_after_commit")
    with pytest.raises(TargetUnavailable):
        run_step(store, registry, task, 1)
    result = run_step(store, registry, task, 1)
    assert result.resolved_by == "probe"
    assert result.outcome["state"] == "submitted" and result.outcome["folder"] == "outbox"
    assert keys_sent(mail) == [result.key]  # no second send
    post(mail, "/_staging/graph/deliver")
    args = GraphSendMail.validate_args(ARGS, "args")  # the plan stores normalised args
    ctx = replace(step_context("graph.send_mail", args, task_id=task),
                  staged=store.step_row(task, 1).staged, before_state={"fence": "draft"})
    assert action(mail).probe(ctx).observed["state"] == "sent"
    assert keys_sent(mail) == [result.key]


def test_a_throttled_send_is_not_sent_so_its_mark_is_taken_back(mail: StagingServer) -> None:
    """A throttled send was not sent, so its mark is taken back.

    Graph's 429 means "the requests fail" (Microsoft Graph throttling guidance): nothing of the
    send reached the mailbox, so the step's mark is taken back (NotSent) and the draft may be
    sent again; a 503 may follow a send that went out, and stays in doubt as it was."""
    a = action(mail)
    failed = blocking(a._send_failed(BLOCKING, "draft-1", _api_error(429)))
    assert isinstance(failed, NotSent)  # Throttled: turned away, nothing applied
    assert type(blocking(a._send_failed(BLOCKING, "draft-1", _api_error(503)))) \
        is TargetUnavailable


def test_run_step_crash_after_stage_sends_the_journaled_draft(
        mail: StagingServer, store: JournalStore) -> None:
    """After a crash past ``stage``, run_step sends the journaled draft.

    A draft is created and journaled, then the attempt dies before sending. The next attempt
    finds it in Drafts (absent) and sends that draft, not a new one."""
    task = persist(store, SPECS, step())
    registry = Registry([action(mail)])
    # The fence's read of the draft fails: the attempt ends before its send (once a send was
    # requested, the draft is never sent again without a person: tests/test_graph_late.py).
    arm(mail, "graph", "messages.get", "fail_before_commit")
    with pytest.raises(TargetUnavailable):
        run_step(store, registry, task, 1)
    staged_row = store.step_row(task, 1).staged
    result = run_step(store, registry, task, 1)
    assert result.resolved_by == "execute"
    assert [e["detail"]["draft"] for e in effects(mail, "graph", "message.send")] == [
        staged_row["id"]]
    assert [e["key"] for e in effects(mail, "graph", "messages.create")] == [result.key]


def test_run_step_unknown_probe_stops_without_sending(mail: StagingServer,
                                                      store: JournalStore,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # No waiting out here (its budget is 0): the probe's failed read stands, as one does once
    # the budget is spent (tests/test_provider_moments.py).
    monkeypatch.setenv(ENV_READ_RETRY, "0")
    task = persist(store, SPECS, step())
    registry = Registry([action(mail)])
    arm(mail, "graph", "messages.get", "fail_before_commit")  # the fence's read, before a send
    with pytest.raises(TargetUnavailable):
        run_step(store, registry, task, 1)  # intent open, nothing sent
    arm(mail, "graph", "messages.list", "fail_before_commit")
    with pytest.raises(NeedsDecision):
        run_step(store, registry, task, 1)
    assert keys_sent(mail) == []
    assert store.step_row(task, 1).outcome is None
    # Once the mailbox can be read again, resuming finds the draft unsent and sends it once.
    result = run_step(store, registry, task, 1)
    assert result.resolved_by == "execute" and keys_sent(mail) == [result.key]


def test_run_step_revoked_token_then_restored(mail: StagingServer, store: JournalStore) -> None:
    task = persist(store, SPECS, step())
    revoke(mail, SEND_TOKEN)
    with pytest.raises(Unauthorized):
        run_step(store, Registry([action(mail)]), task, 1)
    add_token(mail, "restored", "graph", ["Mail.Send", "Mail.ReadWrite", "User.Read"])
    result = run_step(store, Registry([action(mail, send_token="restored")]), task, 1)
    assert result.resolved_by == "execute" and keys_sent(mail) == [result.key]


# -- a sent copy moved to Deleted Items ----------------------------------------------------

def move_to_deleted_items(server: StagingServer, message_id: str) -> str:
    """Moves a message as a person would; returns its new id."""
    return str(post(server, f"/_staging/graph/messages/{message_id}/move",
                    {"folder": "deleteditems"})["id"])


def test_probe_finds_a_sent_message_moved_to_deleted_items(mail: StagingServer) -> None:
    hold_in_outbox(mail)
    a = action(mail)
    ctx = staged(a)
    a.execute(ctx)
    post(mail, "/_staging/graph/deliver")
    sent = a.probe(ctx).observed
    moved_id = move_to_deleted_items(mail, sent["id"])
    assert graph(mail).messages_in("sentitems") == []
    probed = a.probe(ctx)
    assert probed.status is ProbeStatus.DONE
    assert probed.observed["state"] == "sent" and probed.observed["folder"] == "deleteditems"
    assert probed.observed["id"] == moved_id != sent["id"]
    assert probed.observed["internetMessageId"] == sent["internetMessageId"]


def test_run_step_dropped_response_then_moved_to_deleted_items_sends_once(
        mail: StagingServer, store: JournalStore) -> None:
    hold_in_outbox(mail)
    task = persist(store, SPECS, step())
    registry = Registry([action(mail)])
    arm(mail, "graph", "message.send", "drop_after_commit")
    with pytest.raises(TargetUnavailable):
        run_step(store, registry, task, 1)
    post(mail, "/_staging/graph/deliver")
    [sent] = graph(mail).messages_in("sentitems")
    move_to_deleted_items(mail, sent.id)
    result = run_step(store, registry, task, 1)
    assert result.resolved_by == "probe"
    assert result.outcome["state"] == "sent" and result.outcome["folder"] == "deleteditems"
    assert keys_sent(mail) == [result.key]  # exactly one send


# -- PR_MESSAGE_FLAGS as Graph returns it ------------------------------------------------------

def test_message_flags_are_read_whatever_the_id_spelling_and_absent_flags_are_none() -> None:
    def message(*props: tuple[str, str]) -> Message:
        return Message(single_value_extended_properties=[
            SingleValueLegacyExtendedProperty(id=i, value=v) for i, v in props])
    assert message_flags(message(("Integer 0xe07", "13"))) == 13
    assert message_flags(message(("integer 0x0E07", "9"), (KEY_PROPERTY_ID, "k"))) == 9
    assert message_flags(message((KEY_PROPERTY_ID, "k"))) is None
    assert message_flags(message(("Integer 0x0E08", "4"))) is None  # another property
    assert message_flags(message(("Integer 0x0E07", "soon"))) is None


def test_our_draft_whose_flags_do_not_come_back_is_unknown_not_absent() -> None:
    """Without PR_MESSAGE_FLAGS a sent draft waiting in Drafts looks like a plain one."""
    probe = GraphSendMailProbe(reader=None)  # type: ignore[arg-type]  # reads nothing here
    draft = Copy(id="d1", folder_id="drafts-id", is_draft=True, internet_message_id="<m1>",
                 sender=None, flags=None)
    names = {"drafts": "drafts-id", "outbox": "outbox-id"}
    ctx = replace(step_context("graph.send_mail", step()[0]["args"]),
                  staged={"id": "d1", "internetMessageId": "<m1>"})
    def probed(ours: Copy) -> ProbeStatus:
        return blocking(probe._probe_draft(BLOCKING, ctx, [ours], [], names)).status
    assert probed(draft) is ProbeStatus.UNKNOWN
    assert probed(replace(draft, flags=0x1 | 0x8)) is ProbeStatus.ABSENT
