"""When an expired lease may be acted on (PROTOCOL.md 6, "Outages"): leases run only while
Redis was reachable, so a restart longer than a lease kills nobody."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from blueque.policy import field_float
from blueque.store import RedisStore

log = logging.getLogger("blueque.recovery")

__all__ = ["RECONNECT_GRACE", "STALL", "LeaseWatch"]


#: How long a sweeper lets every listener renew after Redis came back (a restart, or an
#: outage the sweeper itself noticed) before it judges their leases: a listener daemon waits
#: at most 5 s between tries while Redis is away (PROTOCOL.md 6, "Outages").
RECONNECT_GRACE = 10.0
#: A sweeper sweeps every interval, half its lease: it was frozen or stalled when its sweeps
#: are a whole lease later than that. (Judged at one lease, a loop whose sweeps came a little
#: late, for instance behind a slow cleanup of old task output, took itself for stalled at
#: every sweep and never recovered a dead listener.)
STALL = 1.5


class LeaseWatch:
    """Which expired leases a sweeper may act on: leases run only while Redis was reachable.

    A lease whose deadline passed is acted on only if (PROTOCOL.md 6, "Outages"):
    - a lease that ran out before the Redis server (re)started is judged from the start
      plus the grace, not from its deadline, so a restart longer than a lease kills nobody
      (every sweeper applies this, even one started after the restart); and
    - after an interruption this sweeper saw (an operation failed transiently, the server's
      run id changed, or its sweeps stalled longer than its own lease), it saw the lease
      live since, or the grace has passed since it saw Redis back. Its sweeps stalled when
      one began more than STALL leases after the previous one ended.
    The grace is the longest of the sweeper's own lease, the listener's lease (2 of its
    intervals, when its info is there) and RECONNECT_GRACE."""

    def __init__(self, store: RedisStore, lease_ms: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.lease_s = lease_ms / 1000
        self.clock = clock
        self._run_id: str | None = None
        self._disruptions = store.health.disruptions
        self._last_sweep: float | None = None
        #: when this sweeper last saw Redis come back (local clock); None: never interrupted
        self._back_since: float | None = None
        self._live: set[tuple[str, str]] = set()  # (queue, listener) seen live since then
        self._server_start = 0.0

    def begin(self) -> None:
        """At the start of a sweep: notice a restart, an outage or a stall."""
        run_id, self._server_start = self.store.server_run()
        current = self.clock()
        if self.store.health.disruptions != self._disruptions:
            interrupted = "Redis was unavailable"
        elif self._run_id is not None and run_id != self._run_id:
            interrupted = "Redis restarted or failed over"
        elif self._last_sweep is not None and current - self._last_sweep > STALL * self.lease_s:
            interrupted = (f"this sweeper was paused or stalled for "
                           f"{current - self._last_sweep:.1f} s")
        else:
            interrupted = ""
        self._run_id, self._disruptions = run_id, self.store.health.disruptions
        if interrupted:
            if self._back_since is None or self._live:
                log.warning("%s: no listener is taken for dead by its lease until it had time "
                            "to renew", interrupted)
            self._back_since = current
            self._live.clear()

    def end(self) -> None:
        self._last_sweep = self.clock()

    def expired(self, queue: str) -> list[str]:
        """Listeners of ``queue`` whose lease ran out while Redis was reachable."""
        leases = self.store.leases(queue)
        server_now = self.store.server_time()
        found = []
        for listener, deadline_ms in leases.items():
            deadline = deadline_ms / 1000
            if deadline > server_now:
                if self._back_since is not None:
                    self._live.add((queue, listener))
                continue
            grace = self._grace(listener)
            if deadline <= self._server_start and server_now < self._server_start + grace:
                continue  # it lapsed before this server even started: time to renew first
            if (self._back_since is not None and (queue, listener) not in self._live
                    and self.clock() - self._back_since < grace):
                continue  # Redis was away: not seen live since, nor the grace passed
            found.append(listener)
        return found

    def _grace(self, listener: str) -> float:
        interval = field_float(self.store.listener_info(listener).get("interval"))
        return max(self.lease_s, 2 * interval if interval else 0.0, RECONNECT_GRACE)


