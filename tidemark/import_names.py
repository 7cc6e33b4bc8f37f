"""Tidemark's top-level import names, and a check that each one is ours.

The layout installs seven top-level names (docs/develop.md, "Import names"). Five are generic:
an application with a ``tools`` package or a ``worker.py`` of its own, earlier on ``sys.path``,
would shadow ours, and Tidemark would then import the wrong code. The worker and the command
check at start that every name resolves beside this package, and stop with one line otherwise.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from tidemark.errors import ConfigError

# The names the wheel installs besides ``tidemark`` itself (tests/test_wheel.py holds the list).
OURS = ("workflows", "activities", "probes", "staging", "tools", "worker")


def home_of(name: str) -> Path | None:
    """The folder that holds the top-level package or module ``name``, or None if not found."""
    try:
        spec = importlib.util.find_spec(name)
    except ImportError:  # a finder that refuses the name (an image without the package)
        return None
    if spec is None:
        return None
    if spec.origin and spec.origin not in ("namespace", "built-in", "frozen"):
        origin = Path(spec.origin)
        # A package's origin is its __init__.py; a module's is the file itself.
        return (origin.parent.parent if spec.submodule_search_locations else origin.parent
                ).resolve()
    locations = list(spec.submodule_search_locations or [])
    return Path(locations[0]).parent.resolve() if locations else None


def shadowed() -> list[str]:
    """Each of our names that resolves outside the folder this package was imported from."""
    ours = Path(__file__).resolve().parent.parent
    found = []
    for name in OURS:
        home = home_of(name)
        if home is not None and home != ours:
            found.append(f"{name!r} from {home}")
    return found


def check_import_names() -> None:
    """Raise ConfigError when another project's module shadows one of our names."""
    found = shadowed()
    if found:
        raise ConfigError(
            f"another project's code shadows Tidemark's import names ({'; '.join(found)}; "
            f"Tidemark's are in {Path(__file__).resolve().parent.parent}): rename that "
            "package or module, or take its folder off sys.path (PYTHONPATH, the current "
            "directory)")
