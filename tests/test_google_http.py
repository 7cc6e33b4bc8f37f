"""The Google client plumbing shared by Drive and Gmail.

OneShotHttp's answers, and how google_error classifies what a call raises."""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import httplib2
import pytest
from googleapiclient.errors import HttpError, UnexpectedBodyError

from activities.drive import drive_client
from helpers.origin import serving
from probes.google_http import OneShotHttp, files_of, google_error
from staging.core import StagingServer
from staging.drive import DEFAULT_READ_TOKEN
from tidemark.errors import Refused, TargetUnavailable, Throttled, Unauthorized

BODY = b'{"name": "report.pdf"}'
# What each path answers: the content-encoding header and the bytes sent under it.
ENCODED = {
    "/gzip": ("gzip", gzip.compress(BODY)),
    "/deflate": ("deflate", zlib.compress(BODY)),  # the zlib wrapper RFC 9110 asks for
    "/raw-deflate": ("deflate", zlib.compress(BODY)[2:-4]),  # what some servers send instead
    "/broken": ("gzip", b"not gzip at all"),
}


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        encoding, content = ENCODED[self.path]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Encoding", encoding)
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)

    def do_POST(self) -> None:  # echoes the body it got
        content = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)

    def log_message(self, *args: object) -> None:
        """Quiet: the test output is for failures."""


@pytest.fixture(scope="module")
def origin() -> Iterator[str]:
    """A plain HTTP server that answers compressed content, as Google's front ends do."""
    with serving(_Handler) as url:
        yield url


@pytest.mark.parametrize("path", ["/gzip", "/deflate", "/raw-deflate"])
def test_compressed_answers_are_decoded_as_httplib2_decodes_them(origin: str, path: str) -> None:
    response, content = OneShotHttp(timeout=5).request(origin + path)
    assert content == BODY
    assert "content-encoding" not in response
    assert response["-content-encoding"] == ENCODED[path][0]
    assert response["content-length"] == str(len(BODY))


def test_an_answer_that_is_not_in_its_encoding_is_a_client_error(origin: str) -> None:
    with pytest.raises(httplib2.FailedToDecompressContent) as info:
        OneShotHttp(timeout=5).request(origin + "/broken")
    assert type(google_error(info.value, "get")) is TargetUnavailable


def test_a_text_body_goes_out_as_utf8(origin: str) -> None:
    _, content = OneShotHttp(timeout=5).request(origin + "/echo", "POST", body="Zoë → 東京",
                                                headers={"content-type": "text/plain"})
    assert content == "Zoë → 東京".encode()


def test_a_service_can_be_closed(server: StagingServer) -> None:
    # Resource.close (and ``with service:``) close the transport; there is nothing to close.
    with drive_client(server.url, DEFAULT_READ_TOKEN, timeout=5) as service:
        assert service.files().list().execute(num_retries=0)["files"] == []


def test_a_services_files_resource_is_built_once_and_again_for_a_new_http(
        server: StagingServer) -> None:
    service = drive_client(server.url, "not-a-token", timeout=5)
    first = files_of(service)
    assert files_of(service) is first
    with pytest.raises(HttpError) as refused:
        first.list().execute(num_retries=0)
    assert refused.value.status_code == 401
    # What activities.granted does to present per-task grants: a new HTTP object on the
    # service. A resource kept from before would still send the old token.
    service._http = drive_client(server.url, DEFAULT_READ_TOKEN, timeout=5)._http
    assert files_of(service).list().execute(num_retries=0)["files"] == []


def _http_error(status: int, *reasons: str) -> HttpError:
    body = {"error": {"code": status, "message": "m",
                      "errors": [{"reason": r, "domain": "global", "message": r}
                                 for r in reasons]}}
    return HttpError(httplib2.Response({"status": str(status)}), json.dumps(body).encode(),
                     uri="https://www.googleapis.com/x")


@pytest.mark.parametrize(("status", "reasons", "expected"), [
    (403, ("rateLimitExceeded",), Throttled),
    (403, ("quotaExceeded", "dailyLimitExceeded"), Throttled),
    # A 403 that names anything besides a rate limit is a credential a person must fix.
    (403, ("insufficientPermissions", "rateLimitExceeded"), Unauthorized),
    (403, ("rateLimitExceeded", "insufficientPermissions"), Unauthorized),
    (403, (), Unauthorized),
    (401, ("authError",), Unauthorized),
    (408, (), TargetUnavailable),
    (409, ("conflict",), Refused),
    (429, ("rateLimitExceeded",), Throttled),
    (502, (), TargetUnavailable),
    # Not a refusal: the write may have been applied, so the step stays in doubt.
    (308, (), TargetUnavailable),
])
def test_http_errors(status: int, reasons: tuple[str, ...], expected: type) -> None:
    error = google_error(_http_error(status, *reasons), "drive files.update f1")
    assert type(error) is expected
    assert str(error).startswith(f"drive files.update f1: HTTP {status} ")


@pytest.mark.parametrize("raised", [
    TimeoutError("timed out"), ConnectionResetError("reset"), ValueError("bad JSON"),
    UnexpectedBodyError("x", "y"), httplib2.ServerNotFoundError("no such host"),
])
def test_failures_without_an_answer_leave_the_step_in_doubt(raised: Exception) -> None:
    assert type(google_error(raised, "gmail.send")) is TargetUnavailable


def test_a_timeout_says_so() -> None:
    assert "no answer in time" in str(google_error(TimeoutError("timed out"), "gmail.send"))


def test_anything_else_is_a_bug_not_an_outcome() -> None:
    with pytest.raises(TypeError):
        google_error(RuntimeError("boom"), "gmail.send")
