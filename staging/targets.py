"""The full set of emulated targets, as started by `tidemark staging` and `tidemark dev`."""

from staging.core import Staging, Target


def all_targets() -> list[Target]:
    """One fresh instance of every emulated target."""
    targets: list[Target] = []
    return targets


def build_staging() -> Staging:
    return Staging(all_targets())
