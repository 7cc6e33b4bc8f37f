"""The Microsoft Graph v1.0 mail staging server, driven by msgraph-sdk over HTTP."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from kiota_abstractions.authentication import BaseBearerTokenAuthenticationProvider
from kiota_abstractions.base_request_configuration import RequestConfiguration
from msgraph import GraphRequestAdapter, GraphServiceClient
from msgraph.generated.models.mail_folder import MailFolder
from msgraph.generated.models.o_data_errors.o_data_error import ODataError
from msgraph.generated.users.item.mail_folders.item.messages.messages_request_builder import (
    MessagesRequestBuilder,
)
from msgraph.generated.users.item.messages.item.move.move_post_request_body import (
    MovePostRequestBody,
)
from msgraph.generated.users.item.messages.messages_request_builder import (
    MessagesRequestBuilder as AllMessagesRequestBuilder,
)

from activities.graph import build_message, build_request
from helpers.staging_fixtures import CLIENT_TIMEOUT_S, add_token, arm, effects, get, post, revoke
from helpers.wait import assert_eventually
from probes.graph import KEY_PROPERTY_ID, GraphClient, StaticTokenProvider, graph_client
from staging.core import StagingServer
from staging.graph import MAILBOX, READ_TOKEN, SEND_TOKEN

OTHER_PROPERTY = "String {00020386-0000-0000-c000-000000000046} Name x-other"

Query = MessagesRequestBuilder.MessagesRequestBuilderGetQueryParameters
AllQuery = AllMessagesRequestBuilder.MessagesRequestBuilderGetQueryParameters


def writer(server: StagingServer, token: str = SEND_TOKEN) -> GraphClient:
    return graph_client(server.url, token, timeout=CLIENT_TIMEOUT_S)


def reader(server: StagingServer, token: str = READ_TOKEN) -> GraphClient:
    return graph_client(server.url, token, timeout=CLIENT_TIMEOUT_S)


def send(server: StagingServer, key: str, subject: str = "Hello", token: str = SEND_TOKEN,
         **args: Any) -> None:
    body = build_request({"to": ["bob@example.com"], "subject": subject, "body": "hi", **args},
                         key)
    assert writer(server, token).call(lambda g: g.me.send_mail.post(body)) is None  # 202


def folder(server: StagingServer, name: str, token: str = READ_TOKEN, **query: Any) -> Any:
    config = RequestConfiguration(query_parameters=Query(**query))
    return reader(server, token).call(
        lambda g: g.me.mail_folders.by_mail_folder_id(name).messages.get(
            request_configuration=config))


def by_key(key: str) -> str:
    return f"singleValueExtendedProperties/any(ep: ep/id eq '{KEY_PROPERTY_ID}' and " \
           f"ep/value eq '{key}')"


def raw_send(server: StagingServer, body: dict[str, Any]) -> tuple[int, dict[str, Any] | None]:
    req = urllib.request.Request(
        server.url + "/v1.0/me/sendMail", data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Bearer {SEND_TOKEN}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, None
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_send_mail_is_accepted_queued_then_moved_under_a_new_id(mail: StagingServer) -> None:
    post(mail, "/_staging/graph/settings", {"send_delay": 60})
    send(mail, "k1")
    [queued] = folder(mail, "outbox").value
    assert folder(mail, "sentitems").value == []
    assert post(mail, "/_staging/graph/deliver") == {"delivered": 1}
    assert folder(mail, "outbox").value == []
    [sent] = folder(mail, "sentitems").value
    assert sent.id != queued.id and sent.subject == "Hello"
    assert sent.internet_message_id == queued.internet_message_id
    with pytest.raises(ODataError) as e:  # the old id is gone, as on Exchange
        reader(mail).call(lambda g: g.me.messages.by_message_id(queued.id).get())
    assert e.value.response_status_code == 404 and e.value.error.code == "ErrorItemNotFound"
    moved = reader(mail).call(lambda g: g.me.messages.by_message_id(sent.id).get())
    assert moved.id == sent.id
    [effect] = effects(mail, "graph", "sendMail")
    assert effect["key"] == "k1" and effect["detail"]["folder"] == "outbox"


def test_send_delay_moves_the_message_by_itself(mail: StagingServer) -> None:
    post(mail, "/_staging/graph/settings", {"send_delay": 0.2})
    send(mail, "k2")
    assert_eventually(lambda: len(folder(mail, "sentitems").value) == 1, timeout=5)
    assert folder(mail, "outbox").value == []


def test_queue_folder_drafts(mail: StagingServer) -> None:
    post(mail, "/_staging/graph/settings", {"send_delay": 60, "queue_folder": "drafts"})
    send(mail, "k3")
    [draft] = folder(mail, "drafts").value
    assert draft.is_draft is True and folder(mail, "outbox").value == []


def test_lower_case_keys_and_save_to_sent_items_false(mail: StagingServer) -> None:
    post(mail, "/_staging/graph/settings", {"send_delay": 60})
    status, _ = raw_send(mail, {"message": {
        "subject": "no copy", "body": {"contentType": "Text", "content": "x"},
        "toRecipients": [{"emailAddress": {"address": "bob@example.com"}}]},
        "saveToSentItems": False})
    assert status == 202
    assert [m.subject for m in folder(mail, "outbox").value] == ["no copy"]
    post(mail, "/_staging/graph/deliver")
    assert folder(mail, "outbox").value == [] and folder(mail, "sentitems").value == []


def test_filter_expand_select_find_only_the_keyed_message(mail: StagingServer) -> None:
    post(mail, "/_staging/graph/settings", {"send_delay": 60})
    send(mail, "mine", subject="mine")
    send(mail, "theirs", subject="theirs")
    page = folder(mail, "outbox", filter=by_key("mine"),
                  expand=[f"singleValueExtendedProperties($filter=id eq '{KEY_PROPERTY_ID}')"],
                  select=["id", "subject", "internetMessageHeaders"])
    [m] = page.value
    assert m.subject == "mine" and m.body is None  # $select left the body out
    assert [(p.id, p.value) for p in m.single_value_extended_properties] == [
        (KEY_PROPERTY_ID, "mine")]
    assert [(h.name, h.value) for h in m.internet_message_headers] == [
        ("x-tidemark-key", "mine")]
    # The property id is compared as Exchange does: the GUID's case does not matter.
    assert len(folder(mail, "outbox", filter=by_key("mine").replace(
        KEY_PROPERTY_ID, KEY_PROPERTY_ID.upper().replace("STRING", "String").replace(
            "NAME TIDEMARK_KEY", "Name tidemark_key"))).value) == 1
    # An $expand for another property leaves the collection out entirely.
    [m] = folder(mail, "outbox", filter=by_key("mine"),
                 expand=[f"singleValueExtendedProperties($filter=id eq '{OTHER_PROPERTY}')"]).value
    assert m.single_value_extended_properties is None


def test_sent_items_copy_has_no_internet_headers_but_keeps_the_property(
        mail: StagingServer) -> None:
    post(mail, "/_staging/graph/settings", {"send_delay": 60})
    send(mail, "k4")
    post(mail, "/_staging/graph/deliver")
    [m] = folder(mail, "sentitems", filter=by_key("k4"), expand=["singleValueExtendedProperties"],
                 select=["id", "internetMessageHeaders"]).value
    assert m.internet_message_headers is None
    assert [p.value for p in m.single_value_extended_properties] == ["k4"]


def test_top_and_next_link(mail: StagingServer) -> None:
    post(mail, "/_staging/graph/settings", {"send_delay": 60})
    for i in range(3):
        send(mail, f"p{i}", subject=f"m{i}")
    first = folder(mail, "outbox", top=2)
    assert [m.subject for m in first.value] == ["m2", "m1"] and first.odata_next_link
    rest = reader(mail).call(lambda g: g.me.mail_folders.by_mail_folder_id("outbox").messages
                             .with_url(first.odata_next_link).get())
    assert [m.subject for m in rest.value] == ["m0"] and rest.odata_next_link is None


@pytest.mark.parametrize(("message", "code"), [
    ({"internetMessageHeaders": [{"name": "Precedence", "value": "bulk"}]},
     "InvalidInternetMessageHeader"),
    ({"internetMessageHeaders": [{"name": f"x-h{i}", "value": "v"} for i in range(6)]},
     "InvalidInternetMessageHeaderCollection"),
    ({"toRecipients": []}, "ErrorInvalidRecipients"),
    ({"toRecipients": [{"emailAddress": {"address": "not-an-address"}}]},
     "ErrorInvalidRecipients"),
    ({"singleValueExtendedProperties": [{"id": "String tidemark_key", "value": "k"}]},
     "ErrorInvalidProperty"),
])
def test_bad_messages_are_refused_with_graphs_codes(mail: StagingServer, message: dict,
                                                    code: str) -> None:
    base = {"subject": "s", "toRecipients": [{"emailAddress": {"address": "bob@example.com"}}]}
    status, body = raw_send(mail, {"Message": {**base, **message}})
    assert status == 400 and body is not None and body["error"]["code"] == code
    assert set(body["error"]) == {"code", "message", "innerError"}
    assert effects(mail, "graph", "sendMail") == []


def test_unsupported_filter_is_a_clear_400(mail: StagingServer) -> None:
    with pytest.raises(ODataError) as e:
        folder(mail, "outbox", filter="subject eq 'x'")
    assert e.value.response_status_code == 400
    assert e.value.error.code == "ErrorInvalidUrlQueryFilter"
    with pytest.raises(ODataError) as e:
        folder(mail, "nosuchfolder")
    assert e.value.response_status_code == 400


def test_scopes_and_revocation_in_graphs_error_shape(mail: StagingServer) -> None:
    with pytest.raises(ODataError) as e:
        send(mail, "k5", token=READ_TOKEN)
    assert e.value.response_status_code == 403 and e.value.error.code == "ErrorAccessDenied"
    add_token(mail, "send-only", "graph", ["Mail.Send"])
    with pytest.raises(ODataError) as e:
        folder(mail, "outbox", token="send-only")
    assert e.value.response_status_code == 403
    revoke(mail, SEND_TOKEN)
    with pytest.raises(ODataError) as e:
        send(mail, "k5")
    assert e.value.response_status_code == 401
    assert e.value.error.code == "InvalidAuthenticationToken"
    assert effects(mail, "graph", "sendMail") == []
    add_token(mail, "rw", "graph", ["Mail.ReadWrite"])
    assert folder(mail, "outbox", token="rw").value == []


def test_list_fault_answers_503(mail: StagingServer) -> None:
    arm(mail, "graph", "messages.list", "fail_before_commit")
    with pytest.raises(ODataError) as e:
        folder(mail, "outbox")
    assert e.value.response_status_code == 503
    assert folder(mail, "outbox").value == []


def test_send_reply_with_retry_after_and_the_sdks_default_retry(mail: StagingServer) -> None:
    """msgraph-sdk's default retry resends a sendMail answered 503 with Retry-After.

    This is the hazard graph_client guards against. msgraph-sdk's default middleware resends a
    sendMail that was answered 503 with Retry-After, after the service had queued it."""
    post(mail, "/_staging/graph/send_reply", {"status": 503, "retry_after": 1})

    async def default_client_send() -> None:
        adapter = GraphRequestAdapter(BaseBearerTokenAuthenticationProvider(
            StaticTokenProvider(SEND_TOKEN, ["127.0.0.1"])))
        adapter.base_url = mail.url + "/v1.0"
        body = build_request({"to": ["bob@example.com"], "subject": "s", "body": "b"}, "twice")
        await GraphServiceClient(request_adapter=adapter).me.send_mail.post(body)

    asyncio.run(default_client_send())
    assert [e["key"] for e in effects(mail, "graph", "sendMail")] == ["twice", "twice"]
    assert get(mail, "/_staging/faults") == []


# -- drafts, folders, moves, mailboxes ----------------------------------------------------------

def create_draft(server: StagingServer, key: str, token: str = SEND_TOKEN) -> Any:
    message = build_message({"to": ["bob@example.com"], "subject": "draft", "body": "b"}, key)
    return writer(server, token).call(lambda g: g.me.messages.post(message))


def send_draft(server: StagingServer, draft_id: str, token: str = SEND_TOKEN) -> None:
    writer(server, token).call(lambda g: g.me.messages.by_message_id(draft_id).send.post())


def everywhere(server: StagingServer, key: str, token: str = READ_TOKEN) -> list[Any]:
    config = RequestConfiguration(query_parameters=AllQuery(
        filter=by_key(key), select=["id", "parentFolderId", "isDraft", "internetMessageId"]))
    page = reader(server, token).call(lambda g: g.me.messages.get(request_configuration=config))
    return list(page.value)


def folder_id(server: StagingServer, name: str) -> str:
    return str(reader(server).call(lambda g: g.me.mail_folders.by_mail_folder_id(name).get()).id)


def test_a_draft_is_created_in_drafts_and_sent_once(mail: StagingServer) -> None:
    post(mail, "/_staging/graph/settings", {"send_delay": 60})
    draft = create_draft(mail, "d1")
    assert draft.is_draft is True and draft.internet_message_id
    assert draft.parent_folder_id == folder_id(mail, "drafts")
    assert [e["key"] for e in effects(mail, "graph", "messages.create")] == ["d1"]
    send_draft(mail, draft.id)  # 202, no body
    [queued] = everywhere(mail, "d1")
    assert queued.id != draft.id and queued.parent_folder_id == folder_id(mail, "outbox")
    assert queued.internet_message_id == draft.internet_message_id
    with pytest.raises(ODataError) as e:  # the draft is consumed: nothing left to send
        send_draft(mail, draft.id)
    assert e.value.response_status_code == 404 and e.value.error.code == "ErrorItemNotFound"
    with pytest.raises(ODataError) as e:  # and a message that is not a draft is not sendable
        send_draft(mail, queued.id)
    assert e.value.response_status_code == 404
    post(mail, "/_staging/graph/deliver")
    [sent] = everywhere(mail, "d1")
    assert sent.parent_folder_id == folder_id(mail, "sentitems") and sent.is_draft is False
    assert [e["detail"]["draft"] for e in effects(mail, "graph", "message.send")] == [draft.id]
    assert get(mail, "/_staging/graph/mailbox")["refused_sends"] == [draft.id, queued.id]


def test_creating_a_draft_needs_mail_readwrite(mail: StagingServer) -> None:
    add_token(mail, "send-only", "graph", ["Mail.Send"])
    with pytest.raises(ODataError) as e:
        create_draft(mail, "d2", token="send-only")
    assert e.value.response_status_code == 403
    draft = create_draft(mail, "d2")
    send_draft(mail, draft.id, token="send-only")  # sending one needs only Mail.Send


def test_stall_leaves_the_message_a_draft_in_drafts(mail: StagingServer) -> None:
    post(mail, "/_staging/graph/settings", {"stall": 2, "send_delay": 0})
    draft = create_draft(mail, "s1")
    send_draft(mail, draft.id)  # 202, yet it stays
    send(mail, "s2")  # sendMail's own draft stays too
    drafts = folder_id(mail, "drafts")
    assert {(m.id == draft.id, m.parent_folder_id, m.is_draft) for m in everywhere(mail, "s1")} \
        == {(True, drafts, True)}
    [stuck] = everywhere(mail, "s2")
    assert (stuck.parent_folder_id, stuck.is_draft) == (drafts, True)
    assert [e["detail"]["stalled"] for e in effects(mail, "graph", "message.send")] == [True]
    send_draft(mail, draft.id)  # the stall is used up: this one goes
    assert_eventually(lambda: everywhere(mail, "s1")[0].parent_folder_id
                      == folder_id(mail, "sentitems"), timeout=5)


def test_me_messages_spans_every_folder_but_recoverable_items(mail: StagingServer) -> None:
    post(mail, "/_staging/graph/settings", {"send_delay": 0})
    send(mail, "m1")
    post(mail, "/_staging/graph/deliver")
    [sent] = everywhere(mail, "m1")
    made = writer(mail).call(lambda g: g.me.mail_folders.post(MailFolder(display_name="Old")))
    body = MovePostRequestBody(destination_id=made.id)
    moved = writer(mail).call(lambda g: g.me.messages.by_message_id(sent.id).move.post(body))
    assert moved.id != sent.id and moved.parent_folder_id == made.id
    [found] = everywhere(mail, "m1")
    assert found.id == moved.id
    for destination in ("archive", "deleteditems"):
        body = MovePostRequestBody(destination_id=destination)
        moved = writer(mail).call(lambda g, b=body, i=found.id: g.me.messages.by_message_id(i)
                                  .move.post(b))
        [found] = everywhere(mail, "m1")
        assert found.parent_folder_id == folder_id(mail, destination)
    assert post(mail, "/_staging/graph/empty_deleted") == {"moved": 1}
    assert everywhere(mail, "m1") == []  # /me/messages does not list Recoverable Items
    [kept] = folder(mail, "recoverableitemsdeletions", filter=by_key("m1"),
                    expand=["singleValueExtendedProperties"]).value
    assert [p.value for p in kept.single_value_extended_properties] == ["m1"]


def test_a_rule_files_sent_copies_elsewhere(mail: StagingServer) -> None:
    post(mail, "/_staging/graph/folders", {"displayName": "Receipts"})
    post(mail, "/_staging/graph/settings", {"send_delay": 0, "sent_rule": "Receipts"})
    send(mail, "r1")
    post(mail, "/_staging/graph/deliver")
    assert folder(mail, "sentitems").value == []
    [m] = everywhere(mail, "r1")
    assert m.parent_folder_id != folder_id(mail, "sentitems") and m.is_draft is False


def test_mailboxes_and_me_follow_the_tokens_account(mail: StagingServer) -> None:
    post(mail, "/_staging/graph/mailboxes", {"account": "b", "address": "b@staging.example"})
    post(mail, "/_staging/tokens", {"token": "rb", "target": "graph", "account": "b",
                                    "scopes": ["Mail.Read", "User.Read"]})
    a = reader(mail).call(lambda g: g.me.get())
    b = reader(mail, "rb").call(lambda g: g.me.get())
    assert a.user_principal_name == MAILBOX and b.user_principal_name == "b@staging.example"
    assert a.id != b.id
    send(mail, "only-a")
    assert everywhere(mail, "only-a", token="rb") == []
    post(mail, "/_staging/tokens", {"token": "nobox", "target": "graph", "account": "c",
                                    "scopes": ["User.Read"]})
    with pytest.raises(ODataError) as e:
        reader(mail, "nobox").call(lambda g: g.me.get())
    assert e.value.error.code == "MailboxNotEnabledForRESTAPI"
    add_token(mail, "mail-only", "graph", ["Mail.Read"])
    with pytest.raises(ODataError) as e:
        reader(mail, "mail-only").call(lambda g: g.me.get())
    assert e.value.response_status_code == 403


def test_inbound_mail_carries_what_the_sender_chose(mail: StagingServer) -> None:
    post(mail, "/_staging/graph/inbound", {
        "from": MAILBOX, "singleValueExtendedProperties": [{"id": KEY_PROPERTY_ID,
                                                            "value": "forged"}]})
    [m] = everywhere(mail, "forged")
    assert m.parent_folder_id == folder_id(mail, "inbox") and m.is_draft is False


# -- the submission window: a sent draft stays in Drafts until transport takes it ---------------

FLAGS = "Integer 0x0E07"  # PR_MESSAGE_FLAGS


def flags_of(server: StagingServer, key: str) -> list[tuple[str, bool, str | None]]:
    """(folder id, isDraft, PR_MESSAGE_FLAGS) of every message with ``key``, via $expand."""
    config = RequestConfiguration(query_parameters=AllQuery(
        filter=by_key(key), select=["id", "parentFolderId", "isDraft"],
        expand=[f"singleValueExtendedProperties($filter=id eq '{KEY_PROPERTY_ID}' or "
                f"id eq '{FLAGS}')"]))
    page = reader(server).call(lambda g: g.me.messages.get(request_configuration=config))
    out = []
    for m in page.value:
        props = {p.id.lower(): p.value for p in m.single_value_extended_properties}
        assert props[KEY_PROPERTY_ID.lower()] == key  # the key comes back beside the flags
        out.append((m.parent_folder_id, m.is_draft, props.get("integer 0xe07")))
    return out


def switch(server: StagingServer, name: str, value: Any) -> None:
    post(server, "/_staging/switches", {"target": "graph", "name": name, "value": value})


def test_a_sent_draft_stays_in_drafts_flagged_submitted_then_moves(mail: StagingServer) -> None:
    switch(mail, "submitted_stays_in_drafts_s", 1.5)
    draft = create_draft(mail, "w1")
    drafts, sent = folder_id(mail, "drafts"), folder_id(mail, "sentitems")
    # A plain draft: read (0x1) and unsent (0x8), not submitted.
    assert flags_of(mail, "w1") == [(drafts, True, str(0x1 | 0x8))]
    send_draft(mail, draft.id)  # 202
    # The transport has not taken it: same id, still a draft in Drafts, mfSubmitted (0x4) set.
    assert [m.id for m in everywhere(mail, "w1")] == [draft.id]
    assert flags_of(mail, "w1") == [(drafts, True, str(0x1 | 0x4 | 0x8))]
    # The id is still a draft, yet it went once; a move of it waits for the transport.
    with pytest.raises(ODataError):
        writer(mail).call(lambda g: g.me.messages.by_message_id(draft.id).move.post(
            MovePostRequestBody(destination_id="archive")))
    assert_eventually(lambda: flags_of(mail, "w1") == [(sent, False, str(0x1))], timeout=5)
    [moved] = everywhere(mail, "w1")
    assert moved.id != draft.id and moved.internet_message_id == draft.internet_message_id
    assert len(effects(mail, "graph", "message.send")) == 1


def test_flags_are_computed_not_taken_from_the_sender(mail: StagingServer) -> None:
    post(mail, "/_staging/graph/inbound", {
        "from": "mallory@example.net", "folder": "drafts",
        "singleValueExtendedProperties": [{"id": KEY_PROPERTY_ID, "value": "f1"},
                                          {"id": FLAGS, "value": str(0x4 | 0x8)}]})
    [(_, is_draft, flags)] = flags_of(mail, "f1")
    assert is_draft is False and flags == "0"  # unread, not a draft, never submitted


def test_sendmail_in_the_window_waits_in_drafts_too(mail: StagingServer) -> None:
    switch(mail, "submitted_stays_in_drafts_s", 60)
    send(mail, "w2")
    assert flags_of(mail, "w2") == [(folder_id(mail, "drafts"), True, str(0x1 | 0x4 | 0x8))]
    post(mail, "/_staging/graph/deliver")
    assert flags_of(mail, "w2") == [(folder_id(mail, "sentitems"), False, str(0x1))]


@pytest.mark.parametrize("behaviour, copies", [("refused", 1), ("ignored", 1),
                                                ("sent_again", 2)])
def test_a_second_send_of_a_submitted_draft(mail: StagingServer, behaviour: str,
                                            copies: int) -> None:
    switch(mail, "submitted_stays_in_drafts_s", 60)
    switch(mail, "second_send", behaviour)
    draft = create_draft(mail, "w3")
    send_draft(mail, draft.id)
    if behaviour == "refused":
        with pytest.raises(ODataError) as e:
            send_draft(mail, draft.id)
        assert e.value.response_status_code == 400
        assert get(mail, "/_staging/graph/mailbox")["refused_sends"] == [draft.id]
    else:
        send_draft(mail, draft.id)  # 202 either way
    sends = effects(mail, "graph", "message.send")
    assert len(sends) == copies and [s["detail"]["again"] for s in sends] == [
        False, True][:copies]
    post(mail, "/_staging/graph/deliver")
    assert len(everywhere(mail, "w3")) == copies  # the one sent copy, or two


def test_window_switches_are_listed_with_their_documentation(mail: StagingServer) -> None:
    listed = {s["name"]: s for s in get(mail, "/_staging/switches") if s["target"] == "graph"}
    window, again = listed["submitted_stays_in_drafts_s"], listed["second_send"]
    assert window["default"] == 0 and window["worst"] > 10  # beyond the default confirm wait
    assert again["default"] == "refused" and again["worst"] == "sent_again"
    assert "outlook-things-to-know-about-send-mail" in window["doc"] or "Send mail" in \
        window["doc"]
    assert "#921" in again["doc"]
