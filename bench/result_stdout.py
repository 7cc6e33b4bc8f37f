"""Standard output for a benchmark's result alone.

The dev servers and worker processes a benchmark starts inherit its standard output and print
there; a result read with ``--json > result.json`` must not be mixed with their lines.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def others_to_stderr() -> Iterator[None]:
    """While the block runs, send what goes to file descriptor 1 to standard error.

    That covers this process and the processes it starts. After the block, standard output is
    the caller's."""
    sys.stdout.flush()
    result_fd = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(result_fd, 1)
        os.close(result_fd)
