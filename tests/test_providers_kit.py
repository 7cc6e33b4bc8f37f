"""The provider conformance kit (``tidemark providers verify``).

Its checks against the staging servers, its refusals (live in CI, a live-mode Stripe key), its
scrubbing of what it records, and the recorded fixtures held against the emulators."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from helpers.staging_fixtures import post
from staging.core import StagingServer
from tidemark import staging_tokens
from tools.cli.main import main
from tools.kit import providers

FIXTURES = Path(__file__).parent / "fixtures" / "providers"
DOC = Path(__file__).parent.parent / "docs" / "provider-assumptions.md"


@pytest.fixture
def endpoints(server: StagingServer) -> providers.Endpoints:
    seeded = post(server, "/_staging/drive/files", {"name": "kit.txt"})
    return providers.staging_endpoints(server.url, seeded["id"])


@pytest.fixture(autouse=True)
def quick_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    # The emulators settle at once unless a switch says otherwise; the switches' windows are
    # set per test below the kit's own wait.
    monkeypatch.setattr(providers, "SETTLE_S", 8.0)
    monkeypatch.setattr(providers, "POLL_S", 0.2)


def _by_id(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in results}


def test_every_required_assumption_holds_on_the_emulators_defaults(
        endpoints: providers.Endpoints) -> None:
    results = _by_id(providers.verify(endpoints))
    assert set(results) == {a.id for a in providers.ASSUMPTIONS}
    for r in results.values():
        assert r["status"] == "held", (r["id"], r.get("error"), r.get("failed"))
    # The facts are the provider's answers, not restatements of the requirement.
    assert results["stripe.idempotency"]["facts"]["replay_header"] is True
    assert results["gmail.send"]["facts"]["second_send_status"] == 404
    assert any(x["response"]["headers"].get("idempotent-replayed") == "true"
               for x in results["stripe.idempotency"]["exchanges"])


def test_a_fact_that_differs_from_what_a_probe_needs_is_broken_not_held(
        endpoints: providers.Endpoints) -> None:
    stripe = next(a for a in providers.ASSUMPTIONS if a.id == "stripe.reads")
    stricter = dataclasses.replace(stripe, required={**stripe.required,
                                                     "metadata_to_restricted_key": "never"})
    with httpx.Client() as client:
        r = providers.run_check(stricter, endpoints, client)
    assert r["status"] == "broken"
    assert r["failed"] == {"metadata_to_restricted_key": {"expected": "never", "got": True}}


def test_a_check_that_cannot_tell_is_an_error_never_held(server: StagingServer,
                                                          endpoints: providers.Endpoints) -> None:
    endpoints.stripe_url = server.url + "/not-stripe"
    results = _by_id(providers.verify(endpoints, ["stripe"]))
    assert {r["status"] for r in results.values()} == {"error"}
    assert "HTTP 404" in results["stripe.idempotency"]["error"]


def test_a_provider_without_credentials_is_skipped_with_what_it_needs(
        endpoints: providers.Endpoints) -> None:
    endpoints.graph_token = None
    graph = _by_id(providers.verify(endpoints, ["graph"]))["graph.submission"]
    assert graph["status"] == "skipped" and graph["needs"] == ["graph_token"]


def test_live_without_accounts_skips_with_one_line(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    for name in [n for n in os.environ if n.startswith("TIDEMARK_LIVE_")]:
        monkeypatch.delenv(name)
    monkeypatch.delenv("CI", raising=False)
    assert main(["providers", "verify", "--live"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "skipped" in out[0] and "TIDEMARK_LIVE_STRIPE_KEY" in out[0]


@pytest.mark.parametrize("env, message", [
    ({"CI": "true", "TIDEMARK_LIVE_STRIPE_KEY": "sk_test_x"}, "does not run where CI is set"),
    ({"TIDEMARK_LIVE_STRIPE_KEY": "sk_live_x"}, "test-mode secret key"),
    ({"TIDEMARK_LIVE_STRIPE_KEY": "sk_test_x", "TIDEMARK_LIVE_STRIPE_RESTRICTED_KEY": "rk_live_y"},
     "test-mode restricted key"),
])
def test_live_refuses_ci_and_live_mode_keys_before_any_request(
        env: dict[str, str], message: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("CI", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["providers", "verify", "--live"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_recorded_fixtures_carry_no_credential_nor_address(
        tmp_path: Path, endpoints: providers.Endpoints) -> None:
    results = providers.verify(endpoints)
    written = providers.record(results, tmp_path, endpoints, "staging")
    assert {p.stem for p in written} == {a.id for a in providers.ASSUMPTIONS}
    text = "".join(p.read_text() for p in written)
    for secret in (staging_tokens.STRIPE_SECRET, staging_tokens.STRIPE_READ,
                   staging_tokens.GMAIL_COMPOSE, staging_tokens.GRAPH_SEND, "check@example.com"):
        assert secret not in text
    assert "Bearer" not in text
    stripe = json.loads((tmp_path / "stripe.idempotency.json").read_text())
    assert stripe["facts"]["other_parameters_refused"] is True and stripe["exchanges"]


def _fixtures() -> list[Path]:
    return sorted(FIXTURES.glob("*.json"))


@pytest.mark.parametrize("path", _fixtures(), ids=lambda p: p.stem)
def test_the_emulator_can_show_what_the_provider_answered(
        path: Path, server: StagingServer, endpoints: providers.Endpoints) -> None:
    """The emulator can show what the provider answered.

    The recorded facts are reproduced together by the emulator in one of its switch
    positions: its default, or with the assumption's switches at the documented worst case;
    and they break none of the facts the probe needs together. Required facts must come out
    the same at the default."""
    fixture = json.loads(path.read_text())
    assumption = next(a for a in providers.ASSUMPTIONS if a.id == fixture["id"])
    assert not assumption.contradictions(fixture["facts"])
    at_default = _by_id(providers.verify(endpoints, [assumption.id]))[assumption.id]
    assert at_default["status"] == "held", at_default
    for fact, value in fixture["facts"].items():
        if fact in assumption.required:
            assert at_default["facts"][fact] == value, fact
    shown = [at_default["facts"]]
    if assumption.switches:
        worst = {f"{s['target']}.{s['name']}": s["worst"]
                 for s in server.staging.switch_list()}
        for switch in assumption.switches:
            target, name = switch.split(".", 1)
            server.staging.set_switch(target, name, worst[switch])
        at_worst = _by_id(providers.verify(endpoints, [assumption.id]))[assumption.id]
        shown.append(at_worst.get("facts") or {})
    assert any(all(f.get(fact) == value for fact, value in fixture["facts"].items())
               for f in shown), (fixture["facts"], shown)


def test_there_are_fixtures_for_every_assumption_and_the_doc_lists_every_switch(
        staging_server: StagingServer) -> None:
    assert {p.stem for p in _fixtures()} == {a.id for a in providers.ASSUMPTIONS}
    for p in _fixtures():
        assert json.loads(p.read_text())["source"]
    doc = DOC.read_text()
    switches = {f"{s['target']}.{s['name']}" for s in staging_server.staging.switch_list()}
    for a in providers.ASSUMPTIONS:
        assert f"`{a.id}`" in doc, a.id
        assert set(a.switches) <= switches, a.id
    for name in switches:
        assert f"`{name}`" in doc, name


def test_the_kit_reads_graphs_flag_whichever_way_graph_spells_its_id(
        server: StagingServer, endpoints: providers.Endpoints) -> None:
    # The emulator answers `Integer 0xe07` for `Integer 0x0E07`, as Graph does; the message
    # waits in Drafts, flagged, for less than the kit's wait.
    post(server, "/_staging/switches", {"target": "graph", "name": "submitted_stays_in_drafts_s",
                                        "value": 2})
    [r] = providers.verify(endpoints, ["graph.submission"])
    assert r["facts"]["in_drafts_right_after_202"] is True
    assert r["facts"]["submit_flag_while_in_drafts"] is True, r["facts"]
    assert r["measured"]["looks_in_drafts"] >= 2  # polled through the window, not once
    assert providers.prop_id("Integer 0x0E07") == providers.prop_id("integer 0xe07")


def test_a_recording_in_drafts_right_after_the_202_without_the_flag_is_refused() -> None:
    graph = next(a for a in providers.ASSUMPTIONS if a.id == "graph.submission")
    dangerous = {"send_answers_202": True, "in_drafts_right_after_202": True}
    assert graph.contradictions(dangerous)
    assert graph.contradictions({**dangerous, "submit_flag_while_in_drafts": False})
    assert not graph.contradictions({**dangerous, "submit_flag_while_in_drafts": True})
    assert "submit_flag_while_in_drafts" in graph.broken(
        {**dangerous, "key_property_kept": True, "key_filter_finds_it": True})


def test_the_kit_runs_the_probes_own_reads(endpoints: providers.Endpoints) -> None:
    results = _by_id(providers.verify(endpoints, ["graph.submission", "gmail.send",
                                                  "stripe.reads"]))
    assert results["graph.submission"]["facts"]["key_filter_finds_it"] is True
    assert results["gmail.send"]["facts"]["history_shows_sent"] is True  # labelId=SENT
    assert results["gmail.send"]["facts"]["draft_gone_after_send"] is True
    assert results["stripe.reads"]["facts"]["restricted_list_finds_it"] is True
