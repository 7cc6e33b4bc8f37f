"""The staging core's switches for provider behaviours.

A target declares the provider behaviours it can show, a test sets one (or all to the worst case)
over HTTP, and a reset returns them to the baseline."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from staging.core import Staging, StagingServer, Switch, Target
from staging.targets import build_staging


class Clocked(Target):
    name = "clocked"
    switches = (
        Switch("clock_offset_s", default=0, worst=600, doc="a provider's clock may run ahead"),
        Switch("second_send", default="refused", worst="sent_again",
               choices=("refused", "ignored", "sent_again"), doc="undocumented"),
    )


def _call(url: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method="GET" if body is None else "POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _values(listing: list[dict[str, Any]]) -> dict[str, Any]:
    return {s["name"]: s["value"] for s in listing}


def test_switches_start_at_their_defaults_and_are_set_one_by_one_or_all_to_the_worst() -> None:
    staging = Staging([Clocked()])
    with StagingServer(staging) as server:
        status, listing = _call(server.url, "/_staging/switches")
        assert status == 200
        assert _values(listing) == {"clock_offset_s": 0, "second_send": "refused"}
        assert listing[0]["worst"] == 600 and listing[0]["doc"]

        status, listing = _call(server.url, "/_staging/switches",
                                {"target": "clocked", "name": "clock_offset_s", "value": -30})
        assert status == 200 and _values(listing)["clock_offset_s"] == -30
        assert staging.targets["clocked"].switch("clock_offset_s") == -30

        status, listing = _call(server.url, "/_staging/switches", {"worst": True})
        assert _values(listing) == {"clock_offset_s": 600, "second_send": "sent_again"}

        _call(server.url, "/_staging/reset", {})
        assert _values(_call(server.url, "/_staging/switches")[1]) == {
            "clock_offset_s": 0, "second_send": "refused"}


@pytest.mark.parametrize("body, message", [
    ({"target": "nowhere", "name": "clock_offset_s", "value": 1}, "unknown target"),
    ({"target": "clocked", "name": "no_such", "value": 1}, "no switch"),
    ({"target": "clocked", "name": "second_send", "value": "twice"}, "not one of"),
    ({"target": "clocked", "name": "clock_offset_s", "value": "soon"}, "not a number"),
    ({"target": "clocked", "name": "clock_offset_s"}, "missing value"),
])
def test_a_bad_switch_request_is_refused_and_changes_nothing(body: dict[str, Any],
                                                             message: str) -> None:
    staging = Staging([Clocked()])
    with StagingServer(staging) as server:
        status, answer = _call(server.url, "/_staging/switches", body)
        assert status == 400 and message in answer["error"]
        assert _values(_call(server.url, "/_staging/switches")[1]) == {
            "clock_offset_s": 0, "second_send": "refused"}


def test_a_worst_case_server_resets_to_the_worst_case() -> None:
    staging = Staging([Clocked()], worst_case=True)
    assert staging.targets["clocked"].switch("clock_offset_s") == 600
    staging.set_switch("clocked", "clock_offset_s", 0)
    staging.reset()
    assert staging.targets["clocked"].switch("second_send") == "sent_again"


def test_every_switch_of_the_staging_targets_cites_its_source_and_allows_its_values() -> None:
    staging = build_staging()
    listing = staging.switch_list()
    names = {(s["target"], s["name"]) for s in listing}
    assert {("gmail", "concurrent_draft_send"), ("gmail", "gone_draft_send_status"),
            ("stripe", "clock_offset_s"), ("stripe", "restricted_key_metadata"),
            ("stripe", "idempotency_ttl_s")} <= names
    for s in listing:
        assert len(s["doc"]) > 40, s  # what the provider documents, and where
        for value in (s["default"], s["worst"]):
            staging.set_switch(s["target"], s["name"], value)  # refused if not allowed
    worst = build_staging(worst_case=True)
    assert worst.targets["gmail"].switch("concurrent_draft_send") == "both"
    assert worst.targets["stripe"].switch("restricted_key_metadata") == "hidden"
