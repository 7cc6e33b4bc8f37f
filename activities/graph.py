"""``graph.send_mail`` {to, cc?, subject, body}: one plain-text mail sent through Microsoft Graph.

Irreversible, and Graph honours no idempotency key, so the step fences at the provider:

1. ``stage`` creates the message as a draft (``POST /me/messages``; it lands in Drafts) stamped
   with the key twice, as the internet header ``x-tidemark-key`` and as a single-value extended
   property in Tidemark's fixed namespace (the one the probe reads: every copy keeps it). It
   returns the draft's ``id`` and ``internetMessageId``, which run_step journals.
2. ``execute`` sends exactly that draft (``POST /me/messages/{id}/send``, 202). A draft is sent
   at most once: the send moves it out of Drafts under a new id, and a second send of the old id
   is refused with 404 ``ErrorItemNotFound``.

So a send that Graph is still working on after our client gave up (Graph keeps a request up to
about 100 s; our client waits ``TIDEMARK_GRAPH_TIMEOUT_S``) cannot add a second mail: if it
lands first, the next attempt's probe sees the message out of Drafts, or its send is refused;
if the next attempt's send lands first, the late one is refused. Hence ``horizon_s = 0``: no
waiting before *absent* is trusted. A 404 on our own send is not a failure of the step but a
sign that the draft moved on; the step stays in doubt and the probe decides.

Done means *submitted*: the message left Drafts. Graph's 202 means accepted, not submitted (a
message can stay in Drafts), so ``execute`` confirms with the read token that the draft left
Drafts, waiting at most ``confirm_s``; if it did not, the step stays in doubt and the next
attempt's probe finds the draft still in Drafts (*absent*) and sends that same draft again.

The write token needs ``Mail.ReadWrite`` (create the draft), ``Mail.Send`` and ``User.Read``
(``check_identity``); the read token ``Mail.Read`` and ``User.Read``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
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
    LOOP_MARGIN_S,
    READ_ERRORS,
    GraphClient,
    GraphSendMailProbe,
    describe_error,
    me,
)
from tidemark.actions import ProbeResult, ProbeStatus, StepContext, address_list
from tidemark.errors import ActionError, ConfigError, Refused, TargetUnavailable, Unauthorized

DEFAULT_CONFIRM_S = 10.0  # how long execute waits for a sent draft to leave Drafts
CONFIRM_ENV = "TIDEMARK_GRAPH_CONFIRM_S"
CONFIRM_POLL_S = 0.2
CONFIRM_READS = 3  # reads of one probe once folder ids are known: mailbox, Recoverable, a name

SEND_ERRORS = (APIError, httpx.HTTPError, TimeoutError, OSError, ValueError)


def build_message(args: dict[str, Any], key: str) -> Message:
    """The message of a ``graph.send_mail`` step, stamped with its key."""
    def recipients(value: Any) -> list[Recipient]:
        return [Recipient(email_address=EmailAddress(address=a)) for a in address_list(value)]

    return Message(
        subject=args["subject"],
        body=ItemBody(content_type=BodyType.Text, content=args["body"]),
        to_recipients=recipients(args["to"]),
        cc_recipients=recipients(args["cc"]) if args.get("cc") else None,
        internet_message_headers=[InternetMessageHeader(name=KEY_HEADER, value=key)],
        single_value_extended_properties=[
            SingleValueLegacyExtendedProperty(id=KEY_PROPERTY_ID, value=key)],
    )


def build_request(args: dict[str, Any], key: str) -> SendMailPostRequestBody:
    """A ``sendMail`` body for the same message (not used by the step, which sends a draft;
    kept for tools and tests that exercise sendMail itself)."""
    return SendMailPostRequestBody(message=build_message(args, key), save_to_sent_items=True)


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


def confirm_timeout(env: Mapping[str, str] | None = None) -> float:
    """``TIDEMARK_GRAPH_CONFIRM_S`` if set, else DEFAULT_CONFIRM_S."""
    raw = (os.environ if env is None else env).get(CONFIRM_ENV)
    if not raw:
        return DEFAULT_CONFIRM_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value < 0:
        raise ConfigError(f"{CONFIRM_ENV} must be a number of seconds >= 0, got {raw!r}")
    return value


class GraphSendMail(MailAction):
    name: ClassVar[str] = "graph.send_mail"
    # The draft is the fence (see the module docstring): a late send cannot duplicate.
    horizon_s: float = 0.0

    def __init__(self, writer: GraphClient, reader: GraphClient, *,
                 confirm_s: float | None = None) -> None:
        """
        Args:
            writer: Graph client whose token has ``Mail.ReadWrite``, ``Mail.Send`` and
                ``User.Read``; used by ``stage``, ``execute`` and ``check_identity``.
            reader: Graph client whose token has ``Mail.Read`` and ``User.Read``; used by the
                probe and to confirm that a sent draft left Drafts.
            confirm_s: How long ``execute`` waits for the sent draft to leave Drafts
                (default: ``confirm_timeout()``).
        """
        self.writer = writer
        self.read_client = reader
        self.reader = GraphSendMailProbe(reader)
        self.confirm_s = confirm_timeout() if confirm_s is None else confirm_s
        # stage: one create; execute: one send, then probes until confirm_s is over, the last
        # of which may start just before that and take its reads' timeouts (the well-known
        # folder ids are read once, at check_identity or the first probe).
        self.deadline_s = (writer.timeout + self.confirm_s + CONFIRM_READS * reader.timeout
                           + 2 * LOOP_MARGIN_S)

    def snapshot(self, ctx: StepContext) -> dict[str, Any]:
        # Marks the intent as fenced by a draft: without a journaled draft, this step's execute
        # never ran (see GraphSendMailProbe.probe).
        return {"fence": "draft"}

    def probe(self, ctx: StepContext) -> ProbeResult:
        return self.reader.probe(ctx)

    def check_identity(self) -> dict[str, Any]:
        """``GET /me`` with both tokens must name the same user: a probe reading another
        mailbox than the one the writer sends from would answer *absent* for every step."""
        seen = {}
        for role, client in (("read", self.read_client), ("write", self.writer)):
            try:
                seen[role] = me(client)
            except SEND_ERRORS as e:
                raise ConfigError(
                    f"graph: cannot read /me with the {role} credential ({describe_error(e)}); "
                    f"both Graph tokens need User.Read so that the worker can check they "
                    f"belong to the same mailbox") from None
        read, write = seen["read"], seen["write"]
        if read["id"] != write["id"]:
            raise ConfigError(
                f"graph: the read credential reads the mailbox of {read['userPrincipalName']} "
                f"(id {read['id']}) but the write credential sends as "
                f"{write['userPrincipalName']} (id {write['id']}); every probe would look in the "
                f"wrong mailbox. Issue TIDEMARK_GRAPH_READ_TOKEN and TIDEMARK_GRAPH_WRITE_TOKEN "
                f"for the same user")
        try:
            self.reader.folder_ids()  # read once here, so that no later probe waits for them
        except READ_ERRORS as e:
            raise ConfigError(f"graph: cannot read the mailbox's folders with the read "
                              f"credential ({describe_error(e)}); it needs Mail.Read") from None
        return {"mailbox": write["userPrincipalName"], "id": write["id"]}

    def stage(self, ctx: StepContext) -> dict[str, Any]:
        message = build_message(ctx.args, ctx.key)
        try:
            draft = self.writer.call(lambda g: g.me.messages.post(message))
        except SEND_ERRORS as e:
            # A draft that was created after all stays in Drafts, unsent and unjournaled.
            raise graph_error(e, "graph.send_mail: create draft") from e
        if draft is None or not draft.id or not draft.internet_message_id:
            raise TargetUnavailable("graph.send_mail: the draft came back without an id or an "
                                    "internetMessageId")
        return {"id": draft.id, "internetMessageId": draft.internet_message_id}

    def execute(self, ctx: StepContext) -> dict[str, Any]:
        staged = ctx.staged
        if not staged or not staged.get("id"):
            raise ActionError("graph.send_mail: no journaled draft to send")
        draft_id = str(staged["id"])
        try:
            self.writer.call(
                lambda g: g.me.messages.by_message_id(draft_id).send.post())
        except SEND_ERRORS as e:
            if isinstance(e, APIError) and e.response_status_code == 404:
                # No longer a draft: an earlier send of it went through, or a person moved or
                # deleted it. Only the probe can tell which.
                raise TargetUnavailable(f"graph.send_mail: draft {draft_id} is no longer a "
                                        f"draft ({describe_error(e)})") from e
            raise graph_error(e, "graph.send_mail: send draft") from e
        return self._confirm(ctx)

    def _confirm(self, ctx: StepContext) -> dict[str, Any]:
        """Waits until the probe sees our message submitted; raises TargetUnavailable if the
        draft is still in Drafts (or cannot be seen) when confirm_s is over."""
        deadline = time.monotonic() + self.confirm_s
        while True:
            try:
                probed = self.reader.probe(ctx)
            except READ_ERRORS as e:  # the probe answers unknown itself; belt and braces
                probed = ProbeResult.unknown(describe_error(e))
            if probed.status is ProbeStatus.DONE:
                return {**probed.observed, "accepted": True, "draft": ctx.staged}
            if time.monotonic() >= deadline:
                raise TargetUnavailable(
                    f"graph.send_mail: the send was accepted but the message did not leave "
                    f"Drafts within {self.confirm_s:g}s ({probed.reason}); the step stays in "
                    f"doubt")
            time.sleep(CONFIRM_POLL_S)
