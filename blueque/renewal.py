"""What a listener does at each lease renewal (PROTOCOL.md 6 "One step"): renew its leases and
info hash (Membership), write its runs to blueque_node_[node], and look at each running
child's task as it is now: a run taken back or reserved again is stopped (superseded: it
could record nothing), and a cancel whose message was missed is found."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable

from blueque import keys as k
from blueque.endings import late_ending_allowed
from blueque.fencing import is_current_run
from blueque.membership import Membership
from blueque.metrics import ListenerMetrics
from blueque.runs import Running
from blueque.store import RedisStore
from blueque.supervisor import NODE_RUNS_TTL, Supervisor

log = logging.getLogger("blueque.daemon")


#: A renewal that takes more than this share of the lease is slow: the next one is due
#: before it ended (it comes every quarter lease), and the lease's slack is being used up.
SLOW_SHARE = 0.25
#: How often a slow renewal is warned of, at most (s).
SLOW_WARN_EVERY = 60.0


class Renewal:
    def __init__(self, store: RedisStore, membership: Membership, supervisor: Supervisor,
                 clock: Callable[[], float] = time.monotonic,
                 metrics: ListenerMetrics | None = None) -> None:
        self.store, self.membership, self.supervisor = store, membership, supervisor
        self.clock, self.metrics = clock, metrics  # the loop's counters
        #: how long the latest renewal took (s), written to the info hash by the next one
        self.took: float | None = None
        self._warned_at: float | None = None
        #: the reserved lists as the latest renewal read them, for the heal that follows it
        self._reserved: dict[str, list[str]] | None = None
        #: when the latest renewal that renewed every lease was sent (this clock), or None
        self.renewed: float | None = None

    def renew(self, busy: int) -> list[str]:
        """Renew in one round trip (RedisStore.renew_node), and return the tasks whose
        cancel was asked for (their message may have been missed). Raises
        RedisUnavailable."""
        supervisor = self.supervisor
        supervisor.defaults.clear()  # an operator's Queue.configure applies from now
        started = self.clock()
        checked = self.checked()
        reply = self.store.renew_node(self.membership.renewal(
            busy, supervisor.records(), NODE_RUNS_TTL, [r.task_id for r in checked],
            self.took))
        if all(deadline != -1 for deadline in reply.leases.values()):
            self.renewed = started  # each lease lapses no earlier than a lease from now
        self.membership.renewed(reply.leases, self.metrics)
        cancels = self.check(zip(checked, reply.tasks, strict=True))
        self._reserved = reply.reserved
        self._took(self.clock() - started)
        return cancels

    def heal(self) -> None:
        """Put back the ids in our reserved lists that no child of ours runs or still has
        an ending to record (Membership.heal): as the renewal just before read them, if one
        did. Raises RedisUnavailable."""
        reserved, self._reserved = self._reserved, None
        self.membership.heal(self.supervisor.task_ids(), reserved)

    def _took(self, seconds: float) -> None:
        """Measure the renewal; warn (at most every SLOW_WARN_EVERY) when it is slow for the
        lease, naming an --interval that would hold."""
        self.took = seconds
        if self.metrics:
            self.metrics.renewal_took(seconds)
        lease = self.membership.lease_ms / 1000
        if seconds <= SLOW_SHARE * lease:
            return
        now = self.clock()
        if self._warned_at is not None and now - self._warned_at < SLOW_WARN_EVERY:
            return
        self._warned_at = now
        holds = math.ceil(seconds / (2 * SLOW_SHARE) * 2) / 2  # renewing in a quarter lease
        log.warning("listener %s: its lease renewal took %.2f s, more than a quarter of its "
                    "%g-s lease (--interval %g): a slow or distant Redis; renewals may come "
                    "too late and live tasks be run again elsewhere. --interval %g or more "
                    "would hold", self.membership.id, seconds, lease,
                    self.membership.interval, holds)

    def check(self, fields: Iterable[tuple[Running, dict[str, str]]]) -> list[str]:
        """With each running child's task as it is now: stop the runs that were taken back
        or reserved again; returns the tasks whose cancel was asked for."""
        cancels = []
        for running, data in fields:
            if data.get("cancel_requested"):
                cancels.append(running.task_id)
            elif self._superseded(running, data):
                self.supervisor.stop(running, "superseded")
        return cancels

    def checked(self) -> list[Running]:
        """The children whose task a renewal looks at: running, and not yet reported (one
        whose outcome we took in is only exiting, not superseded by its own end)."""
        return [r for r in self.supervisor.children.values()
                if r.report is None and r.state == "running"]

    def _superseded(self, running: Running, data: dict[str, str]) -> bool:
        if not data or running.attempt is None:
            return False
        if (data.get("status") == k.FAILED
                and late_ending_allowed(data, self.membership.id, running.attempt)):
            return False  # recovered while it lived, and no attempt will follow: it may end
        return not is_current_run(data, self.membership.id, running.attempt)
