"""GraphTarget: the emulated Microsoft Graph v1.0 mail API.

Its default tokens, switches and routes, assembled from the mailbox store and the route groups."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Iterable

from aiohttp import web

from staging.core import Reply, Token
from staging.graph.control import ControlRoutes
from staging.graph.messages import MessageRoutes
from staging.graph.send import SendRoutes
from staging.graph.store import MAILBOX
from staging.graph.switches import SWITCHES
from staging.throttle import (
    GRAPH_MAILBOX_CONCURRENCY,
    GRAPH_RETRY_AFTER,
    MAILBOX_CONCURRENCY,
    RETRY_AFTER,
    graph_throttled,
    rate_switch,
)
from tidemark import staging_tokens

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# The write token may create drafts (Mail.ReadWrite), send them (Mail.Send) and read its own
# profile (User.Read); the read token reads mail and its profile.
SEND_TOKEN = staging_tokens.GRAPH_SEND
READ_TOKEN = staging_tokens.GRAPH_READ


class GraphTarget(MessageRoutes, SendRoutes, ControlRoutes):
    """The emulated Microsoft Graph v1.0 mail API of one or more mailboxes."""

    name = "graph"
    default_tokens = (
        Token(SEND_TOKEN, "graph", ["Mail.Send", "Mail.ReadWrite", "User.Read"]),
        Token(READ_TOKEN, "graph", ["Mail.Read", "User.Read"]),
    )
    switches = (*SWITCHES,
                rate_switch("Graph", "Microsoft Graph throttling guidance: past a threshold "
                                     "Graph answers 429 Too Many Requests, the request fails, "
                                     "and a Retry-After header suggests the wait; reads and "
                                     "writes are throttled apart."),
                GRAPH_RETRY_AFTER, GRAPH_MAILBOX_CONCURRENCY)

    def __init__(self, address: str = MAILBOX) -> None:
        super().__init__(address)
        self.busy: Counter[str] = Counter()  # requests each mailbox is serving now
        self.turned_away = 0  # requests answered 429 for the mailbox's concurrency

    def throttled(self, op: str) -> web.Response:
        return graph_throttled(self.switch(RETRY_AFTER))

    def _one_of_four(self, handler: Handler) -> Handler:
        """``handler`` counted against its mailbox's concurrent requests.

        Past the ``mailbox_concurrency`` switch (Outlook's four per app and mailbox) Graph
        answers 429."""

        async def limited(request: web.Request) -> web.StreamResponse:
            limit = self.switch(MAILBOX_CONCURRENCY)
            if not limit:
                return await handler(request)
            bearer = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
            with self.staging.lock:
                tok = self.staging.tokens.get(bearer)
            box = request.match_info.get("user") or (tok.account if tok else "")
            busy = self.busy
            with self.staging.lock:
                if busy[box] >= limit:
                    self.turned_away += 1
                    raise Reply(graph_throttled(self.switch(RETRY_AFTER), concurrency=True))
                busy[box] += 1
            try:
                return await handler(request)
            finally:
                with self.staging.lock:
                    busy[box] -= 1

        return limited

    def routes(self) -> Iterable[web.RouteDef]:
        mine = [
            (web.get, "", self._h_me),
            (web.post, "/sendMail", self._h_send_mail),
            (web.post, "/messages", self._h_create),
            (web.get, "/messages", self._h_list),
            (web.get, "/messages/{id}", self._h_get),
            (web.post, "/messages/{id}/send", self._h_send),
            (web.post, "/messages/{id}/move", self._h_api_move),
            (web.get, "/mailFolders", self._h_folders),
            (web.post, "/mailFolders", self._h_create_folder),
            (web.get, "/mailFolders/{folder}", self._h_folder),
            (web.get, "/mailFolders/{folder}/messages", self._h_list),
            (web.get, "/mailFolders/{folder}/messages/{id}", self._h_get),
        ]
        return [
            *(route(prefix + path, self._one_of_four(handler))
              for prefix in ("/v1.0/me", "/v1.0/users/{user}") for route, path, handler in mine),
            web.post("/_staging/graph/mailboxes", self._h_add_mailbox),
            web.post("/_staging/graph/settings", self._h_settings),
            web.post("/_staging/graph/deliver", self._h_deliver),
            web.post("/_staging/graph/send_reply", self._h_send_reply),
            web.post("/_staging/graph/messages/{id}/move", self._h_move),
            web.post("/_staging/graph/folders", self._h_control_folder),
            web.post("/_staging/graph/empty_deleted", self._h_empty_deleted),
            web.post("/_staging/graph/inbound", self._h_inbound),
            web.get("/_staging/graph/mailbox", self._h_mailbox),
        ]
