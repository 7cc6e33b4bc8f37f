"""Gmail's drafts routes: create, list, get, delete, and drafts.send.

drafts.send consumes the draft and stores the sent message in one step (the switches decide what
overlapping and late sends of one draft do)."""

from __future__ import annotations

import email
import email.policy

from aiohttp import web

from staging.core import Reply
from staging.gmail.mailboxes import GmailMailboxes
from staging.gmail.mime import (
    KEY_HEADER,
    as_sent,
    b64url_decode,
    recipients_of,
    resource,
    sent_labels,
)
from staging.gmail.params import json_body, message_format
from staging.gmail.scopes import DRAFT_READ_SCOPES, DRAFT_WRITE_SCOPES
from staging.gmail.store import StoredMessage


class DraftRoutes(GmailMailboxes):
    """The handlers of ``users.drafts``."""

    async def _h_draft_create(self, request: web.Request) -> web.Response:
        box = self._mailbox_of(request, self.authorize(request, *DRAFT_WRITE_SCOPES))
        body = await json_body(self, request)
        message = body.get("message")
        raw = message.get("raw") if isinstance(message, dict) else None
        if not isinstance(raw, str) or not raw:
            raise Reply(self.error(400, "invalidArgument",
                                   "Missing draft message: 'message.raw' is required"))
        msg = email.message_from_bytes(b64url_decode(self, raw), policy=email.policy.default)
        fault = await self.before_write(request, "drafts.create")
        with self._lock:
            stored = self._add_locked(box, msg, ["DRAFT"], None)
            self._seq += 1
            draft_id = f"r{self.now_ms()}{self._seq:06d}"
            box.drafts[draft_id] = stored.id
        self.record("drafts.create", stored.header(KEY_HEADER), mailbox=box.address,
                    draft_id=draft_id, id=stored.id)
        self.after_commit(request, fault)
        return web.json_response({"id": draft_id, "message": stored.ref()})

    async def _h_draft_list(self, request: web.Request) -> web.Response:
        box = self._mailbox_of(request, self.authorize(request, *DRAFT_READ_SCOPES))
        fault = await self.before_write(request, "drafts.list")
        with self._lock:
            drafts = [{"id": d, "message": {"id": m, "threadId": box.messages[m].thread_id}}
                      for d, m in box.drafts.items()]
        self.after_commit(request, fault)
        return web.json_response({"drafts": drafts, "resultSizeEstimate": len(drafts)}
                                 if drafts else {"resultSizeEstimate": 0})

    async def _h_draft_get(self, request: web.Request) -> web.Response:
        token = self.authorize(request, *DRAFT_READ_SCOPES)
        box = self._mailbox_of(request, token)
        fmt = message_format(self, request, token)
        fault = await self.before_write(request, "drafts.get")
        with self._lock:
            mid = box.drafts.get(request.match_info["id"])
            stored = box.messages.get(mid) if mid is not None else None
        if stored is None:
            raise self.not_found()
        out = {"id": request.match_info["id"],
               "message": resource(stored, fmt, request.query.getall("metadataHeaders", []))}
        self.after_commit(request, fault)
        return web.json_response(out)

    async def _h_draft_delete(self, request: web.Request) -> web.Response:
        box = self._mailbox_of(request, self.authorize(request, *DRAFT_WRITE_SCOPES))
        fault = await self.before_write(request, "drafts.delete")
        with self._lock:
            mid = box.drafts.pop(request.match_info["id"], None)
            stored = box.messages.pop(mid, None) if mid is not None else None
            if stored is not None:
                box.note("messageDeleted", stored)
        if stored is None:
            raise self.not_found()
        self.record("drafts.delete", stored.header(KEY_HEADER), mailbox=box.address,
                    draft_id=request.match_info["id"])
        self.after_commit(request, fault)
        return web.Response(status=204)

    async def _h_draft_send(self, request: web.Request) -> web.Response:
        box = self._mailbox_of(request, self.authorize(request, *DRAFT_WRITE_SCOPES))
        body = await json_body(self, request)
        draft_id = body.get("id")
        if not isinstance(draft_id, str) or not draft_id:
            raise Reply(self.error(400, "invalidArgument", "Missing draft id"))
        # Under concurrent_draft_send=both the send takes the draft as it is on arrival: a twin
        # that arrives before this one has consumed it sends it as well.
        taken: StoredMessage | None = None
        if self.switch("concurrent_draft_send") == "both":
            with self._lock:
                mid = box.drafts.get(draft_id)
                taken = box.messages.get(mid) if mid is not None else None
        # The delay comes first: a slow provider looks the draft up when it gets to the work,
        # so a late send of a draft another send consumed meanwhile finds nothing.
        fault = await self.before_write(request, "drafts.send")
        with self._lock:  # consume the draft and store the sent message in one step
            mid = box.drafts.get(draft_id)
            draft = box.messages.get(mid) if mid is not None else None
            if draft is None and taken is None:
                raise self._gone_draft()
            source = draft if draft is not None else taken
            assert source is not None
            recipients = recipients_of(self, source.parsed)
            msg = as_sent(email.message_from_bytes(source.raw, policy=email.policy.default),
                           box.address)
            labels = sent_labels(box.address, recipients)
            if draft is None:  # consumed by a twin meanwhile: this send goes out all the same
                stored = self._add_locked(box, msg, labels, source.thread_id)
            elif self.draft_send == "relabel":  # the draft's own message becomes the sent one
                del box.drafts[draft_id]
                draft.raw, draft.parsed = msg.as_bytes(), msg
                draft.label_ids = labels
                draft.internal_ms = self.now_ms()
                box.note("labelRemoved", draft, ["DRAFT"])
                box.note("labelAdded", draft, labels)
                stored = draft
            else:
                del box.drafts[draft_id]
                del box.messages[draft.id]
                box.note("messageDeleted", draft)
                stored = self._add_locked(box, msg, labels, draft.thread_id)
        self.record("drafts.send", stored.header(KEY_HEADER), mailbox=box.address,
                    draft_id=draft_id, id=stored.id, threadId=stored.thread_id,
                    message_id=stored.header("Message-ID"), to=recipients,
                    subject=stored.header("Subject"))
        self.after_commit(request, fault)
        return web.json_response(stored.ref())

    def _gone_draft(self) -> Reply:
        """What a send of a draft that is no longer there gets (``gone_draft_send_status``)."""
        status = self.switch("gone_draft_send_status")
        if status == 400:
            return Reply(self.error(400, "failedPrecondition", "Invalid draft"))
        if status == 500:
            return Reply(self.error(500, "backendError", "Backend Error"))
        return self.not_found()
