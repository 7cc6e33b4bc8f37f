"""Tidemark core: the two-phase journal, plans, keys, settings and the step algorithm.

Nothing in the core talks to Temporal (settings.py reads only the SDK's environment
configuration, temporalio.envconfig, and codec.py encrypts the payloads a client or worker
sends); workflows/, activities/ and worker.py build on it, and the
tooling in tools/ drives them all.
"""


def installed_version() -> str:
    """The installed distribution's version, or ``(not installed)`` for a bare source tree.

    It is read from its metadata, so it cannot drift from what pip installed. Read only when
    asked: importlib.metadata and what it loads (email, zipfile, csv) cost `--help` tens of
    milliseconds."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tidemark")
    except PackageNotFoundError:  # a source tree on PYTHONPATH that was never installed
        return "(not installed)"
