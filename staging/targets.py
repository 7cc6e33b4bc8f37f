"""The full set of emulated targets, as started by `tidemark staging` and `tidemark dev`."""

from staging.core import Staging, Target
from staging.drive import DriveTarget
from staging.gmail import GmailTarget
from staging.graph import GraphTarget
from staging.stripe import StripeTarget
from tidemark.plugins import plugin_staging_targets


def all_targets() -> list[Target]:
    """One fresh instance of every emulated target."""
    targets: list[Target] = []
    targets.append(GmailTarget())
    targets.append(GraphTarget())
    targets.append(DriveTarget())
    targets.append(StripeTarget())
    targets.extend(plugin_staging_targets())  # those installed plugins bring
    return targets


def build_staging(worst_case: bool = False) -> Staging:
    """Every target.

    With ``worst_case`` each switch starts (and resets) at the provider's documented worst case
    instead of the emulator's default."""
    return Staging(all_targets(), worst_case=worst_case)
