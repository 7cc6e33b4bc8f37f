"""Read-only side of ``gmail.send``: the Gmail client, the mailbox snapshot and the probe.

The key travels in the message as an ``X-Tidemark-Key`` header, next to a Message-ID derived
from it. ``gmail.send`` fences at the provider: it creates a draft carrying the key, the draft's
id is journaled, and only then is that draft sent by id (``drafts.send`` consumes the draft;
that a second send of it then has nothing to send is not documented, so ``gmail.send`` never
lets two sends of one draft overlap: see its horizon).

The probe counts only our own sent copy: a message carrying our key *and* the SENT label (a
message mailed to the mailbox can carry any header and Message-ID; keys are predictable). It
looks in two places, neither of which depends on a clock or on Gmail's lagging search index:

* the fast path, a search by our Message-ID (``rfc822msgid:``): positive answers only, since the
  index trails the mailbox and Gmail replaces the Message-ID of what it sends;
* the mailbox's history since the ``historyId`` recorded in before_state (``history.list``,
  messages added with the SENT label, chronological), read in full up to MAX_CANDIDATES;
* when that history is no longer kept (history.list answers 404: a historyId is "typically
  valid for at least a week, but in some rare circumstances may be valid for only a few
  hours"), a search of SENT instead: by our Message-ID, then every message sent since a day
  before the intent, each read for our key. Search trails the mailbox, so what it does not
  find is not proof of absence: the probe then says why.

Then the draft decides what the history cannot: our draft still in Drafts means it was never
sent (sending it again is safe), our draft gone with no sent copy means somebody deleted the
draft or the sent copy: a person decides.

The probe needs a ``gmail.readonly`` token (``gmail.metadata`` cannot search: Gmail refuses
``q`` for any token carrying it; nor can it read drafts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from googleapiclient.discovery import Resource
from googleapiclient.errors import HttpError

from probes.google_http import (
    CLIENT_ERRORS,
    DEFAULT_TIMEOUT_S,
    google_error,
    google_service,
    read,
)
from tidemark.actions import ProbeResult, StepContext

KEY_HEADER = "X-Tidemark-Key"
MESSAGE_ID_DOMAIN = "tidemark.invalid"  # reserved TLD: the id must never look like a real host

# More messages sent since the snapshot than this and the probe stops and says it cannot tell,
# rather than reading a whole mailbox (each candidate costs one request).
MAX_CANDIDATES = 500
HISTORY_PAGE = 500  # Gmail's largest page of history records: fewest round trips
# How far before the intent a search of SENT looks once the history is gone: Gmail's clock and
# ours may disagree, and the intent was written before the send; a day covers both.
SEARCH_MARGIN_S = 24 * 3600
SENT = "SENT"


def message_id_for(key: str) -> str:
    """The Message-ID we stamp for ``key`` (Gmail replaces it; the header keeps the key)."""
    return f"<{key}@{MESSAGE_ID_DOMAIN}>"


def gmail_client(base_url: str, token: str, *, timeout: float = DEFAULT_TIMEOUT_S) -> Resource:
    """A Gmail v1 client for ``base_url``, authorised with the bearer ``token``.

    ``base_url`` is ``https://gmail.googleapis.com`` or a staging URL; see
    ``probes.google_http``."""
    # Gmail's discovery paths already contain "gmail/v1/", so its endpoint is the bare root.
    return google_service("gmail", "v1", base_url, token, endpoint="/", timeout=timeout)


def profile(client: Resource, user_id: str = "me") -> dict[str, Any]:
    """``users.getProfile``: the mailbox's ``emailAddress`` and current ``historyId``."""
    return dict(read(client.users().getProfile(userId=user_id)))


def _header(message: dict[str, Any], name: str) -> str | None:
    for h in message.get("payload", {}).get("headers", []):
        if h.get("name", "").lower() == name.lower():
            return str(h.get("value", ""))
    return None


@dataclass
class _Search:
    """What the sent-copy search found: our copy, or nothing.

    ``doubt`` says why "nothing" does not prove the mail unsent (too many candidates, a copy
    deleted for good …)."""

    hit: dict[str, Any] | None = None
    found_by: str = ""
    doubt: str | None = None
    checked: int = 0


class GmailSendProbe:
    """Finds the copy a ``gmail.send`` step sent, by the key in its headers and its SENT label."""

    def __init__(self, reader: Resource, user_id: str = "me") -> None:
        self.reader = reader
        self.user_id = user_id

    def snapshot(self) -> dict[str, Any]:
        """The before_state: the mailbox and its ``historyId`` now, before anything is sent.

        The probe reads the mailbox's history from there on."""
        p = profile(self.reader, self.user_id)
        return {"mailbox": p["emailAddress"], "history_id": str(p["historyId"])}

    def probe(self, ctx: StepContext) -> ProbeResult:
        """Tells whether the mail was sent: done, absent or unknown.

        ``done`` with the sent copy's id, threadId and labelIds. ``absent`` when no copy was
        sent (and, for a staged step, our draft is still unsent). ``unknown`` when Gmail could
        not be read or cannot tell (the step is then never re-sent blindly)."""
        draft_id = (ctx.staged or {}).get("draft_id")
        try:
            search = self._search(ctx)
            if search.hit is not None:
                return self._found(ctx, search, draft_id)
            if draft_id is None:
                # No draft was journaled, so this step never sent one; a draft carrying our
                # key left by a crash before the journal write is not a sent mail.
                if search.doubt is not None:
                    return ProbeResult.unknown(search.doubt, {"checked": search.checked})
                return ProbeResult.absent(
                    f"none of the {search.checked} messages sent since historyId "
                    f"{_start(ctx)} carries {KEY_HEADER} {ctx.key}",
                    {"checked": search.checked, "history_id": _start(ctx)})
            if self._draft_exists(draft_id):
                return ProbeResult.absent(
                    f"draft {draft_id} is still in Drafts, unsent; sending it by id can "
                    "happen only once", {"draft_id": draft_id, "checked": search.checked})
            # The draft is gone: sent (perhaps just now, by a late earlier attempt) or deleted.
            again = self._search(ctx)
            if again.hit is not None:
                return self._found(ctx, again, None)
            why = (f"draft {draft_id} is gone and no sent copy carries {KEY_HEADER} "
                   f"{ctx.key}: somebody deleted the draft, or the sent copy was deleted "
                   "for good")
            if again.doubt is not None:
                why += f" ({again.doubt})"
            return ProbeResult.unknown(why, {"draft_id": draft_id, "checked": again.checked})
        except CLIENT_ERRORS as e:
            return ProbeResult.unknown(
                f"cannot read the mailbox: {google_error(e, 'gmail history/messages/drafts')}")

    def _found(self, ctx: StepContext, search: _Search, draft_id: str | None) -> ProbeResult:
        hit = search.hit
        assert hit is not None
        if draft_id is not None and self._draft_exists(draft_id):
            # drafts.send consumes the draft: a sent copy next to our unsent draft was not sent
            # by this step (imported with a SENT label, or sent by other means).
            return ProbeResult.unknown(
                f"message {hit['id']} carries {KEY_HEADER} {ctx.key} and the SENT label, but "
                f"our draft {draft_id} is still unsent: that copy is not ours",
                {"id": hit["id"], "draft_id": draft_id})
        return ProbeResult.done(
            {"id": hit["id"], "threadId": hit["threadId"], "labelIds": hit.get("labelIds", []),
             "message_id": _header(hit, "Message-ID"), "found_by": search.found_by},
            f"sent message {hit['id']} carries {KEY_HEADER} {ctx.key}")

    def _search(self, ctx: StepContext) -> _Search:
        """Our sent copy by the fast path, then through the history since the snapshot."""
        checked: set[str] = set()
        # Fast path: a Gmail that kept our Message-ID. The index may not show it yet, so
        # finding nothing here proves nothing.
        page = read(self.reader.users().messages().list(
            userId=self.user_id, q=f"rfc822msgid:{message_id_for(ctx.key)}",
            includeSpamTrash=True, maxResults=10))
        for m in page.get("messages", []):
            checked.add(m["id"])
            hit = self._ours(m["id"], ctx.key)
            if isinstance(hit, dict):
                return _Search(hit, "rfc822msgid", checked=len(checked))
        start = _start(ctx)
        if start is None:
            return _Search(doubt="before_state holds no historyId to read the mailbox's "
                                 "history from", checked=len(checked))
        ids, doubt = self._sent_since(start)
        found_by = "history"
        if ids is None:  # the history is no longer kept: search SENT instead
            ids, doubt = self._sent_by_search(ctx, start)
            found_by = "sent search"
        gone: list[str] = []
        for mid in ids:
            if mid in checked:
                continue
            checked.add(mid)
            hit = self._ours(mid, ctx.key)
            if hit is None:
                gone.append(mid)
            elif hit:
                return _Search(hit, found_by, checked=len(checked))
        if gone and doubt is None:
            doubt = (f"{len(gone)} message(s) sent since historyId {start} were deleted for "
                     f"good (e.g. {gone[0]}); one may have been ours")
        return _Search(doubt=doubt, checked=len(checked))

    def _sent_since(self, start: str) -> tuple[list[str] | None, str | None]:
        """Ids of the messages that got the SENT label after history id ``start``.

        A message counts if it was added with the label, labelled with it, or deleted while it
        had it; oldest first. Also returns why that list is not the whole story, if so. None for
        the ids when Gmail no longer keeps that history."""
        ids: list[str] = []
        token: str | None = None
        while True:
            try:
                page = read(self.reader.users().history().list(
                    userId=self.user_id, startHistoryId=start, labelId=SENT,
                    historyTypes=["messageAdded", "messageDeleted", "labelAdded"],
                    maxResults=HISTORY_PAGE, pageToken=token))
            except HttpError as e:
                if e.status_code == 404:  # documented: history before startHistoryId is gone
                    return None, None
                raise
            for record in page.get("history", []):
                # A message stored with SENT, one that had it when deleted, and one that got it
                # later (should Gmail turn a draft into the sent message rather than add one).
                changes = [*record.get("messagesAdded", []), *record.get("messagesDeleted", []),
                           *(c for c in record.get("labelsAdded", [])
                             if SENT in c.get("labelIds", []))]
                for change in changes:
                    mid = change.get("message", {}).get("id")
                    if mid and mid not in ids:
                        ids.append(mid)
            if len(ids) > MAX_CANDIDATES:
                return ids[:MAX_CANDIDATES], (f"more than {MAX_CANDIDATES} messages sent since "
                                              f"historyId {start}; too many to check one by one")
            token = page.get("nextPageToken")
            if not token:
                return ids, None

    def _sent_by_search(self, ctx: StepContext, start: str) -> tuple[list[str], str]:
        """Ids of SENT messages that may be our copy, found by search.

        The search runs once the history since ``start`` is gone. It finds those with our
        Message-ID, then every one sent since a day before the intent (Gmail's clock may differ
        from ours; a day covers any a person would run), up to MAX_CANDIDATES. Also returns why
        finding none of ours would still prove nothing."""
        doubt = (f"the mailbox's history since historyId {start} is no longer kept (Gmail "
                 "keeps a historyId at least a week, in rare cases a few hours); SENT was "
                 "searched instead, and search trails the mailbox")
        queries = [f"in:sent rfc822msgid:{message_id_for(ctx.key)}"]
        queries.append("in:sent" if ctx.started_at is None else
                       f"in:sent after:{int(ctx.started_at.timestamp()) - SEARCH_MARGIN_S}")
        ids: list[str] = []
        for q in queries:
            token: str | None = None
            while True:
                page = read(self.reader.users().messages().list(
                    userId=self.user_id, q=q, maxResults=HISTORY_PAGE, pageToken=token))
                ids += [m["id"] for m in page.get("messages", []) if m["id"] not in ids]
                if len(ids) > MAX_CANDIDATES:
                    return ids[:MAX_CANDIDATES], (f"{doubt}; more than {MAX_CANDIDATES} "
                                                  "messages sent since; too many to check")
                token = page.get("nextPageToken")
                if not token:
                    break
        return ids, doubt

    def _ours(self, mid: str, key: str) -> dict[str, Any] | Literal[False] | None:
        """The message if it is our sent copy; False if it is not; None if it is gone."""
        try:
            msg = read(self.reader.users().messages().get(
                userId=self.user_id, id=mid, format="metadata",
                metadataHeaders=[KEY_HEADER, "Message-ID"]))
        except HttpError as e:
            if e.status_code == 404:
                return None
            raise
        ours = SENT in msg.get("labelIds", []) and _header(msg, KEY_HEADER) == key
        return dict(msg) if ours else False

    def _draft_exists(self, draft_id: str) -> bool:
        try:
            read(self.reader.users().drafts().get(userId=self.user_id, id=draft_id,
                                                  format="minimal"))
        except HttpError as e:
            if e.status_code == 404:
                return False
            raise
        return True


def _start(ctx: StepContext) -> str | None:
    value = (ctx.before_state or {}).get("history_id")
    return str(value) if value else None
