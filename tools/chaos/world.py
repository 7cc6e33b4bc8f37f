"""The world `tidemark chaos` runs in (see tools/chaos/run.py).

That is the staging servers driven over HTTP, seeded for a plan, and the worker's registry
bound against them."""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Sequence
from typing import Any

from tidemark.actions import Action, Registry
from tidemark.errors import TidemarkError
from tidemark.faults import CRASH_ENV
from tidemark.plan import Plan
from tidemark.plugins import plugin_action_classes

# The client timeout of a plugin's staging target (its ``timeout_env``) unless the environment
# sets one: a killed attempt's lease, which covers the action's deadline, lapses in seconds.
STAGING_PLUGIN_TIMEOUT_S = "2"


class HarnessError(Exception):
    """Chaos's own machinery failed (seeding, binding, reading the world).

    The run could not be judged. Never a mismatch: it says nothing about Tidemark."""


def staging_http(url: str, path: str, body: dict[str, Any] | None = None) -> Any:
    import urllib.request

    req = urllib.request.Request(url + path, method="GET" if body is None else "POST",
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def seed_world(staging_url: str, plan: Plan, worst_case: bool = False) -> None:
    """A reset staging server with what the plan's steps act on.

    That is the Drive files it renames (under the supplier-sync demo's original names where the
    ids are the demo's). With ``worst_case``, every switch of every target is set to its
    documented worst case."""
    from tidemark.supplier_sync import seed_requests

    staging_http(staging_url, "/_staging/reset", {})
    if worst_case:  # a reset returns to the server's baseline, which may be the defaults
        staging_http(staging_url, "/_staging/switches", {"worst": True})
    demo = {body["id"]: (path, body) for path, body in seed_requests()}
    for s in plan.steps:
        if s.action == "drive.rename":
            fid = s.args["file_id"]
            path, body = demo.get(fid, ("/_staging/drive/files",
                                        {"id": fid, "name": f"{fid}.orig"}))
            staging_http(staging_url, path, body)


# -- the registry -----------------------------------------------------------------------

def load_class(spec: str) -> type[Action]:
    module, _, name = spec.partition(":")
    cls = getattr(importlib.import_module(module), name, None)
    if not (isinstance(cls, type) and issubclass(cls, Action)):
        raise TidemarkError(f"--action {spec}: not an Action class")
    return cls


def chaos_registry(staging_url: str, extra: Sequence[str] = ()) -> Registry:
    """The worker's registry bound against the staging server, with ``extra`` action classes.

    The extra classes (MODULE:CLASS, bound by their ``from_env``) take the place of same-named
    ones."""
    from activities.wiring import worker_registry
    from tools.stack.devstack import STAGING_CLIENTS

    # The staging servers' client settings (short timeouts, so a killed attempt's lease lapses
    # in seconds; no Drive horizon, as staging applies a write within its request), unless the
    # environment says otherwise.
    env = {**STAGING_CLIENTS, "TIDEMARK_STAGING_URL": staging_url, **passthrough_env()}
    classes = [*plugin_action_classes(), *(load_class(spec) for spec in extra)]
    for cls in classes:  # a plugin's staging target answers in milliseconds too
        if getattr(cls, "timeout_env", None):
            env.setdefault(cls.timeout_env, STAGING_PLUGIN_TIMEOUT_S)  # type: ignore[attr-defined]
    registry = worker_registry(env)
    for spec in extra:
        cls = load_class(spec)
        registry.register(cls)
        bound = cls.from_env(env)  # type: ignore[attr-defined]
        if bound is None:
            raise TidemarkError(f"--action {spec}: from_env bound nothing")
        registry.register(bound)
    return registry


def passthrough_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith("TIDEMARK_")
            and k not in (CRASH_ENV, "TIDEMARK_STAGING_URL")}
