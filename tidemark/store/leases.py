"""The attempt lease: its rules, its keeper, and the watch against a lapse.

The attempt lease: its rules, the lease keeper that renews it while an action's call runs,
and the watch that ends the process rather than let a lease lapse under a call still running."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from tidemark.store.connection import CONNECT_TIMEOUT_S, connect_options

log = logging.getLogger(__name__)

# The attempt lease of an open intent says until when the attempt acting on it may still be
# acting; a twin neither takes the intent over, nor probes, nor acts before it has passed
# (StepSession.take_over checks it in the statement that takes the intent). It is what keeps a
# twin out while the owner's call to the target is in flight: the owner holds no connection
# then, and may lose every session it had (a restart, a failover) without losing the step. The
# lease does not depend on renewals succeeding:
#
# * before an action's call (stage or execute) the attempt writes
#   lease_until = now + deadline_s + horizon_s, in the statement that writes the intent (or, on a
#   resume, claims it): the call cannot outlive its deadline, and the target may still apply it
#   up to horizon_s after that;
# * while the attempt acts, a LeaseKeeper extends it every LEASE_RENEW_S on a connection of its
#   own (never from the step pool, which is empty at full load) to at least now + LEASE_S +
#   horizon_s, never shortening it; a failed renewal costs nothing but this extension;
# * when the call fails ambiguously, the lease is set to now + horizon_s (the attempt is over,
#   its request may still land); when it ends with an outcome, the lease no longer matters;
# * a call that outlives what the committed lease covers (past its declared deadline, with
#   renewals failing) ends the process before the lease can lapse (LeaseKeeper's watch), so
#   no request leaves an attempt after a twin may have found its lease lapsed.
#
# LEASE_S is the margin a renewal adds (four renewals missed in a row), and the lease of a row
# written before lease_until existed (started_at + LEASE_S).
LEASE_S = 2.0
LEASE_RENEW_S = 0.5
# The lease keeper's statements give up after this long, so a hung database cannot hold up the
# end of an attempt that waits for a renewal in flight.
RENEW_TIMEOUT_MS = 2000

# What the deadline watch does when an attempt's lease would lapse while its call runs: end
# the process at once (see LeaseKeeper). The exit status says why to whatever restarts it.
EXIT_LEASE_LAPSED = 75
# The watch fires this long before the committed lease could lapse: its own tick, the time an
# exit takes, and the two clocks' rates (the lease is counted by the database, the watch by this
# machine's monotonic clock, which NTP slews by at most 0.05 %).
LAPSE_MARGIN_S = 0.25
WATCH_EVERY_S = 0.05
# A renewal is started this long before a held key's cover would run out, whatever the
# renewal period: an action whose deadline is shorter than LEASE_RENEW_S is renewed in time.
RENEW_AHEAD_S = LEASE_RENEW_S
# The least time between two renewals, so that a database that is away is not asked in a loop.
RENEW_MIN_GAP_S = 0.1


def end_process(keys: list[str]) -> None:
    """The default response to a lapsing lease: the process ends now.

    It calls os._exit: no cleanup that could block, no thread that goes on.

    A thread cannot be stopped from outside in Python, and giving up on a call without stopping
    it (a timeout around ``execute``) would leave the call free to send its request later, when
    a twin may already have acted. Ending the process closes every socket it holds: whatever
    left before is covered by the lease (it lapses only after the horizon), nothing leaves
    after. The other steps this process ran are left in doubt, as by any crash, and settled by
    their probes; Temporal retries them on another worker once the heartbeats stop."""
    log.critical("the attempt lease of %s would lapse while its call still runs (past the "
                 "action's declared deadline, and Postgres cannot be reached to renew it): "
                 "ending this process before a twin attempt may act", ", ".join(keys))
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    os._exit(EXIT_LEASE_LAPSED)


@dataclass
class _Held:
    """One action call under way in this process, as the lease keeper sees it.

    ``cover_until`` (monotonic seconds) is when the lease committed for it stops covering a
    request that leaves us: a lease written with ``secs`` (the statement sent at ``t``) runs to
    at least ``t + secs`` on the database's clock, and a request may be applied up to
    ``horizon_s`` after it left, so requests that leave before ``t + secs - horizon_s`` are
    covered. ``deadline_at`` is when the call passes its declared deadline."""

    owner: uuid.UUID  # the attempt's token: a renewal extends only the lease it owns
    renew_s: float
    horizon_s: float
    cover_until: float
    deadline_s: float
    deadline_at: float
    overran: bool = False


class LeaseKeeper:
    """Extends the attempt leases of this process's actions, and ends it before one lapses.

    Extends the attempt leases of the actions running in this process, and ends the process
    rather than let one lapse while its call runs.

    Renewals go out every LEASE_RENEW_S (sooner when a call's cover would run out), all in one
    statement, on a connection of its own (opened when first needed, opened again after a
    failure). A renewal that fails is logged and changes nothing else while the call is within
    its declared deadline: the lease written before the call covers it.

    Past the deadline (an action that declared too short a deadline, a client timeout that does
    not bound the whole call, a provider that trickles its answer), only renewals cover the
    call. If they fail too (Postgres restarts, or this worker is cut off from it while the
    target is still reachable), the lease would lapse while the call may still send its
    request: a twin attempt (Temporal's retry after the start-to-close or heartbeat timeout, a
    resume on another worker) then finds the step's lock free and its lease lapsed, probes,
    finds nothing yet, and acts, and the late request lands too. So a watch thread compares
    each call's cover with this machine's monotonic clock (never its wall clock, which may be
    set anywhere; the lease itself is counted on the database's clock, and the cover only ever
    errs early) and calls ``on_lapse`` (default: end_process) LAPSE_MARGIN_S before the lease
    could lapse. An attempt past its deadline thus goes on while it is renewed (a twin finds it
    fresh and waits), and never acts unseen after its lease is gone. Each call that passes its
    deadline is logged and journaled as an ``overran`` event.

    What the watch cannot cover: a process frozen as a whole past its cover (SIGSTOP, a paused
    VM) may, on waking, send a request before the watch thread runs again. So the cover is also
    checked where each request leaves, on the sending thread (``covers``, asked by
    tidemark.wire), and a renewal extends only the cover of a lease it did renew: a frozen
    attempt whose intent a twin took over gains nothing. Left is a process frozen between that
    check and its socket: the target's fence, or the mark (tidemark.wire), holds then."""

    def __init__(self, conninfo: str, every: float = LEASE_RENEW_S,
                 on_lapse: Callable[[list[str]], None] = end_process) -> None:
        self.conninfo = conninfo
        self.every = every
        self.on_lapse = on_lapse
        self._held: dict[str, _Held] = {}
        self._overran: list[tuple[str, float]] = []  # (key, deadline_s) not yet journaled
        self._mutex = threading.Lock()  # guards _held, _overran and the threads
        self._renewing = threading.Lock()  # held while a renewal is read and written
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: threading.Thread | None = None
        self._conn: psycopg.Connection[Any] | None = None
        self._last = 0.0  # monotonic: when the last renewal was started

    def hold(self, key: str, owner: uuid.UUID, seconds: float, *, horizon_s: float,
             covered_until: float, deadline_s: float) -> None:
        """Renews ``key`` to ``seconds`` from each renewal until ``drop``, and watches it.

        Args:
            seconds: what each renewal extends the lease to (LEASE_S plus the horizon).
            horizon_s: the target's horizon, part of ``seconds``.
            covered_until: monotonic time until which the lease already committed for the call
                covers a request that leaves us (taken before the statement that wrote it,
                plus what the lease covers of the call).
            deadline_s: the call's declared deadline, for the ``overran`` note.
        """
        now = time.monotonic()
        with self._mutex:
            if not self._held:  # the period runs from here: a quick call is never renewed
                self._last = now
            self._held[key] = _Held(owner, seconds, horizon_s, covered_until, deadline_s,
                                    now + deadline_s)
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="tidemark-leases")
                self._thread.start()
            if self._watch is None or not self._watch.is_alive():
                self._watch = threading.Thread(target=self._watching, daemon=True,
                                               name="tidemark-deadlines")
                self._watch.start()
            # Woken only when this cover runs out before the next renewal is due (a quick
            # step, the fast path's usual one, costs the renewer nothing).
            soon = covered_until - LAPSE_MARGIN_S - RENEW_AHEAD_S < self._last + self.every
        if soon:
            self._wake.set()

    def cover(self, key: str, until: float, deadline_s: float) -> None:
        """Notes the cover of a new call on ``key``: requests leaving before ``until``.

        A lease committed for a new call on ``key`` (stage, then execute) covers requests
        that leave before ``until`` (monotonic); its deadline runs from now."""
        with self._mutex:
            h = self._held.get(key)
            if h is not None:
                h.cover_until = max(h.cover_until, until)
                h.deadline_s, h.overran = deadline_s, False
                h.deadline_at = time.monotonic() + deadline_s

    def covers(self, key: str) -> bool:
        """Whether a request of the call on ``key`` that leaves now is covered.

        Whether a request of the call on ``key`` that leaves now is covered by the lease
        committed for it, on this machine's monotonic clock: the cover (the moments a request
        may leave at and still land, horizon included, before the lease can lapse) runs past
        now by LAPSE_MARGIN_S, the margin the deadline watch keeps too. False for a key not
        held (no call of it is under way here)."""
        with self._mutex:
            h = self._held.get(key)
            return h is not None and time.monotonic() + LAPSE_MARGIN_S < h.cover_until

    def drop(self, key: str) -> None:
        """Stops renewing ``key``.

        When this returns, no renewal of it is still to come (unless a renewal in flight hangs past
        RENEW_TIMEOUT_MS, which can only lengthen the lease)."""
        with self._mutex:
            self._held.pop(key, None)
        if self._renewing.acquire(timeout=RENEW_TIMEOUT_MS / 1000 + 1):
            self._renewing.release()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        for thread in (self._thread, self._watch):
            if thread is not None:
                thread.join(timeout=RENEW_TIMEOUT_MS / 1000 + 1)
        with self._renewing:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _next_renewal(self) -> float:
        """Seconds until the next renewal: the period, or sooner if a cover runs out first."""
        with self._mutex:
            covers = [h.cover_until for h in self._held.values()]
            last = self._last
        due = last + self.every
        if covers:
            due = max(last + RENEW_MIN_GAP_S,
                      min(due, min(covers) - LAPSE_MARGIN_S - RENEW_AHEAD_S))
        return max(0.0, due - time.monotonic())

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._next_renewal())
            self._wake.clear()
            if self._stop.is_set():
                return
            if self._next_renewal() > 0:
                continue  # woken by a new hold whose cover is long enough
            with self._renewing:
                with self._mutex:
                    self._last = time.monotonic()
                    held = {k: (h.renew_s, h.horizon_s, h.owner) for k, h in self._held.items()}
                    overran, self._overran = self._overran, []
                if held or overran:  # an overrun is journaled even once its call ended
                    self._renew(held, overran)

    def _renew(self, held: dict[str, tuple[float, float, uuid.UUID]],
               overran: list[tuple[str, float]]) -> None:
        sent = time.monotonic()  # the lease runs from a moment after this
        try:
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(
                    self.conninfo, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S,
                    **connect_options())
                sent = time.monotonic()
            # The timeout is the transaction's own (set_config's is_local), never the session's:
            # through a transaction-mode pooler the next transaction may run on another server
            # session. One round trip, one transaction: the setting and the renewal go out
            # together and the pipeline's one Sync ends them (StepSession.begin).
            with self._conn.pipeline():
                self._conn.execute("SELECT set_config('statement_timeout', %s, true)",
                                   (str(RENEW_TIMEOUT_MS),))
                cur = self._conn.execute(
                    "UPDATE tidemark.journal j SET lease_until = greatest(j.lease_until,"
                    "   clock_timestamp() + make_interval(secs => v.secs)),"
                    " lease_s = greatest(coalesce(j.lease_s, 0), v.secs)"
                    " FROM unnest(%s::text[], %s::float8[], %s::uuid[]) AS v(key, secs, owner)"
                    " WHERE j.idem_key = v.key AND j.outcome IS NULL AND j.owner = v.owner"
                    " RETURNING j.idem_key",
                    (list(held), [renew for renew, _, _ in held.values()],
                     [owner for _, _, owner in held.values()]))
            renewed = {r[0] for r in cur.fetchall()}
        except psycopg.Error as e:  # the database is away
            log.warning("cannot renew %d attempt lease(s): %s", len(held), e)
            with self._mutex:
                self._overran = overran + self._overran  # journaled with a later renewal
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            return
        with self._mutex:
            # Only a lease the statement renewed covers more: one whose intent a twin took
            # over (this attempt froze past its lease) or settled keeps the cover it had, so a
            # request of this attempt that has not left yet never leaves (tidemark.wire).
            for key in renewed:
                h = self._held.get(key)
                renew, horizon, _ = held[key]
                if h is not None:
                    h.cover_until = max(h.cover_until, sent + renew - horizon)
        self._note_overruns(overran)

    def _note_overruns(self, overran: list[tuple[str, float]]) -> None:
        """Journals an ``overran`` event for each call that passed its declared deadline."""
        if not overran or self._conn is None:
            return
        try:
            self._conn.execute(
                "INSERT INTO tidemark.events (task_id, step, kind, detail)"
                " SELECT j.task_id, j.step, 'overran', jsonb_build_object('phase', j.phase,"
                "   'key', j.idem_key, 'deadline_s', v.deadline_s)"
                " FROM tidemark.journal j"
                " JOIN unnest(%s::text[], %s::float8[]) AS v(key, deadline_s)"
                "   ON j.idem_key = v.key",
                ([k for k, _ in overran], [d for _, d in overran]))
        except psycopg.Error as e:
            log.warning("cannot journal %d overrun(s): %s", len(overran), e)

    def _watching(self) -> None:
        while not self._stop.wait(WATCH_EVERY_S):
            now = time.monotonic()
            lapsing: list[str] = []
            with self._mutex:
                for key, h in self._held.items():
                    if not h.overran and now > h.deadline_at:
                        h.overran = True
                        self._overran.append((key, h.deadline_s))
                        log.warning("the call of %s is past its declared deadline; it goes on "
                                    "while its lease is renewed", key)
                    if now >= h.cover_until - LAPSE_MARGIN_S:
                        lapsing.append(key)
            if lapsing:
                self.on_lapse(lapsing)
