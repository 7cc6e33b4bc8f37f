"""Read-only side of ``gmail.send``: the Gmail client and the probe that finds our message.

The key travels in the message as an ``X-Tidemark-Key`` header, next to a Message-ID derived
from it. Gmail replaces that Message-ID with its own on send, so the derived id is only a fast
path; the probe's answer rests on the header: it lists the newest sent messages (by label, which
Gmail's lagging search index cannot hide) and what search finds sent since the intent's start,
fetches the metadata headers of each candidate, and matches our key.

The probe needs a ``gmail.readonly`` token (``gmail.metadata`` cannot search: Gmail refuses
``q`` for any token carrying it).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from googleapiclient.discovery import Resource

from probes.google_http import CLIENT_ERRORS, DEFAULT_TIMEOUT_S, google_error, google_service
from tidemark.actions import ProbeResult, StepContext

KEY_HEADER = "X-Tidemark-Key"
MESSAGE_ID_DOMAIN = "tidemark.invalid"  # reserved TLD: the id must never look like a real host

# Seconds to search before the intent's start: Gmail stamps internalDate by Google's clock, not
# ours, and a few minutes comfortably covers NTP-synchronised hosts.
CLOCK_SKEW_S = 300
# More sent messages than this in the window and the probe stops and says it cannot tell,
# rather than reading a whole mailbox (each candidate costs one request).
MAX_CANDIDATES = 500
PAGE_SIZE = 100  # Gmail's default page; fewer round trips than smaller pages, small responses
# Newest sent messages read by label on top of the search: Gmail's index trails by seconds to
# minutes, and a mailbox rarely sends more than this many messages in that time.
RECENT_SENT = 50


def message_id_for(key: str) -> str:
    """The Message-ID we stamp for ``key`` (Gmail replaces it; the header keeps the key)."""
    return f"<{key}@{MESSAGE_ID_DOMAIN}>"


def gmail_client(base_url: str, token: str, *, timeout: float = DEFAULT_TIMEOUT_S) -> Resource:
    """A Gmail v1 client for ``base_url`` (``https://gmail.googleapis.com`` or a staging URL)
    authorised with the bearer ``token``; see ``probes.google_http``."""
    # Gmail's discovery paths already contain "gmail/v1/", so its endpoint is the bare root.
    return google_service("gmail", "v1", base_url, token, endpoint="/", timeout=timeout)


def _header(message: dict[str, Any], name: str) -> str | None:
    for h in message.get("payload", {}).get("headers", []):
        if h.get("name", "").lower() == name.lower():
            return str(h.get("value", ""))
    return None


class GmailSendProbe:
    """Finds the message a ``gmail.send`` step sent, by the key in its headers."""

    def __init__(self, reader: Resource, user_id: str = "me") -> None:
        self.reader = reader
        self.user_id = user_id

    def probe(self, ctx: StepContext) -> ProbeResult:
        """``done`` with the message's id, threadId and labelIds when a message carrying our key
        exists; ``absent`` when none was sent since the intent's start; ``unknown`` when Gmail
        could not be read (the step is then never re-sent blindly)."""
        if ctx.started_at is None:
            return ProbeResult.unknown("the step has no recorded start; cannot bound the search")
        since = _epoch(ctx.started_at) - CLOCK_SKEW_S
        checked: set[str] = set()
        searches = (
            # Fast path: a Gmail that kept our Message-ID (or a copy imported elsewhere).
            ("rfc822msgid", {"q": f"rfc822msgid:{message_id_for(ctx.key)}"}),
            # The newest sent messages by label, not by search: Gmail's search index trails the
            # mailbox, and a probe right after a lost response would otherwise miss the message.
            ("recent sent", {"labelIds": ["SENT"], "maxResults": RECENT_SENT}),
            ("sent since intent", {"q": f"in:sent after:{since}"}),
        )
        try:
            for found_by, params in searches:
                ids = self._list(params)
                if ids is None:
                    return ProbeResult.unknown(
                        f"more than {MAX_CANDIDATES} messages sent since {since}; "
                        "too many to check one by one")
                for mid in ids:
                    if mid in checked:
                        continue
                    checked.add(mid)
                    hit = self._ours(mid, ctx.key)
                    if hit is not None:
                        return ProbeResult.done(
                            {"id": hit["id"], "threadId": hit["threadId"],
                             "labelIds": hit.get("labelIds", []),
                             "message_id": _header(hit, "Message-ID"), "found_by": found_by},
                            f"message {hit['id']} carries {KEY_HEADER} {ctx.key}")
        except CLIENT_ERRORS as e:
            return ProbeResult.unknown(
                f"cannot search the mailbox: {google_error(e, 'gmail messages.list/get')}")
        return ProbeResult.absent(
            f"none of the {len(checked)} messages sent since {since} (epoch seconds) carries "
            f"{KEY_HEADER} {ctx.key}", {"checked": len(checked), "since": since})

    def _list(self, params: dict[str, Any]) -> list[str] | None:
        """Ids that ``messages.list`` gives for ``params`` (trash and spam included: a sent
        message that was deleted afterwards was still sent), or None when there are more than
        MAX_CANDIDATES. Without ``q`` only the first page is read (the newest messages)."""
        ids: list[str] = []
        token: str | None = None
        while True:
            page = self.reader.users().messages().list(
                userId=self.user_id, includeSpamTrash=True, pageToken=token,
                **{"maxResults": PAGE_SIZE, **params}).execute(num_retries=0)
            ids.extend(m["id"] for m in page.get("messages", []))
            if len(ids) > MAX_CANDIDATES:
                return None
            token = page.get("nextPageToken")
            if not token or "q" not in params:
                return ids

    def _ours(self, mid: str, key: str) -> dict[str, Any] | None:
        # A candidate deleted between list and get raises a 404 here, and the probe answers
        # unknown: that message may have been ours.
        msg = self.reader.users().messages().get(
            userId=self.user_id, id=mid, format="metadata",
            metadataHeaders=[KEY_HEADER, "Message-ID"]).execute(num_retries=0)
        return msg if _header(msg, KEY_HEADER) == key else None


def _epoch(t: datetime) -> int:
    return int(t.timestamp())
