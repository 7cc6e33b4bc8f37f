"""Drafts and sending on Graph.

Creating a draft, sending it (and what a second send of a draft still waiting in Drafts does,
per the ``second_send`` switch), ``sendMail``, and the submission that queues a message for
transport."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from staging.core import Reply
from staging.graph.mailboxes import SEND_SCOPES, WRITE_SCOPES, MailboxTarget
from staging.graph.mapi import effect_key
from staging.graph.odata import message_view
from staging.graph.payloads import ci, parse_message
from staging.graph.store import Folder, GraphMessage, Mailbox, iso, new_id


class SendRoutes(MailboxTarget):
    """The handlers that create and send mail, and the submission they share."""

    async def _h_create(self, request: web.Request) -> web.Response:
        box = self._caller(request, *WRITE_SCOPES)
        message = parse_message(self, await self._json_body(request), box, save_to_sent=True,
                                      need_recipients=False)
        fault = await self.before_write(request, "messages.create")
        with self._lock:
            message.fields["isDraft"] = True
            self._add(box.well_known("drafts"), message)
            out = message_view(message, None, (True, None))
        self.record("messages.create", effect_key(message), id=message.id,
                    account=box.account, subject=message.fields["subject"])
        self.after_commit(request, fault)
        return web.json_response(out, status=201)

    async def _h_send(self, request: web.Request) -> web.Response:
        box = self._caller(request, *SEND_SCOPES)
        draft_id = request.match_info["id"]
        # The fault's delay comes before the lookup: a late request finds what the mailbox
        # holds when it is finally worked on, as on the real service.
        fault = await self.before_write(request, "message.send")
        with self._lock:
            hit = box.find(draft_id)
            if hit is None or not hit[1].fields.get("isDraft"):
                # Sent already (the draft left Drafts under a new id), moved or deleted.
                box.refused_sends.append(draft_id)
                raise self._not_found()
            source, m = hit
            if not (m.fields["toRecipients"] or m.fields["ccRecipients"]
                    or m.fields["bccRecipients"]):
                raise Reply(self.error(400, "ErrorInvalidRecipients", "At least one recipient "
                                       "isn't valid., A message can't be sent because it "
                                       "contains no recipients."))
            again = m.submitted
            submitted = self._send_again(box, m, draft_id) if again \
                else self._submit(box, m, source)
            reply = self._take_reply()
            detail = {"id": m.id, "draft": draft_id,
                      "folder": box.folders[m.fields["parentFolderId"]].name,
                      "account": box.account, "stalled": not submitted, "again": again,
                      "internetMessageId": m.fields["internetMessageId"],
                      "to": [r["emailAddress"]["address"] for r in m.fields["toRecipients"]],
                      "subject": m.fields["subject"]}
        if again and not submitted:  # ignored: 202, and nothing more went out
            self.after_commit(request, fault)
            return self._answer(reply)
        self.record("message.send", effect_key(m), **detail)
        self.after_commit(request, fault)
        return self._answer(reply)

    async def _h_send_mail(self, request: web.Request) -> web.Response:
        box = self._caller(request, *SEND_SCOPES)
        body = await self._json_body(request)
        raw = ci(body).get("message")
        if not isinstance(raw, dict):
            raise Reply(self.error(400, "ErrorInvalidParameter",
                                   "The value of the parameter 'Message' is empty."))
        save = ci(body).get("savetosentitems", True)
        message = parse_message(self, raw, box, save is not False, need_recipients=True)
        fault = await self.before_write(request, "sendMail")
        with self._lock:
            submitted = self._submit(box, message, None)
            reply = self._take_reply()
            folder = box.folders[message.fields["parentFolderId"]].name
        self.record("sendMail", effect_key(message), id=message.id, folder=folder,
                    account=box.account, stalled=not submitted,
                    to=[r["emailAddress"]["address"] for r in message.fields["toRecipients"]],
                    subject=message.fields["subject"])
        self.after_commit(request, fault)
        return self._answer(reply)

    def _answer(self, reply: dict[str, Any] | None) -> web.Response:
        """A committed send's answer: 202, or the status ``send_reply`` armed for it."""
        if reply is None:
            return web.Response(status=202)
        headers = {"Retry-After": str(reply["retry_after"])}
        if reply["status"] == 202:
            return web.Response(status=202, headers=headers)
        response = self.error(reply["status"], "ErrorServerBusy" if reply["status"] != 429
                              else "ApplicationThrottled", "The server cannot service this "
                              "request right now. Try again later.")
        response.headers.update(headers)
        return response

    def _take_reply(self) -> dict[str, Any] | None:
        if not self._replies:
            return None
        reply = self._replies[0]
        reply["times"] -= 1
        if reply["times"] <= 0:
            self._replies.pop(0)
        return reply

    def _submit(self, box: Mailbox, m: GraphMessage, source: Folder | None) -> bool:
        """Submits ``m`` (lock held) for transport.

        It leaves ``source`` (Drafts) for the queue folder under a new id and waits there
        ``send_delay``. Or, while the ``submitted_stays_in_drafts_s`` switch is on, it stays a
        draft in Drafts under its id, flagged submitted, that long. Its mfSubmitted shows only
        ``submitted_flag_after_s`` after the send. Returns False when a stall fault keeps it a
        draft in Drafts, unsubmitted, instead."""
        if box.stall > 0:
            box.stall -= 1
            if source is None:  # sendMail saves a draft first; here it stays one
                m.fields["isDraft"] = True
                self._add(box.well_known("drafts"), m)
            return False
        window = float(self.switch("submitted_stays_in_drafts_s"))
        if window > 0:  # Graph's documented sequence: saved in Drafts, moved by transport
            if source is None:
                self._add(box.well_known("drafts"), m)
            m.fields["isDraft"] = True
            m.submitted = True
            m.flagged_from = time.time() + float(self.switch("submitted_flag_after_s"))
            m.deliver_at = time.time() + window
            return True
        if source is not None:
            del source.messages[m.id]
            m.fields.update(id=new_id("AAMkAD"), changeKey=new_id("CQAAAB"))
        queue = box.well_known(box.queue_folder if source is None else "outbox")
        m.fields["isDraft"] = queue.name == "drafts"
        m.deliver_at = time.time() + box.send_delay
        self._add(queue, m)
        return True

    def _send_again(self, box: Mailbox, m: GraphMessage, draft_id: str) -> bool:
        """A send of a draft already submitted (lock held).

        As the ``second_send`` switch says, it raises the refusal, or returns whether a second
        copy went out."""
        behaviour = self.switch("second_send")
        if behaviour == "refused":
            box.refused_sends.append(draft_id)
            raise Reply(self.error(400, "ErrorInvalidRequest",
                                   "The message has already been submitted for delivery."))
        if behaviour == "ignored":
            return False
        copy = GraphMessage(dict(m.fields), [dict(h) for h in m.headers],
                            [dict(p) for p in m.properties], m.save_to_sent)
        stamp = iso(time.time())
        copy.fields.update(id=new_id("AAMkAD"), changeKey=new_id("CQAAAB"), isDraft=False,
                           sentDateTime=stamp, lastModifiedDateTime=stamp)
        if copy.save_to_sent:
            self._add(box.well_known("sentitems"), copy)
        return True
