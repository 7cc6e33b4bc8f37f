"""DriveTarget: the emulated Drive v3 ``files`` and ``about`` routes.

Also its default tokens, Google's error answers and the control endpoints that seed files, users
and shares."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from aiohttp import web

from staging.core import DEFAULT_ACCOUNT, DEFAULT_CLIENT, Reply, Switch, Target, Token
from staging.drive.files import EDIT_ROLES, ROLES, DriveFile, new_file_id, now, prop_str
from staging.drive.query import parse_query
from staging.drive.responses import (
    DEFAULT_FIELDS,
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    decode_page_token,
    encode_page_token,
    google_error,
    select_fields,
)
from staging.throttle import GOOGLE_STATUS, google_status_switch, google_throttled, rate_switch
from tidemark import staging_tokens

SCOPE_DRIVE = "https://www.googleapis.com/auth/drive"
SCOPE_DRIVE_FILE = "https://www.googleapis.com/auth/drive.file"
SCOPE_DRIVE_READONLY = "https://www.googleapis.com/auth/drive.readonly"
SCOPE_METADATA = "https://www.googleapis.com/auth/drive.metadata"
SCOPE_METADATA_READONLY = "https://www.googleapis.com/auth/drive.metadata.readonly"
WRITE_SCOPES = (SCOPE_DRIVE, SCOPE_DRIVE_FILE)
READ_SCOPES = (*WRITE_SCOPES, SCOPE_DRIVE_READONLY, SCOPE_METADATA, SCOPE_METADATA_READONLY)

DEFAULT_WRITE_TOKEN = staging_tokens.DRIVE_WRITE
DEFAULT_READ_TOKEN = staging_tokens.DRIVE_READ

STAMP_PROPERTY = "tidemark_key"  # the appProperties key whose value is recorded with effects

WRITABLE = frozenset({"name", "description", "trashed", "appProperties"})
EMAIL_DOMAIN = "drive.staging.example"  # where a staging Drive user's address lives


class DriveTarget(Target):
    """Files in memory, keyed by id, in creation order."""

    name = "drive"
    default_tokens = (
        Token(DEFAULT_WRITE_TOKEN, "drive", [SCOPE_DRIVE]),
        Token(DEFAULT_READ_TOKEN, "drive", [SCOPE_METADATA_READONLY]),
    )
    switches = (
        rate_switch("Drive", "Drive's Usage limits: 403 User rate limit exceeded past a quota, "
                             "429 Too many requests from the backend's own checks."),
        google_status_switch("Drive's Usage limits (developers.google.com/drive/api/guides/"
                             "limits)"),
        Switch("app_properties_visible_to", default="writing_client", worst="writing_client",
               choices=("writing_client", "project"),
               doc="Which OAuth clients see the appProperties a client set. Drive's 'Add custom "
                   "file properties': appProperties are restricted to the app that set them "
                   "(properties are visible to all apps). Worst, and the default: only the "
                   "writing OAuth client id, so a read token issued to another client sees "
                   "no stamp; 'project': every client of the emulator shares them."),
    )

    def __init__(self) -> None:
        super().__init__()
        self.files: dict[str, DriveFile] = {}
        self.users: dict[str, dict[str, Any]] = {}

    def reset(self) -> None:
        self.files = {}
        self.users = {}

    def user(self, account: str) -> dict[str, Any]:
        """The Drive ``User`` of ``account``, as ``about.get`` shows it to that user.

        It is set over ``/_staging/drive/users``, or derived from the account's name."""
        digest = hashlib.sha256(account.encode()).hexdigest()
        derived = {"kind": "drive#user", "displayName": account, "me": True,
                   "permissionId": str(int(digest, 16))[:20],
                   "emailAddress": f"{account}@{EMAIL_DOMAIN}"}
        return {**derived, **self.users.get(account, {})}

    def routes(self) -> Iterable[web.RouteDef]:
        return (
            web.get("/drive/v3/about", self._h_about),
            web.get("/drive/v3/files", self._h_list),
            web.post("/drive/v3/files", self._h_create),
            web.get("/drive/v3/files/{file_id}", self._h_get),
            web.patch("/drive/v3/files/{file_id}", self._h_update),
            web.post("/_staging/drive/files", self._h_seed),
            web.post("/_staging/drive/users", self._h_add_user),
            web.post("/_staging/drive/files/{file_id}/share", self._h_share),
            web.post("/_staging/drive/files/{file_id}/third_party_rename",
                     self._h_third_party_rename),
        )

    # Google's error shapes --------------------------------------------------------------------

    def error(self, status: int, code: str, message: str) -> web.Response:
        """Maps the core's generic failures onto what Google answers for them."""
        if status == 401:
            return google_error(
                401, "Request had invalid authentication credentials. Expected OAuth 2 access "
                "token, login cookie or other valid authentication credential. See "
                "https://developers.google.com/identity/sign-in/web/devconsole-project.",
                reason="authError", detail="Invalid Credentials", status="UNAUTHENTICATED",
                location=("header", "Authorization"),
                headers={"WWW-Authenticate": 'Bearer realm="https://accounts.google.com/", '
                                             'error="invalid_token"'})
        if status == 403 and code == "insufficient_scope":
            return google_error(
                403, "Request had insufficient authentication scopes.",
                reason="insufficientPermissions", detail="Insufficient Permission",
                status="PERMISSION_DENIED",
                extra={"details": [{
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": "ACCESS_TOKEN_SCOPE_INSUFFICIENT", "domain": "googleapis.com",
                    "metadata": {"service": "drive.googleapis.com"}}]},
                headers={"WWW-Authenticate": 'Bearer realm="https://accounts.google.com/", '
                                             'error="insufficient_scope"'})
        if status >= 500:
            return google_error(status, "The service is currently unavailable.",
                                 reason="backendError", status="UNAVAILABLE")
        return google_error(status, message, reason=code)

    def throttled(self, op: str) -> web.Response:
        return google_throttled(self.switch(GOOGLE_STATUS))

    def _client(self, tok: Token) -> str:
        """Whose appProperties ``tok`` sees and writes (``app_properties_visible_to``)."""
        return tok.client if self.switch("app_properties_visible_to") == "writing_client" \
            else DEFAULT_CLIENT

    def _not_found(self, file_id: str) -> Reply:
        message = f"File not found: {file_id}."
        return Reply(google_error(404, message, reason="notFound",
                                   location=("parameter", "fileId")))

    def _visible(self, file_id: str, tok: Token) -> DriveFile:
        """The file, if the token's user can see it; Drive's 404 otherwise.

        Drive does not tell a file you may not see from one that does not exist. A trashed file
        is visible to its owner only: "other users can't view files in the owner's trash" (Drive
        API guide, "Trash or delete files and folders")."""
        f = self.files.get(file_id)
        role = f.role_of(tok.account) if f is not None else None
        if f is None or role is None or (f.trashed and role != "owner"):
            raise self._not_found(file_id)
        return f

    def _may_edit(self, f: DriveFile, tok: Token) -> None:
        """Drive's 403 answers about one file; the credential itself is fine.

        Either the user's role on it does not allow editing (``insufficientFilePermissions``),
        or a ``drive.file`` token's app was never granted this file
        (``appNotAuthorizedToFile``)."""
        if f.role_of(tok.account) not in EDIT_ROLES:
            message = f"The user does not have sufficient permissions for file {f.id}."
            raise Reply(google_error(403, message, reason="insufficientFilePermissions"))
        if SCOPE_DRIVE not in tok.scopes and tok.client not in f.apps:
            message = (f"The user has not granted the app {tok.client} write access to the "
                       f"file {f.id}.")
            raise Reply(google_error(403, message, reason="appNotAuthorizedToFile",
                                      location=("header", "Authorization")))

    def _invalid(self, location: str, message: str = "Invalid Value") -> Reply:
        return Reply(google_error(400, message, reason="invalid",
                                   location=("parameter", location)))

    # Drive API ------------------------------------------------------------------------------

    async def _h_get(self, request: web.Request) -> web.Response:
        tok = self.authorize(request, *READ_SCOPES)
        await self.before_write(request, "files.get")
        f = self._visible(request.match_info["file_id"], tok)
        return web.json_response(select_fields(f.resource(self._client(tok)),
                                               request.query.get("fields"), DEFAULT_FIELDS))

    async def _h_about(self, request: web.Request) -> web.Response:
        tok = self.authorize(request, *READ_SCOPES)
        fields = request.query.get("fields")
        if not fields:
            raise Reply(google_error(400, "The 'fields' parameter is required for this method.",
                                      reason="required", location=("parameter", "fields")))
        about = {"kind": "drive#about", "user": self.user(tok.account)}
        return web.json_response(select_fields(about, fields, ()))

    async def _h_list(self, request: web.Request) -> web.Response:
        tok = self.authorize(request, *READ_SCOPES)
        await self.before_write(request, "files.list")
        try:
            match = parse_query(request.query.get("q", ""), self._client(tok))
        except ValueError:
            raise self._invalid("q") from None
        try:
            size = int(request.query.get("pageSize", DEFAULT_PAGE_SIZE))
            start = decode_page_token(request.query.get("pageToken"))
        except ValueError:
            raise self._invalid("pageSize") from None
        if not 1 <= size <= MAX_PAGE_SIZE:
            raise self._invalid("pageSize")
        hits = [f for f in self.files.values() if f.role_of(tok.account) is not None
                and (not f.trashed or f.role_of(tok.account) == "owner") and match(f)]
        page = hits[start:start + size]
        body: dict[str, Any] = {"kind": "drive#fileList", "incompleteSearch": False,
                                "files": [f.resource(self._client(tok)) for f in page]}
        if start + size < len(hits):
            body["nextPageToken"] = encode_page_token(start + size)
        fields = request.query.get("fields")
        if fields is None:
            body["files"] = [select_fields(r, None, DEFAULT_FIELDS) for r in body["files"]]
            return web.json_response(body)
        return web.json_response(select_fields(body, fields, ()))

    async def _h_update(self, request: web.Request) -> web.Response:
        tok = self.authorize(request, *WRITE_SCOPES)
        file_id = request.match_info["file_id"]
        try:
            patch = await request.json() if request.can_read_body else {}
        except json.JSONDecodeError:
            raise Reply(google_error(400, "Parse Error", reason="parseError")) from None
        if not isinstance(patch, dict):
            raise Reply(google_error(400, "Parse Error", reason="parseError"))
        unwritable = sorted(set(patch) - WRITABLE)
        if unwritable:
            raise Reply(google_error(
                403, "The resource body includes fields which are not directly writable.",
                reason="fieldNotWritable"))
        props = patch.get("appProperties")
        if props is not None and not (isinstance(props, dict) and all(
                v is None or isinstance(v, str | int | float | bool) for v in props.values())):
            raise self._invalid("appProperties")
        visible = self._visible(file_id, tok)
        self._may_edit(visible, tok)
        if "trashed" in patch and visible.role_of(tok.account) != "owner":
            # "Only the file owner can trash a file ... If you attempt to trash a file you
            # don't own, you receive an insufficientFilePermissions error" (Drive API guide,
            # "Trash or delete files and folders"; My Drive files, which is all we emulate).
            message = f"The user does not have sufficient permissions for file {file_id}."
            raise Reply(google_error(403, message, reason="insufficientFilePermissions"))
        fault = await self.before_write(request, "files.update")
        f = self._visible(file_id, tok)
        old_name = f.name
        if "name" in patch:
            f.name = str(patch["name"])
        if "description" in patch:
            f.description = patch["description"]
        if "trashed" in patch:
            f.trashed = bool(patch["trashed"])
        own = f.app_properties_of(self._client(tok))
        for k, v in (props or {}).items():
            if v is None:
                own.pop(k, None)
            else:
                own[k] = prop_str(v)
        f.version += 1
        f.modified = now()
        key = (props or {}).get(STAMP_PROPERTY)
        self.record("files.update", key if isinstance(key, str) else None, file_id=file_id,
                    old_name=old_name, name=f.name, app_properties=props or {},
                    client=tok.client)
        self.after_commit(request, fault)
        return web.json_response(select_fields(f.resource(self._client(tok)),
                                               request.query.get("fields"), DEFAULT_FIELDS))

    async def _h_create(self, request: web.Request) -> web.Response:
        """``files.create`` of a file without content (metadata only).

        The file is the token's user's, and the creating app may open it (``drive.file``)."""
        tok = self.authorize(request, *WRITE_SCOPES)
        try:
            body = await request.json() if request.can_read_body else {}
        except json.JSONDecodeError:
            raise Reply(google_error(400, "Parse Error", reason="parseError")) from None
        if not isinstance(body, dict) or not isinstance(body.get("name", "Untitled"), str):
            raise Reply(google_error(400, "Parse Error", reason="parseError"))
        fault = await self.before_write(request, "files.create")
        f = self.seed(body.get("name", "Untitled"), owner=tok.account,
                      mime_type=str(body.get("mimeType", "application/octet-stream")))
        f.apps.add(tok.client)
        own = f.app_properties_of(self._client(tok))
        own.update({k: prop_str(v) for k, v in (body.get("appProperties") or {}).items()})
        self.record("files.create", None, file_id=f.id, name=f.name, client=tok.client)
        self.after_commit(request, fault)
        return web.json_response(select_fields(f.resource(self._client(tok)),
                                               request.query.get("fields"), DEFAULT_FIELDS))

    # control ---------------------------------------------------------------------------------

    async def _h_seed(self, request: web.Request) -> web.Response:
        body = await request.json()
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            return web.json_response({"error": "a file needs a string 'name'"}, status=400)
        f = self.seed(body["name"], file_id=body.get("id"), trashed=bool(body.get("trashed")),
                      app_properties=body.get("appProperties"),
                      mime_type=body.get("mimeType", "application/octet-stream"),
                      owner=str(body.get("owner", DEFAULT_ACCOUNT)),
                      shared=body.get("shared"))
        return web.json_response(f.resource())

    async def _h_add_user(self, request: web.Request) -> web.Response:
        body = await request.json()
        if not isinstance(body, dict) or not isinstance(body.get("account"), str):
            return web.json_response({"error": "a user needs a string 'account'"}, status=400)
        known = {k: str(body[k]) for k in ("displayName", "permissionId", "emailAddress")
                 if k in body}
        with self.staging.lock:
            self.users[body["account"]] = known
        return web.json_response(self.user(body["account"]))

    async def _h_share(self, request: web.Request) -> web.Response:
        body = await request.json()
        f = self.files.get(request.match_info["file_id"])
        if f is None:
            return web.json_response({"error": "no such file"}, status=404)
        role = body.get("role")
        if role is not None and role not in ROLES:
            return web.json_response({"error": f"role must be one of {ROLES} or null"},
                                     status=400)
        with self.staging.lock:
            if role is None:
                f.shared.pop(str(body["account"]), None)
            else:
                f.shared[str(body["account"])] = role
        return web.json_response({"id": f.id, "owner": f.owner, "shared": f.shared})

    async def _h_third_party_rename(self, request: web.Request) -> web.Response:
        body = await request.json()
        f = self.files.get(request.match_info["file_id"])
        if f is None:
            return web.json_response({"error": "no such file"}, status=404)
        old_name = f.name
        f.name = str(body["name"])
        f.version += 1
        f.modified = now()
        # Someone else's edit is a side effect too; it carries no key of ours.
        self.record("third_party.rename", None, file_id=f.id, old_name=old_name, name=f.name)
        return web.json_response(f.resource())

    def seed(self, name: str, *, file_id: str | None = None, trashed: bool = False,
             app_properties: dict[str, str] | None = None,
             mime_type: str = "application/octet-stream", owner: str = DEFAULT_ACCOUNT,
             shared: dict[str, str] | None = None) -> DriveFile:
        """Adds a file (replacing one with the same id) and returns it.

        ``owner`` is the account whose Drive it is in; ``shared`` gives other accounts a role on
        it."""
        f = DriveFile(id=file_id or new_file_id(), name=name, mime_type=mime_type,
                      trashed=trashed, owner=owner, shared=dict(shared or {}))
        f.app_properties = {k: prop_str(v) for k, v in (app_properties or {}).items()}
        with self.staging.lock:
            self.files[f.id] = f
        return f
