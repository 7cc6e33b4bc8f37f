"""GmailTarget: the emulated Gmail v1 API.

Its default tokens, switches and routes, assembled from the mailboxes and the route groups, and
its settings endpoint."""

from __future__ import annotations

from collections.abc import Iterable

from aiohttp import web

from staging.core import Token
from staging.gmail.drafts import DraftRoutes
from staging.gmail.messages import MessageRoutes
from staging.gmail.scopes import COMPOSE_SCOPE, METADATA_SCOPE, READONLY_SCOPE, SEND_SCOPE
from staging.gmail.switches import CONCURRENT_DRAFT_SEND, GONE_DRAFT_STATUS, HISTORY_KEPT
from staging.throttle import GOOGLE_STATUS, google_status_switch, google_throttled, rate_switch
from tidemark import staging_tokens

COMPOSE_TOKEN = staging_tokens.GMAIL_COMPOSE  # what gmail.send writes with: drafts need compose
SEND_TOKEN = staging_tokens.GMAIL_SEND  # gmail.send only: messages.send, no drafts
READ_TOKEN = staging_tokens.GMAIL_READ
METADATA_TOKEN = staging_tokens.GMAIL_METADATA


class GmailTarget(MessageRoutes, DraftRoutes):
    """The emulated Gmail v1 API: one mailbox per account, the default one :data:`MAILBOX`."""

    name = "gmail"
    switches = (
        CONCURRENT_DRAFT_SEND, GONE_DRAFT_STATUS, HISTORY_KEPT,
        rate_switch("Gmail", "Gmail's Resolve errors: 403 userRateLimitExceeded or "
                             "rateLimitExceeded, and 429 Too many requests."),
        google_status_switch("Gmail's Resolve errors (developers.google.com/workspace/gmail/"
                             "api/guides/handle-errors)"),
    )
    default_tokens = (
        Token(COMPOSE_TOKEN, "gmail", [COMPOSE_SCOPE]),
        Token(SEND_TOKEN, "gmail", [SEND_SCOPE]),
        Token(READ_TOKEN, "gmail", [READONLY_SCOPE]),
        Token(METADATA_TOKEN, "gmail", [METADATA_SCOPE]),
    )

    def throttled(self, op: str) -> web.Response:
        return google_throttled(self.switch(GOOGLE_STATUS))

    def routes(self) -> Iterable[web.RouteDef]:
        user = "/gmail/v1/users/{userId}"
        base = user + "/messages"
        return [
            web.get(user + "/profile", self._h_profile),
            web.get(user + "/history", self._h_history),
            web.post(user + "/drafts", self._h_draft_create),
            web.get(user + "/drafts", self._h_draft_list),
            web.post(user + "/drafts/send", self._h_draft_send),
            web.get(user + "/drafts/{id}", self._h_draft_get),
            web.delete(user + "/drafts/{id}", self._h_draft_delete),
            web.post(base + "/send", self._h_send),
            web.post("/upload" + base + "/send", self._h_send_upload),
            web.post(base, self._h_insert),
            web.get(base, self._h_list),
            web.get(base + "/{id}", self._h_get),
            web.delete(base + "/{id}", self._h_delete),
            web.post(base + "/{id}/trash", self._h_trash),
            web.post("/_staging/gmail/settings", self._h_settings),
        ]

    async def _h_settings(self, request: web.Request) -> web.Response:
        body = await request.json()
        try:
            if not isinstance(body, dict):
                raise ValueError("the settings are a JSON object")
            unknown = set(body) - {"search_lag", "list_order", "clock_offset", "expire_history",
                                   "draft_send"}
            if unknown:
                raise ValueError(f"unknown setting {sorted(unknown)[0]!r}")
            self.configure(body.get("search_lag"), body.get("list_order"),
                           body.get("clock_offset"), bool(body.get("expire_history", False)),
                           body.get("draft_send"))
        except (TypeError, ValueError) as e:
            return web.json_response({"error": str(e)}, status=400)
        return web.json_response({"search_lag": self.search_lag, "list_order": self.list_order,
                                  "clock_offset": self.clock_offset,
                                  "draft_send": self.draft_send})
