"""Gmail's message routes.

The profile and history, messages.send (JSON or upload), messages.insert, list (with search),
get, delete and trash."""

from __future__ import annotations

import email
import email.policy
import time
from typing import Any

from aiohttp import web

from staging.core import Reply
from staging.gmail.mailboxes import GmailMailboxes
from staging.gmail.mime import (
    KEY_HEADER,
    as_sent,
    b64url_decode,
    read_related,
    recipients_of,
    resource,
    sent_labels,
)
from staging.gmail.params import (
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    int_param,
    json_body,
    message_format,
    page_offset,
    page_token,
)
from staging.gmail.scopes import (
    DELETE_SCOPES,
    INSERT_SCOPES,
    METADATA_SCOPE,
    PROFILE_SCOPES,
    READ_SCOPES,
    SEND_SCOPES,
    TRASH_SCOPES,
)
from staging.gmail.search import Query
from staging.gmail.store import HISTORY_TYPES, HistoryRecord, Mailbox


class MessageRoutes(GmailMailboxes):
    """The handlers of ``users.getProfile``, ``users.history`` and ``users.messages``."""

    async def _h_profile(self, request: web.Request) -> web.Response:
        box = self._mailbox_of(request, self.authorize(request, *PROFILE_SCOPES))
        fault = await self.before_write(request, "users.getProfile")
        with self._lock:
            out = {"emailAddress": box.address, "messagesTotal": len(box.messages),
                   "threadsTotal": len({m.thread_id for m in box.messages.values()}),
                   "historyId": str(box.history_id)}
        self.after_commit(request, fault)
        return web.json_response(out)

    async def _h_history(self, request: web.Request) -> web.Response:
        box = self._mailbox_of(request, self.authorize(request, *READ_SCOPES))
        raw_start = request.query.get("startHistoryId")
        if not raw_start:
            raise Reply(self.error(400, "invalidArgument", "startHistoryId is required"))
        try:
            start = int(raw_start)
        except ValueError:
            raise Reply(self.error(400, "invalidArgument",
                                   f"Invalid value at 'start_history_id' (TYPE_UINT64), "
                                   f"\"{raw_start}\"")) from None
        types = request.query.getall("historyTypes", [])
        bad = [t for t in types if t not in HISTORY_TYPES]
        if bad:
            raise Reply(self.error(400, "invalidArgument",
                                   f"Invalid value at 'history_types', \"{bad[0]}\""))
        label = request.query.get("labelId")
        size = int_param(self, request, "maxResults", DEFAULT_PAGE_SIZE, 1, MAX_PAGE_SIZE)
        offset = page_offset(self, request.query.get("pageToken"))
        fault = await self.before_write(request, "history.list")
        forgotten = time.time() - self.switch("history_kept_s")
        with self._lock:
            gone = [r.id for r in box.history if r.at < forgotten]  # kept no more
            if start < box.history_floor - 1 or (gone and start < max(gone)):
                raise self.not_found()  # documented: an out-of-date startHistoryId is a 404
            found = [r for r in box.history if r.id > start
                     and (not types or r.kind in types)
                     and (label is None or label in r.message["labelIds"])]
            current = box.history_id
        page = found[offset:offset + size]
        out: dict[str, Any] = {"historyId": str(current)}
        if page:
            out["history"] = [history_json(r) for r in page]
        if offset + size < len(found):
            out["nextPageToken"] = page_token(offset + size)
        self.after_commit(request, fault)
        return web.json_response(out)

    async def _h_send(self, request: web.Request) -> web.Response:
        box = self._mailbox_of(request, self.authorize(request, *SEND_SCOPES))
        body = await json_body(self, request)
        raw = body.get("raw")
        if not isinstance(raw, str) or not raw:
            raise Reply(self.error(400, "invalidArgument",
                                   "'raw' RFC822 payload message string or uploading message "
                                   "via /upload/* URL required"))
        return await self._send(request, box, b64url_decode(self, raw), body.get("threadId"))

    async def _h_send_upload(self, request: web.Request) -> web.Response:
        box = self._mailbox_of(request, self.authorize(request, *SEND_SCOPES))
        kind = request.query.get("uploadType", "")
        if kind == "media":
            return await self._send(request, box, await request.read(), None)
        if kind == "multipart":
            meta, media = await read_related(self, request)
            return await self._send(request, box, media, meta.get("threadId"))
        raise Reply(self.error(400, "invalidArgument",
                               f"Invalid value for uploadType: {kind!r} (media or multipart)"))

    async def _send(self, request: web.Request, box: Mailbox, raw: bytes,
                    thread_id: Any) -> web.Response:
        msg = email.message_from_bytes(raw, policy=email.policy.default)
        recipients = recipients_of(self, msg)
        fault = await self.before_write(request, "messages.send")
        with self._lock:
            stored = self._add_locked(box, as_sent(msg, box.address),
                                      sent_labels(box.address, recipients), thread_id)
        self.record("messages.send", stored.header(KEY_HEADER), mailbox=box.address,
                    id=stored.id, threadId=stored.thread_id,
                    message_id=stored.header("Message-ID"), to=recipients,
                    subject=stored.header("Subject"))
        self.after_commit(request, fault)
        return web.json_response(stored.ref())

    async def _h_insert(self, request: web.Request) -> web.Response:
        box = self._mailbox_of(request, self.authorize(request, *INSERT_SCOPES))
        body = await json_body(self, request)
        raw = body.get("raw")
        if not isinstance(raw, str) or not raw:
            raise Reply(self.error(400, "invalidArgument", "'raw' RFC822 payload required"))
        labels = body.get("labelIds", [])
        if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
            raise Reply(self.error(400, "invalidArgument", "labelIds must be a list of ids"))
        msg = email.message_from_bytes(b64url_decode(self, raw), policy=email.policy.default)
        fault = await self.before_write(request, "messages.insert")
        with self._lock:  # inserted as given: its Message-ID and headers stay
            stored = self._add_locked(box, msg, list(labels), body.get("threadId"))
        self.record("messages.insert", stored.header(KEY_HEADER), mailbox=box.address,
                    id=stored.id, labelIds=list(labels))
        self.after_commit(request, fault)
        return web.json_response(stored.ref())

    async def _h_list(self, request: web.Request) -> web.Response:
        token = self.authorize(request, *READ_SCOPES)
        box = self._mailbox_of(request, token)
        q = request.query.get("q")
        if q is not None and METADATA_SCOPE in token.scopes:
            # Real Gmail refuses q for any token that carries gmail.metadata, even together
            # with broader scopes.
            raise Reply(self.error(403, "forbidden",
                                   "Metadata scope does not support 'q' parameter"))
        fault = await self.before_write(request, "messages.list")
        match = Query.parse(self, q or "")
        include_trash = request.query.get("includeSpamTrash", "false").lower() == "true"
        wanted = set(request.query.getall("labelIds", []))
        size = int_param(self, request, "maxResults", DEFAULT_PAGE_SIZE, 1, MAX_PAGE_SIZE)
        offset = page_offset(self, request.query.get("pageToken"))
        # Searches read an index that lags behind the mailbox; listing by label does not.
        indexed_before = self.now_ms() - self.search_lag * 1000 if q is not None else None
        messages = self.messages(box.address)
        if self.list_order == "oldest_first":
            messages.reverse()
        found = [m for m in messages
                 if wanted <= set(m.label_ids) and match(m, include_trash)
                 and (indexed_before is None or m.internal_ms <= indexed_before)]
        page = found[offset:offset + size]
        out: dict[str, Any] = {"resultSizeEstimate": len(found)}
        if page:
            out["messages"] = [{"id": m.id, "threadId": m.thread_id} for m in page]
        if offset + size < len(found):
            out["nextPageToken"] = page_token(offset + size)
        self.after_commit(request, fault)
        return web.json_response(out)

    async def _h_get(self, request: web.Request) -> web.Response:
        token = self.authorize(request, *READ_SCOPES)
        box = self._mailbox_of(request, token)
        fmt = message_format(self, request, token)
        fault = await self.before_write(request, "messages.get")
        stored = self._find(box, request.match_info["id"])
        out = resource(stored, fmt, request.query.getall("metadataHeaders", []))
        self.after_commit(request, fault)
        return web.json_response(out)

    async def _h_delete(self, request: web.Request) -> web.Response:
        box = self._mailbox_of(request, self.authorize(request, *DELETE_SCOPES))
        fault = await self.before_write(request, "messages.delete")
        with self._lock:  # for good: no trash, no way back
            stored = box.messages.pop(request.match_info["id"], None)
            if stored is not None:
                box.drafts = {d: m for d, m in box.drafts.items() if m != stored.id}
                box.note("messageDeleted", stored)
        if stored is None:
            raise self.not_found()
        self.record("messages.delete", stored.header(KEY_HEADER), mailbox=box.address,
                    id=stored.id)
        self.after_commit(request, fault)
        return web.Response(status=204)

    async def _h_trash(self, request: web.Request) -> web.Response:
        box = self._mailbox_of(request, self.authorize(request, *TRASH_SCOPES))
        fault = await self.before_write(request, "messages.trash")
        stored = self._find(box, request.match_info["id"])
        with self._lock:
            if "TRASH" not in stored.label_ids:
                stored.label_ids = [x for x in stored.label_ids if x != "INBOX"] + ["TRASH"]
                box.note("labelAdded", stored, ["TRASH"])
        self.record("messages.trash", stored.header(KEY_HEADER), mailbox=box.address,
                    id=stored.id)
        self.after_commit(request, fault)
        return web.json_response(resource(stored, "minimal", []))


def history_json(r: HistoryRecord) -> dict[str, Any]:
    ref = {"id": r.message["id"], "threadId": r.message["threadId"]}
    out: dict[str, Any] = {"id": str(r.id), "messages": [ref]}
    if r.kind == "messageAdded":
        out["messagesAdded"] = [{"message": dict(r.message)}]
    elif r.kind == "messageDeleted":
        out["messagesDeleted"] = [{"message": dict(r.message)}]
    else:
        out["labelsAdded" if r.kind == "labelAdded" else "labelsRemoved"] = [
            {"message": dict(r.message), "labelIds": list(r.labels)}]
    return out
