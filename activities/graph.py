"""``graph.send_mail`` {to, cc?, subject, body}: one plain-text mail submitted through
Microsoft Graph ``sendMail``.

Irreversible. Graph honours no idempotency key and answers 202 with no body — accepted, not
yet sent — so the key travels in the message twice: as the internet header ``x-tidemark-key``
and as a single-value extended property in Tidemark's fixed namespace (the one the probe reads,
because Sent Items copies keep it). Recovery asks :class:`probes.graph.GraphSendMailProbe`
whether Drafts, the Outbox or Sent Items hold a message with our key.
"""

from __future__ import annotations

from typing import Any, ClassVar

import httpx
from kiota_abstractions.api_error import APIError
from msgraph.generated.models.body_type import BodyType
from msgraph.generated.models.email_address import EmailAddress
from msgraph.generated.models.internet_message_header import InternetMessageHeader
from msgraph.generated.models.item_body import ItemBody
from msgraph.generated.models.message import Message
from msgraph.generated.models.recipient import Recipient
from msgraph.generated.models.single_value_legacy_extended_property import (
    SingleValueLegacyExtendedProperty,
)
from msgraph.generated.users.item.send_mail.send_mail_post_request_body import (
    SendMailPostRequestBody,
)

from activities.mail import MailAction
from probes.graph import (
    KEY_HEADER,
    KEY_PROPERTY_ID,
    GraphClient,
    GraphSendMailProbe,
    describe_error,
)
from tidemark.actions import ProbeResult, StepContext, address_list
from tidemark.errors import ActionError, Refused, TargetUnavailable, Unauthorized


def build_request(args: dict[str, Any], key: str) -> SendMailPostRequestBody:
    """The sendMail body for a ``graph.send_mail`` step, stamped with its key."""
    def recipients(value: Any) -> list[Recipient]:
        return [Recipient(email_address=EmailAddress(address=a)) for a in address_list(value)]

    message = Message(
        subject=args["subject"],
        body=ItemBody(content_type=BodyType.Text, content=args["body"]),
        to_recipients=recipients(args["to"]),
        cc_recipients=recipients(args["cc"]) if args.get("cc") else None,
        internet_message_headers=[InternetMessageHeader(name=KEY_HEADER, value=key)],
        single_value_extended_properties=[
            SingleValueLegacyExtendedProperty(id=KEY_PROPERTY_ID, value=key)],
    )
    # Saving to Sent Items is what lets the probe tell "sent" later; without it the message
    # vanishes once sent and a probe after that would wrongly answer absent.
    return SendMailPostRequestBody(message=message, save_to_sent_items=True)


def graph_error(e: BaseException, what: str) -> ActionError:
    """Maps an exception from msgraph-sdk / kiota / httpx to what it means for the step."""
    text = f"{what}: {describe_error(e)}"
    if isinstance(e, APIError):
        status = e.response_status_code or 0
        if status in (401, 403):
            return Unauthorized(text)
        if status in (408, 429) or status >= 500:
            # Throttled or timed out: nothing done yet; a 5xx may come after the commit. Either
            # way the step stays in doubt and the next attempt probes.
            return TargetUnavailable(text)
        if 400 <= status < 500:
            return Refused(text)
    # httpx timeouts, refused or dropped connections, our own call timeout, anything unreadable
    return TargetUnavailable(text)


class GraphSendMail(MailAction):
    name: ClassVar[str] = "graph.send_mail"

    def __init__(self, writer: GraphClient, reader: GraphClient) -> None:
        """
        Args:
            writer: Graph client whose token has ``Mail.Send``; used by ``execute`` only.
            reader: Graph client whose token has ``Mail.Read``; used by the probe.
        """
        self.writer = writer
        self.reader = GraphSendMailProbe(reader)

    def probe(self, ctx: StepContext) -> ProbeResult:
        return self.reader.probe(ctx)

    def execute(self, ctx: StepContext) -> dict[str, Any]:
        body = build_request(ctx.args, ctx.key)
        try:
            self.writer.call(lambda g: g.me.send_mail.post(body))
        except (APIError, httpx.HTTPError, TimeoutError, OSError, ValueError) as e:
            raise graph_error(e, "graph.send_mail") from e
        # 202 Accepted: queued, not sent. The probe tells the two apart later if asked.
        return {"state": "submitted", "accepted": True}
