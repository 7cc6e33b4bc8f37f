"""``gmail.send`` {to, cc?, subject, body}: one plain-text mail sent through the Gmail API.

Irreversible. No Gmail endpoint honours an idempotency key, so the fence is a draft: ``stage``
creates a draft carrying our key (an ``X-Tidemark-Key`` header, kept by Gmail, and a Message-ID
derived from it, replaced by Gmail on send), run_step journals the draft's id, and ``execute``
sends exactly that draft with ``drafts.send``. Gmail consumes a draft when it sends it, so a
send that is slower than our client's timeout and lands late, and the send of a later attempt,
should not both go out. Google documents neither that (the reference says only that drafts.send
"sends the specified, existing draft") nor what the second send gets, so neither is relied on:

* every failure after the send request left us (a 404, a 5xx, a timeout, a dropped
  connection, any status that is not a refusal of the request as such) leaves the step in doubt
  for the probe; a 401/403 (the credential, checked before Gmail looks at the request) stops
  the task with the step in doubt; only a 400 whose draft the probe then finds still in Drafts,
  unsent, closes the step as failed (INVALID_ARGUMENT, as Google's error model defines it, is a
  problem of the request whatever the state, and a send that went out consumes its draft);
* a later attempt does not send while an earlier one may still be sending: after an ambiguous
  failure the lease is held for ``horizon_s`` (TIDEMARK_GMAIL_HORIZON_S), so two drafts.send
  of one draft never overlap, whatever Gmail would make of them.

Recovery asks :class:`probes.gmail.GmailSendProbe` whether our sent copy exists, or our draft is
still unsent.

Credentials: the write token needs ``gmail.compose`` (drafts.create and drafts.send accept
compose, modify or full access, never ``gmail.send``); compose is the narrowest of them, and it
cannot list or read the mailbox's other mail. The read token needs ``gmail.readonly``.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Mapping
from email.message import EmailMessage
from typing import Any, ClassVar

from googleapiclient.discovery import Resource
from googleapiclient.errors import HttpError
from googleapiclient.http import HttpRequest

from activities.mail import MailAction
from probes.gmail import KEY_HEADER, GmailSendProbe, gmail_client, message_id_for, profile
from probes.google_async import execute_async
from probes.google_http import CLIENT_ERRORS, DEFAULT_TIMEOUT_S, google_error
from tidemark.actions import ProbeResult, ProbeStatus, StepContext, address_list
from tidemark.errors import ConfigError, Refused, TargetUnavailable, Unauthorized
from tidemark.wire import effect

TIMEOUT_ENV = "TIDEMARK_GMAIL_TIMEOUT_S"  # the clients' timeout, seconds
USER_ENV = "TIDEMARK_GMAIL_USER"  # the mailbox address to act on; "me" (the token's) if unset
HORIZON_ENV = "TIDEMARK_GMAIL_HORIZON_S"  # seconds, from 0 to 600
# How long after our client gave up on a drafts.send Gmail may still be sending it. Google
# publishes no bound; a minute is a judgment (as for Drive), to be raised where a deployment
# sees slower sends. Until it has passed, no later attempt sends: two overlapping sends of one
# draft may both go out, for all Google documents.
DEFAULT_HORIZON_S = 60.0
MAX_HORIZON_S = 600.0
# On top of twice the client timeout (connecting, then waiting for the answer, may each take
# that long) before a call is over for certain.
DEADLINE_MARGIN_S = 5.0


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
    # execute_async sends the same drafts.send on the event loop (probes.google_async).
    awaits: ClassVar[bool] = True

    def __init__(self, writer: Resource, reader: Resource, user_id: str = "me", *,
                 timeout: float = DEFAULT_TIMEOUT_S,
                 horizon_s: float = DEFAULT_HORIZON_S) -> None:
        """Sets the Gmail clients, the mailbox, the timeout and Gmail's horizon.

        Args:
            writer: Gmail client whose token has ``gmail.compose``; used by ``stage`` and
                ``execute``, and to read the profile it writes to.
            reader: Gmail client whose token has ``gmail.readonly``; used by the probe and the
                snapshot.
            user_id: The mailbox, ``me`` for the tokens' own.
            timeout: The clients' timeout in seconds; the action's deadline follows from it.
            horizon_s: How long after an ambiguous failure Gmail may still send the draft; no
                later attempt probes (and sends) before it has passed.
        """
        self.horizon_s = horizon_s
        self.writer = writer
        self.user_id = user_id
        self.reader = GmailSendProbe(reader, user_id)
        self.deadline_s = 2 * timeout + DEADLINE_MARGIN_S

    @classmethod
    def from_env(cls, env: Mapping[str, str], url: str, write: str, read: str) -> GmailSend:
        """The action as a worker configures it, from the environment.

        Besides the URL and the two tokens, it reads ``TIDEMARK_GMAIL_TIMEOUT_S`` (default 30),
        ``TIDEMARK_GMAIL_HORIZON_S`` (default 60, from 0 to 600) and ``TIDEMARK_GMAIL_USER``
        (default ``me``)."""
        timeout = _seconds(env, TIMEOUT_ENV, DEFAULT_TIMEOUT_S)
        if not timeout > 0:
            raise ConfigError(f"{TIMEOUT_ENV} must be positive, got {env.get(TIMEOUT_ENV)!r}")
        horizon = _seconds(env, HORIZON_ENV, DEFAULT_HORIZON_S)
        if not 0 <= horizon <= MAX_HORIZON_S:
            raise ConfigError(f"{HORIZON_ENV} must be from 0 to {MAX_HORIZON_S:.0f} seconds, "
                              f"got {env.get(HORIZON_ENV)!r}")
        return cls(gmail_client(url, write, timeout=timeout),
                   gmail_client(url, read, timeout=timeout),
                   env.get(USER_ENV) or "me", timeout=timeout, horizon_s=horizon)

    def check_identity(self) -> dict[str, Any]:
        """Checks that both tokens reach one mailbox, and the configured one.

        Both tokens' ``users.getProfile`` must name one mailbox (and the configured one, if
        any): a probe reading another mailbox would find nothing and say *absent*. The write
        token can read the profile because ``gmail.compose`` may call getProfile."""
        seen: dict[str, str] = {}
        for role, client in (("read", self.reader.reader), ("write", self.writer)):
            try:
                # "me": the token's own mailbox, whatever TIDEMARK_GMAIL_USER says
                seen[role] = str(profile(client, "me")["emailAddress"])
            except CLIENT_ERRORS as e:
                err = google_error(e, "gmail users.getProfile")
                raise ConfigError(
                    f"gmail: cannot read the mailbox profile with the {role} credential ({err});"
                    f" the write token needs gmail.compose, the read token gmail.readonly"
                ) from None
        read, write = seen["read"], seen["write"]
        if read.lower() != write.lower():
            raise ConfigError(
                f"gmail: the read credential reads mailbox {read} but the write credential "
                f"writes mailbox {write}; give TIDEMARK_GMAIL_READ_TOKEN and "
                f"TIDEMARK_GMAIL_WRITE_TOKEN of the same account")
        if self.user_id != "me" and self.user_id.lower() != read.lower():
            raise ConfigError(f"gmail: {USER_ENV} is {self.user_id} but both credentials "
                              f"address mailbox {read}")
        return {"mailbox": read}

    def snapshot(self, ctx: StepContext) -> dict[str, Any]:
        try:
            return self.reader.snapshot()
        except CLIENT_ERRORS as e:  # nothing written yet; the step can be tried again
            raise google_error(e, "gmail users.getProfile") from e

    def probe(self, ctx: StepContext) -> ProbeResult:
        return self.reader.probe(ctx)

    def stage(self, ctx: StepContext) -> dict[str, Any]:
        """Creates the draft that ``execute`` sends; its id is journaled before."""
        try:
            message = build_message(ctx.args, ctx.key)
        except ValueError as e:  # the email package refused a header: nothing was created
            raise Refused(f"gmail.send: cannot build the message: {e}") from e
        raw = base64.urlsafe_b64encode(message.as_bytes()).decode()
        try:
            draft = self.writer.users().drafts().create(
                userId=self.user_id, body={"message": {"raw": raw}}).execute(num_retries=0)
        except CLIENT_ERRORS as e:
            raise google_error(e, "gmail drafts.create") from e
        return {"draft_id": draft["id"], "message_id": draft["message"]["id"]}

    def execute(self, ctx: StepContext) -> dict[str, Any]:
        draft_id, request = self._send_request(ctx)
        try:
            with effect():
                sent = request.execute(num_retries=0)
        except HttpError as e:
            return self._after_error(ctx, draft_id, e)
        except CLIENT_ERRORS as e:  # a timeout, a dropped connection: in doubt
            raise google_error(e, "gmail drafts.send") from e
        return _outcome(sent, draft_id)

    async def execute_async(self, ctx: StepContext) -> dict[str, Any]:
        draft_id, request = self._send_request(ctx)
        try:
            with effect():
                sent = await execute_async(request)
        except HttpError as e:  # the probe it may ask reads the mailbox: a blocking call
            return await asyncio.to_thread(self._after_error, ctx, draft_id, e)
        except CLIENT_ERRORS as e:
            raise google_error(e, "gmail drafts.send") from e
        return _outcome(sent, draft_id)

    def _send_request(self, ctx: StepContext) -> tuple[str, HttpRequest]:
        """The journaled draft's id and its ``drafts.send``, built and not sent."""
        if not ctx.staged or "draft_id" not in ctx.staged:
            raise ValueError("gmail.send sends a journaled draft: stage() must run first")
        draft_id = ctx.staged["draft_id"]
        return draft_id, self.writer.users().drafts().send(userId=self.user_id,
                                                           body={"id": draft_id})

    def _after_error(self, ctx: StepContext, draft_id: str, e: HttpError) -> dict[str, Any]:
        """What an error answer to ``drafts.send`` means for the step.

        Returns:
            The sent copy, when a 400 turns out to follow a send that went out (an earlier
            attempt's).

        Raises:
            Unauthorized: a 401, or a 403 that is no rate limit (the step stays in doubt).
            Refused: a 400, and the probe finds our draft still in Drafts with no sent copy.
            TargetUnavailable: anything else; the step stays in doubt and the probe decides.
        """
        err = google_error(e, "gmail drafts.send")
        if isinstance(err, Unauthorized):
            raise err from e
        if e.status_code == 400:
            # INVALID_ARGUMENT is a problem of the request itself, but Gmail documents no error
            # of drafts.send, so the 400 of a draft another send consumed is possible too. The
            # mailbox tells them apart: a draft still there, unsent, was refused.
            probed = self.reader.probe(ctx)
            if probed.status is ProbeStatus.ABSENT:
                raise Refused(f"{err}; draft {draft_id} is still in Drafts and nothing was "
                              "sent: the send was refused") from e
            if probed.status is ProbeStatus.DONE:
                return {**probed.observed, "draft_id": draft_id}
        gone = " (draft no longer there: sent by an earlier attempt, or deleted)" if (
            e.status_code == 404) else ""
        raise TargetUnavailable(f"{err}{gone}; the send may have gone out, so the step stays "
                                "in doubt and the probe decides") from e


def _outcome(sent: dict[str, Any], draft_id: str) -> dict[str, Any]:
    """A step's outcome: the sent message as drafts.send answered it."""
    return {"id": sent["id"], "threadId": sent["threadId"],
            "labelIds": sent.get("labelIds", []), "draft_id": draft_id}


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number of seconds, got {raw!r}") from None
