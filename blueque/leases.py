"""When an expired lease may be acted on (PROTOCOL.md 6, "Outages"): leases run only while
Redis was reachable, so a restart longer than a lease kills nobody."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from blueque.policy import field_float
from blueque.store import RedisStore

log = logging.getLogger("blueque.recovery")

__all__ = ["EXCLUSIVE_MARGIN", "GAP", "RECONNECT_GRACE", "STALL", "LeaseWatch"]


#: How long a sweeper lets every listener renew after Redis came back (a restart, or an
#: outage the sweeper itself noticed) before it judges their leases: a listener daemon waits
#: at most 5 s between tries while Redis is away (PROTOCOL.md 6, "Outages").
RECONNECT_GRACE = 10.0
#: A sweeper sweeps every interval, half its lease: it was frozen or stalled when its sweeps
#: are a whole lease later than that. (Judged at one lease, a loop whose sweeps came a little
#: late, for instance behind a slow cleanup of old task output, took itself for stalled at
#: every sweep and never recovered a dead listener.)
STALL = 1.5


#: How far past its lapse (a share of the lease, on Redis' clock) a sweeper waits before it
#: recovers a listener holding an exclusive task (PROTOCOL.md 6.6): its listener killed the
#: run at 3/4 of the lease (blueque.daemon.exclusive), so the retry starts half a lease after.
EXCLUSIVE_MARGIN = 0.25
#: A wait for Redis' answer longer than this many of a listener's leases is a gap for that
#: listener: its renewals (every quarter lease) waited too, so its lease may have lapsed for
#: Redis' stall, not its death (PROTOCOL.md 6, "Outages").
GAP = 0.25


class LeaseWatch:
    """Which expired leases a sweeper may act on: leases run only while Redis was reachable.

    A lease whose deadline passed is acted on only if (PROTOCOL.md 6, "Outages"):
    - a lease that ran out before the Redis server (re)started is judged from the start
      plus the grace, not from its deadline, so a restart longer than a lease kills nobody
      (every sweeper applies this, even one started after the restart);
    - after an interruption this sweeper saw (an operation failed transiently, the server's
      run id changed, or its sweeps stalled longer than its own lease), it saw the lease
      live since, or the grace has passed since it saw Redis back. Its sweeps stalled when
      one began more than STALL leases after the previous one ended;
    - after a gap in Redis' answers to this sweeper longer than GAP of the listener's lease
      (the store's Health), it saw the lease live since, or a whole listener lease has
      passed since the gap ended: the lease must lapse again after the gap.
    The grace is the longest of the sweeper's own lease, the listener's lease (2 of its
    intervals, when its info is there) and RECONNECT_GRACE. The sweeper's own listener id
    (``exclude``) is never judged: it renews, or learns it was recovered."""

    def __init__(self, store: RedisStore, lease_ms: int) -> None:
        self.store = store
        #: the store's view of Redis' continuity; its clock is this watch's
        self.health = store.health
        self.lease_s = lease_ms / 1000
        self._run_id: str | None = None
        self._disruptions = self.health.disruptions
        self._last_sweep: float | None = None
        #: when this sweeper last saw Redis come back (local clock); None: never interrupted
        self._back_since: float | None = None
        #: queue -> when its leases were last read (local clock), and each lapsed lease then
        #: with when this sweeper last saw it live (None: never). A lease is seen live at a
        #: read that does not find it lapsed: only lapsed leases are read, whatever the fleet
        self._lapsed_at: dict[str, tuple[float, dict[str, float | None]]] = {}
        #: when leases were last read, of any queue (local clock)
        self._read_at: float | None = None
        self._server_start = 0.0
        #: the server's clock at the start of the sweep (Unix s): leases lapsed by then
        self._server_now = 0.0
        #: listener -> its lease in s, for the listeners the latest ``expired`` judged dead
        self._judged: dict[str, float] = {}
        self._judged_at = 0.0
        #: listener -> how long its lease had lapsed (Redis' clock) when ``expired`` judged it
        self._lapsed: dict[str, float] = {}

    def begin(self) -> None:
        """At the start of a sweep: notice a restart, an outage or a stall."""
        run_id, self._server_start, self._server_now = self.store.server_run()
        current = self.clock()
        if self.health.disruptions != self._disruptions:
            interrupted = "Redis was unavailable"
        elif self._run_id is not None and run_id != self._run_id:
            interrupted = "Redis restarted or failed over"
        elif self._last_sweep is not None and current - self._last_sweep > STALL * self.lease_s:
            interrupted = (f"this sweeper was paused or stalled for "
                           f"{current - self._last_sweep:.1f} s")
        else:
            interrupted = ""
        self._run_id, self._disruptions = run_id, self.health.disruptions
        if interrupted:
            if self._back_since is None or (self._read_at is not None
                                            and self._read_at >= self._back_since):
                log.warning("%s: no listener is taken for dead by its lease until it had time "
                            "to renew", interrupted)
            self._back_since = current

    def end(self) -> None:
        self._last_sweep = self.clock()

    def expired(self, queue: str, exclude: Iterable[str] = ()) -> list[str]:
        """Listeners of ``queue`` whose lease ran out while Redis was reachable (never one
        of ``exclude``: the sweeper itself). Reads the leases lapsed by the server's clock
        at the sweep's start (ZRANGEBYSCORE), never the live ones: a lease not found lapsed
        at a read was live then (or not there yet: it was live after), which is all the
        rules ask of "seen live"."""
        lapsed = self.store.lapsed_leases(queue, self._server_now * 1000)
        server_now = self._server_now
        current, skip = self.clock(), set(exclude)  # after the read: it may be the stalled one
        found, self._judged, self._judged_at, self._lapsed = [], {}, current, {}
        before = self._lapsed_at.get(queue)
        seen_now: dict[str, float | None] = {}
        for listener, deadline_ms in lapsed.items():
            # live at the previous read unless lapsed already then (no previous read: unknown)
            seen = None if before is None else before[1].get(listener, before[0])
            seen_now[listener] = seen
            if listener in skip:
                continue
            deadline = deadline_ms / 1000
            lease = self._lease(listener)
            grace = max(self.lease_s, lease, RECONNECT_GRACE)
            if deadline <= self._server_start and server_now < self._server_start + grace:
                continue  # it lapsed before this server even started: time to renew first
            if not self._after(seen, self._back_since, grace, current):
                continue  # Redis was away: not seen live since, nor the grace passed
            if not self._after(seen, self._gap_end(lease), lease, current):
                continue  # Redis stalled or was slow: it must lapse again after that
            found.append(listener)
            self._judged[listener] = lease
            self._lapsed[listener] = server_now - deadline
        self._lapsed_at[queue] = (current, seen_now)
        self._read_at = current
        return found

    def still_dead(self, listener: str) -> bool:
        """Just before recovering ``listener`` (judged dead by the latest ``expired``): no
        interruption, nor a gap long for its lease, came while its verdicts were read."""
        lease = self._judged.get(listener)
        if lease is None or self.health.disruptions != self._disruptions:
            return False
        gap = self._gap_end(lease)
        return gap is None or gap < self._judged_at

    def lapsed_past(self, listener: str, share: float) -> bool:
        """Whether ``listener``'s lease (judged dead by the latest ``expired``) had lapsed
        ``share`` of its lease ago: exclusive runs are recovered only past such a margin."""
        lease = self._judged.get(listener)
        return lease is not None and self._lapsed.get(listener, 0.0) >= share * lease

    @staticmethod
    def _after(seen: float | None, since: float | None, wait: float, current: float) -> bool:
        """Judged since ``since`` (an interruption's end): seen live after it, or ``wait``
        seconds passed since it."""
        return (since is None or (seen is not None and seen >= since)
                or current - since >= wait)

    def clock(self) -> float:
        return self.health.clock()

    def _gap_end(self, lease: float) -> float | None:
        """When the latest gap longer than GAP of ``lease`` ended."""
        gap = self.health.last_gap(GAP * lease)
        return None if gap is None else gap.end

    def _lease(self, listener: str) -> float:
        """The listener's lease (2 of its intervals), else the sweeper's own."""
        interval = field_float(self.store.listener_info(listener).get("interval"))
        return 2 * interval if interval else self.lease_s
