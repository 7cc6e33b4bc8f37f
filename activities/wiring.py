"""Which actions a worker can run, built from its configuration (environment variables).

Every known action class is registered, so plans validate everywhere; an instance is bound
only where its clients are configured. A plan that needs an unconfigured action is refused
before its first step.
"""

from __future__ import annotations

from collections.abc import Mapping

from activities.catalog import ACTION_CLASSES
from activities.fs import FsRename
from tidemark.actions import Action, Registry


def bound_actions(env: Mapping[str, str]) -> list[Action]:
    """Instances of every action whose configuration is present in ``env``."""
    actions: list[Action] = [FsRename()]
    return actions


def worker_registry(env: Mapping[str, str]) -> Registry:
    registry = Registry(ACTION_CLASSES)
    for action in bound_actions(env):
        registry.register(action)
    return registry
