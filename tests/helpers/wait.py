"""Polling instead of sleeping."""

import time
from collections.abc import Callable
from typing import Any


def assert_eventually(check: Callable[[], Any], timeout: float = 10.0,
                      interval: float = 0.05) -> Any:
    """Calls ``check`` until it returns a truthy value, which is returned.

    An AssertionError inside ``check`` counts as "not yet"; the last one is raised at the
    timeout."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
            if result:
                return result
            failure: AssertionError = AssertionError(
                f"condition not met within {timeout}s (last result {result!r})")
        except AssertionError as e:
            failure = e
        if time.monotonic() > deadline:
            raise failure
        time.sleep(interval)
