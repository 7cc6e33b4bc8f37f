"""``gmail.send`` {to, cc?, subject, body}: one plain-text mail sent through the Gmail API.

Irreversible. No Gmail endpoint honours an idempotency key, so the key travels in the message:
an ``X-Tidemark-Key`` header (kept by Gmail) and a Message-ID derived from it (replaced by
Gmail, used by the probe only as a fast path). Recovery asks :class:`probes.gmail.GmailSendProbe`
whether a message with our key was sent.
"""

from __future__ import annotations

import base64
import http.client
import json
from email.message import EmailMessage
from typing import Any, ClassVar

from googleapiclient.discovery import Resource
from googleapiclient.errors import Error as ClientError
from googleapiclient.errors import HttpError

from probes.gmail import KEY_HEADER, GmailSendProbe, message_id_for
from tidemark.actions import Action, Arg, ProbeResult, StepContext, address_list
from tidemark.errors import ActionError, Refused, TargetUnavailable, Unauthorized

# Gmail reports quota and rate limits as 403 with these reasons: the credential is fine and a
# later attempt may pass, so they must not read as a rejected credential.
RATE_LIMIT_REASONS = frozenset({"rateLimitExceeded", "userRateLimitExceeded",
                                "dailyLimitExceeded", "quotaExceeded"})


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


def gmail_error(e: Exception, what: str) -> ActionError:
    """Maps an exception from google-api-python-client to what it means for the step."""
    if isinstance(e, HttpError):
        status = e.resp.status
        reason = _reason(e)
        text = f"{what}: Gmail answered {status} ({reason or 'no reason'}): {e.reason}"
        if status == 403 and reason in RATE_LIMIT_REASONS:
            return TargetUnavailable(text)
        if status in (401, 403):
            return Unauthorized(text)
        if status in (408, 429) or status >= 500:
            # A timeout or throttling answer says nothing was done *yet*; a 5xx may come after
            # the commit. Either way the step stays in doubt and the next attempt probes.
            return TargetUnavailable(text)
        if 400 <= status < 500:
            return Refused(text)
        return TargetUnavailable(text)
    # Socket timeouts, refused or dropped connections (OSError), broken HTTP (HTTPException),
    # an unreadable answer (ValueError, ClientError): the send may have happened.
    return TargetUnavailable(f"{what}: {type(e).__name__}: {e}")


def _reason(e: HttpError) -> str | None:
    try:
        errors = json.loads(e.content or b"{}").get("error", {}).get("errors", [])
        return str(errors[0]["reason"]) if errors else None
    except (ValueError, AttributeError, KeyError, IndexError, TypeError):
        return None


class GmailSend(Action):
    name: ClassVar[str] = "gmail.send"
    irreversible: ClassVar[bool] = True
    args: ClassVar[dict[str, Arg]] = {
        "to": Arg((str, list), check=address_list),
        "cc": Arg((str, list), required=False, check=address_list),
        "subject": Arg(str),
        "body": Arg(str),
    }

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

    @classmethod
    def describe(cls, args: dict[str, Any]) -> str:
        to = address_list(args["to"])
        cc = f" (+{len(address_list(args['cc']))} cc)" if args.get("cc") else ""
        return f"{args['subject']!r} to {', '.join(to)}{cc}"

    def probe(self, ctx: StepContext) -> ProbeResult:
        return self.reader.probe(ctx)

    def execute(self, ctx: StepContext) -> dict[str, Any]:
        raw = base64.urlsafe_b64encode(build_message(ctx.args, ctx.key).as_bytes()).decode()
        try:
            sent = self.writer.users().messages().send(
                userId=self.user_id, body={"raw": raw}).execute(num_retries=0)
        except (ClientError, OSError, http.client.HTTPException, ValueError) as e:
            raise gmail_error(e, "gmail.send") from e
        return {"id": sent["id"], "threadId": sent["threadId"],
                "labelIds": sent.get("labelIds", [])}
