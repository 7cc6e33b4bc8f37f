"""Actions that installed packages bring, found through Python entry points.

Actions (and their staging targets) that installed packages bring, found through Python
entry points.

A package registers an action class in the group ``tidemark.actions``::

    [project.entry-points."tidemark.actions"]
    "ledger.post_invoice" = "tidemark_ledger.action:PostInvoice"

The class is enough to validate plans (``tidemark plan check``); a worker binds it by calling the
class's ``from_env(env) -> Action | None``, which returns None when the action's configuration is
absent from ``env`` (the action is then known but not bound, like a built-in target without
credentials). A package may also bring an emulated target for ``tidemark staging`` and
``tidemark chaos`` in the group ``tidemark.staging``: a callable that returns a
``staging.core.Target``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from tidemark.actions import Action, ActionRef
from tidemark.errors import ConfigError

log = logging.getLogger(__name__)

ACTIONS_GROUP = "tidemark.actions"
STAGING_GROUP = "tidemark.staging"


def _entry_points(group: str) -> list[Any]:
    """The entry points of ``group``, by name; none of them is loaded."""
    # importlib.metadata (with its email, zipfile and csv parsing) is paid only by the commands
    # that look for plugins, not by every start of the CLI.
    from importlib.metadata import entry_points

    return sorted(entry_points(group=group), key=lambda e: e.name)


def _load_one(group: str, ep: Any) -> Any:
    try:
        return ep.load()
    except Exception as e:  # a broken plugin is named, not silently skipped
        raise ConfigError(f"the {group} entry point {ep.name!r} ({ep.value}) cannot be "
                          f"loaded: {type(e).__name__}: {e}") from e


def _load(group: str) -> list[tuple[str, Any]]:
    return [(ep.name, _load_one(group, ep)) for ep in _entry_points(group)]


def _checked(name: str, obj: Any) -> type[Action]:
    """``obj`` as the action class of the entry point ``name``.

    It must be an Action subclass whose ``name`` is the entry point's name."""
    if not (isinstance(obj, type) and issubclass(obj, Action)):
        raise ConfigError(f"the {ACTIONS_GROUP} entry point {name!r} must name an Action "
                          f"subclass, got {obj!r}")
    if getattr(obj, "name", None) != name:
        raise ConfigError(f"the {ACTIONS_GROUP} entry point {name!r} names "
                          f"{obj.__name__}, whose name is {getattr(obj, 'name', None)!r}; "
                          "the two must agree")
    return obj


def plugin_action_classes() -> list[type[Action]]:
    """Every action class installed packages register, checked.

    Each is checked to be an Action subclass whose ``name`` is the entry point's name."""
    return [_checked(name, obj) for name, obj in _load(ACTIONS_GROUP)]


def plugin_action_refs() -> list[ActionRef]:
    """Every action installed packages register, by entry point name, none imported.

    A reference's class is loaded, and checked as plugin_action_classes checks it, when a registry
    first needs it (a plan names the action)."""

    def ref(ep: Any) -> ActionRef:
        return ActionRef(ep.name, lambda: _checked(ep.name, _load_one(ACTIONS_GROUP, ep)))

    return [ref(ep) for ep in _entry_points(ACTIONS_GROUP)]


def bind_plugin(cls: type[Action], env: Mapping[str, str]) -> Action | None:
    """The bound instance of a plugin action from ``env``, or None when it is not configured."""
    binder = getattr(cls, "from_env", None)
    if binder is None:
        raise ConfigError(f"plugin action {cls.name} has no from_env(env) binder")
    action = binder(env)
    if action is not None and not isinstance(action, cls):
        raise ConfigError(f"{cls.name}: from_env returned {type(action).__name__}, "
                          f"not a {cls.__name__}")
    return action


def plugin_staging_targets() -> list[Any]:
    """A fresh emulated target from every ``tidemark.staging`` entry point."""
    return [factory() for _, factory in _load(STAGING_GROUP)]
