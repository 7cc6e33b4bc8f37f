"""``gmail.send`` {to, cc?, subject, body}: one plain-text mail sent through the Gmail API.

Irreversible. No Gmail endpoint honours an idempotency key, so the fence is a draft: ``stage``
creates a draft carrying our key (an ``X-Tidemark-Key`` header, kept by Gmail, and a Message-ID
derived from it, replaced by Gmail on send), run_step journals the draft's id, and ``execute``
sends exactly that draft with ``drafts.send``. Gmail consumes a draft when it sends it, so a
send that is slower than our client's timeout and lands late, and the send of a later attempt,
cannot both go out: whichever comes second finds no draft and gets a 404. Recovery asks
:class:`probes.gmail.GmailSendProbe` whether our sent copy exists, or our draft is still unsent.

Credentials: the write token needs ``gmail.compose`` (drafts.create and drafts.send accept
compose, modify or full access, never ``gmail.send``); compose is the narrowest of them, and it
cannot list or read the mailbox's other mail. The read token needs ``gmail.readonly``.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from email.message import EmailMessage
from typing import Any, ClassVar

from googleapiclient.discovery import Resource
from googleapiclient.errors import HttpError

from activities.mail import MailAction
from probes.gmail import KEY_HEADER, GmailSendProbe, gmail_client, message_id_for, profile
from probes.google_http import CLIENT_ERRORS, DEFAULT_TIMEOUT_S, google_error
from tidemark.actions import ProbeResult, StepContext, address_list
from tidemark.errors import ConfigError, Refused, TargetUnavailable

TIMEOUT_ENV = "TIDEMARK_GMAIL_TIMEOUT_S"  # the clients' timeout, seconds
USER_ENV = "TIDEMARK_GMAIL_USER"  # the mailbox address to act on; "me" (the token's) if unset
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
    # Fenced at the provider: a late drafts.send and a new one cannot both send the draft, so
    # after an ambiguous failure the next attempt may probe and act at once.
    horizon_s = 0.0

    def __init__(self, writer: Resource, reader: Resource, user_id: str = "me", *,
                 timeout: float = DEFAULT_TIMEOUT_S) -> None:
        """
        Args:
            writer: Gmail client whose token has ``gmail.compose``; used by ``stage`` and
                ``execute``, and to read the profile it writes to.
            reader: Gmail client whose token has ``gmail.readonly``; used by the probe and the
                snapshot.
            user_id: The mailbox, ``me`` for the tokens' own.
            timeout: The clients' timeout in seconds; the action's deadline follows from it.
        """
        self.writer = writer
        self.user_id = user_id
        self.reader = GmailSendProbe(reader, user_id)
        self.deadline_s = 2 * timeout + DEADLINE_MARGIN_S

    @classmethod
    def from_env(cls, env: Mapping[str, str], url: str, write: str, read: str) -> GmailSend:
        """The action as a worker configures it: ``TIDEMARK_GMAIL_TIMEOUT_S`` (default 30) and
        ``TIDEMARK_GMAIL_USER`` (default ``me``) besides the URL and the two tokens."""
        raw = env.get(TIMEOUT_ENV)
        try:
            timeout = float(raw) if raw else DEFAULT_TIMEOUT_S
        except ValueError:
            raise ConfigError(f"{TIMEOUT_ENV} must be a number of seconds, got {raw!r}") from None
        if not timeout > 0:
            raise ConfigError(f"{TIMEOUT_ENV} must be positive, got {raw!r}")
        return cls(gmail_client(url, write, timeout=timeout),
                   gmail_client(url, read, timeout=timeout),
                   env.get(USER_ENV) or "me", timeout=timeout)

    def check_identity(self) -> dict[str, Any]:
        """Both tokens' ``users.getProfile`` must name one mailbox (and the configured one, if
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
        if not ctx.staged or "draft_id" not in ctx.staged:
            raise ValueError("gmail.send sends a journaled draft: stage() must run first")
        draft_id = ctx.staged["draft_id"]
        try:
            sent = self.writer.users().drafts().send(
                userId=self.user_id, body={"id": draft_id}).execute(num_retries=0)
        except HttpError as e:
            if e.status_code == 404:
                # The draft is gone: an earlier attempt's send landed after all, or somebody
                # deleted it. Not a refusal: the step stays in doubt and the probe decides.
                raise TargetUnavailable(
                    f"gmail drafts.send: draft {draft_id} is no longer there (sent by an "
                    "earlier attempt, or deleted)") from e
            raise google_error(e, "gmail drafts.send") from e
        except CLIENT_ERRORS as e:
            raise google_error(e, "gmail drafts.send") from e
        return {"id": sent["id"], "threadId": sent["threadId"],
                "labelIds": sent.get("labelIds", []), "draft_id": draft_id}
