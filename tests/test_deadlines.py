"""Each built-in action's deadline fits its own clients' timeouts.

The deadline is ``deadline_s``. The lease written before a call covers the call for that long,
and only renewals cover it past that (tidemark.store.LeaseKeeper). A call is a sequence of
requests, each of which may take the client's timeout to connect and again to answer
(google-api-python-client over ``OneShotHttp``, stripe's ``RequestsClient``), or the timeout in
all (msgraph over httpx, under ``asyncio.wait_for``). The behaviour against a target that holds
the write is checked for each of them by the conformance kit (tests/test_action_contract.py,
check_deadline_and_horizon)."""

from __future__ import annotations

import pytest

from activities.drive import DriveRename, drive_client
from activities.fs import FsRename
from activities.gmail import GmailSend
from activities.graph import CONFIRM_READS, GraphSendMail
from activities.stripe import StripePaymentIntent, stripe_client
from probes.gmail import gmail_client
from probes.graph import graph_client
from tidemark.actions import Action
from tidemark.payment_limits import PaymentLimits

URL = "http://127.0.0.1:9"  # never contacted: the clients are only built
TIMEOUTS = (0.5, 30.0, 600.0)  # the smallest we use, the default, the largest a setting allows


def longest_call(action: Action, timeout: float) -> float:
    """The longest the call of a built-in can take by its clients' timeouts alone."""
    if isinstance(action, DriveRename | GmailSend):
        return 2 * timeout  # one request (files.update, drafts.send): connect, then answer
    if isinstance(action, StripePaymentIntent):
        return 2 * 2 * timeout  # the create, and the listing after a replayed 5xx
    if isinstance(action, GraphSendMail):
        # the send, the wait for the draft to leave Drafts, then one probe's reads
        return timeout + action.confirm_s + CONFIRM_READS * timeout
    raise AssertionError(f"no rule for {action.name}")


def built(timeout: float) -> list[Action]:
    return [
        DriveRename(drive_client(URL, "w", timeout=timeout),
                    drive_client(URL, "r", timeout=timeout), timeout=timeout),
        GmailSend(gmail_client(URL, "w", timeout=timeout), gmail_client(URL, "r", timeout=timeout),
                  timeout=timeout),
        GraphSendMail(graph_client(URL, "w", timeout=timeout, user="me@example.com"),
                      graph_client(URL, "r", timeout=timeout, user="me@example.com")),
        StripePaymentIntent(stripe_client(URL, "sk_test_w", timeout=timeout),
                            stripe_client(URL, "rk_test_r", timeout=timeout),
                            limits=PaymentLimits(per_step=100), timeout=timeout),
    ]


@pytest.mark.parametrize("timeout", TIMEOUTS)
def test_every_built_in_call_fits_inside_its_declared_deadline(timeout: float) -> None:
    for action in built(timeout):
        assert timeout < action.deadline_s, action.name
        assert longest_call(action, timeout) < action.deadline_s, (
            f"{action.name}: its clients may take {longest_call(action, timeout)}s, it declares "
            f"a deadline of {action.deadline_s}s")


def test_a_local_rename_declares_a_deadline_and_no_horizon() -> None:
    # rename(2) has no client timeout: it returns or fails within the call, on this machine;
    # the deadline only covers a slow disk, and a call past it is still covered by renewals.
    assert FsRename.deadline_s > 0 and FsRename.horizon_s == 0
