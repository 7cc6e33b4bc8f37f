"""Every action Tidemark knows, for validating plans where no clients exist (the CLI): the
built-in ones and those installed packages register (entry point group ``tidemark.actions``,
see tidemark/plugins.py)."""

from activities.drive import DriveRename
from activities.fs import FsRename
from activities.gmail import GmailSend
from activities.graph import GraphSendMail
from activities.stripe import StripePaymentIntent
from tidemark.actions import Action, Registry
from tidemark.plugins import plugin_action_classes

# Reversible first, irreversible last: the order `tidemark plan check` lists them in.
BUILTIN_ACTION_CLASSES: list[type[Action]] = [FsRename, DriveRename, GmailSend, GraphSendMail,
                                              StripePaymentIntent]
# Plugins follow the built-in ones, by entry point name.
ACTION_CLASSES: list[type[Action]] = [*BUILTIN_ACTION_CLASSES, *plugin_action_classes()]


def spec_registry(*extra: type[Action]) -> Registry:
    """A registry of every action class (plus ``extra``): enough to validate plans, not to
    run them."""
    return Registry([*ACTION_CLASSES, *extra])
