"""``drive.rename`` {file_id, name}: give a Drive file a name, stamped with the step's key.

Reversible and an end state. The one ``files.update`` both renames the file and writes
``appProperties.tidemark_key = <key>``, so the probe can tell our rename from anyone else's.
Compensation puts the before_state name (and stamp) back, but only while the file is still as we
left it.

Clients come from ``drive_client``: the real google-api-python-client over an HTTP transport
that sends every request exactly once (see ``OneShotHttp``) and gives up after a timeout, so a
lost answer surfaces as ``TargetUnavailable`` and the journal, not the library, decides what
happens next.
"""

from __future__ import annotations

import gzip
import http.client
import urllib.parse
import zlib
from typing import Any, ClassVar

import google.oauth2.credentials
import google_auth_httplib2
import httplib2
from googleapiclient.discovery import build

from probes.drive import CLIENT_ERRORS, STAMP, DriveRenameProbe, google_error
from tidemark.actions import Action, Arg, ProbeResult, StepContext, nonempty_str
from tidemark.errors import Refused

DEFAULT_TIMEOUT = 30.0  # seconds; Drive metadata calls answer well under a second, so 30 s
#                         only ever cuts off a response that is lost, not one that is slow


class OneShotHttp:
    """An ``httplib2.Http`` stand-in that sends each request exactly once.

    httplib2 silently re-sends a request (even a PATCH or POST) when the connection drops before
    the status line arrives — exactly the "committed, then the answer was lost" case. A re-send
    behind our back turns one in-doubt write into two writes, so this transport opens a fresh
    connection per request and lets the failure surface instead.

    Args:
        timeout: Seconds to wait for connecting and for each read.
    """

    def __init__(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.timeout = timeout
        # Attributes google_auth_httplib2.AuthorizedHttp forwards to the wrapped http.
        self.follow_redirects = False
        self.redirect_codes: frozenset[int] = frozenset()
        self.connections: dict[str, Any] = {}

    def request(self, uri: str, method: str = "GET", body: bytes | str | None = None,
                headers: dict[str, str] | None = None, redirections: int = 0,
                connection_type: Any = None) -> tuple[httplib2.Response, bytes]:
        parts = urllib.parse.urlsplit(uri)
        conn_class = (http.client.HTTPSConnection if parts.scheme == "https"
                      else http.client.HTTPConnection)
        conn = conn_class(parts.hostname or "", parts.port, timeout=self.timeout)
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        if isinstance(body, str):
            body = body.encode("utf-8")
        try:
            conn.request(method, target, body=body, headers=dict(headers or {}))
            raw = conn.getresponse()
            content = raw.read()
        finally:
            conn.close()
        response = httplib2.Response(raw)
        encoding = response.get("content-encoding", "")
        if encoding == "gzip":
            content = gzip.decompress(content)
        elif encoding == "deflate":
            content = zlib.decompress(content, -zlib.MAX_WBITS)
        return response, content

    def close(self) -> None:
        """Nothing to close: connections are not kept."""


def drive_client(base_url: str, token: str, *, timeout: float = DEFAULT_TIMEOUT) -> Any:
    """A Drive v3 service for ``base_url`` (a staging server's URL, or
    ``https://www.googleapis.com``) authorised with the bearer ``token``.

    401 answers are not turned into a token refresh (the token is handed in, there is nothing to
    refresh with): they surface as errors, and the action maps them to ``Unauthorized``.
    """
    credentials = google.oauth2.credentials.Credentials(token)
    http = google_auth_httplib2.AuthorizedHttp(credentials, http=OneShotHttp(timeout),
                                               refresh_status_codes=())
    return build("drive", "v3", http=http, static_discovery=True, cache_discovery=False,
                 client_options={"api_endpoint": base_url.rstrip("/") + "/drive/v3/"})


class DriveRename(Action):
    """Renames a Drive file by id and stamps the step's key into its appProperties.

    Args:
        writer: Drive service with a write scope (``auth/drive`` or ``auth/drive.file``).
        reader: Drive service with a read-only scope, for the probe, snapshot and gates.
    """

    name = "drive.rename"
    irreversible = False
    args: ClassVar[dict[str, Arg]] = {
        "file_id": Arg(str, check=nonempty_str),
        # Drive accepts any non-empty name, slashes included.
        "name": Arg(str, check=nonempty_str),
    }

    def __init__(self, writer: Any, reader: Any) -> None:
        self.writer = writer
        self.reads = DriveRenameProbe(reader)

    @classmethod
    def describe(cls, args: dict[str, Any]) -> str:
        return f"{args.get('file_id')} -> {args.get('name')}"

    def preconditions(self, ctx: StepContext) -> None:
        self.reads.preconditions(ctx)

    def snapshot(self, ctx: StepContext) -> dict[str, Any]:
        return self.reads.snapshot(ctx)

    def probe(self, ctx: StepContext) -> ProbeResult:
        return self.reads.probe(ctx)

    def execute(self, ctx: StepContext) -> dict[str, Any]:
        file_id = ctx.args["file_id"]
        f = self._update(file_id, {"name": ctx.args["name"], "appProperties": {STAMP: ctx.key}})
        return {"file_id": file_id, "name": f.get("name"),
                "tidemark_key": (f.get("appProperties") or {}).get(STAMP)}

    def compensate(self, ctx: StepContext) -> dict[str, Any]:
        """Restores the before_state name and stamp, if the file is still as this step left it.

        Raises:
            Refused: the file changed since (renamed, re-stamped or deleted by someone else);
                restoring would overwrite their change.
        """
        file_id, target = ctx.args["file_id"], ctx.args["name"]
        before = ctx.before_state or {}
        if "name" not in before:
            raise Refused(f"drive file {file_id}: no before_state name to restore")
        old_stamp = (before.get("app_properties") or {}).get(STAMP)
        f = self.reads.read(file_id)
        if f is None:
            raise Refused(f"drive file {file_id} no longer exists; nothing to restore")
        name, stamp = f.get("name"), (f.get("appProperties") or {}).get(STAMP)
        if name == before["name"] and stamp == old_stamp:
            # Already restored (an earlier attempt of this compensation got through).
            return {"file_id": file_id, "name": name, "tidemark_key": stamp}
        if name != target or stamp != ctx.key:
            raise Refused(f"drive file {file_id} is no longer as this step left it (named "
                          f"{name!r}, stamp {stamp!r}; we left {target!r}, {ctx.key}): "
                          "someone else changed it, so it is not put back")
        restored = self._update(file_id, {"name": before["name"],
                                          "appProperties": {STAMP: old_stamp}})
        return {"file_id": file_id, "name": restored.get("name"),
                "tidemark_key": (restored.get("appProperties") or {}).get(STAMP)}

    def _update(self, file_id: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            return self.writer.files().update(
                fileId=file_id, body=body, fields="id,name,appProperties").execute(num_retries=0)
        except CLIENT_ERRORS as e:
            raise google_error(e, f"drive files.update {file_id}") from e
