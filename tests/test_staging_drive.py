"""The Drive v3 staging server, driven by the real google-api-python-client over HTTP."""

from __future__ import annotations

import json
from typing import Any

import google.oauth2.credentials
import google_auth_httplib2
import httplib2
import pytest
from googleapiclient.discovery import build
from googleapiclient.errors import HttpError

from activities.drive import drive_client
from helpers.staging_fixtures import post
from helpers.steps import step_context
from helpers.wait import assert_eventually
from probes.drive import DriveRenameProbe
from staging.core import Fault, Staging, StagingServer
from staging.drive import DEFAULT_READ_TOKEN, DEFAULT_WRITE_TOKEN, DriveTarget, parse_query
from tidemark.actions import ProbeStatus


@pytest.fixture
def writer(server: StagingServer) -> Any:
    return drive_client(server.url, DEFAULT_WRITE_TOKEN, timeout=5)


@pytest.fixture
def reader(server: StagingServer) -> Any:
    return drive_client(server.url, DEFAULT_READ_TOKEN, timeout=5)


def http_error(call: Any) -> tuple[int, dict[str, Any]]:
    with pytest.raises(HttpError) as info:
        call.execute(num_retries=0)
    return info.value.status_code, json.loads(info.value.content)


def test_get_answers_default_fields_or_the_selected_ones(server: StagingServer,
                                                         reader: Any) -> None:
    f = post(server, "/_staging/drive/files", {"id": "f1", "name": "report.pdf",
                                               "appProperties": {"a": "1"}})
    assert f["id"] == "f1" and f["trashed"] is False
    assert reader.files().get(fileId="f1").execute(num_retries=0) == {
        "kind": "drive#file", "id": "f1", "name": "report.pdf",
        "mimeType": "application/octet-stream"}
    assert reader.files().get(fileId="f1", fields="id,appProperties,trashed").execute(
        num_retries=0) == {"id": "f1", "appProperties": {"a": "1"}, "trashed": False}
    everything = reader.files().get(fileId="f1", fields="*").execute(num_retries=0)
    assert {"version", "modifiedTime", "createdTime"} <= set(everything)


def test_missing_file_is_drives_exact_404(reader: Any) -> None:
    status, body = http_error(reader.files().get(fileId="nope"))
    assert status == 404
    assert body == {"error": {"code": 404, "message": "File not found: nope.", "errors": [
        {"message": "File not found: nope.", "domain": "global", "reason": "notFound",
         "locationType": "parameter", "location": "fileId"}]}}


def test_update_renames_and_merges_app_properties(drive: DriveTarget, writer: Any) -> None:
    drive.seed("a.txt", file_id="f1", app_properties={"keep": "x", "drop": "y"})
    out = writer.files().update(
        fileId="f1", body={"name": "b.txt", "appProperties": {"drop": None, "new": "z"}},
        fields="id,name,appProperties").execute(num_retries=0)
    assert out == {"id": "f1", "name": "b.txt", "appProperties": {"keep": "x", "new": "z"}}
    assert drive.files["f1"].version == 2


def test_update_of_missing_file_is_404_and_records_nothing(staging: Staging,
                                                           writer: Any) -> None:
    status, body = http_error(writer.files().update(fileId="gone", body={"name": "x"}))
    assert status == 404 and body["error"]["errors"][0]["reason"] == "notFound"
    assert staging.effects_of("drive") == []


def test_every_update_is_recorded_with_the_key_it_carried(staging: Staging, drive: DriveTarget,
                                                          writer: Any) -> None:
    drive.seed("a.txt", file_id="f1")
    writer.files().update(fileId="f1", body={"name": "b.txt", "appProperties": {
        "tidemark_key": "k1"}}).execute(num_retries=0)
    writer.files().update(fileId="f1", body={"name": "c.txt"}).execute(num_retries=0)
    effects = staging.effects_of("drive", "files.update")
    assert [(e.key, e.detail["old_name"], e.detail["name"]) for e in effects] == [
        ("k1", "a.txt", "b.txt"), (None, "b.txt", "c.txt")]


@pytest.mark.parametrize(("q", "expected"), [
    ("name = 'a.txt'", ["f1"]),
    ("name != 'a.txt'", ["f2", "f3"]),
    ("name contains 'REPORT'", ["f2", "f3"]),
    ("appProperties has { key='tidemark_key' and value='k1' }", ["f2", "f3"]),
    ("appProperties has { key='tidemark_key' and value='k1' } and trashed = false", ["f2"]),
    ("trashed = true", ["f3"]),
    ("name = 'it\\'s.txt'", []),
    ("", ["f1", "f2", "f3"]),
])
def test_list_filters_with_q(drive: DriveTarget, reader: Any, q: str,
                             expected: list[str]) -> None:
    drive.seed("a.txt", file_id="f1")
    drive.seed("report.pdf", file_id="f2", app_properties={"tidemark_key": "k1"})
    drive.seed("old report.pdf", file_id="f3", trashed=True,
               app_properties={"tidemark_key": "k1"})
    got = reader.files().list(q=q, fields="files(id),nextPageToken").execute(num_retries=0)
    assert [f["id"] for f in got["files"]] == expected


def test_quotes_escape_in_q(drive: DriveTarget, reader: Any) -> None:
    drive.seed("it's.txt", file_id="f1")
    got = reader.files().list(q="name = 'it\\'s.txt'").execute(num_retries=0)
    assert [f["id"] for f in got["files"]] == ["f1"]
    assert set(got["files"][0]) == {"kind", "id", "name", "mimeType"}


def test_unsupported_q_is_a_400_invalid_value(reader: Any) -> None:
    status, body = http_error(reader.files().list(q="name = 'a' or name = 'b'"))
    assert status == 400
    assert body["error"]["message"] == "Invalid Value"
    assert body["error"]["errors"][0]["location"] == "q"
    with pytest.raises(ValueError):
        parse_query("modifiedTime > '2026-01-01'")


def test_list_pages_with_page_tokens(drive: DriveTarget, reader: Any) -> None:
    for i in range(5):
        drive.seed(f"f{i}", file_id=f"id{i}")
    seen, token = [], None
    for _ in range(5):
        page = reader.files().list(pageSize=2, pageToken=token).execute(num_retries=0)
        seen += [f["id"] for f in page["files"]]
        token = page.get("nextPageToken")
        if token is None:
            break
    assert seen == [f"id{i}" for i in range(5)]


def test_read_only_scope_can_read_but_not_write(drive: DriveTarget, reader: Any) -> None:
    drive.seed("a.txt", file_id="f1")
    assert reader.files().get(fileId="f1").execute(num_retries=0)["name"] == "a.txt"
    status, body = http_error(reader.files().update(fileId="f1", body={"name": "b"}))
    assert status == 403
    assert body["error"]["status"] == "PERMISSION_DENIED"
    assert body["error"]["errors"][0]["reason"] == "insufficientPermissions"
    assert drive.files["f1"].name == "a.txt"


def test_unknown_and_revoked_tokens_get_googles_401(server: StagingServer, drive: DriveTarget,
                                                    writer: Any) -> None:
    drive.seed("a.txt", file_id="f1")
    stranger = drive_client(server.url, "ya29.not-a-token", timeout=5)
    status, body = http_error(stranger.files().get(fileId="f1"))
    assert status == 401 and body["error"]["status"] == "UNAUTHENTICATED"
    post(server, f"/_staging/tokens/{DEFAULT_WRITE_TOKEN}/revoke", {})
    status, body = http_error(writer.files().update(fileId="f1", body={"name": "b"}))
    assert status == 401 and body["error"]["errors"][0]["reason"] == "authError"
    assert drive.files["f1"].name == "a.txt"


def test_third_party_rename_keeps_our_stamp(server: StagingServer, staging: Staging,
                                            drive: DriveTarget) -> None:
    drive.seed("a.txt", file_id="f1", app_properties={"tidemark_key": "k1"})
    out = post(server, "/_staging/drive/files/f1/third_party_rename", {"name": "theirs"})
    assert out["name"] == "theirs" and out["appProperties"] == {"tidemark_key": "k1"}
    assert [(e.op, e.key) for e in staging.effects_of("drive")] == [
        ("third_party.rename", None)]


def test_a_dropped_answer_surfaces_and_the_write_happens_once(staging: Staging,
                                                             drive: DriveTarget,
                                                             writer: Any) -> None:
    drive.seed("a.txt", file_id="f1")
    staging.arm(Fault("drive", "files.update", "drop_after_commit"))
    with pytest.raises(ConnectionError):
        writer.files().update(fileId="f1", body={"name": "b.txt"}).execute(num_retries=0)
    assert drive.files["f1"].name == "b.txt"
    assert len(staging.effects_of("drive", "files.update")) == 1


def test_plain_httplib2_would_resend_a_dropped_write(server: StagingServer, staging: Staging,
                                                     drive: DriveTarget) -> None:
    # Why google_service sends through OneShotHttp, not httplib2.Http: httplib2 re-sends a PATCH
    # whose answer was lost and reports success, hiding the in-doubt write and applying it twice.
    drive.seed("a.txt", file_id="f1")
    http = google_auth_httplib2.AuthorizedHttp(
        google.oauth2.credentials.Credentials(DEFAULT_WRITE_TOKEN), http=httplib2.Http(timeout=5))
    plain = build("drive", "v3", http=http, static_discovery=True,
                  client_options={"api_endpoint": server.url + "/drive/v3/"})
    staging.arm(Fault("drive", "files.update", "drop_after_commit"))
    plain.files().update(fileId="f1", body={"name": "b.txt"}).execute(num_retries=0)
    assert len(staging.effects_of("drive", "files.update")) == 2


def test_a_delayed_answer_times_out(server: StagingServer, staging: Staging,
                                    drive: DriveTarget) -> None:
    drive.seed("a.txt", file_id="f1")
    impatient = drive_client(server.url, DEFAULT_WRITE_TOKEN, timeout=0.2)
    staging.arm(Fault("drive", "files.update", "delay", seconds=0.6))
    with pytest.raises(TimeoutError):
        impatient.files().update(fileId="f1", body={"name": "b.txt"}).execute(num_retries=0)
    # The request we gave up on still lands; the test ends when it has (the server is shared,
    # and a late write would land in the next test's files).
    assert_eventually(lambda: drive.files["f1"].name == "b.txt", timeout=10)


def test_fail_before_commit_is_a_503_and_changes_nothing(staging: Staging, drive: DriveTarget,
                                                         writer: Any) -> None:
    drive.seed("a.txt", file_id="f1")
    staging.arm(Fault("drive", "files.update", "fail_before_commit"))
    status, body = http_error(writer.files().update(fileId="f1", body={"name": "b.txt"}))
    assert status == 503 and body["error"]["errors"][0]["reason"] == "backendError"
    assert drive.files["f1"].name == "a.txt" and staging.effects_of("drive") == []


# -- appProperties are private to the OAuth client that set them -----------------------------

OTHER_CLIENT_TOKEN = "other-client-read"


@pytest.fixture
def other_reader(server: StagingServer) -> Any:
    """A read-only Drive client whose token belongs to another OAuth client than ours."""
    post(server, "/_staging/tokens", {
        "token": OTHER_CLIENT_TOKEN, "target": "drive", "client": "another-app",
        "scopes": ["https://www.googleapis.com/auth/drive.metadata.readonly"]})
    return drive_client(server.url, OTHER_CLIENT_TOKEN, timeout=5)


def test_another_client_neither_sees_nor_matches_our_stamp(drive: DriveTarget, writer: Any,
                                                           reader: Any,
                                                           other_reader: Any) -> None:
    drive.seed("a.txt", file_id="f1")
    writer.files().update(fileId="f1", body={"name": "b.txt", "appProperties": {
        "tidemark_key": "k1"}}).execute(num_retries=0)
    fields = "id,name,appProperties"
    assert reader.files().get(fileId="f1", fields=fields).execute(num_retries=0) == {
        "id": "f1", "name": "b.txt", "appProperties": {"tidemark_key": "k1"}}
    assert other_reader.files().get(fileId="f1", fields=fields).execute(num_retries=0) == {
        "id": "f1", "name": "b.txt"}
    q = "appProperties has { key='tidemark_key' and value='k1' }"
    assert [f["id"] for f in reader.files().list(q=q).execute(num_retries=0)["files"]] == ["f1"]
    assert other_reader.files().list(q=q).execute(num_retries=0)["files"] == []


def test_another_clients_write_leaves_our_app_properties_alone(server: StagingServer,
                                                               drive: DriveTarget,
                                                               reader: Any) -> None:
    drive.seed("a.txt", file_id="f1", app_properties={"tidemark_key": "k1"})
    post(server, "/_staging/tokens", {"token": "other-write", "target": "drive",
                                      "client": "another-app",
                                      "scopes": ["https://www.googleapis.com/auth/drive"]})
    other_writer = drive_client(server.url, "other-write", timeout=5)
    out = other_writer.files().update(fileId="f1", fields="appProperties", body={
        "appProperties": {"tidemark_key": "theirs", "x": "1"}}).execute(num_retries=0)
    assert out == {"appProperties": {"tidemark_key": "theirs", "x": "1"}}
    assert reader.files().get(fileId="f1", fields="appProperties").execute(num_retries=0) == {
        "appProperties": {"tidemark_key": "k1"}}


def test_probe_reading_as_another_client_is_unknown_for_a_landed_rename(
        drive: DriveTarget, writer: Any, reader: Any, other_reader: Any) -> None:
    # Our rename landed with our stamp, but a reader of another OAuth client cannot see the
    # stamp: "absent" would rename again and "done" would be a guess; only a person can tell.
    drive.seed("report.pdf", file_id="f1")
    ctx = step_context("drive.rename", {"file_id": "f1", "name": "final.pdf"},
                       before_state={"file_id": "f1", "name": "report.pdf",
                                     "app_properties": {}})
    writer.files().update(fileId="f1", body={"name": "final.pdf", "appProperties": {
        "tidemark_key": ctx.key}}).execute(num_retries=0)
    probed = DriveRenameProbe(other_reader).probe(ctx)
    assert probed.status is ProbeStatus.UNKNOWN
    assert probed.observed["name"] == "final.pdf" and probed.observed["tidemark_key"] is None
    assert DriveRenameProbe(reader).probe(ctx).status is ProbeStatus.DONE  # our own client


# -- users, sharing and the answers about one file ----------------------------------------------

def bobs_client(server: StagingServer, scopes: list[str] | None = None) -> Any:
    post(server, "/_staging/tokens", {"token": "bob", "target": "drive", "account": "bob",
                                      "scopes": scopes or ["https://www.googleapis.com/auth/drive"]})
    return drive_client(server.url, "bob", timeout=5)


def test_about_names_the_tokens_user_and_requires_fields(server: StagingServer, writer: Any,
                                                         reader: Any) -> None:
    ours = writer.about().get(fields="user(permissionId,emailAddress)").execute(num_retries=0)
    assert ours == reader.about().get(fields="user(permissionId,emailAddress)").execute(
        num_retries=0)
    assert ours["user"]["emailAddress"] == "default@drive.staging.example"
    post(server, "/_staging/drive/users", {"account": "bob", "emailAddress": "bob@example.com"})
    bob = bobs_client(server).about().get(fields="user").execute(num_retries=0)["user"]
    assert bob["emailAddress"] == "bob@example.com" and bob["me"] is True
    assert bob["permissionId"] != ours["user"]["permissionId"]
    status, body = http_error(writer.about().get())
    assert status == 400 and body["error"]["errors"][0]["reason"] == "required"


def test_a_user_sees_only_files_it_has_a_role_on(server: StagingServer, drive: DriveTarget,
                                                 writer: Any) -> None:
    drive.seed("ours.txt", file_id="f1")
    drive.seed("bobs.txt", file_id="f2", owner="bob")
    bob = bobs_client(server)
    assert [f["id"] for f in bob.files().list().execute(num_retries=0)["files"]] == ["f2"]
    status, body = http_error(bob.files().get(fileId="f1"))
    assert status == 404 and body["error"]["errors"][0]["reason"] == "notFound"
    status, _ = http_error(writer.files().update(fileId="f2", body={"name": "x"}))
    assert status == 404  # Drive does not tell "not yours" from "no such file"
    post(server, "/_staging/drive/files/f2/share", {"account": "default", "role": "writer"})
    assert writer.files().update(fileId="f2", body={"name": "x"}).execute(
        num_retries=0)["name"] == "x"


def test_a_role_that_cannot_edit_gets_a_403_about_that_file(server: StagingServer,
                                                            drive: DriveTarget,
                                                            writer: Any,
                                                            staging: Staging) -> None:
    drive.seed("bobs.txt", file_id="f2", owner="bob", shared={"default": "commenter"})
    assert writer.files().get(fileId="f2").execute(num_retries=0)["name"] == "bobs.txt"
    status, body = http_error(writer.files().update(fileId="f2", body={"name": "x"}))
    assert status == 403
    assert body["error"]["errors"][0]["reason"] == "insufficientFilePermissions"
    assert "f2" in body["error"]["message"]
    assert drive.files["f2"].name == "bobs.txt" and staging.effects_of("drive") == []


def test_only_the_owner_trashes_a_file_and_only_the_owner_still_sees_it(
        server: StagingServer, drive: DriveTarget, writer: Any, reader: Any) -> None:
    drive.seed("ours.pdf", file_id="f1")
    drive.seed("bobs.pdf", file_id="f2", owner="bob", shared={"default": "writer"})
    status, body = http_error(writer.files().update(fileId="f2", body={"trashed": True}))
    assert (status, body["error"]["errors"][0]["reason"]) == (403, "insufficientFilePermissions")
    assert drive.files["f2"].trashed is False
    writer.files().update(fileId="f1", body={"trashed": True}).execute(num_retries=0)
    assert reader.files().get(fileId="f1", fields="name,trashed").execute(num_retries=0) == {
        "name": "ours.pdf", "trashed": True}
    drive.files["f2"].trashed = True  # bob trashed his file
    assert http_error(reader.files().get(fileId="f2"))[0] == 404
    listed = reader.files().list(fields="files(id)").execute(num_retries=0)["files"]
    assert [f["id"] for f in listed] == ["f1"]
