"""Google Drive v3, the part of ``files`` that Tidemark uses: get, list with ``q``, update.

Routes (the Drive client reaches them with ``api_endpoint = <base>/drive/v3/``):

* ``GET   /drive/v3/files/{fileId}`` — ``fields`` is honoured for top-level names
  (``id,name,appProperties``, ``*``); without it Drive's default ``kind,id,name,mimeType``;
* ``GET   /drive/v3/files`` — ``q`` terms joined with ``and``: ``name = '…'``, ``name != '…'``,
  ``name contains '…'``, ``mimeType = '…'``, ``trashed = true|false``,
  ``appProperties has { key='k' and value='v' }``; ``pageSize`` / ``pageToken``; trashed files
  are listed unless the query excludes them, as on Drive;
* ``PATCH /drive/v3/files/{fileId}`` — ``name``, ``description``, ``trashed`` and
  ``appProperties`` (merged key by key; a null value deletes the key);
* ``GET   /drive/v3/about?fields=user`` — the token's user (``permissionId``,
  ``emailAddress``, ``displayName``); ``fields`` is required, as on Drive.

Users: every token acts as the Drive user of its ``account`` (``staging.core.Token``). A file
lives in its owner's Drive and is shared with other accounts by role; a user sees (get, list)
only files it has a role on, and anything else is Drive's 404 ``notFound``. An update by a user
whose role cannot edit is Drive's 403 ``insufficientFilePermissions``; by a ``drive.file``-only
token whose app was never granted the file, 403 ``appNotAuthorizedToFile``. Both are answers
about that one file: the credential is fine. Only a file's owner may trash it (``trashed``:
anyone else gets 403 ``insufficientFilePermissions``), and a trashed file is visible to its
owner alone, as Drive documents ("Trash or delete files and folders").

``appProperties`` are private to the requesting app, as on Drive: each file keeps them per OAuth
client (the token's ``client``), and get, list, ``appProperties has`` and update see and change
only those of the caller's client. Seeded files and control endpoints use the default client.

Errors have Google's shape, e.g. ``{"error": {"code": 404, "message": "File not found: X.",
"errors": [{"domain": "global", "reason": "notFound", ...}]}}``.

Scopes: writes need ``auth/drive`` or ``auth/drive.file``; reads also accept ``drive.readonly``,
``drive.metadata`` and ``drive.metadata.readonly``. Default tokens (``/_staging/reset`` keeps
them): ``staging-drive-write`` (``auth/drive``) and ``staging-drive-read``
(``auth/drive.metadata.readonly``).

Control endpoints:

* ``POST /_staging/drive/files`` ``{"id"?, "name", "trashed"?, "appProperties"?, "mimeType"?,
  "owner"?, "shared"?: {account: role}}`` seeds a file (in the default account's Drive unless
  ``owner`` says otherwise) and answers it in full;
* ``POST /_staging/drive/files/{id}/share`` ``{"account", "role"}`` gives an account a role on
  a file (``reader``, ``commenter``, ``writer`` …; null takes it away);
* ``POST /_staging/drive/users`` ``{"account", "emailAddress"?, "displayName"?,
  "permissionId"?}`` sets what ``about.get`` shows for an account (derived from its name
  otherwise: ``<account>@drive.staging.example``);
* ``POST /_staging/drive/files/{id}/third_party_rename`` ``{"name"}`` renames a file the way
  another user would: the name changes, our appProperties stamp does not.

Every ``files.update`` is recorded as an effect with the ``tidemark_key`` its body carried in
``appProperties``. Faults can be armed on ``files.update``, ``files.get`` and ``files.list``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from staging.core import DEFAULT_ACCOUNT, DEFAULT_CLIENT, Reply, Target, Token
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

DEFAULT_FIELDS = ("kind", "id", "name", "mimeType")  # what Drive v3 answers without `fields`
DEFAULT_PAGE_SIZE = 100  # Drive's default pageSize for files.list
MAX_PAGE_SIZE = 1000  # Drive's documented maximum pageSize
WRITABLE = frozenset({"name", "description", "trashed", "appProperties"})
ROLES = ("owner", "organizer", "fileOrganizer", "writer", "commenter", "reader")
EDIT_ROLES = frozenset({"owner", "organizer", "fileOrganizer", "writer"})
EMAIL_DOMAIN = "drive.staging.example"  # where a staging Drive user's address lives


@dataclass
class DriveFile:
    id: str
    name: str
    mime_type: str = "application/octet-stream"
    trashed: bool = False
    description: str | None = None
    # appProperties by OAuth client id: Drive shows and changes only the requesting app's own.
    app_properties_by_client: dict[str, dict[str, str]] = field(default_factory=dict)
    version: int = 1
    created: str = field(default_factory=lambda: _now())
    modified: str = field(default_factory=lambda: _now())
    # Who may see and change it: the owner, and the accounts it is shared with, by role.
    owner: str = DEFAULT_ACCOUNT
    shared: dict[str, str] = field(default_factory=dict)
    # The OAuth clients a user opened or created it with: all a ``drive.file`` token may touch.
    apps: set[str] = field(default_factory=lambda: {DEFAULT_CLIENT})

    def role_of(self, account: str) -> str | None:
        """The Drive role ``account`` has on this file; None if it is not shared with it."""
        return "owner" if account == self.owner else self.shared.get(account)

    def app_properties_of(self, client: str) -> dict[str, str]:
        """The appProperties ``client`` set on this file (a live dict, empty if none)."""
        return self.app_properties_by_client.setdefault(client, {})

    @property
    def app_properties(self) -> dict[str, str]:
        """The default client's appProperties: those our own tokens see."""
        return self.app_properties_of(DEFAULT_CLIENT)

    @app_properties.setter
    def app_properties(self, value: dict[str, str]) -> None:
        self.app_properties_by_client[DEFAULT_CLIENT] = value

    def resource(self, client: str = DEFAULT_CLIENT) -> dict[str, Any]:
        """The full Drive ``File`` resource (as with ``fields=*``) as ``client`` sees it."""
        out: dict[str, Any] = {
            "kind": "drive#file", "id": self.id, "name": self.name, "mimeType": self.mime_type,
            "trashed": self.trashed, "version": str(self.version),
            "createdTime": self.created, "modifiedTime": self.modified,
        }
        if self.description is not None:
            out["description"] = self.description
        props = self.app_properties_by_client.get(client)
        if props:
            out["appProperties"] = dict(props)
        return out


class DriveTarget(Target):
    """Files in memory, keyed by id, in creation order."""

    name = "drive"
    default_tokens = (
        Token(DEFAULT_WRITE_TOKEN, "drive", [SCOPE_DRIVE]),
        Token(DEFAULT_READ_TOKEN, "drive", [SCOPE_METADATA_READONLY]),
    )

    def __init__(self) -> None:
        super().__init__()
        self.files: dict[str, DriveFile] = {}
        self.users: dict[str, dict[str, Any]] = {}

    def reset(self) -> None:
        self.files = {}
        self.users = {}

    def user(self, account: str) -> dict[str, Any]:
        """The Drive ``User`` of ``account``, as ``about.get`` shows it to that user: set over
        ``/_staging/drive/users``, or derived from the account's name."""
        digest = hashlib.sha256(account.encode()).hexdigest()
        derived = {"kind": "drive#user", "displayName": account, "me": True,
                   "permissionId": str(int(digest, 16))[:20],
                   "emailAddress": f"{account}@{EMAIL_DOMAIN}"}
        return {**derived, **self.users.get(account, {})}

    def routes(self) -> Iterable[web.RouteDef]:
        return (
            web.get("/drive/v3/about", self._h_about),
            web.get("/drive/v3/files", self._h_list),
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
            return _google_error(
                401, "Request had invalid authentication credentials. Expected OAuth 2 access "
                "token, login cookie or other valid authentication credential. See "
                "https://developers.google.com/identity/sign-in/web/devconsole-project.",
                reason="authError", detail="Invalid Credentials", status="UNAUTHENTICATED",
                location=("header", "Authorization"),
                headers={"WWW-Authenticate": 'Bearer realm="https://accounts.google.com/", '
                                             'error="invalid_token"'})
        if status == 403 and code == "insufficient_scope":
            return _google_error(
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
            return _google_error(status, "The service is currently unavailable.",
                                 reason="backendError", status="UNAVAILABLE")
        return _google_error(status, message, reason=code)

    def _not_found(self, file_id: str) -> Reply:
        message = f"File not found: {file_id}."
        return Reply(_google_error(404, message, reason="notFound",
                                   location=("parameter", "fileId")))

    def _visible(self, file_id: str, tok: Token) -> DriveFile:
        """The file, if the token's user can see it; Drive's 404 otherwise (Drive does not
        tell a file you may not see from one that does not exist). A trashed file is visible
        to its owner only: "other users can't view files in the owner's trash" (Drive API
        guide, "Trash or delete files and folders")."""
        f = self.files.get(file_id)
        role = f.role_of(tok.account) if f is not None else None
        if f is None or role is None or (f.trashed and role != "owner"):
            raise self._not_found(file_id)
        return f

    def _may_edit(self, f: DriveFile, tok: Token) -> None:
        """Drive's 403 answers about one file: the user's role on it does not allow editing
        (``insufficientFilePermissions``), or a ``drive.file`` token's app was never granted
        this file (``appNotAuthorizedToFile``). The credential itself is fine."""
        if f.role_of(tok.account) not in EDIT_ROLES:
            message = f"The user does not have sufficient permissions for file {f.id}."
            raise Reply(_google_error(403, message, reason="insufficientFilePermissions"))
        if SCOPE_DRIVE not in tok.scopes and tok.client not in f.apps:
            message = (f"The user has not granted the app {tok.client} write access to the "
                       f"file {f.id}.")
            raise Reply(_google_error(403, message, reason="appNotAuthorizedToFile",
                                      location=("header", "Authorization")))

    def _invalid(self, location: str, message: str = "Invalid Value") -> Reply:
        return Reply(_google_error(400, message, reason="invalid",
                                   location=("parameter", location)))

    # Drive API ------------------------------------------------------------------------------

    async def _h_get(self, request: web.Request) -> web.Response:
        tok = self.authorize(request, *READ_SCOPES)
        await self.before_write(request, "files.get")
        f = self._visible(request.match_info["file_id"], tok)
        return web.json_response(_select(f.resource(tok.client), request.query.get("fields"),
                                         DEFAULT_FIELDS))

    async def _h_about(self, request: web.Request) -> web.Response:
        tok = self.authorize(request, *READ_SCOPES)
        fields = request.query.get("fields")
        if not fields:
            raise Reply(_google_error(400, "The 'fields' parameter is required for this method.",
                                      reason="required", location=("parameter", "fields")))
        about = {"kind": "drive#about", "user": self.user(tok.account)}
        return web.json_response(_select(about, fields, ()))

    async def _h_list(self, request: web.Request) -> web.Response:
        tok = self.authorize(request, *READ_SCOPES)
        await self.before_write(request, "files.list")
        try:
            match = parse_query(request.query.get("q", ""), tok.client)
        except ValueError:
            raise self._invalid("q") from None
        try:
            size = int(request.query.get("pageSize", DEFAULT_PAGE_SIZE))
            start = _decode_page_token(request.query.get("pageToken"))
        except ValueError:
            raise self._invalid("pageSize") from None
        if not 1 <= size <= MAX_PAGE_SIZE:
            raise self._invalid("pageSize")
        hits = [f for f in self.files.values() if f.role_of(tok.account) is not None
                and (not f.trashed or f.role_of(tok.account) == "owner") and match(f)]
        page = hits[start:start + size]
        body: dict[str, Any] = {"kind": "drive#fileList", "incompleteSearch": False,
                                "files": [f.resource(tok.client) for f in page]}
        if start + size < len(hits):
            body["nextPageToken"] = _encode_page_token(start + size)
        fields = request.query.get("fields")
        if fields is None:
            body["files"] = [_select(r, None, DEFAULT_FIELDS) for r in body["files"]]
            return web.json_response(body)
        return web.json_response(_select(body, fields, ()))

    async def _h_update(self, request: web.Request) -> web.Response:
        tok = self.authorize(request, *WRITE_SCOPES)
        file_id = request.match_info["file_id"]
        try:
            patch = await request.json() if request.can_read_body else {}
        except json.JSONDecodeError:
            raise Reply(_google_error(400, "Parse Error", reason="parseError")) from None
        if not isinstance(patch, dict):
            raise Reply(_google_error(400, "Parse Error", reason="parseError"))
        unwritable = sorted(set(patch) - WRITABLE)
        if unwritable:
            raise Reply(_google_error(
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
            raise Reply(_google_error(403, message, reason="insufficientFilePermissions"))
        fault = await self.before_write(request, "files.update")
        f = self._visible(file_id, tok)
        old_name = f.name
        if "name" in patch:
            f.name = str(patch["name"])
        if "description" in patch:
            f.description = patch["description"]
        if "trashed" in patch:
            f.trashed = bool(patch["trashed"])
        own = f.app_properties_of(tok.client)
        for k, v in (props or {}).items():
            if v is None:
                own.pop(k, None)
            else:
                own[k] = _prop_str(v)
        f.version += 1
        f.modified = _now()
        key = (props or {}).get(STAMP_PROPERTY)
        self.record("files.update", key if isinstance(key, str) else None, file_id=file_id,
                    old_name=old_name, name=f.name, app_properties=props or {},
                    client=tok.client)
        self.after_commit(request, fault)
        return web.json_response(_select(f.resource(tok.client), request.query.get("fields"),
                                         DEFAULT_FIELDS))

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
        f.modified = _now()
        # Someone else's edit is a side effect too; it carries no key of ours.
        self.record("third_party.rename", None, file_id=f.id, old_name=old_name, name=f.name)
        return web.json_response(f.resource())

    def seed(self, name: str, *, file_id: str | None = None, trashed: bool = False,
             app_properties: dict[str, str] | None = None,
             mime_type: str = "application/octet-stream", owner: str = DEFAULT_ACCOUNT,
             shared: dict[str, str] | None = None) -> DriveFile:
        """Adds a file (replacing one with the same id) and returns it. ``owner`` is the
        account whose Drive it is in; ``shared`` gives other accounts a role on it."""
        f = DriveFile(id=file_id or _new_file_id(), name=name, mime_type=mime_type,
                      trashed=trashed, owner=owner, shared=dict(shared or {}))
        f.app_properties = {k: _prop_str(v) for k, v in (app_properties or {}).items()}
        with self.staging.lock:
            self.files[f.id] = f
        return f


# -- the `q` language, the subset we use ------------------------------------------------------

_TOKEN = re.compile(r"""\s*(?:
    (?P<str>'(?:[^'\\]|\\.)*')
  | (?P<op>!=|=|\{|\})
  | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
)""", re.VERBOSE)


def _tokens(q: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(q):
        if q[pos:].strip() == "":
            break
        m = _TOKEN.match(q, pos)
        if m is None:
            raise ValueError(f"cannot read the query at {q[pos:]!r}")
        kind = m.lastgroup or ""
        text = m.group(kind)
        if kind == "str":
            text = re.sub(r"\\(.)", r"\1", text[1:-1])
        out.append((kind, text))
        pos = m.end()
    return out


Predicate = Callable[[DriveFile], bool]


class _Cursor:
    """The tokens of a ``q`` and how far they have been read."""

    def __init__(self, toks: list[tuple[str, str]]) -> None:
        self.toks = toks
        self.i = 0

    def more(self) -> bool:
        return self.i < len(self.toks)

    def next_kind(self) -> str:
        return self.toks[self.i][0]

    def take(self, kind: str, text: str | None = None) -> str:
        """The next token's text, which must be of ``kind`` (and read ``text``, any case)."""
        toks, i = self.toks, self.i
        if i >= len(toks) or toks[i][0] != kind or (text is not None and
                                                    toks[i][1].lower() != text.lower()):
            raise ValueError(f"expected {text or kind} at token {i}")
        self.i += 1
        return toks[i][1]

    def expect(self, *words: tuple[str, str]) -> None:
        """Reads a fixed sequence of (kind, text) tokens."""
        for kind, text in words:
            self.take(kind, text)


def parse_query(q: str, client: str = DEFAULT_CLIENT) -> Predicate:
    """Compiles a Drive ``q`` of terms joined with ``and`` into a predicate, for a caller of
    OAuth client ``client`` (``appProperties has`` matches only that client's properties).

    Raises:
        ValueError: the query uses something outside the supported subset.
    """
    cur = _Cursor(_tokens(q))
    preds: list[Predicate] = []
    while cur.more():
        if preds:
            cur.take("word", "and")
        fld = cur.take("word")
        term = _TERMS.get(fld)
        if term is None:
            raise ValueError(f"field {fld} is not supported")
        preds.append(term(cur, fld, client))
    return lambda f: all(p(f) for p in preds)


def _app_properties_term(cur: _Cursor, fld: str, client: str) -> Predicate:
    """``appProperties has { key='k' and value='v' }``, on ``client``'s own properties."""
    cur.expect(("word", "has"), ("op", "{"), ("word", "key"), ("op", "="))
    k = cur.take("str")
    cur.expect(("word", "and"), ("word", "value"), ("op", "="))
    v = cur.take("str")
    cur.take("op", "}")
    return lambda f: f.app_properties_by_client.get(client, {}).get(k) == v


def _text_term(cur: _Cursor, fld: str, client: str) -> Predicate:
    """``name`` or ``mimeType`` with ``=`` or ``!=``; ``name contains``."""
    attr = "name" if fld == "name" else "mime_type"
    op = cur.take("word", "contains") if cur.next_kind() == "word" else cur.take("op")
    s = cur.take("str")
    if op == "=":
        return lambda f: bool(getattr(f, attr) == s)
    if op == "!=":
        return lambda f: bool(getattr(f, attr) != s)
    if op.lower() == "contains" and fld == "name":
        # Drive matches `contains` on name prefixes of words; a substring test is
        # looser but never misses what Drive would find.
        return lambda f: s.lower() in f.name.lower()
    raise ValueError(f"operator {op} is not supported on {fld}")


def _trashed_term(cur: _Cursor, fld: str, client: str) -> Predicate:
    """``trashed = true|false`` (or ``!=``)."""
    op = cur.take("op")
    value = cur.take("word").lower()
    if op not in ("=", "!=") or value not in ("true", "false"):
        raise ValueError("trashed takes = or != and true or false")
    want = (value == "true") == (op == "=")
    return lambda f: f.trashed is want


# The fields a ``q`` may name, each with the parser of its term (after the field's name).
_TERMS: dict[str, Callable[[_Cursor, str, str], Predicate]] = {
    "appProperties": _app_properties_term,
    "name": _text_term,
    "mimeType": _text_term,
    "trashed": _trashed_term,
}


# -- helpers ----------------------------------------------------------------------------------

def _google_error(http_status: int, message: str, *, reason: str, detail: str | None = None,
                  status: str | None = None, location: tuple[str, str] | None = None,
                  extra: dict[str, Any] | None = None,
                  headers: dict[str, str] | None = None) -> web.Response:
    """Google's JSON error body. ``detail`` is the per-error message when it differs from the
    top-level one; ``status`` the RPC status name that newer Google front ends add."""
    item: dict[str, Any] = {"message": detail or message, "domain": "global", "reason": reason}
    if location is not None:
        item["locationType"], item["location"] = location
    err: dict[str, Any] = {"code": http_status, "message": message, "errors": [item]}
    if status:
        err["status"] = status
    err.update(extra or {})
    return web.json_response({"error": err}, status=http_status, headers=headers)


def _split_top(fields: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in fields:
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
            continue
        depth += (ch == "(") - (ch == ")")
        cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def _select(resource: dict[str, Any], fields: str | None,
            default: tuple[str, ...]) -> dict[str, Any]:
    """Applies a partial-response ``fields`` selection loosely: top-level names, ``*``,
    ``name(sub,fields)`` and ``name/sub`` on lists of objects; unknown names are ignored."""
    if fields is None:
        return {k: v for k, v in resource.items() if k in default}
    out: dict[str, Any] = {}
    for part in _split_top(fields):
        if part == "*":
            return dict(resource)
        m = re.fullmatch(r"([A-Za-z]+)(?:\((.*)\)|/(.+))?", part)
        if m is None or m.group(1) not in resource:
            continue
        name, sub = m.group(1), m.group(2) or m.group(3)
        value = resource[name]
        if sub and isinstance(value, list):
            value = [_select(v, sub, ()) if isinstance(v, dict) else v for v in value]
        elif sub and isinstance(value, dict) and name != "appProperties":
            value = _select(value, sub, ())
        out[name] = value
    return out


def _prop_str(v: object) -> str:
    return json.dumps(v) if isinstance(v, bool) else str(v)


def _encode_page_token(offset: int) -> str:
    return base64.urlsafe_b64encode(f"offset:{offset}".encode()).decode()


def _decode_page_token(token: str | None) -> int:
    if not token:
        return 0
    text = base64.urlsafe_b64decode(token.encode()).decode()
    if not text.startswith("offset:"):
        raise ValueError("bad page token")
    return int(text.removeprefix("offset:"))


def _new_file_id() -> str:
    # Drive ids are 33 characters of base64url-ish text starting with "1".
    return "1" + secrets.token_urlsafe(24)[:32]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
