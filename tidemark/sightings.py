"""When this process first saw each open intent as it is now.

When this process first saw each open intent as it is now, on its own monotonic clock: what
a twin waits out before it takes an intent over (tidemark.attempt.taken_over).

The attempt lease is written as a moment on the database's clock, and a step of that clock (NTP
stepping it, a person setting it, a restored VM) moves the moment: 30 s forward hands the step
to a twin while the first attempt's request is still at the provider. So a twin also measures
the lease itself: it takes the intent over only once it has seen the row unchanged (the same
owner, the same version of the row: no renewal, claim or stage since) for the lease's whole
length (``lease_s``, a length, on nobody's clock) on its own monotonic clock, as a leader lease
is waited out by its successor. The attempt that holds the lease counts its cover on its own
monotonic clock from before it wrote the lease (tidemark.store.LeaseKeeper), and the twin
counts from after it read the write, so the cover always ends first, whatever the database's
clock did; only the two clocks' rates matter (NTP slews a monotonic clock by at most 0.05 %).

A sighting lives in this process: a retry on another worker starts its own count (it waits
longer, never less).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable

# Sightings kept at most; beyond, the oldest half is forgotten (a forgotten one only makes its
# twin wait the whole length again). An open intent is one per task, so this is far more than a
# worker holds at once.
MAX_SIGHTINGS = 10_000


class Sightings:
    """The first sighting of each open intent's present state, on ``clock``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._seen: dict[str, tuple[Hashable, float]] = {}
        self._lock = threading.Lock()

    def left(self, key: str, state: Hashable, length_s: float) -> float:
        """Seconds until this process will have seen ``key`` in ``state`` for ``length_s``.

        0.0: it has. A state not seen before starts the count now."""
        now = self._clock()
        with self._lock:
            seen = self._seen.get(key)
            if seen is None or seen[0] != state:
                if len(self._seen) >= MAX_SIGHTINGS:
                    oldest = sorted(self._seen.items(), key=lambda kv: kv[1][1])
                    for k, _ in oldest[:MAX_SIGHTINGS // 2]:
                        del self._seen[k]
                self._seen[key] = (state, now)
                return max(0.0, length_s)
            return max(0.0, seen[1] + length_s - now)

    def forget(self, key: str) -> None:
        with self._lock:
            self._seen.pop(key, None)


SIGHTINGS = Sightings()  # this process's
