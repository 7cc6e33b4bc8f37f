"""Every action Tidemark knows, for validating plans where no clients exist (the CLI)."""

from activities.drive import DriveRename
from activities.fs import FsRename
from activities.gmail import GmailSend
from activities.graph import GraphSendMail
from activities.stripe import StripePaymentIntent
from tidemark.actions import Action, Registry

# Reversible first, irreversible last: the order `tidemark plan check` lists them in.
ACTION_CLASSES: list[type[Action]] = [FsRename, DriveRename, GmailSend, GraphSendMail,
                                      StripePaymentIntent]


def spec_registry(*extra: type[Action]) -> Registry:
    """A registry of every action class (plus ``extra``): enough to validate plans, not to
    run them."""
    return Registry([*ACTION_CLASSES, *extra])
