"""Every action, built-in and plugin, through the probe conformance kit.

The kit is tools.kit.testing, run against the staging servers. A deliberately wrong probe is
caught by it."""

from __future__ import annotations

import base64
import itertools
import shutil
from dataclasses import replace
from email.message import EmailMessage
from pathlib import Path
from typing import Any, ClassVar

import pytest
from tidemark_ledger.action import LedgerClient, PostInvoice
from tidemark_ledger.staging import READ_TOKEN as LEDGER_READ
from tidemark_ledger.staging import WRITE_TOKEN as LEDGER_WRITE

from activities.drive import DriveRename, drive_client
from activities.fs import FsRename
from activities.gmail import GmailSend
from activities.graph import GraphSendMail
from activities.stripe import StripePaymentIntent, stripe_client
from helpers.wrong_ledger import ByReference
from probes.gmail import gmail_client
from probes.graph import graph_client
from staging import drive as sd
from staging import gmail as sg
from staging import graph as sgr
from staging import stripe as ss
from staging.core import StagingServer
from tidemark.actions import ProbeResult, StepContext
from tidemark.payment_limits import PaymentLimits
from tools.kit.testing import (
    ActionContract,
    ContractCase,
    check_third_party_is_never_done,
    staging_post,
)

TIMEOUT = 5.0
GRAPH_CONFIRM_S, GRAPH_LATE_S = 2.0, 5.0
_n = itertools.count(1)


def invoice_args() -> dict[str, Any]:
    return {"customer": "acme", "amount": 120_000, "currency": "eur",
            "reference": "2026-Q3 retainer"}


def ledger_case(server: StagingServer, cls: type[PostInvoice] = PostInvoice) -> ContractCase:
    writer = LedgerClient(server.url, LEDGER_WRITE, timeout=TIMEOUT)

    def clerk_posts_the_same(ctx: StepContext) -> None:  # no Idempotency-Key: not ours
        writer.call("POST", "/ledger/v1/invoices", dict(ctx.args))

    def clerk_voids_ours(ctx: StepContext) -> None:
        for inv in writer.invoices(idempotency_key=ctx.key):
            writer.call("POST", f"/ledger/v1/invoices/{inv['id']}/void")

    return ContractCase(
        build=lambda: cls(LedgerClient(server.url, LEDGER_WRITE, timeout=TIMEOUT),
                          LedgerClient(server.url, LEDGER_READ, timeout=TIMEOUT)),
        args=invoice_args, staging_url=server.url, write_ops=[("ledger", "invoices.post")],
        secrets=[LEDGER_WRITE, LEDGER_READ], mimic=clerk_posts_the_same,
        tamper=clerk_voids_ours)


class TestLedgerPostInvoice(ActionContract):
    @pytest.fixture
    def case(self, tidemark_target: StagingServer) -> ContractCase:  # the kit's own fixture
        return ledger_case(tidemark_target)


def test_the_kit_catches_a_probe_that_matches_on_the_name_alone(server: StagingServer) -> None:
    with pytest.raises(AssertionError, match="made the probe say done"):
        check_third_party_is_never_done(ledger_case(server, ByReference))


def test_the_kit_catches_a_call_that_outlives_its_declared_deadline(
        server: StagingServer) -> None:
    class Optimistic(PostInvoice):  # its client waits TIMEOUT, it declares a fifth of that
        def __init__(self, writer: LedgerClient, reader: LedgerClient) -> None:
            super().__init__(writer, reader)
            self.deadline_s = TIMEOUT / 5

    from tools.kit.testing import check_deadline_and_horizon
    with pytest.raises(AssertionError, match=r"past its declared deadline_s 1\.0"):
        check_deadline_and_horizon(ledger_case(server, Optimistic))


def test_the_kit_catches_horizon_zero_declared_without_a_fence(
        server: StagingServer) -> None:
    class Unfenced(PostInvoice):  # a fresh Idempotency-Key per request: no fence at all
        def execute(self, ctx: StepContext) -> dict[str, Any]:
            return super().execute(replace(ctx, key=f"{ctx.key}-{next(_n)}"))

    def ours(key: str) -> int:  # the invoices posted under keys this step made from its own
        return sum(1 for e in server.staging.effects_of("ledger", "invoices.post")
                   if (e.key or "").startswith(key))

    from tools.kit.testing import check_deadline_and_horizon
    case = replace(ledger_case(server, Unfenced), effects=ours)
    with pytest.raises(AssertionError, match=r"declares horizon_s = 0 \(a fence\)"):
        check_deadline_and_horizon(case)


def test_the_kit_catches_a_probe_that_reads_through_the_write_client(
        server: StagingServer) -> None:
    class ReadsWithWriter(PostInvoice):
        def probe(self, ctx: StepContext) -> ProbeResult:
            try:
                found = self.writer.invoices(idempotency_key=ctx.key)
            except Exception:  # swallowing the kit's error does not hide the use
                return ProbeResult.unknown("cannot read")
            return (ProbeResult.done({}) if found else ProbeResult.absent("none"))

    from tools.kit.testing import check_read_only_parts
    with pytest.raises(AssertionError, match="write client 'writer' was used"):
        check_read_only_parts(ledger_case(server, ReadsWithWriter))


def test_the_kit_refuses_a_write_client_hidden_in_a_helper(server: StagingServer) -> None:
    class Hidden(PostInvoice):
        def __init__(self, writer: LedgerClient, reader: LedgerClient) -> None:
            super().__init__(writer, reader)
            self.helpers = {"poster": writer}

    from tools.kit.testing import check_read_only_parts
    with pytest.raises(AssertionError, match=r"helpers\['poster'\] reaches a write client"):
        check_read_only_parts(ledger_case(server, Hidden))


# -- the built-in actions -------------------------------------------------------------------

class TestDriveRename(ActionContract):
    @pytest.fixture
    def case(self, server: StagingServer) -> ContractCase:
        def args() -> dict[str, Any]:
            f = staging_post(server.url, "/_staging/drive/files", {"name": f"scan-{next(_n)}"})
            return {"file_id": f["id"], "name": "2026-Q3 invoice.pdf"}

        def third_party(name: str) -> Any:
            return lambda ctx: staging_post(
                server.url, f"/_staging/drive/files/{ctx.args['file_id']}/third_party_rename",
                {"name": name})

        def renames(key: str) -> int:  # a rename that changed the file (a repeat changes none)
            return sum(1 for e in server.staging.effects_of("drive", "files.update")
                       if e.key == key and e.detail["old_name"] != e.detail["name"])

        return ContractCase(
            build=lambda: DriveRename(drive_client(server.url, sd.DEFAULT_WRITE_TOKEN,
                                                   timeout=TIMEOUT),
                                      drive_client(server.url, sd.DEFAULT_READ_TOKEN,
                                                   timeout=TIMEOUT), timeout=TIMEOUT),
            args=args, staging_url=server.url, write_ops=[("drive", "files.update")],
            secrets=[sd.DEFAULT_WRITE_TOKEN, sd.DEFAULT_READ_TOKEN],
            mimic=third_party("2026-Q3 invoice.pdf"), tamper=third_party("someone else.pdf"),
            effects=renames)


def mail_args() -> dict[str, Any]:
    return {"to": ["ap@supplier.example"], "subject": f"Q3 invoices filed {next(_n)}",
            "body": "Filed."}


class TestGmailSend(ActionContract):
    reversible = False

    @pytest.fixture
    def case(self, server: StagingServer) -> ContractCase:
        def somebody_sends_the_same(ctx: StepContext) -> None:
            msg = EmailMessage()
            msg["To"] = ", ".join(ctx.args["to"])
            msg["Subject"] = ctx.args["subject"]
            msg.set_content(ctx.args["body"])
            raw = base64.urlsafe_b64encode(msg.as_bytes()).decode()
            gmail_client(server.url, sg.COMPOSE_TOKEN).users().messages().send(
                userId="me", body={"raw": raw}).execute()

        return ContractCase(
            build=lambda: GmailSend(gmail_client(server.url, sg.COMPOSE_TOKEN, timeout=TIMEOUT),
                                    gmail_client(server.url, sg.READ_TOKEN, timeout=TIMEOUT),
                                    timeout=TIMEOUT),
            args=mail_args, staging_url=server.url,
            write_ops=[("gmail", "drafts.create"), ("gmail", "drafts.send")],
            secrets=[sg.COMPOSE_TOKEN, sg.READ_TOKEN], mimic=somebody_sends_the_same)


class TestGraphSendMail(ActionContract):
    reversible = False

    @pytest.fixture
    def case(self, server: StagingServer) -> ContractCase:
        return ContractCase(
            # The watches shorter than a worker's defaults (10 s and 100 s): deadline_s is
            # written from them, so the held write checks the same sum, in 30 s, not 150 s.
            build=lambda: GraphSendMail(graph_client(server.url, sgr.SEND_TOKEN,
                                                     timeout=TIMEOUT),
                                        graph_client(server.url, sgr.READ_TOKEN,
                                                     timeout=TIMEOUT),
                                        confirm_s=GRAPH_CONFIRM_S, late_s=GRAPH_LATE_S),
            args=mail_args, staging_url=server.url,
            write_ops=[("graph", "messages.create"), ("graph", "message.send")],
            secrets=[sgr.SEND_TOKEN, sgr.READ_TOKEN])


class TestStripePaymentIntent(ActionContract):
    reversible = False

    @pytest.fixture
    def case(self, server: StagingServer) -> ContractCase:
        def args() -> dict[str, Any]:
            return {"amount": 2500, "currency": "eur", "description": f"batch {next(_n)}"}

        def another_payment_alike(ctx: StepContext) -> None:  # same amount, no key of ours
            stripe_client(server.url, ss.DEFAULT_SECRET_KEY).v1.payment_intents.create(
                {"amount": ctx.args["amount"], "currency": ctx.args["currency"],
                 "description": ctx.args["description"]})

        return ContractCase(
            build=lambda: StripePaymentIntent(
                stripe_client(server.url, ss.DEFAULT_SECRET_KEY, timeout=TIMEOUT),
                stripe_client(server.url, ss.DEFAULT_READ_KEY, timeout=TIMEOUT),
                limits=PaymentLimits(per_step=50_000), timeout=TIMEOUT),
            args=args, staging_url=server.url,
            write_ops=[("stripe", "payment_intents.create")],
            secrets=[ss.DEFAULT_SECRET_KEY, ss.DEFAULT_READ_KEY], mimic=another_payment_alike)


class TestFsRename(ActionContract):
    # A local rename holds no credential, and has no answer to lose nor a provider that could
    # hold the request (rename(2) is applied or refused within the call).
    not_applicable: ClassVar[tuple[str, ...]] = ("no_secrets", "lost_answer", "deadline")

    @pytest.fixture
    def case(self, tmp_path: Path) -> ContractCase:
        def args() -> dict[str, Any]:
            d = tmp_path / f"d{next(_n)}"
            d.mkdir()
            (d / "draft.txt").write_text("ours")
            return {"path": str(d / "draft.txt"), "name": "final.txt"}

        def a_copy_at_the_name(ctx: StepContext) -> None:  # another file, the same name
            src = Path(ctx.args["path"])
            shutil.copy(src, src.with_name(ctx.args["name"]))

        def renamed(key: str) -> int:  # files at the target name: one rename, or none
            return len(list(tmp_path.glob("d*/final.txt")))

        return ContractCase(
            build=lambda: FsRename([str(tmp_path)]), args=args, staging_url="", write_ops=[],
            mimic=a_copy_at_the_name, effects=renamed,
            # The local filesystem records no author: a rename of the same file by another
            # step is the same inode at the same name. The probe's identity is the inode.
            same_args_other_key=False)
