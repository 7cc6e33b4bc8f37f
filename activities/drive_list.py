"""Listing Drive files with the real Drive client (``files.list``, every page).

It is what a planner reads to turn tonight's request into a plan."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from activities.drive import drive_client
from activities.granted import granted_google
from activities.wiring import credentials, grant_minter
from probes.drive import drive_error
from probes.google_http import CLIENT_ERRORS, files_of
from tidemark.errors import ConfigError
from tidemark.words import GrantScope

PAGE_SIZE = 100


def list_files(client: Any, q: str) -> list[dict[str, Any]]:
    """``{id, name}`` of every file matching the Drive query ``q``.

    All pages, in Drive's order."""
    out: list[dict[str, Any]] = []
    token: str | None = None
    files = files_of(client)  # one resource for every page
    while True:
        try:
            page = files.list(q=q, pageSize=PAGE_SIZE, pageToken=token,
                              fields="nextPageToken,files(id,name)").execute(num_retries=0)
        except CLIENT_ERRORS as e:
            raise drive_error(e, "drive files.list") from e
        out += [{"id": f["id"], "name": f["name"]} for f in page.get("files", [])]
        token = page.get("nextPageToken")
        if not token:
            return out


def reader_from_env(env: Mapping[str, str]) -> Any:
    """A Drive client with the worker's read-only credential (the worker's configuration)."""
    creds = credentials(env, "drive")
    if creds is None:
        raise ConfigError("drive is not configured (TIDEMARK_DRIVE_URL, _WRITE_TOKEN, "
                          "_READ_TOKEN or TIDEMARK_STAGING_URL)")
    # Inside a task (a scheduled run's planner) it presents the task's read grant, minted like
    # the actions' grants; outside one, the read credential itself, kept fresh.
    return granted_google(drive_client(creds.url, ""), "drive", GrantScope.READ,
                          grant_minter(env, creds.url), creds.read)
