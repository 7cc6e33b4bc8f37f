"""``gmail.send`` {to, cc?, subject, body}: one plain-text mail sent through the Gmail API.

Irreversible. No Gmail endpoint honours an idempotency key, so the key travels in the message:
an ``X-Tidemark-Key`` header (kept by Gmail) and a Message-ID derived from it (replaced by
Gmail, used by the probe only as a fast path). Recovery asks :class:`probes.gmail.GmailSendProbe`
whether a message with our key was sent.
"""

from __future__ import annotations

import base64
from email.message import EmailMessage
from typing import Any, ClassVar

from googleapiclient.discovery import Resource

from activities.mail import MailAction
from probes.gmail import KEY_HEADER, GmailSendProbe, message_id_for
from probes.google_http import CLIENT_ERRORS, google_error
from tidemark.actions import ProbeResult, StepContext, address_list
from tidemark.errors import Refused


def build_message(args: dict[str, Any], key: str) -> EmailMessage:
    """The RFC 822 message for a ``gmail.send`` step, stamped with its key."""
    msg = EmailMessage()
    msg["To"] = ", ".join(address_list(args["to"]))
    if args.get("cc"):
        msg["Cc"] = ", ".join(address_list(args["cc"]))
    msg["Subject"] = args["subject"]
    msg["Message-ID"] = message_id_for(key)
    msg[KEY_HEADER] = key
    msg.set_content(args["body"])
    return msg


class GmailSend(MailAction):
    name: ClassVar[str] = "gmail.send"

    def __init__(self, writer: Resource, reader: Resource, user_id: str = "me") -> None:
        """
        Args:
            writer: Gmail client whose token has ``gmail.send``; used by ``execute`` only.
            reader: Gmail client whose token has ``gmail.readonly``; used by the probe.
            user_id: The mailbox, ``me`` for the token's own.
        """
        self.writer = writer
        self.user_id = user_id
        self.reader = GmailSendProbe(reader, user_id)

    def probe(self, ctx: StepContext) -> ProbeResult:
        return self.reader.probe(ctx)

    def execute(self, ctx: StepContext) -> dict[str, Any]:
        try:
            message = build_message(ctx.args, ctx.key)
        except ValueError as e:  # the email package refused a header: nothing was sent
            raise Refused(f"gmail.send: cannot build the message: {e}") from e
        raw = base64.urlsafe_b64encode(message.as_bytes()).decode()
        try:
            sent = self.writer.users().messages().send(
                userId=self.user_id, body={"raw": raw}).execute(num_retries=0)
        except CLIENT_ERRORS as e:
            raise google_error(e, "gmail.send") from e
        return {"id": sent["id"], "threadId": sent["threadId"],
                "labelIds": sent.get("labelIds", [])}
