"""A provider's moment is not a verdict: a busy read is asked again.

A probe or gate read that meets a 503, a 429 or a rate limit is asked again (honouring
Retry-After) within its budget, through each real SDK against the emulators; a write the target
turned away applied nothing and holds no horizon."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from activities.catalog import spec_registry
from activities.drive import DriveRename, drive_client
from activities.gmail import GmailSend
from activities.graph import GraphSendMail
from activities.stripe import StripePaymentIntent, stripe_client
from helpers.staging_fixtures import CLIENT_TIMEOUT_S, arm, post
from helpers.steps import persist, step_context
from probes.gmail import gmail_client
from probes.graph import graph_client
from staging.core import StagingServer
from staging.drive import DEFAULT_READ_TOKEN, DEFAULT_WRITE_TOKEN
from staging.gmail import COMPOSE_TOKEN
from staging.gmail import READ_TOKEN as GMAIL_READ
from staging.graph import READ_TOKEN as GRAPH_READ
from staging.graph import SEND_TOKEN as GRAPH_SEND
from staging.stripe import DEFAULT_READ_KEY, DEFAULT_SECRET_KEY
from tidemark.actions import Action, ProbeStatus, Registry
from tidemark.errors import NeedsDecision, TargetUnavailable, Throttled
from tidemark.payment_limits import PaymentLimits
from tidemark.reads import (
    BACKOFF_FIRST_S,
    ENV_READ_RETRY,
    Backoff,
    Transient,
    patient_reads,
    retry_after_s,
)
from tidemark.run_step import run_step
from tidemark.store import JournalStore

MAIL = {"to": "bob@example.com", "subject": "Q3 report", "body": "Attached in spirit."}


@dataclass(frozen=True)
class Target:
    """One provider as these tests use it.

    Its action on the staging server, a step's args, the write whose answer is lost and the
    probe's first read."""

    name: str
    action: str
    build: Callable[[StagingServer], Action]
    args: dict[str, Any]
    write: str
    read: str


TARGETS = {t.name: t for t in (
    Target("drive", "drive.rename", lambda s: DriveRename(
        writer=drive_client(s.url, DEFAULT_WRITE_TOKEN, timeout=CLIENT_TIMEOUT_S),
        reader=drive_client(s.url, DEFAULT_READ_TOKEN, timeout=CLIENT_TIMEOUT_S),
        timeout=CLIENT_TIMEOUT_S, horizon_s=0.0),
        {"file_id": "f1", "name": "q3.pdf"}, "files.update", "files.get"),
    Target("gmail", "gmail.send", lambda s: GmailSend(
        writer=gmail_client(s.url, COMPOSE_TOKEN, timeout=CLIENT_TIMEOUT_S),
        reader=gmail_client(s.url, GMAIL_READ, timeout=CLIENT_TIMEOUT_S), horizon_s=0.0),
        MAIL, "drafts.send", "messages.list"),
    Target("graph", "graph.send_mail", lambda s: GraphSendMail(
        writer=graph_client(s.url, GRAPH_SEND, timeout=CLIENT_TIMEOUT_S),
        reader=graph_client(s.url, GRAPH_READ, timeout=CLIENT_TIMEOUT_S)),
        MAIL, "message.send", "messages.list"),
    Target("stripe", "stripe.payment_intent", lambda s: StripePaymentIntent(
        writer=stripe_client(s.url, DEFAULT_SECRET_KEY, timeout=CLIENT_TIMEOUT_S),
        reader=stripe_client(s.url, DEFAULT_READ_KEY, timeout=CLIENT_TIMEOUT_S),
        limits=PaymentLimits(per_step=10_000)),
        {"amount": 2500, "currency": "usd"}, "payment_intents.create", "payment_intents.list"),
)}


def writes(server: StagingServer, target: Target) -> int:
    """The writes the target applied (Stripe and Drive: the effect of the write; mail: sends)."""
    return len(server.staging.effects_of(target.name, target.write))


def in_doubt(server: StagingServer, store: JournalStore, t: Target,
             fault: str = "drop_after_commit", horizon_s: float = 0.0,
             raised: type[TargetUnavailable] = TargetUnavailable) -> tuple[str, Registry]:
    """A task whose step's write met ``fault``, so that the step is in doubt.

    By default the write landed and its answer was lost."""
    server.staging.targets["drive"].seed("report.pdf", file_id="f1")  # type: ignore[attr-defined]
    action = t.build(server)
    if horizon_s:
        action.horizon_s = horizon_s  # type: ignore[misc]
    task = persist(store, spec_registry(type(action)), [{"action": t.action, "args": t.args}])
    registry = Registry([action])
    arm(server, t.name, t.write, fault)
    with pytest.raises(raised):
        run_step(store, registry, task, 1)
    return task, registry


@pytest.mark.parametrize("kind", ["fail_before_commit", "throttle"])
@pytest.mark.parametrize("name", sorted(TARGETS))
def test_one_failed_probe_read_is_asked_again_not_a_decision(
        server: StagingServer, store: JournalStore, name: str, kind: str) -> None:
    # The probe's first read meets one 503 (or the provider's throttled answer): the read is
    # asked again, the step is found done, and the run goes on; no person is asked.
    t = TARGETS[name]
    task, registry = in_doubt(server, store, t)
    assert writes(server, t) == 1
    arm(server, t.name, t.read, kind)
    resumed = run_step(store, registry, task, 1)
    assert (resumed.status, resumed.resolved_by) == ("done", "probe")
    assert writes(server, t) == 1


def test_googles_403_rate_limit_is_waited_out_not_read_as_a_refused_credential(
        server: StagingServer, store: JournalStore) -> None:
    # Drive's worst answer to a throttled read: 403 userRateLimitExceeded.
    post(server, "/_staging/switches", {"target": "drive", "name": "throttle_status",
                                        "value": 403})
    t = TARGETS["drive"]
    task, registry = in_doubt(server, store, t)
    arm(server, "drive", "files.get", "throttle", times=2)
    resumed = run_step(store, registry, task, 1)
    assert (resumed.status, resumed.resolved_by) == ("done", "probe")


def test_a_throttled_gate_read_is_waited_out_and_the_step_runs_in_the_same_attempt(
        server: StagingServer, store: JournalStore) -> None:
    t = TARGETS["drive"]
    server.staging.targets["drive"].seed("report.pdf", file_id="f1")  # type: ignore[attr-defined]
    task = persist(store, spec_registry(DriveRename), [{"action": "drive.rename",
                                                       "args": t.args}])
    arm(server, "drive", "files.get", "throttle", times=2)  # the gate's read, then the snapshot's
    done = run_step(store, Registry([t.build(server)]), task, 1)
    assert (done.status, done.resolved_by) == ("done", "execute")


def test_a_read_that_keeps_failing_past_the_budget_is_unknown(
        server: StagingServer, store: JournalStore, monkeypatch: pytest.MonkeyPatch) -> None:
    # The budget is what keeps an outage from holding a step for ever: past it, the probe's
    # read stands, and the probe cannot tell.
    monkeypatch.setenv(ENV_READ_RETRY, "1")
    t = TARGETS["stripe"]
    task, registry = in_doubt(server, store, t)
    arm(server, "stripe", "payment_intents.list", "fail_before_commit", times=1000)
    began = time.monotonic()
    with pytest.raises(NeedsDecision, match="503"):
        run_step(store, registry, task, 1)
    assert time.monotonic() - began < 5
    assert writes(server, t) == 1


def test_the_wait_is_what_retry_after_asks_and_never_past_the_budget() -> None:
    assert Backoff(10).next_wait(Transient(retry_after=3.0)) == 3.0  # not the backoff's 0.5 s
    assert Backoff(10).next_wait(Transient()) <= BACKOFF_FIRST_S  # type: ignore[operator]
    assert Backoff(2).next_wait(Transient(retry_after=3.0)) is None  # past the budget: stands
    assert retry_after_s("7") == 7.0 and retry_after_s("Wed, 21 Oct 2015 07:28:00 GMT") is None


def test_graphs_retry_after_is_honoured(server: StagingServer) -> None:
    post(server, "/_staging/switches", {"target": "graph", "name": "throttle_retry_after_s",
                                        "value": 1})
    action = TARGETS["graph"].build(server)
    ctx = step_context("graph.send_mail", GraphSendMail.validate_args(MAIL, "args"),
                       before_state={"fence": "draft"})
    arm(server, "graph", "messages.list", "throttle")
    began = time.monotonic()
    with patient_reads(30):  # room for a slow answer on a loaded machine besides the wait
        probed = action.probe(ctx)
    assert probed.status is ProbeStatus.ABSENT and time.monotonic() - began >= 1.0


def test_graphs_four_requests_per_mailbox_are_waited_out(server: StagingServer) -> None:
    # More probes of one mailbox at once than Graph serves (the worst case: 4, here 1 so that
    # two suffice): the one turned away with 429 asks again and answers like the other.
    post(server, "/_staging/switches", {"target": "graph", "name": "mailbox_concurrency",
                                        "value": 1})
    action = TARGETS["graph"].build(server)
    action.reader.folder_ids()  # type: ignore[attr-defined]  # read once, before
    ctx = step_context("graph.send_mail", GraphSendMail.validate_args(MAIL, "args"),
                       before_state={"fence": "draft"})
    arm(server, "graph", "messages.list", "delay", seconds=0.5)
    answers: list[ProbeStatus] = []

    def probe() -> None:
        with patient_reads(30):
            answers.append(action.probe(ctx).status)
    threads = [threading.Thread(target=probe) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=30)
    assert answers == [ProbeStatus.ABSENT, ProbeStatus.ABSENT]
    assert server.staging.targets["graph"].turned_away >= 1  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ["drive", "graph"])
def test_a_throttled_write_applied_nothing_and_the_next_attempt_acts_at_once(
        server: StagingServer, store: JournalStore, name: str) -> None:
    # A 429 on the write is documented as turned away: the step stays open, but no horizon
    # is held (Drive's is a minute), so the next attempt probes absent and writes, once.
    t = TARGETS[name]
    task, registry = in_doubt(server, store, t, "throttle", horizon_s=60.0, raised=Throttled)
    assert writes(server, t) == 0
    done = run_step(store, registry, task, 1)
    assert done.status == "done" and writes(server, t) == 1


def test_the_worst_case_throttles_as_documented_and_throttles_nothing_by_itself(
        server: StagingServer) -> None:
    listed = {(s["target"], s["name"]): s["value"] for s in
              post(server, "/_staging/switches", {"worst": True})}
    assert listed[("drive", "throttle_status")] == 403  # reads like a refused credential
    assert listed[("gmail", "throttle_status")] == 403
    assert listed[("graph", "mailbox_concurrency")] == 4  # Outlook's service limit
    assert all(listed[(t, "throttle_rate")] == 0 for t in TARGETS)  # load, not behaviour
