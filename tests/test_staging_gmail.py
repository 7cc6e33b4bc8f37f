"""The Gmail v1 staging server, driven by google-api-python-client over HTTP."""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from email.message import EmailMessage

import google_auth_httplib2
import httplib2
import pytest
from google.oauth2.credentials import Credentials
from googleapiclient.discovery import Resource, build
from googleapiclient.errors import HttpError

from helpers.staging_fixtures import CLIENT_TIMEOUT_S, add_token, arm, effects, post, revoke
from probes.gmail import gmail_client
from staging.core import StagingServer, Token
from staging.gmail import (
    COMPOSE_SCOPE,
    COMPOSE_TOKEN,
    FULL_SCOPE,
    INSERT_SCOPE,
    MAILBOX,
    METADATA_SCOPE,
    METADATA_TOKEN,
    MODIFY_SCOPE,
    READ_TOKEN,
    READONLY_SCOPE,
    SEND_TOKEN,
)


def client(server: StagingServer, token: str) -> Resource:
    return gmail_client(server.url, token, timeout=CLIENT_TIMEOUT_S)


def raw_message(to: str = "bob@example.com", subject: str = "Hello", **headers: str) -> str:
    msg = EmailMessage()
    msg["To"] = to
    msg["Subject"] = subject
    for name, value in headers.items():
        msg[name.replace("_", "-")] = value
    msg.set_content(f"body of {subject}")
    return base64.urlsafe_b64encode(msg.as_bytes()).decode()


def send(server: StagingServer, **kw: str) -> dict:
    return client(server, SEND_TOKEN).users().messages().send(
        userId="me", body={"raw": raw_message(**kw)}).execute(num_retries=0)


def list_ids(server: StagingServer, token: str = READ_TOKEN, **params: object) -> list[str]:
    page = client(server, token).users().messages().list(userId="me", **params).execute()
    return [m["id"] for m in page.get("messages", [])]


def headers_of(server: StagingServer, mid: str, *names: str) -> dict[str, str]:
    msg = client(server, READ_TOKEN).users().messages().get(
        userId="me", id=mid, format="metadata", metadataHeaders=list(names)).execute()
    return {h["name"]: h["value"] for h in msg["payload"]["headers"]}


def error_of(e: HttpError) -> dict:
    return json.loads(e.content)["error"]


def test_send_replaces_message_id_and_keeps_x_headers(mail: StagingServer) -> None:
    sent = send(mail, Message_ID="<ours-1@tidemark.invalid>", X_Tidemark_Key="k" * 32)
    assert sent["labelIds"] == ["SENT"] and sent["threadId"] == sent["id"]
    assert len(sent["id"]) == 16 and int(sent["id"], 16)

    got = headers_of(mail, sent["id"], "Message-ID", "X-Tidemark-Key", "From")
    assert got["X-Tidemark-Key"] == "k" * 32
    assert got["Message-ID"] != "<ours-1@tidemark.invalid>"
    assert got["Message-ID"].endswith("@mail.gmail.com>")
    assert got["From"] == MAILBOX
    assert set(got) == {"Message-ID", "X-Tidemark-Key", "From"}  # metadataHeaders filters

    [effect] = effects(mail, "gmail", "messages.send")
    assert effect["key"] == "k" * 32 and effect["detail"]["id"] == sent["id"]


def test_search_by_rfc822msgid_finds_gmails_id_not_ours(mail: StagingServer) -> None:
    sent = send(mail, Message_ID="<ours-2@tidemark.invalid>")
    theirs = headers_of(mail, sent["id"], "Message-ID")["Message-ID"]
    assert list_ids(mail, q=f"rfc822msgid:{theirs}") == [sent["id"]]
    assert list_ids(mail, q=f"rfc822msgid:{theirs.strip('<>')}") == [sent["id"]]
    assert list_ids(mail, q="rfc822msgid:ours-2@tidemark.invalid") == []


def test_search_in_sent_after_epoch_and_combined_terms(mail: StagingServer) -> None:
    before = int(time.time()) - 1
    first = send(mail, subject="one")["id"]
    second = send(mail, subject="two")["id"]
    assert list_ids(mail, q=f"in:sent after:{before}") == [second, first]  # newest first
    assert list_ids(mail, q=f"in:sent after:{before + 3600}") == []
    assert list_ids(mail, q=f"in:sent before:{before}") == []
    assert list_ids(mail, q="in:inbox") == []
    assert list_ids(mail, labelIds=["SENT"]) == [second, first]


def test_mail_to_the_mailbox_itself_lands_in_inbox_too(mail: StagingServer) -> None:
    sent = send(mail, to=MAILBOX)
    assert set(sent["labelIds"]) == {"SENT", "INBOX", "UNREAD"}
    assert list_ids(mail, q="in:inbox") == [sent["id"]]


def test_paging_with_max_results_and_page_token(mail: StagingServer) -> None:
    ids = [send(mail, subject=f"m{i}")["id"] for i in range(5)]
    messages = client(mail, READ_TOKEN).users().messages()
    seen, token, pages = [], None, 0
    while True:
        page = messages.list(userId="me", q="in:sent", maxResults=2, pageToken=token).execute()
        pages += 1
        assert page["resultSizeEstimate"] == 5
        seen += [m["id"] for m in page["messages"]]
        token = page.get("nextPageToken")
        if not token:
            break
    assert pages == 3 and seen == list(reversed(ids))


def test_unsupported_search_term_is_a_clear_400(mail: StagingServer) -> None:
    with pytest.raises(HttpError) as e:
        list_ids(mail, q="from:bob@example.com")
    assert e.value.resp.status == 400 and "from:" in error_of(e.value)["message"]
    with pytest.raises(HttpError) as e:
        list_ids(mail, q="after:2026/11/30")
    assert e.value.resp.status == 400


def test_metadata_scope_cannot_use_q_even_with_readonly(mail: StagingServer) -> None:
    send(mail)
    add_token(mail, "both", "gmail", [METADATA_SCOPE, READONLY_SCOPE])
    for token in (METADATA_TOKEN, "both"):
        with pytest.raises(HttpError) as e:
            list_ids(mail, token, q="in:sent")
        err = error_of(e.value)
        assert e.value.resp.status == 403 and err["status"] == "PERMISSION_DENIED"
        assert err["message"] == "Metadata scope does not support 'q' parameter"
        assert err["errors"][0]["reason"] == "forbidden"
    # Without q, and with format=metadata, the metadata scope is enough.
    [mid] = list_ids(mail, METADATA_TOKEN)
    meta = client(mail, METADATA_TOKEN).users().messages().get(
        userId="me", id=mid, format="metadata").execute()
    assert meta["id"] == mid
    with pytest.raises(HttpError) as e:
        client(mail, METADATA_TOKEN).users().messages().get(userId="me", id=mid).execute()
    assert e.value.resp.status == 403 and "format FULL" in error_of(e.value)["message"]


def test_scopes_are_enforced_in_googles_error_shape(mail: StagingServer) -> None:
    with pytest.raises(HttpError) as e:
        list_ids(mail, SEND_TOKEN)
    err = error_of(e.value)
    assert e.value.resp.status == 403
    assert err["errors"][0]["reason"] == "insufficientPermissions"
    assert err["message"] == "Request had insufficient authentication scopes."
    with pytest.raises(HttpError) as e:
        client(mail, READ_TOKEN).users().messages().send(
            userId="me", body={"raw": raw_message()}).execute()
    assert e.value.resp.status == 403
    assert effects(mail, "gmail", "messages.send") == []


def test_revoked_token_is_401(mail: StagingServer) -> None:
    revoke(mail, SEND_TOKEN)
    with pytest.raises(HttpError) as e:
        send(mail)
    err = error_of(e.value)
    assert e.value.resp.status == 401 and err["status"] == "UNAUTHENTICATED"
    assert err["errors"][0]["reason"] == "authError"
    assert effects(mail, "gmail", "messages.send") == []


def test_search_unavailable_fault_answers_503(mail: StagingServer) -> None:
    arm(mail, "gmail", "messages.list", "fail_before_commit")
    with pytest.raises(HttpError) as e:
        list_ids(mail, q="in:sent")
    assert e.value.resp.status == 503 and error_of(e.value)["status"] == "UNAVAILABLE"
    assert list_ids(mail, q="in:sent") == []  # the fault was armed for one call


def test_bad_sends_are_refused_with_400(mail: StagingServer) -> None:
    msg = EmailMessage()
    msg["Subject"] = "nobody"
    msg.set_content("x")
    sender = client(mail, SEND_TOKEN).users().messages()
    for body, text in (({"raw": base64.urlsafe_b64encode(msg.as_bytes()).decode()},
                        "Recipient address required"),
                       ({}, "'raw' RFC822 payload"),
                       ({"raw": "not+url/safe"}, "Base64 decoding failed")):
        with pytest.raises(HttpError) as e:
            sender.send(userId="me", body=body).execute()
        assert e.value.resp.status == 400 and text in error_of(e.value)["message"]
    with pytest.raises(HttpError) as e:
        sender.send(userId="someone@else.example", body={"raw": raw_message()}).execute()
    assert e.value.resp.status == 403
    assert effects(mail, "gmail", "messages.send") == []


def test_send_by_media_upload(mail: StagingServer) -> None:
    # google-api-python-client sends uploads to the discovery document's rootUrl whatever
    # api_endpoint says, so this route is driven over plain HTTP, as other clients would.
    data = base64.urlsafe_b64decode(raw_message(subject="uploaded", X_Tidemark_Key="u" * 32))
    url = mail.url + "/upload/gmail/v1/users/me/messages/send"
    auth = {"Authorization": f"Bearer {SEND_TOKEN}"}
    media = urllib.request.Request(url + "?uploadType=media", data=data, method="POST",
                                   headers={**auth, "Content-Type": "message/rfc822"})
    multipart = urllib.request.Request(
        url + "?uploadType=multipart", method="POST",
        headers={**auth, "Content-Type": 'multipart/related; boundary="b"'},
        data=b"--b\r\nContent-Type: application/json\r\n\r\n{}\r\n--b\r\n"
             b"Content-Type: message/rfc822\r\n\r\n" + data + b"\r\n--b--\r\n")
    for req in (media, multipart):
        with urllib.request.urlopen(req, timeout=5) as resp:
            sent = json.loads(resp.read())
        assert headers_of(mail, sent["id"], "X-Tidemark-Key", "Subject") == {
            "Subject": "uploaded", "X-Tidemark-Key": "u" * 32}
    assert len(effects(mail, "gmail", "messages.send")) == 2


def test_full_and_raw_formats_return_the_stored_message(mail: StagingServer) -> None:
    sent = send(mail, subject="formats")
    reader = client(mail, READ_TOKEN).users().messages()
    full = reader.get(userId="me", id=sent["id"]).execute()
    text = base64.urlsafe_b64decode(full["payload"]["body"]["data"]).decode()
    assert text.strip() == "body of formats" and full["snippet"] == "body of formats"
    raw = reader.get(userId="me", id=sent["id"], format="raw").execute()
    assert b"Subject: formats" in base64.urlsafe_b64decode(raw["raw"])
    with pytest.raises(HttpError) as e:
        reader.get(userId="me", id="0000000000000000").execute()
    assert e.value.resp.status == 404


def test_trashed_message_needs_include_spam_trash(mail: StagingServer) -> None:
    sent = send(mail)
    add_token(mail, "modify", "gmail", ["https://www.googleapis.com/auth/gmail.modify"])
    client(mail, "modify").users().messages().trash(userId="me", id=sent["id"]).execute()
    assert list_ids(mail, q="in:sent") == []
    assert list_ids(mail, q="in:sent", includeSpamTrash=True) == [sent["id"]]
    assert list_ids(mail, q="in:trash") == [sent["id"]]


def test_plain_httplib2_resends_a_send_whose_response_was_dropped(mail: StagingServer) -> None:
    """Plain httplib2 resends a send whose response was dropped.

    This is the hazard probes.google_http.OneShotHttp guards against. httplib2 (the client's
    default transport) sends the POST again when the connection closes before the answer, and
    reports the second message as the result."""
    arm(mail, "gmail", "messages.send", "drop_after_commit")
    authed = google_auth_httplib2.AuthorizedHttp(Credentials(SEND_TOKEN),
                                                 http=httplib2.Http(timeout=CLIENT_TIMEOUT_S))
    plain = build("gmail", "v1", http=authed, static_discovery=True,
                  client_options={"api_endpoint": mail.url + "/"})
    sent = plain.users().messages().send(userId="me", body={"raw": raw_message()}).execute()
    assert [e["detail"]["id"] for e in effects(mail, "gmail", "messages.send")][-1] == sent["id"]
    assert len(effects(mail, "gmail", "messages.send")) == 2


def test_search_lags_behind_listing_by_label(mail: StagingServer) -> None:
    post(mail, "/_staging/gmail/settings", {"search_lag": 60})
    sent = send(mail)
    assert list_ids(mail, q="in:sent") == []
    assert list_ids(mail, labelIds=["SENT"]) == [sent["id"]]
    post(mail, "/_staging/gmail/settings", {"search_lag": 0})
    assert list_ids(mail, q="in:sent") == [sent["id"]]


# -- drafts ------------------------------------------------------------------------------------

def create_draft(server: StagingServer, token: str = COMPOSE_TOKEN, **kw: str) -> dict:
    return client(server, token).users().drafts().create(
        userId="me", body={"message": {"raw": raw_message(**kw)}}).execute(num_retries=0)


def send_draft(server: StagingServer, draft_id: str, *, timeout: float = CLIENT_TIMEOUT_S) -> dict:
    return gmail_client(server.url, COMPOSE_TOKEN, timeout=timeout).users().drafts().send(
        userId="me", body={"id": draft_id}).execute(num_retries=0)


def test_a_draft_is_sent_once_under_a_new_id_and_then_is_gone(mail: StagingServer) -> None:
    draft = create_draft(mail, X_Tidemark_Key="d" * 32, Message_ID="<d@tidemark.invalid>")
    assert draft["message"]["labelIds"] == ["DRAFT"]
    got = client(mail, READ_TOKEN).users().drafts().get(userId="me", id=draft["id"]).execute()
    assert got["message"]["id"] == draft["message"]["id"]
    listed = client(mail, COMPOSE_TOKEN).users().drafts().list(userId="me").execute()
    assert [d["id"] for d in listed["drafts"]] == [draft["id"]]
    sent = send_draft(mail, draft["id"])
    assert sent["id"] != draft["message"]["id"] and sent["labelIds"] == ["SENT"]
    assert headers_of(mail, sent["id"], "X-Tidemark-Key")["X-Tidemark-Key"] == "d" * 32
    assert list_ids(mail) == [sent["id"]]  # the draft's message went with the draft
    for call in (lambda: send_draft(mail, draft["id"]),
                 lambda: client(mail, READ_TOKEN).users().drafts().get(
                     userId="me", id=draft["id"]).execute()):
        with pytest.raises(HttpError) as e:
            call()
        assert e.value.resp.status == 404 and error_of(e.value)["status"] == "NOT_FOUND"
    [effect] = effects(mail, "gmail", "drafts.send")
    assert effect["key"] == "d" * 32 and effect["detail"]["draft_id"] == draft["id"]


def test_a_draft_can_be_sent_under_its_own_message_id(mail: StagingServer) -> None:
    post(mail, "/_staging/gmail/settings", {"draft_send": "relabel"})
    start = client(mail, READ_TOKEN).users().getProfile(userId="me").execute()["historyId"]
    draft = create_draft(mail)
    sent = send_draft(mail, draft["id"])
    assert sent["id"] == draft["message"]["id"] and sent["labelIds"] == ["SENT"]
    assert list_ids(mail) == [sent["id"]]
    records = history(mail, start, labelId="SENT")["history"]
    assert [(k, r[k][0]["labelIds"]) for r in records for k in ("labelsAdded", "labelsRemoved")
            if k in r] == [("labelsRemoved", ["DRAFT"]), ("labelsAdded", ["SENT"])]
    with pytest.raises(HttpError) as e:
        send_draft(mail, draft["id"])
    assert e.value.resp.status == 404


def test_a_late_send_finds_the_draft_consumed(mail: StagingServer) -> None:
    draft = create_draft(mail)
    arm(mail, "gmail", "drafts.send", "delay", seconds=0.8)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        send_draft(mail, draft["id"], timeout=0.2)  # the client gives up; Gmail goes on
    sent = send_draft(mail, draft["id"])
    time.sleep(max(0.0, started + 1.2 - time.monotonic()))
    assert [e["detail"]["id"] for e in effects(mail, "gmail", "drafts.send")] == [sent["id"]]
    assert list_ids(mail) == [sent["id"]]


def switch(server: StagingServer, name: str, value: object) -> None:
    post(server, "/_staging/switches", {"target": "gmail", "name": name, "value": value})


def test_overlapping_sends_of_one_draft_both_go_out_under_the_switch(mail: StagingServer) -> None:
    switch(mail, "concurrent_draft_send", "both")
    draft = create_draft(mail)
    arm(mail, "gmail", "drafts.send", "delay", seconds=0.8)
    with pytest.raises(TimeoutError):
        send_draft(mail, draft["id"], timeout=0.2)  # still being sent when the second arrives
    second = send_draft(mail, draft["id"])
    time.sleep(1.0)
    sent = [e["detail"]["id"] for e in effects(mail, "gmail", "drafts.send")]
    assert len(sent) == 2 and second["id"] in sent and sorted(list_ids(mail)) == sorted(sent)
    with pytest.raises(HttpError) as e:  # a send after both finished finds no draft
        send_draft(mail, draft["id"])
    assert e.value.resp.status == 404


@pytest.mark.parametrize("status", [400, 500])
def test_what_the_send_of_a_consumed_draft_gets_is_a_switch(mail: StagingServer,
                                                            status: int) -> None:
    switch(mail, "gone_draft_send_status", status)
    draft = create_draft(mail)
    send_draft(mail, draft["id"])
    with pytest.raises(HttpError) as e:
        send_draft(mail, draft["id"])
    assert e.value.resp.status == status
    assert len(effects(mail, "gmail", "drafts.send")) == 1


def test_drafts_need_compose_not_send(mail: StagingServer) -> None:
    for token in (SEND_TOKEN, READ_TOKEN):
        with pytest.raises(HttpError) as e:
            create_draft(mail, token)
        assert e.value.resp.status == 403
    draft = create_draft(mail)
    client(mail, COMPOSE_TOKEN).users().drafts().delete(userId="me", id=draft["id"]).execute()
    assert list_ids(mail) == []


# -- profile and history -----------------------------------------------------------------------

def history(server: StagingServer, start: str, token: str = READ_TOKEN, **params: object) -> dict:
    return client(server, token).users().history().list(
        userId="me", startHistoryId=start, **params).execute(num_retries=0)


def test_history_since_a_profiles_history_id_is_chronological(mail: StagingServer) -> None:
    start = client(mail, READ_TOKEN).users().getProfile(userId="me").execute()
    assert start["emailAddress"] == MAILBOX
    first = send(mail, subject="one")["id"]
    draft = create_draft(mail)
    second = send_draft(mail, draft["id"])["id"]
    everything = history(mail, start["historyId"])
    ids = [int(r["id"]) for r in everything["history"]]
    assert ids == sorted(ids) and len(set(ids)) == len(ids) > 3
    assert int(everything["historyId"]) == ids[-1]
    sent = history(mail, start["historyId"], labelId="SENT", historyTypes=["messageAdded"])
    assert [r["messagesAdded"][0]["message"]["id"] for r in sent["history"]] == [first, second]
    deleted = history(mail, start["historyId"], historyTypes=["messageDeleted"])
    assert [r["messagesDeleted"][0]["message"]["id"] for r in deleted["history"]] == [
        draft["message"]["id"]]  # drafts.send consumed the draft's message
    paged = history(mail, start["historyId"], maxResults=1)
    assert len(paged["history"]) == 1 and paged["nextPageToken"]
    assert history(mail, everything["historyId"]) == {"historyId": everything["historyId"]}


def test_expired_or_missing_start_history_id(mail: StagingServer) -> None:
    start = client(mail, READ_TOKEN).users().getProfile(userId="me").execute()["historyId"]
    send(mail)
    post(mail, "/_staging/gmail/settings", {"expire_history": True})
    with pytest.raises(HttpError) as e:
        history(mail, start)
    assert e.value.resp.status == 404
    now = client(mail, READ_TOKEN).users().getProfile(userId="me").execute()["historyId"]
    assert history(mail, now) == {"historyId": now}
    with pytest.raises(HttpError) as e:
        client(mail, READ_TOKEN).users().history().list(userId="me").execute()
    assert e.value.resp.status == 400


# -- inbound mail and permanent delete ------------------------------------------------------------

def test_inserted_mail_keeps_its_message_id_and_labels(mail: StagingServer) -> None:
    add_token(mail, "inbound", "gmail", [INSERT_SCOPE])
    body = {"raw": raw_message(to=MAILBOX, Message_ID="<forged@tidemark.invalid>"),
            "labelIds": ["INBOX", "UNREAD"]}
    with pytest.raises(HttpError) as e:
        client(mail, COMPOSE_TOKEN).users().messages().insert(userId="me", body=body).execute()
    assert e.value.resp.status == 403
    got = client(mail, "inbound").users().messages().insert(userId="me", body=body).execute()
    assert set(got["labelIds"]) == {"INBOX", "UNREAD"}
    assert list_ids(mail, q="rfc822msgid:forged@tidemark.invalid") == [got["id"]]
    assert list_ids(mail, labelIds=["SENT"]) == []


def test_permanent_delete_needs_full_access_and_leaves_a_history_record(
        mail: StagingServer) -> None:
    start = client(mail, READ_TOKEN).users().getProfile(userId="me").execute()["historyId"]
    sent = send(mail)
    add_token(mail, "modify", "gmail", [MODIFY_SCOPE])
    add_token(mail, "full", "gmail", [FULL_SCOPE])
    with pytest.raises(HttpError) as e:
        client(mail, "modify").users().messages().delete(userId="me", id=sent["id"]).execute()
    assert e.value.resp.status == 403
    client(mail, "full").users().messages().delete(userId="me", id=sent["id"]).execute()
    with pytest.raises(HttpError) as e:
        headers_of(mail, sent["id"], "Subject")
    assert e.value.resp.status == 404
    assert list_ids(mail, includeSpamTrash=True) == []
    kinds = [(next(k for k in r if k.startswith("messages") and k != "messages"),
              r["messages"][0]["id"]) for r in history(mail, start, labelId="SENT")["history"]]
    assert kinds == [("messagesAdded", sent["id"]), ("messagesDeleted", sent["id"])]


# -- several mailboxes ---------------------------------------------------------------------------

def test_tokens_see_only_their_own_mailbox(mail: StagingServer) -> None:
    mail.staging.add_token(Token("b-compose", "gmail", [COMPOSE_SCOPE], account="bob"))
    mail.staging.add_token(Token("b-read", "gmail", [READONLY_SCOPE], account="bob"))
    ours = send(mail)
    theirs = create_draft(mail, "b-compose")
    sent = client(mail, "b-compose").users().drafts().send(
        userId="me", body={"id": theirs["id"]}).execute()
    bob = client(mail, "b-read").users()
    assert bob.getProfile(userId="me").execute()["emailAddress"] == "bob@staging.example"
    assert [m["id"] for m in bob.messages().list(userId="me").execute()["messages"]] == [
        sent["id"]]
    assert list_ids(mail) == [ours["id"]]
    with pytest.raises(HttpError) as e:
        bob.messages().get(userId="me", id=ours["id"]).execute()
    assert e.value.resp.status == 404
    with pytest.raises(HttpError) as e:
        bob.messages().list(userId=MAILBOX).execute()
    assert e.value.resp.status == 403 and "Delegation denied" in error_of(e.value)["message"]


# -- list order and Google's clock ---------------------------------------------------------------

def test_list_order_and_clock_offset_are_settings(mail: StagingServer) -> None:
    first, second = send(mail, subject="1")["id"], send(mail, subject="2")["id"]
    post(mail, "/_staging/gmail/settings", {"list_order": "oldest_first"})
    assert list_ids(mail, labelIds=["SENT"]) == [first, second]
    post(mail, "/_staging/gmail/settings", {"clock_offset": -3600})
    late = send(mail, subject="3")["id"]
    internal = client(mail, READ_TOKEN).users().messages().get(
        userId="me", id=late, format="minimal").execute()["internalDate"]
    assert int(internal) / 1000 < time.time() - 3500
    assert late not in list_ids(mail, q=f"in:sent after:{int(time.time()) - 60}")
    for bad in ({"list_order": "random"}, {"clock_offset": "x"}, {"search_lag": -1},
                {"draft_send": "twice"}, {"nonsense": 1}):
        with pytest.raises(urllib.error.HTTPError) as err:
            post(mail, "/_staging/gmail/settings", bad)
        assert err.value.code == 400
