"""A store's view of Redis' continuity (PROTOCOL.md 6, "Outages"): how many of its operations
failed transiently, and the gaps in Redis' answers to this process. A sweeper reads both to
know whether the leases it judges ran out while Redis was there for their listeners too."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["MIN_GAP", "Gap", "Health"]

#: Waits shorter than this are not kept: far below a quarter of any lease a listener may take.
MIN_GAP = 0.05
#: How many of the latest gaps are kept (a sweeper looks only at the latest long enough).
KEPT_GAPS = 64


@dataclass(frozen=True)
class Gap:
    """A wait for Redis' answer: ``length`` seconds up to ``end`` (the Health's clock)."""

    end: float
    length: float


class Health:
    """Counts operations that failed transiently (a lost connection, READONLY, LOADING...),
    and notes every wait for an answer longer than MIN_GAP: from the later of the asking and
    the previous answer to this process, to the answer. Shared by a store and its bounded
    copies (and the threads that use them): a recovery sweep that sees the count move, or a
    gap longer than a quarter of a lease, knows its view of the leases was interrupted."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.disruptions = 0
        self.clock = clock
        self.answered_at: float | None = None
        self.gaps: deque[Gap] = deque(maxlen=KEPT_GAPS)

    def disrupted(self) -> None:
        self.disruptions += 1

    def asked(self) -> float:
        """The time an operation is sent, to give back to ``answered``."""
        return self.clock()

    def answered(self, asked_at: float) -> None:
        now = self.clock()
        previous = self.answered_at
        waited = now - (asked_at if previous is None else max(asked_at, previous))
        self.answered_at = now
        if waited >= MIN_GAP:
            self.gaps.append(Gap(now, waited))

    def last_gap(self, longer_than: float) -> Gap | None:
        """The latest gap longer than ``longer_than`` seconds, if one is kept."""
        for gap in reversed(self.gaps):
            if gap.length > longer_than:
                return gap
        return None
