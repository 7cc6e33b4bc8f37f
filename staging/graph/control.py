"""The control endpoints of the emulated Graph (``/_staging/graph/...``).

Mailboxes, send settings, delivery, armed sendMail replies, moves as a person would make them,
folders, emptying Deleted Items, inbound mail, and a dump of every folder for tests."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from staging.core import DEFAULT_ACCOUNT, Reply
from staging.graph.mailboxes import MailboxTarget
from staging.graph.store import folder_view, newest_first


class ControlRoutes(MailboxTarget):
    """The handlers of ``/_staging/graph/...``.

    Every body is JSON; ``account`` picks the mailbox."""

    @staticmethod
    async def _control_body(request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except ValueError:
            body = {}
        return body if isinstance(body, dict) else {}

    async def _h_add_mailbox(self, request: web.Request) -> web.Response:
        body = await self._control_body(request)
        if not isinstance(body.get("account"), str) or not isinstance(body.get("address"), str):
            return web.json_response({"error": "account and address are required"}, status=400)
        box = self.add_mailbox(body["account"], body["address"], body.get("name"))
        return web.json_response(box.me())

    async def _h_settings(self, request: web.Request) -> web.Response:
        body = await self._control_body(request)
        account = body.get("account", DEFAULT_ACCOUNT)
        try:
            self.configure(body.get("send_delay"), body.get("queue_folder"),
                           stall=body.get("stall"), sent_rule=body.get("sent_rule"),
                           clear_rule="sent_rule" in body and body["sent_rule"] is None,
                           account=account)
            box = self.box(account)
        except (TypeError, ValueError, KeyError) as e:
            return web.json_response({"error": str(e)}, status=400)
        return web.json_response({"send_delay": box.send_delay, "queue_folder": box.queue_folder,
                                  "stall": box.stall, "sent_rule": box.sent_rule})

    async def _h_deliver(self, request: web.Request) -> web.Response:
        body = await self._control_body(request)
        return web.json_response({"delivered": self.deliver(
            body.get("account", DEFAULT_ACCOUNT))})

    async def _h_send_reply(self, request: web.Request) -> web.Response:
        body = await request.json()
        status, after, times = body.get("status", 202), body.get("retry_after", 1), \
            body.get("times", 1)
        if status not in (202, 429, 503, 504) or not isinstance(after, int) or after < 0 \
                or not isinstance(times, int) or times < 1:
            return web.json_response({"error": "status must be 202, 429, 503 or 504; "
                                               "retry_after and times non-negative integers"},
                                     status=400)
        with self._lock:
            self._replies.append({"status": status, "retry_after": after, "times": times})
        return web.json_response({"armed": body})

    async def _h_move(self, request: web.Request) -> web.Response:
        body = await self._control_body(request)
        wanted = body.get("folder")
        if not isinstance(wanted, str):
            return web.json_response({"error": "folder (a name or an id) is required"},
                                     status=400)
        try:
            new_id = self.move(request.match_info["id"], wanted,
                               body.get("account", DEFAULT_ACCOUNT))
        except KeyError as e:
            return web.json_response({"error": f"no such message or folder: {e}"}, status=404)
        except ValueError as e:
            return web.json_response({"error": str(e)}, status=409)
        return web.json_response({"id": new_id, "folder": wanted})

    async def _h_control_folder(self, request: web.Request) -> web.Response:
        body = await self._control_body(request)
        try:
            f = self.create_folder(str(body.get("displayName") or ""),
                                   body.get("account", DEFAULT_ACCOUNT))
        except (ValueError, KeyError) as e:
            return web.json_response({"error": str(e)}, status=400)
        return web.json_response(folder_view(f))

    async def _h_empty_deleted(self, request: web.Request) -> web.Response:
        body = await self._control_body(request)
        return web.json_response({"moved": self.empty_deleted(
            body.get("account", DEFAULT_ACCOUNT))})

    async def _h_inbound(self, request: web.Request) -> web.Response:
        body = await self._control_body(request)
        if not isinstance(body.get("from"), str):
            return web.json_response({"error": "from is required"}, status=400)
        try:
            new_id = self.inbound(body["from"], str(body.get("subject") or ""),
                                  body.get("internetMessageHeaders") or [],
                                  body.get("singleValueExtendedProperties") or [],
                                  str(body.get("folder") or "inbox"),
                                  body.get("account", DEFAULT_ACCOUNT))
        except Reply as r:
            return r.response
        except KeyError as e:
            return web.json_response({"error": f"no such folder or mailbox: {e}"}, status=400)
        return web.json_response({"id": new_id})

    async def _h_mailbox(self, request: web.Request) -> web.Response:
        account = request.query.get("account", DEFAULT_ACCOUNT)
        box = self.box(account)
        self._settle(box)
        with self._lock:
            return web.json_response({
                "folders": {f.name: [{"fields": m.fields, "internetMessageHeaders": m.headers,
                                      "singleValueExtendedProperties": m.properties,
                                      "deliver_at": m.deliver_at, "submitted": m.submitted}
                                     for m in newest_first(f.messages.values())]
                            for f in box.folders.values()},
                "refused_sends": list(box.refused_sends)})
