"""Every action Tidemark knows, for validating plans where no clients exist (the CLI).

It holds the built-in actions and those installed packages register (entry point group
``tidemark.actions``, see tidemark/plugins.py).

The catalog names each action and where its class lives, and imports none of them. An action's
module brings its provider's client library (googleapiclient, msgraph and kiota, stripe). A
command that reads the journal, or checks a plan of renames, must not pay their second of
import. A registry (tidemark.actions.Registry) imports a class the first time a plan names it.
"""

from __future__ import annotations

from functools import cache

from tidemark.actions import Action, ActionRef, ClientLibrary, Registry
from tidemark.plugins import plugin_action_refs

# Reversible first, irreversible last: the order `tidemark plan check` lists them in.
BUILTIN_ACTIONS: dict[str, str] = {
    "fs.rename": "activities.fs:FsRename",
    "drive.rename": "activities.drive:DriveRename",
    "gmail.send": "activities.gmail:GmailSend",
    "graph.send_mail": "activities.graph:GraphSendMail",
    "stripe.payment_intent": "activities.stripe:StripePaymentIntent",
}

# The client libraries, each the extra of pyproject.toml that installs it (docs/install.md), by
# the top-level modules our action and probe modules import from them at their top (google-auth
# comes with google-api-python-client; azure-identity and msal with msgraph-sdk; httpx carries
# Drive's and Gmail's awaited calls, probes/google_async.py).
GOOGLE = ClientLibrary("Google's API client", "google",
                       ("googleapiclient", "google_auth_httplib2", "httplib2", "httpx"))
MICROSOFT = ClientLibrary("the Microsoft Graph client", "microsoft",
                          ("msgraph", "msgraph_core", "kiota_abstractions", "kiota_http",
                           "httpx"))
# httpx: stripe-python's asynchronous HTTP client, which the action's execute_async awaits.
STRIPE = ClientLibrary("the Stripe client", "stripe", ("stripe", "httpx"))
# fs.rename needs none: a base install runs it.
BUILTIN_LIBRARIES: dict[str, ClientLibrary] = {
    "drive.rename": GOOGLE, "gmail.send": GOOGLE, "graph.send_mail": MICROSOFT,
    "stripe.payment_intent": STRIPE,
}


def builtin_refs() -> list[ActionRef]:
    """The built-in actions, by name, none of their modules imported."""
    return [ActionRef.at(name, where, BUILTIN_LIBRARIES.get(name))
            for name, where in BUILTIN_ACTIONS.items()]


def missing_libraries() -> dict[ClientLibrary, list[str]]:
    """The client libraries not installed here, each with the actions it leaves out.

    The actions named are built-in ones; nothing is imported to find out."""
    missing: dict[ClientLibrary, list[str]] = {}
    for name, library in BUILTIN_LIBRARIES.items():
        if not library.installed():
            missing.setdefault(library, []).append(name)
    return missing


def action_refs() -> list[ActionRef]:
    """Every action, built-in ones first, then plugins by entry point name; nothing imported."""
    return [*builtin_refs(), *plugin_action_refs()]


def spec_registry(*extra: type[Action]) -> Registry:
    """A registry of every action (plus ``extra``), to validate plans but not run them.

    An action's class is imported when a plan first names it."""
    return Registry([*action_refs(), *extra])


@cache
def _classes(which: str) -> list[type[Action]]:
    refs = builtin_refs() if which == "BUILTIN_ACTION_CLASSES" else action_refs()
    registry = Registry(refs)
    loaded = [registry.spec(ref.name) for ref in refs]
    return [cls for cls in loaded if cls is not None]


def __getattr__(name: str) -> list[type[Action]]:
    """Gives ``BUILTIN_ACTION_CLASSES`` and ``ACTION_CLASSES``, every class imported.

    ``ACTION_CLASSES`` holds the built-in ones, then plugins. They are for the code that needs
    them all, and computed on first access only."""
    if name in ("BUILTIN_ACTION_CLASSES", "ACTION_CLASSES"):
        return _classes(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
