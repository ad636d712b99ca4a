"""Redis' clock, read through this host's (PROTOCOL.md §1, "Time").

Every time Blueque writes or compares (created, eta, started_at, a retry's eta, a lease
judged by a listener's ``renewed``, a purge's age) is on the Redis server's clock, so that
hosts whose clocks disagree still agree on when a task is due. Asking Redis for ``TIME`` at
every timestamp would cost a round trip each, so a ``ServerClock`` keeps the offset between
the server's clock and this host's ``time.time()``, measured with one ``TIME`` (the reply
taken at the midpoint of the round trip) when first needed and again every ``RESYNC``
seconds; between two measurements it moves with the host's clock.

A measurement that fails (Redis away) keeps the last offset (none yet: the host's clock) and
is tried again ``RETRY`` seconds later, so that ``now()`` never blocks a caller for long and
never raises.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger("blueque.store")

__all__ = ["RESYNC", "RETRY", "SKEW_WARNING", "ServerClock"]

#: How often the offset is measured again (a host clock that NTP steps, or that drifts).
RESYNC = 60.0
#: How soon a failed measurement is tried again.
RETRY = 5.0
#: An offset this large (seconds) is logged once: the host's clock is wrong, and whatever
#: else on it trusts that clock (cron, logs) is off by as much.
SKEW_WARNING = 1.0


class ServerClock:
    """The offset of Redis' clock from this host's, and ``now()`` on Redis' clock.

    ``local`` is the host's clock (``time.time``) and ``monotonic`` times the resync; both
    are injectable for tests."""

    def __init__(self, local: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.local = local
        self.monotonic = monotonic
        #: server time minus host time, seconds
        self.offset = 0.0
        self.synced = False
        self._next_sync = 0.0
        self._warned = False

    def due(self) -> bool:
        """Time to measure the offset (never measured, or RESYNC since the last time)."""
        return self.monotonic() >= self._next_sync

    def measured(self, before: float, server: float, after: float) -> None:
        """Take a measurement: ``server`` is what TIME answered between the host times
        ``before`` and ``after``."""
        self.offset = server - (before + after) / 2
        self.synced = True
        self._next_sync = self.monotonic() + RESYNC
        if abs(self.offset) >= SKEW_WARNING and not self._warned:
            self._warned = True
            log.warning("this host's clock is %.1f s %s Redis' clock: Blueque times tasks by "
                        "Redis' clock, but check the host's time synchronisation (NTP)",
                        abs(self.offset), "behind" if self.offset > 0 else "ahead of")

    def failed(self) -> None:
        """A measurement could not be taken: keep the last offset, try again soon."""
        self._next_sync = self.monotonic() + RETRY

    def now(self) -> float:
        """Unix seconds on Redis' clock (as last measured)."""
        return self.local() + self.offset

    def to_local(self, server_time: float) -> float:
        """A time on Redis' clock, on this host's (to compare with ``time.time()``)."""
        return server_time - self.offset
