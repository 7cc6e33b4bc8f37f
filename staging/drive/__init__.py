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

The package, by concern: ``files`` (the files, roles and appProperties), ``query`` (``q``),
``responses`` (Google's errors, ``fields``, page tokens) and ``target`` (DriveTarget: the
routes, auth answers and control endpoints).
"""

from staging.drive.files import EDIT_ROLES, ROLES, DriveFile
from staging.drive.query import Predicate, parse_query
from staging.drive.responses import DEFAULT_FIELDS, DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE
from staging.drive.target import (
    DEFAULT_READ_TOKEN,
    DEFAULT_WRITE_TOKEN,
    EMAIL_DOMAIN,
    READ_SCOPES,
    SCOPE_DRIVE,
    SCOPE_DRIVE_FILE,
    SCOPE_DRIVE_READONLY,
    SCOPE_METADATA,
    SCOPE_METADATA_READONLY,
    STAMP_PROPERTY,
    WRITABLE,
    WRITE_SCOPES,
    DriveTarget,
)

__all__ = [
    "DEFAULT_FIELDS", "DEFAULT_PAGE_SIZE", "DEFAULT_READ_TOKEN", "DEFAULT_WRITE_TOKEN",
    "EDIT_ROLES", "EMAIL_DOMAIN", "MAX_PAGE_SIZE", "READ_SCOPES", "ROLES", "SCOPE_DRIVE",
    "SCOPE_DRIVE_FILE", "SCOPE_DRIVE_READONLY", "SCOPE_METADATA", "SCOPE_METADATA_READONLY",
    "STAMP_PROPERTY", "WRITABLE", "WRITE_SCOPES", "DriveFile", "DriveTarget", "Predicate",
    "parse_query",
]
