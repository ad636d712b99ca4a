"""The lease keeper (PROTOCOL.md 6, step 2, "The lease keeper"): a thread of the listener that
renews its leases on a connection of its own whenever the loop has not renewed them for 3/4 of
an interval, so that neither a distant Redis (a step of the loop is ten or more round trips)
nor a long step lets the lease of a live listener lapse. It never registers (a lost lease is
the loop's to register again), and it stops renewing once the loop is stuck, so that a
listener that no longer steps is taken for dead as before.

Who writes what: ``renewed`` is called by the loop (its registration and renewals) and by the
keeper's thread, under the keeper's lock; ``beat`` by the loop only; everything else is the
thread's."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from blueque.errors import BluequeError
from blueque.metrics import ListenerMetrics
from blueque.store import RedisStore

log = logging.getLogger("blueque.daemon")

__all__ = ["DUE", "RETRY", "STUCK_LEASES", "STUCK_MIN", "LeaseKeeper"]

#: The keeper renews once no renewal was sent for this share of an interval (the loop's
#: renewals come every half interval: on a near Redis the keeper sends nothing).
DUE = 0.75
#: After a renewal that failed, or found a lease lost, the next try comes this much later (s).
RETRY = 0.5
#: The loop is stuck once it has not begun a step for this many leases, and at least
#: STUCK_MIN seconds: the keeper then lets the lease lapse.
STUCK_LEASES, STUCK_MIN = 5, 60.0
#: How often the keeper says that it renewed in the loop's place, at most (s).
SAY_EVERY = 60.0


class LeaseKeeper:
    """Renews ``listener``'s leases on ``queues`` (``store``: a connection of its own whose
    calls time out: blueque.store.apart) when the latest renewal was sent DUE of an interval ago;
    tells ``on_renewed`` (the exclusive guard) and the metrics of every renewal that renewed
    every lease, the loop's and its own."""

    def __init__(self, store: RedisStore, listener: str, queues: Sequence[str],
                 interval: float, on_renewed: Callable[[float], None],
                 clock: Callable[[], float] = time.monotonic,
                 metrics: ListenerMetrics | None = None) -> None:
        self.store, self.listener, self.queues = store, listener, list(queues)
        self.interval, self.on_renewed, self.clock = interval, on_renewed, clock
        self.metrics = metrics
        self.lease_ms = int(interval * 2000)
        self.info_ttl = int(interval * 3) + 1  # as the loop's renewal writes it
        self.stuck_after = max(STUCK_LEASES * 2 * interval, STUCK_MIN)
        #: when the latest renewal that renewed every lease was sent (None: not registered)
        self.renewed_at: float | None = None
        self._beat = clock()
        self._next_try = 0.0
        self._stuck = False
        self._said_at: float | None = None
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def renewed(self, sent: float | None) -> None:
        """Every lease was renewed (or registered again) by a renewal sent at ``sent`` (this
        keeper's clock): the loop's or the keeper's own (None: none yet)."""
        with self._lock:
            previous = self.renewed_at
            if sent is None or (previous is not None and sent <= previous):
                return
            self.renewed_at = sent
            self.on_renewed(sent)
            if self.metrics:
                self.metrics.renewal(sent, self.interval)

    def beat(self) -> None:
        """The loop begins a step."""
        self._beat = self.clock()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="blueque-lease-keeper",
                                            daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop renewing (before the listener leaves): the thread ends at its next look, and
        its connection is closed. A thread still in a call on a dead link after a second is
        left to end with the process: a renewal of a released lease changes nothing."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join(1.0)
            if self._thread.is_alive():
                return
        self.store.close()

    def _watch(self) -> None:
        try:  # connected ahead: a renewal then takes one round trip
            self.store.ping()
        except BluequeError as error:
            log.debug("listener %s: the lease keeper could not connect yet: %s", self.listener,
                      error)
        look = min(0.1, self.interval / 8)
        while not self._closed.wait(look):
            try:
                self.step()
            except Exception:  # never let the keeper die: log and go on
                log.exception("listener %s: the lease keeper failed a step", self.listener)

    def step(self) -> bool:
        """Renew now if it is due; returns whether a renewal was sent."""
        current = self.clock()
        renewed = self.renewed_at
        if renewed is None or current - renewed < DUE * self.interval or current < self._next_try:
            return False
        if self._loop_stuck(current):
            return False
        try:
            leases = self.store.renew_leases(self.listener, self.queues, self.lease_ms,
                                             self.info_ttl)
        except BluequeError as error:  # Redis away or refusing: the loop says so
            log.debug("listener %s: the lease keeper's renewal failed: %s", self.listener, error)
            self._next_try = self.clock() + RETRY
            return True
        if any(deadline == -1 for deadline in leases.values()):
            self._next_try = self.clock() + RETRY  # lost: the loop registers again
            return True
        self.renewed(current)
        if self._said_at is None or current - self._said_at >= SAY_EVERY:
            self._said_at = current
            log.info("listener %s: the lease keeper renewed its lease, %.1f s after the last "
                     "renewal (the loop was busy: a slow link to Redis, or a long step)",
                     self.listener, current - renewed)
        return True

    def _loop_stuck(self, current: float) -> bool:
        silent = current - self._beat
        if silent > self.stuck_after:
            if not self._stuck:
                self._stuck = True
                log.error("listener %s: its loop has not stepped for %.0f s: it is stuck, so "
                          "its lease is no longer renewed and other nodes will take its tasks "
                          "back", self.listener, silent)
            return True
        if self._stuck:
            self._stuck = False
            log.warning("listener %s: its loop steps again; its lease is renewed again",
                        self.listener)
        return False
