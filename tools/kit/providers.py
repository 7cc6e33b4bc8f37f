"""``tidemark providers verify``: checks, against a provider, each assumption our probes rest on.

A probe is only as right as what it believes about the provider: that Stripe replays a request
with the same Idempotency-Key instead of creating a second payment, that Graph keeps a sent draft
in Drafts for a while, that Drive returns our appProperties to us. Each :class:`Assumption`
below names one such belief, the documentation it comes from, the probe that relies on it and
the staging switch that shows its other side; its ``check`` asks the provider over plain HTTP
(no SDK between us and the answer) and returns *facts*: small, comparable values ("the replay
carried ``Idempotent-Replayed: true``"). Measured numbers (seconds in Drafts, clock offset) go
to ``measured`` and are recorded, not compared.

Two ways to run it:

* against a staging server (``--staging URL``, the default in the tests): the emulators'
  defaults must keep every *required* assumption, and each switch must show its worst case;
* against the real providers (``--live``), for someone with test accounts: a Gmail test
  mailbox, a Microsoft 365 developer tenant, a Drive file that may be renamed and trashed, and a
  Stripe **test-mode** key (a live-mode key is refused). It needs ``--live`` on the command line,
  refuses to run where ``CI`` is set, and without credentials prints one line naming what it
  needs. ``--record DIR`` writes each check's facts and exchanges, with every credential and
  address scrubbed, as ``DIR/<assumption id>.json``: the fixtures that
  ``tests/test_provider_fixtures.py`` holds the emulators to.

A check that cannot tell (an HTTP error the check did not expect, a timeout) reports
``error``; it never counts as the assumption holding.
"""

from __future__ import annotations

import base64
import json
import os
import re
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from email.message import EmailMessage
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidemark import staging_tokens
from tidemark.actions import ClientLibrary
from tidemark.errors import TidemarkError

if TYPE_CHECKING:
    import httpx

# What the kit runs on beyond the core, each the extra that installs it (docs/install.md): its
# checks speak plain HTTP through httpx, which Microsoft Graph's SDK brings; without --live they
# run against the staging servers (aiohttp, and PyJWT for the OAuth endpoints).
HTTP_CLIENT = ClientLibrary("httpx, the HTTP client its checks speak through", "microsoft",
                            ("httpx",))
STAGING_SERVERS = ClientLibrary("the staging servers (or --live)", "staging", ("aiohttp", "jwt"))

# How long a check waits for a provider's eventual state (a search to show a sent message, the
# transport to move a submitted draft): Gmail's search lags by seconds, Graph's transport by
# seconds to a minute; past this the check records what it saw.
SETTLE_S = 90.0
POLL_S = 1.0
TIMEOUT_S = 30.0  # one request; the providers answer these small calls in well under a second
# Graph's PR_MESSAGE_FLAGS (MAPI property tag 0x0E07, an integer): MSGFLAG_UNSENT is 0x8 and
# MSGFLAG_SUBMIT 0x4 ([MS-OXCMSG] 2.2.1.6 PidTagMessageFlags).
MESSAGE_FLAGS_ID = "Integer 0x0E07"
MSGFLAG_SUBMIT = 0x4
KEY_PROPERTY_ID = "String {5b1f2c7e-8a43-4d0e-9f6b-2c71d3a9e804} Name tidemark_key"
SCRUBBED = "<scrubbed>"


class ProvidersError(TidemarkError):
    """The kit was asked to run in a way it must not (live in CI, a live-mode Stripe key)."""


class NoAccounts(Exception):
    """``--live`` without any test account configured: nothing to check (not an error)."""


@dataclass
class Endpoints:
    """Where and as whom the checks talk to each provider. ``None`` leaves a provider out."""

    drive_url: str | None = None
    drive_token: str | None = None
    drive_file: str | None = None  # a file the kit may rename and trash (and restores)
    gmail_url: str | None = None
    gmail_token: str | None = None  # gmail.compose: drafts and send
    gmail_read_token: str | None = None  # gmail.readonly: the search the probe makes
    mail_to: str | None = None  # where the test mails go (the test mailbox itself is fine)
    graph_url: str | None = None  # ending in /v1.0
    graph_token: str | None = None  # Mail.ReadWrite, Mail.Send
    stripe_url: str | None = None
    stripe_key: str | None = None  # sk_test_ only
    stripe_restricted_key: str | None = None  # rk_test_ with read access to PaymentIntents

    def secrets(self) -> list[str]:
        return [s for s in (self.drive_token, self.gmail_token, self.gmail_read_token,
                            self.graph_token,
                            self.stripe_key, self.stripe_restricted_key, self.mail_to) if s]


@dataclass
class Session:
    """One check's HTTP calls, each kept (scrubbed when written) as an exchange."""

    endpoints: Endpoints
    client: httpx.Client
    exchanges: list[dict[str, Any]] = field(default_factory=list)
    measured: dict[str, Any] = field(default_factory=dict)

    def call(self, method: str, url: str, token: str | None, *,
             json_body: Any = None, form: Mapping[str, Any] | None = None,
             params: Mapping[str, Any] | None = None,
             headers: Mapping[str, str] | None = None) -> httpx.Response:
        hdrs = dict(headers or {})
        if token:
            hdrs["Authorization"] = f"Bearer {token}"
        r = self.client.request(method, url, json=json_body, data=form, params=params,
                                headers=hdrs, timeout=TIMEOUT_S)
        body: Any
        try:
            body = r.json() if r.content else None
        except ValueError:
            body = r.text[:2000]
        self.exchanges.append({
            "request": {"method": method, "url": url, "params": dict(params or {}),
                        "headers": {k: v for k, v in hdrs.items() if k != "Authorization"},
                        "json": json_body, "form": dict(form or {})},
            "response": {"status": r.status_code,
                         "headers": {k: v for k, v in r.headers.items()
                                     if k.lower() in ("idempotent-replayed", "idempotency-key",
                                                      "content-type", "request-id")},
                         "body": body}})
        return r


class CheckFailed(Exception):
    """The provider answered something the check did not expect; the message says what."""


def _expect(r: httpx.Response, *status: int) -> Any:
    if r.status_code not in status:
        raise CheckFailed(f"{r.request.method} {r.request.url.path}: HTTP {r.status_code}: "
                          f"{r.text[:300]}")
    return r.json() if r.content else None


def _poll(until: Callable[[], Any]) -> tuple[Any, float]:
    """Calls ``until`` every POLL_S until it returns something truthy or SETTLE_S pass.

    Returns (its last answer, seconds waited)."""
    start, seconds = time.monotonic(), SETTLE_S
    while True:
        got = until()
        waited = time.monotonic() - start
        if got or waited >= seconds:
            return got, round(waited, 1)
        time.sleep(POLL_S)


# -- Drive ------------------------------------------------------------------------------------

def _drive_file(s: Session, fields: str) -> Any:
    e = s.endpoints
    return _expect(s.call("GET", f"{e.drive_url}/drive/v3/files/{e.drive_file}", e.drive_token,
                          params={"fields": fields}), 200)


def _drive_update(s: Session, body: dict[str, Any]) -> Any:
    e = s.endpoints
    return _expect(s.call("PATCH", f"{e.drive_url}/drive/v3/files/{e.drive_file}",
                          e.drive_token, json_body=body, params={"fields": "id,name,trashed"}),
                   200)


def check_drive_app_properties(s: Session) -> dict[str, Any]:
    key = uuid.uuid4().hex
    before = _drive_file(s, "name")
    _drive_update(s, {"name": before["name"], "appProperties": {"tidemark_key": key}})
    got = _drive_file(s, "name,appProperties")
    return {"returned_to_same_client": (got.get("appProperties") or {}).get("tidemark_key") == key,
            "name_unchanged": got.get("name") == before["name"]}


def check_drive_trashed_visible(s: Session) -> dict[str, Any]:
    _drive_update(s, {"trashed": True})
    try:
        got = _drive_file(s, "name,trashed,appProperties")
    finally:
        _drive_update(s, {"trashed": False})
    return {"get_answers_trashed_file": True, "trashed_flag": got.get("trashed") is True}


# -- Gmail ------------------------------------------------------------------------------------

def _gmail(s: Session, path: str) -> str:
    return f"{s.endpoints.gmail_url}/gmail/v1/users/me{path}"


def _gmail_draft(s: Session, key: str) -> tuple[str, str]:
    e = s.endpoints
    mid = f"<tidemark-kit-{key}@tidemark.invalid>"
    msg = EmailMessage()
    msg["To"] = e.mail_to or ""
    msg["Subject"] = f"tidemark provider check {key[:8]}"
    msg["Message-ID"] = mid
    msg["X-Tidemark-Key"] = key
    msg.set_content("A check of the provider assumptions Tidemark relies on. Safe to delete.")
    raw = base64.urlsafe_b64encode(msg.as_bytes()).decode()
    draft = _expect(s.call("POST", _gmail(s, "/drafts"), e.gmail_token,
                           json_body={"message": {"raw": raw}}), 200)
    return str(draft["id"]), mid


def _gmail_send(s: Session, draft_id: str) -> httpx.Response:
    return s.call("POST", _gmail(s, "/drafts/send"), s.endpoints.gmail_token,
                  json_body={"id": draft_id})


def _gmail_added_sent(s: Session, since: str) -> list[str]:
    """Ids of messages that got the SENT label since ``since`` (a historyId).

    They are read as the probe reads them: history.list of label SENT, messages added, deleted
    or labelled."""
    r = s.call("GET", _gmail(s, "/history"), s.endpoints.gmail_read_token,
               params={"startHistoryId": since, "labelId": "SENT",
                       "historyTypes": ["messageAdded", "messageDeleted", "labelAdded"]})
    ids: list[str] = []
    for h in (_expect(r, 200) or {}).get("history") or []:
        for change in (*(h.get("messagesAdded") or []), *(h.get("messagesDeleted") or []),
                       *(c for c in h.get("labelsAdded") or []
                         if "SENT" in (c.get("labelIds") or []))):
            mid = change.get("message", {}).get("id")
            if mid and mid not in ids:
                ids.append(mid)
    return ids


def _gmail_headers(s: Session, message_id: str) -> dict[str, str]:
    got = _expect(s.call("GET", _gmail(s, f"/messages/{message_id}"),
                         s.endpoints.gmail_read_token,
                         params={"format": "metadata",
                                 "metadataHeaders": ["X-Tidemark-Key", "Message-ID"]}), 200)
    return {h["name"].lower(): h["value"] for h in got.get("payload", {}).get("headers", [])}


def check_gmail_send_once(s: Session) -> dict[str, Any]:
    key = uuid.uuid4().hex
    profile = _expect(s.call("GET", _gmail(s, "/profile"), s.endpoints.gmail_read_token), 200)
    draft_id, mid = _gmail_draft(s, key)
    sent = _expect(_gmail_send(s, draft_id), 200)
    second = _gmail_send(s, draft_id)
    added, waited = _poll(lambda: _gmail_added_sent(s, str(profile["historyId"])))
    s.measured["history_lag_s"] = waited
    ours = [h for h in (_gmail_headers(s, m) for m in added) if h.get("x-tidemark-key") == key]
    # The probe reads a draft still there as never sent: the draft must be gone once sent.
    draft_after = s.call("GET", _gmail(s, f"/drafts/{draft_id}"), s.endpoints.gmail_read_token,
                         params={"format": "minimal"})
    return {"sent_has_sent_label": "SENT" in (sent.get("labelIds") or []),
            "draft_gone_after_send": draft_after.status_code == 404,
            "history_shows_sent": bool(ours),
            "copies_sent": len(ours),
            "custom_header_kept": bool(ours),
            "message_id_kept": bool(ours) and ours[0].get("message-id") == mid,
            "second_send_status": second.status_code}


# -- Microsoft Graph --------------------------------------------------------------------------

def _graph_message(s: Session, mid: str, prop: str = MESSAGE_FLAGS_ID) -> httpx.Response:
    e = s.endpoints
    return s.call("GET", f"{e.graph_url}/me/messages/{mid}", e.graph_token, params={
        "$select": "id,isDraft,parentFolderId",
        "$expand": f"singleValueExtendedProperties($filter=id eq '{prop}')"})


def prop_id(value: str) -> str:
    """An extended property's id in one spelling.

    A tagged one's tag as a number (Graph answers ``Integer 0xe07`` for ``Integer 0x0E07``), a
    named one lower-cased."""
    kind, _, tag = value.strip().partition(" ")
    try:
        return f"{kind.lower()} {int(tag, 16):#x}" if tag.lower().startswith("0x") else \
            value.strip().lower()
    except ValueError:
        return value.strip().lower()


def _graph_props(message: Mapping[str, Any]) -> dict[str, str]:
    """The message's single-value extended properties by ``prop_id``."""
    return {prop_id(str(p.get("id", ""))): str(p.get("value"))
            for p in message.get("singleValueExtendedProperties") or []}


def _graph_flags(message: Mapping[str, Any]) -> int | None:
    value = _graph_props(message).get(prop_id(MESSAGE_FLAGS_ID))
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def _graph_key_filter(s: Session, folder: str | None, key: str) -> list[dict[str, Any]]:
    """The probe's own read: messages whose key property is ``key``.

    It reads in every folder (``folder`` None: ``/me/messages``) or in one, with the key and
    flags expanded."""
    e = s.endpoints
    base = f"{e.graph_url}/me/messages" if folder is None else \
        f"{e.graph_url}/me/mailFolders/{folder}/messages"
    r = s.call("GET", base, e.graph_token, params={
        "$filter": f"singleValueExtendedProperties/any(ep: ep/id eq '{KEY_PROPERTY_ID}' "
                   f"and ep/value eq '{key}')",
        "$expand": f"singleValueExtendedProperties($filter=id eq '{KEY_PROPERTY_ID}' "
                   f"or id eq '{MESSAGE_FLAGS_ID}')",
        "$select": "id,internetMessageId,isDraft,parentFolderId"})
    return list((_expect(r, 200) or {}).get("value") or [])


def check_graph_submission(s: Session) -> dict[str, Any]:
    e = s.endpoints
    key = uuid.uuid4().hex
    draft = _expect(s.call("POST", f"{e.graph_url}/me/messages", e.graph_token, json_body={
        "subject": f"tidemark provider check {key[:8]}",
        "body": {"contentType": "Text", "content": "A check of Tidemark's provider assumptions."},
        "toRecipients": [{"emailAddress": {"address": e.mail_to}}],
        "singleValueExtendedProperties": [{"id": KEY_PROPERTY_ID, "value": key}]}), 201)
    stamped = _expect(_graph_message(s, draft["id"], KEY_PROPERTY_ID), 200)
    drafts = _expect(s.call("GET", f"{e.graph_url}/me/mailFolders/drafts", e.graph_token,
                            params={"$select": "id"}), 200)["id"]
    sent = s.call("POST", f"{e.graph_url}/me/messages/{draft['id']}/send", e.graph_token)
    # Every look while the message is still in Drafts, from right after the 202 until the
    # transport moves it: the flag must be there at each, not only at some.
    looks: list[int | None] = []
    started = time.monotonic()

    def moved() -> bool:
        r = _graph_message(s, draft["id"])
        if r.status_code == 200 and r.json().get("parentFolderId") == drafts:
            looks.append(_graph_flags(r.json()))
            return False
        return r.status_code in (200, 404)

    moved()
    in_drafts = bool(looks)
    second = s.call("POST", f"{e.graph_url}/me/messages/{draft['id']}/send", e.graph_token)
    _, waited = _poll(moved)
    unflagged = [f for f in looks if f is None or not f & MSGFLAG_SUBMIT]
    s.measured["seconds_in_drafts_after_send"] = waited if in_drafts else 0
    s.measured["looks_in_drafts"] = len(looks)
    s.measured["unflagged_looks_in_drafts"] = len(unflagged)
    found = _graph_key_filter(s, None, key)
    in_sent = _graph_key_filter(s, "sentitems", key)
    s.measured["seconds_to_sent_items"] = round(time.monotonic() - started, 1)
    return {"send_answers_202": sent.status_code == 202 and not sent.content,
            "key_property_kept": _graph_props(stamped).get(prop_id(KEY_PROPERTY_ID)) == key,
            "in_drafts_right_after_202": in_drafts,
            "submit_flag_while_in_drafts": in_drafts and not unflagged,
            "key_filter_finds_it": len(found) == 1,
            "key_filter_on_sent_items_finds_it": len(in_sent) == 1,
            "second_send_status": second.status_code}


# -- Stripe -----------------------------------------------------------------------------------

def _stripe_create(s: Session, key: str, amount: int, token: str | None = None) -> httpx.Response:
    e = s.endpoints
    return s.call("POST", f"{e.stripe_url}/v1/payment_intents", token or e.stripe_key,
                  form={"amount": amount, "currency": "usd", "metadata[tidemark_key]": key,
                        "description": f"tidemark provider check {key[:8]}"},
                  headers={"Idempotency-Key": key})


def check_stripe_idempotency(s: Session) -> dict[str, Any]:
    key = uuid.uuid4().hex
    first = _stripe_create(s, key, 100)
    made = _expect(first, 200)
    again = _stripe_create(s, key, 100)
    other = _stripe_create(s, key, 101)
    err = (other.json().get("error") or {}) if other.status_code >= 400 else {}
    s.measured["clock_offset_s"] = round(float(made["created"]) - time.time(), 1)
    return {"replay_same_object": again.status_code == 200 and again.json()["id"] == made["id"],
            "replay_header": again.headers.get("Idempotent-Replayed") == "true",
            "other_parameters_refused": other.status_code == 400
            and err.get("type") == "idempotency_error",
            "metadata_to_secret_key": (made.get("metadata") or {}).get("tidemark_key") == key}


def check_stripe_reads(s: Session) -> dict[str, Any]:
    e = s.endpoints
    key = uuid.uuid4().hex
    made = _expect(_stripe_create(s, key, 100), 200)
    listed = _expect(s.call("GET", f"{e.stripe_url}/v1/payment_intents", e.stripe_key,
                            params={"created[gte]": int(made["created"]) - 1, "limit": 100}), 200)
    facts: dict[str, Any] = {
        "list_by_created_finds_it": any(p["id"] == made["id"] for p in listed["data"])}
    facts["restricted_key_given"] = bool(e.stripe_restricted_key)
    if e.stripe_restricted_key:
        got = s.call("GET", f"{e.stripe_url}/v1/payment_intents/{made['id']}",
                     e.stripe_restricted_key)
        body = _expect(got, 200)
        facts["metadata_to_restricted_key"] = (body.get("metadata") or {}).get(
            "tidemark_key") == key
        facts["amount_to_restricted_key"] = body.get("amount") == 100
        # The probe's own read: the list by created[gte], with the restricted key.
        mine = _expect(s.call("GET", f"{e.stripe_url}/v1/payment_intents",
                              e.stripe_restricted_key,
                              params={"created[gte]": int(made["created"]) - 1, "limit": 100}),
                       200)
        facts["restricted_list_finds_it"] = any(p["id"] == made["id"] for p in mine["data"])
    return facts


@dataclass(frozen=True)
class Assumption:
    """One belief of a probe about its provider, and how to check it."""

    id: str
    provider: str  # drive, gmail, graph, stripe
    statement: str
    source: str  # the provider's documentation it comes from
    relied_on_by: str  # the code that would be wrong if it did not hold
    required: dict[str, Any]  # facts that must hold for our probes as written
    switches: tuple[str, ...]  # the staging switches (target.name) that show the other side
    check: Callable[[Session], dict[str, Any]]
    # Facts that must hold together: (fact, value, then fact, value). A state the probe reads
    # wrongly is a combination ("in Drafts right after the 202" without "flagged"), which
    # facts checked one by one never catch.
    together: tuple[tuple[str, Any, str, Any], ...] = ()

    def broken(self, facts: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """What these facts break.

        Each required fact that differs, and each fact that another fact's value requires
        (``together``); a fact not recorded differs."""
        failed = {k: {"expected": v, "got": facts.get(k)} for k, v in self.required.items()
                  if facts.get(k) != v}
        for when, is_, then, must in self.together:
            if facts.get(when) == is_ and facts.get(then) != must:
                failed[then] = {"expected": must, "got": facts.get(then),
                                "because": f"{when} is {is_!r}"}
        return failed

    def contradictions(self, facts: Mapping[str, Any]) -> list[str]:
        """The ``together`` rules a recording breaks.

        A fixture records only some facts: a rule applies once its first fact is there, and a
        second fact missing breaks it."""
        return [f"{when} is {is_!r} but {then} is {facts.get(then)!r}, not {must!r}"
                for when, is_, then, must in self.together
                if facts.get(when) == is_ and facts.get(then) != must]


ASSUMPTIONS: tuple[Assumption, ...] = (
    Assumption(
        "drive.app_properties", "drive",
        "appProperties set by files.update are returned by files.get to the same OAuth client",
        "Drive API: Add custom file properties (appProperties are private to the app)",
        "probes/drive.py: the stamp that tells our rename from anybody's",
        {"returned_to_same_client": True, "name_unchanged": True}, (),
        check_drive_app_properties),
    Assumption(
        "drive.trashed", "drive",
        "a trashed file still answers files.get, with trashed: true",
        "Drive API: files resource, field trashed; Trash or delete files",
        "probes/drive.py and the verification gate: a trashed file is unknown, never done",
        {"get_answers_trashed_file": True, "trashed_flag": True}, (),
        check_drive_trashed_visible),
    Assumption(
        "gmail.send", "gmail",
        "drafts.send sends the draft once, labelled SENT, and the draft is gone; history.list "
        "of label SENT since the snapshot's historyId shows it; a custom X- header is kept "
        "(undocumented: the live check records it; the Message-ID may be replaced)",
        "Gmail API: users.drafts.send, users.history.list (messageAdded), users.messages.get "
        "format=metadata",
        "probes/gmail.py (our sent copy: SENT label and X-Tidemark-Key, found in history; "
        "a draft still there was never sent)",
        {"sent_has_sent_label": True, "history_shows_sent": True, "copies_sent": 1,
         "custom_header_kept": True, "draft_gone_after_send": True},
        ("gmail.concurrent_draft_send", "gmail.gone_draft_send_status"), check_gmail_send_once),
    Assumption(
        "graph.submission", "graph",
        "send of a draft answers 202 with no body; the message may stay in Drafts, flagged "
        "submitted, until the transport moves it to Sent Items",
        "Microsoft Graph: message: send (202 Accepted, no body; saves the message in Sent "
        "Items). 'Outlook: things to know about send mail' describes sendMail, reply and "
        "forward (a draft saved, the 202, then transport); nothing documents PR_MESSAGE_FLAGS "
        "during that window",
        "probes/graph.py: a submitted draft is done or in doubt, never absent; our copy is "
        "found by the key property's filter",
        {"send_answers_202": True, "key_property_kept": True, "key_filter_finds_it": True},
        ("graph.submitted_stays_in_drafts_s", "graph.second_send"), check_graph_submission,
        together=(("in_drafts_right_after_202", True, "submit_flag_while_in_drafts", True),)),
    Assumption(
        "stripe.idempotency", "stripe",
        "the same Idempotency-Key with the same parameters replays the first answer "
        "(Idempotent-Replayed: true); with other parameters it is a 400 idempotency_error",
        "Stripe API: Idempotent requests",
        "activities/stripe.py and probes/stripe.py: the replay that creates nothing",
        {"replay_same_object": True, "replay_header": True, "other_parameters_refused": True,
         "metadata_to_secret_key": True},
        ("stripe.clock_offset_s", "stripe.idempotency_ttl_s"), check_stripe_idempotency),
    Assumption(
        "stripe.reads", "stripe",
        "a PaymentIntent is listed by created[gte] at once; a restricted key reads its amount "
        "(metadata may be withheld)",
        "Stripe API: List all PaymentIntents (created filter); Search, Data freshness (list "
        "APIs are not subject to search's delay); Restricted API keys; Metadata",
        "probes/stripe.py: matching by what Stripe always returns, listed with the read key",
        {"list_by_created_finds_it": True},
        ("stripe.restricted_key_metadata",), check_stripe_reads,
        together=(("restricted_key_given", True, "restricted_list_finds_it", True),)),
)


def _needs(a: Assumption, e: Endpoints) -> list[str]:
    need = {"drive": [("drive_url", e.drive_url), ("drive_token", e.drive_token),
                      ("drive_file", e.drive_file)],
            "gmail": [("gmail_url", e.gmail_url), ("gmail_token", e.gmail_token),
                      ("gmail_read_token", e.gmail_read_token), ("mail_to", e.mail_to)],
            "graph": [("graph_url", e.graph_url), ("graph_token", e.graph_token),
                      ("mail_to", e.mail_to)],
            "stripe": [("stripe_url", e.stripe_url), ("stripe_key", e.stripe_key)]}[a.provider]
    return [name for name, value in need if not value]


def run_check(a: Assumption, e: Endpoints, client: httpx.Client) -> dict[str, Any]:
    """Runs one check: ``{id, provider, status, facts, measured, failed, exchanges}``.

    ``status`` is ``held``, ``broken`` (a required fact differs), ``error`` (the check could not
    tell) or ``skipped`` (no credentials for this provider)."""
    import httpx  # see HTTP_CLIENT

    out: dict[str, Any] = {"id": a.id, "provider": a.provider, "statement": a.statement,
                           "source": a.source, "switches": list(a.switches)}
    missing = _needs(a, e)
    if missing:
        return {**out, "status": "skipped", "needs": missing}
    s = Session(e, client)
    try:
        facts = a.check(s)
    except (CheckFailed, httpx.HTTPError, KeyError, ValueError) as err:
        return {**out, "status": "error", "error": f"{type(err).__name__}: {err}",
                "exchanges": s.exchanges}
    failed = a.broken(facts)
    return {**out, "status": "broken" if failed else "held", "facts": facts,
            "measured": s.measured, "failed": failed, "exchanges": s.exchanges}


def check_installed(*, staging: bool) -> None:
    """Raises ProvidersError when a library the kit needs is not installed.

    The error is one line naming the extra (``staging``: it is to run against the staging
    servers); nothing is imported to find out."""
    for library in (HTTP_CLIENT, *([STAGING_SERVERS] if staging else [])):
        if not library.installed():
            raise ProvidersError(f"`tidemark providers verify` needs {library.what}: "
                                 f"pip install 'tidemark[{library.extra}]'")


def verify(e: Endpoints, only: list[str] | None = None) -> list[dict[str, Any]]:
    import httpx  # see HTTP_CLIENT: the caller checked it is installed

    chosen = [a for a in ASSUMPTIONS if not only or a.id in only or a.provider in only]
    with httpx.Client() as client:
        return [run_check(a, e, client) for a in chosen]


def scrub(value: Any, secrets: list[str]) -> Any:
    """``value`` with every secret and every e-mail address replaced.

    The secrets are tokens, keys and the test address. E-mail addresses go too: a fixture is
    committed to the repository."""
    text = json.dumps(value)
    for secret in sorted(set(secrets), key=len, reverse=True):
        text = text.replace(secret, SCRUBBED)
    text = re.sub(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}", "user@example.invalid", text)
    text = re.sub(r"(sk|rk)_(live|test)_[A-Za-z0-9]+", SCRUBBED, text)
    return json.loads(text)


def record(results: list[dict[str, Any]], directory: Path, e: Endpoints, source: str) -> list[Path]:
    """Writes each checked (not skipped) result as ``directory/<id>.json``, scrubbed."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for r in results:
        if r["status"] in ("skipped", "error"):
            continue
        path = directory / f"{r['id']}.json"
        fixture = {"id": r["id"], "source": source, "recorded_at": time.strftime(
            "%Y-%m-%d", time.gmtime()), "facts": r["facts"], "measured": r["measured"],
            "exchanges": r["exchanges"]}
        path.write_text(json.dumps(scrub(fixture, e.secrets()), indent=1, sort_keys=True) + "\n")
        written.append(path)
    return written


# -- where the endpoints come from ------------------------------------------------------------

LIVE_ENV = {  # Endpoints field -> environment variable (a secret may also come from NAME_FILE)
    "drive_token": "TIDEMARK_LIVE_DRIVE_TOKEN", "drive_file": "TIDEMARK_LIVE_DRIVE_FILE",
    "gmail_token": "TIDEMARK_LIVE_GMAIL_TOKEN",
    "gmail_read_token": "TIDEMARK_LIVE_GMAIL_READ_TOKEN", "mail_to": "TIDEMARK_LIVE_MAIL_TO",
    "graph_token": "TIDEMARK_LIVE_GRAPH_TOKEN", "stripe_key": "TIDEMARK_LIVE_STRIPE_KEY",
    "stripe_restricted_key": "TIDEMARK_LIVE_STRIPE_RESTRICTED_KEY",
}
LIVE_URLS = {"drive_url": "https://www.googleapis.com", "gmail_url": "https://gmail.googleapis.com",
             "graph_url": "https://graph.microsoft.com/v1.0", "stripe_url": "https://api.stripe.com"}


def _env_secret(env: Mapping[str, str], name: str) -> str | None:
    if env.get(name):
        return env[name]
    path = env.get(name + "_FILE")
    return Path(path).read_text(encoding="utf-8").strip() if path else None


def live_endpoints(env: Mapping[str, str] = os.environ) -> Endpoints:
    """The real providers, with the test accounts named in the environment.

    Refuses in CI and with a live-mode Stripe key: this kit must never touch a real account
    unasked."""
    if env.get("CI"):
        raise ProvidersError("providers verify --live does not run where CI is set: it would "
                             "touch real accounts")
    values = {f: _env_secret(env, var) for f, var in LIVE_ENV.items()}
    if not any(values.values()):
        raise NoAccounts(
            "providers verify --live: skipped, no test account is configured; it needs any of "
            + ", ".join(LIVE_ENV.values()) + " (or NAME_FILE); see docs/provider-assumptions.md")
    key = values.get("stripe_key") or ""
    if key and not key.startswith("sk_test_"):
        raise ProvidersError("TIDEMARK_LIVE_STRIPE_KEY must be a test-mode secret key (sk_test_)")
    rkey = values.get("stripe_restricted_key") or ""
    if rkey and not rkey.startswith("rk_test_"):
        raise ProvidersError("TIDEMARK_LIVE_STRIPE_RESTRICTED_KEY must be a test-mode restricted "
                             "key (rk_test_)")
    return Endpoints(**LIVE_URLS, **values)


def staging_endpoints(url: str, drive_file: str | None = None) -> Endpoints:
    """A staging server with its documented default credentials."""
    return Endpoints(drive_url=url, drive_token=staging_tokens.DRIVE_WRITE,
                     drive_file=drive_file, gmail_url=url,
                     gmail_token=staging_tokens.GMAIL_COMPOSE,
                     gmail_read_token=staging_tokens.GMAIL_READ, mail_to="check@example.com",
                     graph_url=url + "/v1.0", graph_token=staging_tokens.GRAPH_SEND,
                     stripe_url=url, stripe_key=staging_tokens.STRIPE_SECRET,
                     stripe_restricted_key=staging_tokens.STRIPE_READ)
