"""``drive.rename`` and ``gmail.send`` awaiting their call on an event loop (``execute_async``).

They give the same request, outcome and effect as ``execute``, through the real Google client
library over HTTP against the staging servers, while a wait on the provider holds no thread; and the
awkward answers (a lost answer, a timeout, a 401 with per-task grants, compressed bodies).
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import socket
import threading
import time
import zlib
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler
from typing import Any, TypeVar

import httplib2
import pytest
from googleapiclient.errors import HttpError

from activities.drive import DriveRename, drive_client
from activities.gmail import GmailSend
from activities.granted import acting_for, granted_google
from helpers.origin import serving
from helpers.staging_fixtures import CLIENT_TIMEOUT_S, target_of
from helpers.steps import persist, step_context
from helpers.wait import assert_eventually
from probes.gmail import KEY_HEADER, gmail_client
from probes.google_async import execute_async
from probes.google_http import OneShotHttp, google_error
from staging.core import Fault, Staging, StagingServer
from staging.drive import DEFAULT_READ_TOKEN, DEFAULT_WRITE_TOKEN, DriveTarget
from staging.gmail import COMPOSE_TOKEN, READ_TOKEN, GmailTarget
from tidemark.actions import ProbeStatus, Registry, StepContext
from tidemark.credentials import RefreshingSource
from tidemark.errors import Refused, TargetUnavailable, Unauthorized
from tidemark.grants import GrantBroker, LocalMinter
from tidemark.store import JournalStore

SHORT_TIMEOUT = 0.5  # for the calls meant to time out; the delays that victimise them are longer
T = TypeVar("T")
MAIL = {"to": ["bob@example.com"], "subject": "Q3 report", "body": "Attached in spirit."}


def drive_action(server: StagingServer, timeout: float = CLIENT_TIMEOUT_S) -> DriveRename:
    return DriveRename(writer=drive_client(server.url, DEFAULT_WRITE_TOKEN, timeout=timeout),
                       reader=drive_client(server.url, DEFAULT_READ_TOKEN, timeout=timeout),
                       timeout=timeout, horizon_s=0.0)


def gmail_action(server: StagingServer) -> GmailSend:
    return GmailSend(gmail_client(server.url, COMPOSE_TOKEN, timeout=CLIENT_TIMEOUT_S),
                     gmail_client(server.url, READ_TOKEN, timeout=CLIENT_TIMEOUT_S),
                     timeout=CLIENT_TIMEOUT_S, horizon_s=0.0)


def rename(file_id: str, name: str, task_id: str = "t") -> StepContext:
    return step_context("drive.rename", {"file_id": file_id, "name": name}, task_id=task_id)


def staged_mail(a: GmailSend, task_id: str = "t") -> StepContext:
    """A gmail.send step whose intent and draft exist, as run_step hands it to execute."""
    ctx = step_context("gmail.send", MAIL, task_id=task_id)
    ctx = replace(ctx, before_state=a.snapshot(ctx))
    return replace(ctx, staged=a.stage(ctx))


def os_threads() -> int:
    """The process's threads as the kernel counts them (Python's and any other)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("Threads:"))


# -- the same outcome and effect as execute ------------------------------------------------------

def test_drive_rename_awaited_renames_and_stamps_as_execute_does(
        server: StagingServer, drive: DriveTarget, staging: Staging) -> None:
    drive.seed("a.pdf", file_id="f1")
    drive.seed("b.pdf", file_id="f2")
    action = drive_action(server)
    synced, awaited = rename("f1", "a done.pdf", "t1"), rename("f2", "b done.pdf", "t2")
    out_sync = action.execute(synced)
    out_async = asyncio.run(action.execute_async(awaited))
    assert DriveRename.awaits is True
    assert out_sync == {"file_id": "f1", "name": "a done.pdf", "tidemark_key": synced.key}
    assert out_async == {"file_id": "f2", "name": "b done.pdf", "tidemark_key": awaited.key}
    assert drive.files["f2"].name == "b done.pdf"
    [effect_sync, effect_async] = staging.effects_of("drive", "files.update")
    assert effect_async.key == awaited.key
    # The same request: the same body but for the key, through the same OAuth client.
    assert {**effect_async.detail, "file_id": "f1", "old_name": "a.pdf", "name": "a done.pdf",
            "app_properties": {"tidemark_key": synced.key}} == effect_sync.detail
    assert action.probe(awaited).status is ProbeStatus.DONE


def test_gmail_send_awaited_sends_the_staged_draft_as_execute_does(
        server: StagingServer, staging: Staging) -> None:
    gmail = target_of(staging, GmailTarget)
    a = gmail_action(server)
    ctx = staged_mail(a)
    [draft_id] = gmail.drafts()
    out = asyncio.run(a.execute_async(ctx))
    assert GmailSend.awaits is True
    [sent] = gmail.messages()
    assert out == {"id": sent.id, "threadId": sent.thread_id, "labelIds": ["SENT"],
                   "draft_id": draft_id}
    assert sent.header(KEY_HEADER) == ctx.key and gmail.drafts() == {}
    [effect] = staging.effects_of("gmail", "drafts.send")
    assert effect.key == ctx.key
    assert a.probe(ctx).status is ProbeStatus.DONE


def test_gmail_send_awaited_without_a_staged_draft_sends_nothing(server: StagingServer,
                                                                 staging: Staging) -> None:
    a = gmail_action(server)
    with pytest.raises(ValueError, match="stage"):
        asyncio.run(a.execute_async(step_context("gmail.send", MAIL)))
    assert staging.requests_of("gmail") == []


# -- waiting costs no thread ------------------------------------------------------------------

def test_fifty_calls_held_by_drive_cost_no_thread_each(server: StagingServer, drive: DriveTarget,
                                                       staging: Staging) -> None:
    """Fifty calls held by Drive cost no thread each.

    Fifty renames wait on a Drive that holds each write for seconds. All fifty are in flight at
    once, and the process has barely more threads than before (a thread per waiting call would
    add fifty; a bounded pool of them would never have all fifty in flight)."""
    n, hold = 50, 3.0
    pool = 4
    for i in range(n):
        drive.seed(f"{i}.pdf", file_id=f"f{i}")
    staging.arm(Fault("drive", "files.update", "delay", seconds=hold, times=n))
    action = drive_action(server, timeout=10.0)
    contexts = [rename(f"f{i}", f"{i} done.pdf", f"t{i}") for i in range(n)]

    async def run() -> tuple[int, list[dict[str, Any]]]:
        # The threads that asyncio.to_thread may start (applying a credential, a DNS lookup),
        # four here whatever the machine's cores, to show the calls do not wait on them.
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(pool))
        before = os_threads()
        calls = asyncio.gather(*(action.execute_async(c) for c in contexts))
        while sum(r.status is None for r in staging.requests_of("drive")) < n:
            assert not calls.done(), "a call ended before all fifty were held"
            await asyncio.sleep(0.02)
        grown = os_threads() - before
        return grown, await calls

    grown, outcomes = asyncio.run(run())
    assert grown <= pool + 1, f"{grown} threads more while {n} calls waited"
    assert [o["tidemark_key"] for o in outcomes] == [c.key for c in contexts]
    assert len(staging.effects_of("drive", "files.update")) == n


# -- the awkward parts ------------------------------------------------------------------------

def test_a_lost_answer_is_target_unavailable_as_the_sync_path_says(
        server: StagingServer, drive: DriveTarget, staging: Staging) -> None:
    drive.seed("a.pdf", file_id="f1")
    drive.seed("b.pdf", file_id="f2")
    action = drive_action(server)
    staging.arm(Fault("drive", "files.update", "drop_after_commit", times=2))
    synced, awaited = rename("f1", "a done.pdf", "t1"), rename("f2", "b done.pdf", "t2")
    with pytest.raises(TargetUnavailable, match="no usable answer") as sync_error:
        action.execute(synced)
    with pytest.raises(TargetUnavailable, match="no usable answer") as async_error:
        asyncio.run(action.execute_async(awaited))
    # Both a dropped connection (the sync path's RemoteDisconnected is a ConnectionError).
    assert isinstance(sync_error.value.__cause__, ConnectionError)
    assert isinstance(async_error.value.__cause__, ConnectionError)
    # Applied once, and the probe finds it: the step settles as the sync path's would.
    assert [e.key for e in staging.effects_of("drive", "files.update")] == [synced.key,
                                                                             awaited.key]
    assert action.probe(awaited).status is ProbeStatus.DONE


def test_a_lost_answer_to_a_send_leaves_the_step_in_doubt(server: StagingServer,
                                                          staging: Staging) -> None:
    a = gmail_action(server)
    ctx = staged_mail(a)
    staging.arm(Fault("gmail", "drafts.send", "drop_after_commit"))
    with pytest.raises(TargetUnavailable, match="no usable answer"):
        asyncio.run(a.execute_async(ctx))
    assert a.probe(ctx).status is ProbeStatus.DONE
    assert len(staging.effects_of("gmail", "drafts.send")) == 1


def test_an_error_answer_to_a_send_goes_through_the_probe(server: StagingServer,
                                                          staging: Staging) -> None:
    """An error answer to a send goes through the probe.

    A second send of a consumed draft gets Gmail's 404, which must leave the step in doubt, not
    fail it (``_after_error``, as execute)."""
    a = gmail_action(server)
    ctx = staged_mail(a)
    first = asyncio.run(a.execute_async(ctx))
    with pytest.raises(TargetUnavailable, match="no longer there"):
        asyncio.run(a.execute_async(ctx))
    assert a.probe(ctx).observed["id"] == first["id"]
    assert len(staging.effects_of("gmail", "drafts.send")) == 1


def test_a_400_for_a_draft_still_unsent_is_a_refusal_after_the_probe(
        server: StagingServer, staging: Staging) -> None:
    """A 400 for a draft still unsent is a refusal, after the probe.

    The probe that tells a refused send from a consumed draft reads the mailbox (off the
    loop) and finds our draft still there: the step fails, nothing was sent."""
    a = gmail_action(server)
    ctx = step_context("gmail.send", MAIL)
    ctx = replace(ctx, before_state=a.snapshot(ctx))
    msg = EmailMessage()  # a draft that names no recipient: Gmail's 400
    msg["Subject"] = "Q3 report"
    msg[KEY_HEADER] = ctx.key
    msg.set_content("nobody to send to")
    draft = a.writer.users().drafts().create(userId="me", body={"message": {
        "raw": base64.urlsafe_b64encode(msg.as_bytes()).decode()}}).execute(num_retries=0)
    with pytest.raises(Refused, match="still in Drafts"):
        asyncio.run(a.execute_async(replace(ctx, staged={"draft_id": draft["id"]})))
    assert staging.effects_of("gmail", "drafts.send") == []


def test_a_late_answer_times_out_and_the_late_commit_is_found(
        server: StagingServer, drive: DriveTarget, staging: Staging) -> None:
    drive.seed("a.pdf", file_id="f1")
    action = drive_action(server, timeout=SHORT_TIMEOUT)
    ctx = rename("f1", "a done.pdf")
    ctx = replace(ctx, before_state=action.snapshot(ctx))
    staging.arm(Fault("drive", "files.update", "delay", seconds=SHORT_TIMEOUT * 6))
    started = time.monotonic()
    with pytest.raises(TargetUnavailable, match="no answer in time"):
        asyncio.run(action.execute_async(ctx))
    assert time.monotonic() - started < SHORT_TIMEOUT * 4  # the read timeout, not the delay
    assert action.probe(ctx).status is ProbeStatus.ABSENT  # not committed yet
    assert_eventually(lambda: action.probe(ctx).status is ProbeStatus.DONE)


def test_no_server_is_target_unavailable() -> None:
    url = closed_port_url()
    action = DriveRename(drive_client(url, "t", timeout=1), drive_client(url, "t", timeout=1),
                         timeout=1)
    with pytest.raises(TargetUnavailable, match="no usable answer"):
        asyncio.run(action.execute_async(rename("f1", "x")))


def test_a_call_cancelled_in_flight_raises_cancelled(server: StagingServer, drive: DriveTarget,
                                                     staging: Staging) -> None:
    drive.seed("a.pdf", file_id="f1")
    staging.arm(Fault("drive", "files.update", "delay", seconds=2.0))
    action = drive_action(server)

    async def run() -> None:
        call = asyncio.ensure_future(action.execute_async(rename("f1", "a done.pdf")))
        # Cancelled once Drive holds the whole request at its delay (the fault is taken after
        # the body is read): a request whose body had not all arrived is one Drive never got.
        while staging.faults:
            await asyncio.sleep(0.01)
        call.cancel()
        await call

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(run())
    # The request had left: Drive still applies it, which is why the caller holds the step in
    # doubt. (Waited for, too, so that it lands in this test and not in the next one's Drive.)
    assert_eventually(lambda: staging.requests_of("drive")[0].status is not None)
    assert [e.detail["name"] for e in staging.effects_of("drive", "files.update")] == [
        "a done.pdf"]


class ExpiresOnce(RefreshingSource):
    """A token endpoint whose first token the provider refuses and whose renewals are good.

    The provider's clock is ahead of ours. After the 401 a renewal brings a token that works."""

    def __init__(self, server: StagingServer, bad: int = 1) -> None:
        super().__init__()
        self.server, self.bad = server, bad

    def describe(self) -> str:
        return "first token expired on arrival"

    def _fetch(self, forced: bool) -> tuple[str, float]:
        token = f"skewed-{self.refreshes}"
        expires = 0 if self.refreshes < self.bad else 3600
        self.server.staging.add_token(replace(
            self.server.staging.tokens[DEFAULT_WRITE_TOKEN], token=token, parent=None,
            expires_at=time.monotonic() + expires))
        return token, time.time() + 3600.0  # what our clock believes


class ThreadPerCall(ThreadPoolExecutor):
    """Runs every call on a thread of its own, sharing no thread's state.

    A worker's pool may hand the 401's renewal to another thread than the request's."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()

        def run() -> None:
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as e:  # handed to the awaiting coroutine
                future.set_exception(e)

        threading.Thread(target=run).start()
        return future


def on_fresh_threads(call: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(call)`` with every ``asyncio.to_thread`` on a new thread."""
    async def run() -> T:
        asyncio.get_running_loop().set_default_executor(ThreadPerCall())
        return await call

    return asyncio.run(run())


def drive_writes(staging: Staging) -> list[tuple[int | None, str]]:
    return [(r.status, r.path) for r in staging.requests_of("drive")]


def test_a_401_with_task_grants_is_renewed_once_and_sent_again(
        server: StagingServer, drive: DriveTarget, staging: Staging, store: JournalStore) -> None:
    """A 401 with task grants is renewed once and sent again.

    The async twin of test_credentials' expired-early write. The grant is read from the journal
    off the loop, the 401 renews the base token and the grant, and the write goes out once more,
    with the renewed token."""
    drive.seed("a.pdf", file_id="f1")
    source = ExpiresOnce(server)
    writer = granted_google(drive_client(server.url, "", timeout=CLIENT_TIMEOUT_S), "drive",
                            "write", LocalMinter(), source)
    action = DriveRename(writer, drive_client(server.url, DEFAULT_READ_TOKEN), horizon_s=0.0)
    task = persist(store, Registry([DriveRename]), [
        {"action": "drive.rename", "args": {"file_id": "f1", "name": "a done.pdf"}}], "g1")
    ctx = rename("f1", "a done.pdf", task)
    with acting_for(GrantBroker(store), task):
        out = on_fresh_threads(action.execute_async(ctx))
    assert out["tidemark_key"] == ctx.key
    assert drive_writes(staging) == [(401, "/drive/v3/files/f1"), (200, "/drive/v3/files/f1")]
    presented = [c.token for c in staging.calls_of("drive") if c.method == "PATCH"]
    assert presented == ["skewed-0", "skewed-1"] and source.refreshes == 2
    assert [e.key for e in staging.effects_of("drive", "files.update")] == [ctx.key]


def test_after_a_401_an_awaited_write_is_sent_again_at_most_once(
        server: StagingServer, drive: DriveTarget, staging: Staging) -> None:
    drive.seed("a.pdf", file_id="f1")
    source = ExpiresOnce(server, bad=10)  # every renewal is refused too
    writer = granted_google(drive_client(server.url, ""), "drive", "write", LocalMinter(), source)
    action = DriveRename(writer, drive_client(server.url, DEFAULT_READ_TOKEN), horizon_s=0.0)
    with pytest.raises(Unauthorized):
        on_fresh_threads(action.execute_async(rename("f1", "a done.pdf")))
    assert [s for s, _ in drive_writes(staging)] == [401, 401] and source.refreshes == 2
    assert drive.files["f1"].name == "a.pdf"


def test_a_refused_static_token_is_not_sent_again(server: StagingServer, drive: DriveTarget,
                                                  staging: Staging) -> None:
    drive.seed("a.pdf", file_id="f1")
    staging.add_token(replace(staging.tokens[DEFAULT_WRITE_TOKEN], token="static",
                              revoked=True))
    writer = granted_google(drive_client(server.url, "static"), "drive", "write", LocalMinter())
    action = DriveRename(writer, drive_client(server.url, DEFAULT_READ_TOKEN), horizon_s=0.0)
    with pytest.raises(Unauthorized):
        asyncio.run(action.execute_async(rename("f1", "a done.pdf")))
    assert [s for s, _ in drive_writes(staging)] == [401]


def test_a_revoked_grant_stops_the_awaited_call_before_it_is_sent(
        server: StagingServer, drive: DriveTarget, staging: Staging, store: JournalStore) -> None:
    from tidemark.grants import revoke_task_grants

    drive.seed("a.pdf", file_id="f1")
    writer = granted_google(drive_client(server.url, DEFAULT_WRITE_TOKEN), "drive", "write",
                            LocalMinter())
    action = DriveRename(writer, drive_client(server.url, DEFAULT_READ_TOKEN), horizon_s=0.0)
    task = persist(store, Registry([DriveRename]), [
        {"action": "drive.rename", "args": {"file_id": "f1", "name": "a done.pdf"}}], "k1")
    broker = GrantBroker(store)
    with acting_for(broker, task):
        asyncio.run(action.execute_async(rename("f1", "a done.pdf", task)))
    store.set_killed(task, "drill", "ops")
    revoke_task_grants(store, task, "ops")
    with acting_for(broker, task), pytest.raises(Unauthorized, match="revoked"):
        asyncio.run(action.execute_async(rename("f1", "again.pdf", task)))
    assert len(staging.requests_of("drive")) == 1


# -- the transport, next to the sync one -----------------------------------------------------

BODY = b'{"id": "f1", "name": "report.pdf"}'
ENCODED = {
    "gzip": ("gzip", gzip.compress(BODY)),
    "deflate": ("deflate", zlib.compress(BODY)),
    "raw-deflate": ("deflate", zlib.compress(BODY)[2:-4]),
    "broken": ("gzip", b"not gzip at all"),
    "plain": (None, BODY),
}


class _Origin(BaseHTTPRequestHandler):
    """Answers a Drive file as Google's front ends may (compressed; a redirect).

    It keeps the headers and body of every request it got."""

    seen: list[tuple[str, dict[str, str], bytes]] = []

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.seen.append((self.command, {k.lower(): v for k, v in self.headers.items()}, body))
        name = self.path.split("?")[0].rsplit("/", 1)[-1]
        if name == "moved":
            self.send_response(302)
            self.send_header("Location", "/drive/v3/files/plain")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        encoding, content = ENCODED[name]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if encoding:
            self.send_header("Content-Encoding", encoding)
        self.send_header("Set-Cookie", "a=1")
        self.send_header("Set-Cookie", "b=2")
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)

    do_GET = do_PATCH = do_POST = _answer

    def log_message(self, *args: object) -> None:
        """Quiet: the test output is for failures."""


@pytest.fixture(scope="module")
def origin() -> Iterator[str]:
    with serving(_Origin) as url:
        yield url


@pytest.mark.parametrize("name", ["gzip", "deflate", "raw-deflate", "plain"])
def test_compressed_answers_are_decoded_as_the_sync_path_decodes_them(origin: str,
                                                                      name: str) -> None:
    files = drive_client(origin, "t", timeout=5).files()
    assert asyncio.run(execute_async(files.get(fileId=name))) == json.loads(BODY)
    sync_response, sync_content = OneShotHttp(5).request(f"{origin}/drive/v3/files/{name}")

    async def raw() -> tuple[httplib2.Response, bytes]:
        from probes.google_async import send
        return await send(OneShotHttp(5), f"{origin}/drive/v3/files/{name}")

    response, content = asyncio.run(raw())
    assert content == sync_content == BODY
    without_date = {k: v for k, v in response.items() if k not in ("date", "server")}
    assert without_date == {k: v for k, v in sync_response.items()
                            if k not in ("date", "server")}
    assert (response.status, response.reason, response.version) == (
        sync_response.status, sync_response.reason, sync_response.version)
    assert response["set-cookie"] == "a=1, b=2"  # repeated headers joined as httplib2 joins them


def test_an_answer_not_in_its_encoding_is_a_client_error(origin: str) -> None:
    files = drive_client(origin, "t", timeout=5).files()
    with pytest.raises(httplib2.FailedToDecompressContent) as info:
        asyncio.run(execute_async(files.get(fileId="broken")))
    assert type(google_error(info.value, "get")) is TargetUnavailable


def test_a_redirect_is_not_followed(origin: str) -> None:
    _Origin.seen.clear()
    files = drive_client(origin, "t", timeout=5).files()
    with pytest.raises(HttpError) as info:
        asyncio.run(execute_async(files.update(fileId="moved", body={"name": "x"})))
    assert info.value.status_code == 302
    assert type(google_error(info.value, "update")) is TargetUnavailable
    assert [m for m, _, _ in _Origin.seen] == ["PATCH"]  # sent once, to where it was aimed


def test_the_awaited_request_is_the_request_execute_sends(origin: str) -> None:
    """The awaited request is the request ``execute`` sends, to the letter.

    Headers (user agent, content type and length, the token, the client's metrics header) and
    body."""
    _Origin.seen.clear()
    files = drive_client(origin, "tok", timeout=5).files()
    body = {"name": "Zoë → 東京", "appProperties": {"tidemark_key": "k"}}
    synced = files.update(fileId="plain", body=body, fields="id,name").execute(num_retries=0)
    awaited = asyncio.run(execute_async(files.update(fileId="plain", body=body,
                                                     fields="id,name")))
    assert awaited == synced
    [(method_a, headers_a, body_a), (method_b, headers_b, body_b)] = _Origin.seen
    assert (method_b, headers_b, body_b) == (method_a, headers_a, body_a)
    assert headers_b["authorization"] == "Bearer tok"


def closed_port_url() -> str:
    """A URL on which nothing listens (a port just bound and released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"
