"""Every action Tidemark knows, for validating plans where no clients exist (the CLI)."""

from activities.fs import FsRename
from tidemark.actions import Action, Registry

ACTION_CLASSES: list[type[Action]] = [FsRename]


def spec_registry(*extra: type[Action]) -> Registry:
    """A registry of every action class (plus ``extra``): enough to validate plans, not to
    run them."""
    return Registry([*ACTION_CLASSES, *extra])
