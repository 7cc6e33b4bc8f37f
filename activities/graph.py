"""``graph.send_mail`` {to, cc?, subject, body}: one plain-text mail sent through Microsoft Graph.

Irreversible, and Graph honours no idempotency key, so the step fences at the provider:

1. ``stage`` creates the message as a draft (``POST /me/messages``; it lands in Drafts) stamped
   with the key twice, as the internet header ``x-tidemark-key`` and as a single-value extended
   property in Tidemark's fixed namespace (the one the probe reads: every copy keeps it). It
   returns the draft's ``id`` and ``internetMessageId``, which run_step journals.
2. ``execute`` sends exactly that draft (``POST /me/messages/{id}/send``, 202), and only while
   it is a plain draft in Drafts: Graph keeps a sent draft in Drafts, ``isDraft`` still true,
   until transport takes it to Sent Items, marked only by the mfSubmitted bit of
   PR_MESSAGE_FLAGS; what a second send of it does is undocumented (it might go out twice), so
   ``execute`` reads the draft first and sends nothing once that bit is set. A send of a draft
   that already left Drafts is refused with 404 ``ErrorItemNotFound``.

A send that Graph is still working on after our client gave up (Graph keeps a request up to
about 100 s; our client waits ``TIDEMARK_GRAPH_TIMEOUT_S``) is waited out inside ``execute``
(below), so no later attempt sends the draft while it can still land. Hence ``horizon_s = 0``:
once an attempt has ended, *absent* is trusted at once. A 404 on our own send is not a failure
of the step but a sign that the draft moved on; the step stays in doubt and the probe decides.

Done means *submitted*: flagged submitted in Drafts, or out of Drafts. Graph's 202 means
accepted, so ``execute`` confirms with the read token that the draft was submitted, waiting at
most ``confirm_s``; if it was not, the step stays in doubt and the next attempt's probe decides:
*done* for a flagged or moved copy, *absent* (send that same draft) only for a draft in Drafts
whose flags say it was never submitted and whose send was never requested (the journal's mark,
written just before the send leaves: tidemark.wire), *unknown* otherwise. Graph documents no
submit bit readable during the window after the 202, so a draft whose send was requested is
never sent again without a person.

A send our client gave up on (a timeout, or Graph's 504) may still land after the attempt
ends, on a draft the next attempt is sending too; with the draft kept in Drafts that would be
a second send of a submitted draft. So after such a send ``execute`` watches the draft for
``late_s`` (``TIDEMARK_GRAPH_LATE_S``, 100 s by default) and only then leaves the step in
doubt; the lease it wrote before the send covers that wait, so no twin sends meanwhile.

The action ``awaits``: ``execute_async`` is the same sequence (the check of the draft, the send,
the watch for a late send, the confirm), written once as a coroutine that reaches Graph through
a ``probes.graph.Calls``. ``execute`` runs it with ``BLOCKING`` on the step's thread, as before;
``execute_async`` with ``AWAITING``: every call still runs on the client's loop, and the
caller's loop waits for it, and sleeps between reads, without a thread. ``stage`` stays a
blocking call of a step thread.

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
    AWAITING,
    BLOCKING,
    KEY_HEADER,
    KEY_PROPERTY_ID,
    LOOP_MARGIN_S,
    READ_ERRORS,
    Calls,
    GraphClient,
    GraphSendMailProbe,
    blocking,
    describe_error,
    me,
)
from tidemark.actions import ProbeResult, ProbeStatus, StepContext, address_list
from tidemark.errors import (
    ActionError,
    ConfigError,
    Refused,
    TargetUnavailable,
    Throttled,
    Unauthorized,
)
from tidemark.reads import retry_after_s
from tidemark.wire import effect

DEFAULT_CONFIRM_S = 10.0  # how long execute waits for a sent draft to leave Drafts
CONFIRM_ENV = "TIDEMARK_GRAPH_CONFIRM_S"
CONFIRM_POLL_S = 0.2
# A send our client gave up on (timeout, or Graph's own 504) may still be applied afterwards;
# Graph publishes no bound (a request is kept for about 100 s), so execute keeps watching the
# draft this long before it leaves the step in doubt (TIDEMARK_GRAPH_LATE_S): a next attempt
# must not send the draft while an earlier send of it can still land. A judgment, like Drive's
# horizon, to be raised where a deployment sees slower commits.
DEFAULT_LATE_S = 100.0
LATE_ENV = "TIDEMARK_GRAPH_LATE_S"
LATE_POLL_S = 2.0  # one read of the draft per poll: gentle on Graph's throttling
CONFIRM_READS = 3  # reads of one probe once folder ids are known: mailbox, Recoverable, a name
DRAFT_READS = 2  # the draft read before the send, and once more after it (refused, unanswered)

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
    """A ``sendMail`` body for the same message.

    The step does not use it: it sends a draft. It is kept for tools and tests that exercise
    sendMail itself."""
    return SendMailPostRequestBody(message=build_message(args, key), save_to_sent_items=True)


def graph_error(e: BaseException, what: str) -> ActionError:
    """Maps an exception from msgraph-sdk / kiota / httpx to what it means for the step."""
    text = f"{what}: {describe_error(e)}"
    if isinstance(e, APIError):
        status = e.response_status_code or 0
        if status in (401, 403):
            return Unauthorized(text)
        if status == 429:
            # "Returns HTTP status code 429 Too Many Requests and the requests fail" (Microsoft
            # Graph throttling guidance): turned away, nothing applied.
            headers = {k.lower(): v for k, v in (e.response_headers or {}).items()}
            return Throttled(text, retry_after_s(headers.get("retry-after")))
        if status == 408 or status >= 500:
            # Throttled or timed out: nothing done yet; a 5xx may come after the commit. Either
            # way the step stays in doubt and the next attempt probes.
            return TargetUnavailable(text)
        if 400 <= status < 500:
            return Refused(text)
    # httpx timeouts, refused or dropped connections, our own call timeout, anything unreadable
    return TargetUnavailable(text)


def confirm_timeout(env: Mapping[str, str] | None = None) -> float:
    """``TIDEMARK_GRAPH_CONFIRM_S`` if set, else DEFAULT_CONFIRM_S."""
    return _env_seconds(env, CONFIRM_ENV, DEFAULT_CONFIRM_S)


def late_timeout(env: Mapping[str, str] | None = None) -> float:
    """``TIDEMARK_GRAPH_LATE_S`` if set, else DEFAULT_LATE_S."""
    return _env_seconds(env, LATE_ENV, DEFAULT_LATE_S)


def _env_seconds(env: Mapping[str, str] | None, name: str, default: float) -> float:
    raw = (os.environ if env is None else env).get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value < 0:
        raise ConfigError(f"{name} must be a number of seconds >= 0, got {raw!r}")
    return value


def unanswered(e: BaseException) -> bool:
    """Whether a failed send may still be applied by Graph.

    That is so when our client gave up waiting, or Graph's gateway did (504) while the mailbox
    may still be working on it."""
    if isinstance(e, APIError):
        return e.response_status_code == 504
    return isinstance(e, TimeoutError | httpx.TimeoutException)


class GraphSendMail(MailAction):
    name: ClassVar[str] = "graph.send_mail"
    # The draft is the fence (see the module docstring) while it leaves Drafts during the send.
    horizon_s: float = 0.0
    # Where it stays there, a late send of it is a second send, whose effect is undocumented:
    # the send is marked before it leaves, and a draft whose send was requested is never sent
    # again automatically (probes.graph: never *absent* once the send was marked).
    marks_sends = True
    # execute_async: the send sequence awaited from the caller's loop (GraphClient.call_async).
    awaits: ClassVar[bool] = True

    def __init__(self, writer: GraphClient, reader: GraphClient, *,
                 confirm_s: float | None = None, late_s: float | None = None) -> None:
        """Sets the Graph clients and how long ``execute`` waits and watches.

        Args:
            writer: Graph client whose token has ``Mail.ReadWrite``, ``Mail.Send`` and
                ``User.Read``; used by ``stage``, ``execute`` and ``check_identity``.
            reader: Graph client whose token has ``Mail.Read`` and ``User.Read``; used by the
                probe and to confirm that a sent draft left Drafts.
            confirm_s: How long ``execute`` waits for the sent draft to leave Drafts
                (default: ``confirm_timeout()``).
            late_s: How long ``execute`` keeps watching the draft after a send it got no
                answer to, before it leaves the step in doubt (default: ``late_timeout()``).
        """
        self.writer = writer
        self.read_client = reader
        self.reader = GraphSendMailProbe(reader)
        self.confirm_s = confirm_timeout() if confirm_s is None else confirm_s
        self.late_s = late_timeout() if late_s is None else late_s
        # stage: one create; execute: a read of the draft, one send, then either a second
        # read of the draft (the send was refused) or reads of it until late_s is over (the
        # send went unanswered; the last read may start just as that ends), then probes until
        # confirm_s is over, the last of which may start just before that and take its reads'
        # timeouts (the well-known folder ids are read once, at check_identity or the first
        # probe). The lease written before the send covers all of it: a twin never sends the
        # draft while a send of ours can still land.
        self.deadline_s = (writer.timeout + self.confirm_s + self.late_s
                           + (CONFIRM_READS + DRAFT_READS) * reader.timeout
                           + 3 * LOOP_MARGIN_S)

    def snapshot(self, ctx: StepContext) -> dict[str, Any]:
        # Marks the intent as fenced by a draft: without a journaled draft, this step's execute
        # never ran (see GraphSendMailProbe.probe).
        return {"fence": "draft"}

    def probe(self, ctx: StepContext) -> ProbeResult:
        return self.reader.probe(ctx)

    def check_identity(self) -> dict[str, Any]:
        """Checks that both tokens name the same user in ``GET /me``.

        A probe reading another mailbox than the one the writer sends from would answer *absent*
        for every step."""
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
        return blocking(self._execute(BLOCKING, ctx))

    async def execute_async(self, ctx: StepContext) -> dict[str, Any]:
        """``execute`` with every read, the send and every wait between reads awaited.

        A step waiting on Graph (the send, the watch for a late send, the confirm) holds no
        thread."""
        return await self._execute(AWAITING, ctx)

    async def _execute(self, io: Calls, ctx: StepContext) -> dict[str, Any]:
        """The send of a journaled draft, written once for both paths (``io``)."""
        staged = ctx.staged
        if not staged or not staged.get("id"):
            raise ActionError("graph.send_mail: no journaled draft to send")
        draft_id = str(staged["id"])
        await self._check_unsent(io, draft_id)
        try:
            with effect():  # the send is the step's effect (tidemark.wire)
                await io.call(self.writer,
                              lambda g: g.me.messages.by_message_id(draft_id).send.post())
        except SEND_ERRORS as e:
            failure = await self._send_failed(io, draft_id, e)
            if not unanswered(e):
                raise failure from e
            await self._await_late_send(io, draft_id, failure)
        return await self._confirm(io, ctx)

    async def _await_late_send(self, io: Calls, draft_id: str, failure: ActionError) -> None:
        """Watches the draft for ``late_s`` after a send that went unanswered.

        Returns once it is no longer a plain draft (the send landed, or something else happened
        to it: the confirm and the probe tell). Raises ``failure`` if it still is by then, when
        a late send of it can no longer land."""
        deadline = time.monotonic() + self.late_s
        while True:
            try:
                if await self.reader.unsent_draft(io, draft_id) is not None:
                    return
            except APIError as e:
                if e.response_status_code == 404:
                    return  # the draft left Drafts under a new id: the send landed
            except READ_ERRORS:
                pass  # unreadable for now: keep watching; the probe decides in the end
            left = deadline - time.monotonic()
            if left <= 0:
                raise failure
            await io.sleep(min(LATE_POLL_S, left))

    async def _check_unsent(self, io: Calls, draft_id: str) -> None:
        """Sends nothing unless the draft is still a plain draft.

        A draft flagged submitted (Graph keeps a sent draft in Drafts until transport takes it)
        would be sent a second time, and what Exchange does then is undocumented. Raises
        TargetUnavailable otherwise: the step stays in doubt and the probe decides."""
        try:
            why = await self.reader.unsent_draft(io, draft_id)
        except READ_ERRORS as e:
            why = f"draft {draft_id} cannot be read ({describe_error(e)})"
        if why is not None:
            raise TargetUnavailable(f"graph.send_mail: not sent: {why}; the step stays in "
                                    f"doubt")

    async def _send_failed(self, io: Calls, draft_id: str, e: BaseException) -> ActionError:
        """What a failed send means.

        A refusal counts as one only while the draft is still a plain draft. A 404 (no longer a
        draft) leaves the step in doubt for the probe. So does any refusal of a draft that was
        submitted meanwhile (a send of ours that landed late, an earlier attempt's). It is never
        ``failed`` for a mail that may have gone."""
        if isinstance(e, APIError) and e.response_status_code == 404:
            return TargetUnavailable(f"graph.send_mail: draft {draft_id} is no longer a draft "
                                     f"({describe_error(e)})")
        error = graph_error(e, "graph.send_mail: send draft")
        if isinstance(error, Refused):
            try:
                why = await self.reader.unsent_draft(io, draft_id)
            except READ_ERRORS as read_error:
                why = f"it cannot be read ({describe_error(read_error)})"
            if why is not None:
                return TargetUnavailable(f"{error}; the draft may have been sent ({why})")
        return error

    async def _confirm(self, io: Calls, ctx: StepContext) -> dict[str, Any]:
        """Waits until the probe sees our message submitted.

        Raises TargetUnavailable if it does not (or cannot read the mailbox) when confirm_s is
        over."""
        deadline = time.monotonic() + self.confirm_s
        while True:
            try:
                probed = await self.reader.probe_with(io, ctx)
            except READ_ERRORS as e:  # the probe answers unknown itself; belt and braces
                probed = ProbeResult.unknown(describe_error(e))
            if probed.status is ProbeStatus.DONE:
                return {**probed.observed, "accepted": True, "draft": ctx.staged}
            if time.monotonic() >= deadline:
                raise TargetUnavailable(
                    f"graph.send_mail: the send was accepted but the message was not seen "
                    f"submitted within {self.confirm_s:g}s ({probed.reason}); the step stays "
                    f"in doubt")
            await io.sleep(CONFIRM_POLL_S)
