"""The listeners of a node that its entries do not name (PROTOCOL.md 6, "Recovery sweep"):
blueque 1.0.1's, which write no entry, no lease and no info (only a member of the queue's
set, on this node when its id names this host), and an earlier Blueque's. A sweeper finds the
dead ones without reading the fleet at every sweep: it reads a queue's whole set once, at its
first sweep, and afterwards one SSCAN page a sweep, only while the set has members without a
lease. A live one it finds gets an entry among its node's listeners: from then on its node's
sweeps judge it by its pid, as they judge their own.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from blueque.node import local_process, parse_listener_id
from blueque.store import NodeView, RedisStore

__all__ = ["MEMBERS_PER_SWEEP", "Unlisted"]

#: Listener ids a sweep reads of a queue whose set has members without a lease: one SSCAN
#: page of about this many per sweep, its cursor kept to the next, so that a sweep costs the
#: same however big the fleet.
MEMBERS_PER_SWEEP = 100


@dataclass
class Unlisted:
    """One sweeper's look at the listener sets, from one sweep to the next."""

    store: RedisStore
    host: str  # this node's name: a 1.0.1 listener's id starts with its host's
    node: str  # this node's identity
    alive: Callable[[int, float | None], bool]
    #: queues whose set this sweeper read whole (once: at its first sweep of them)
    looked: set[str] = field(default_factory=set)
    #: queue -> SSCAN cursor through its set
    cursors: dict[str, int] = field(default_factory=dict)

    def found(self, queues: list[str], view: NodeView, known: Iterable[str]
              ) -> list[tuple[str, str, tuple[int, float | None], bool]]:
        """The listeners of this node among the members read now, but ``known`` ones (its
        entries, the sweeper): (queue, listener, its pid and create time, whether it lives).
        The whole set at the first sweep of a queue (also of the queues the node's runs name,
        ``view``), then a page while the set has more members than leases
        (``view.members``)."""
        skip = set(known)
        first = [q for q in [*queues, *sorted(_run_queues(view.runs) - set(queues))]
                 if q not in self.looked]
        found = []
        for queue in [*first, *(q for q in queues if q not in first)]:
            if queue in first:
                self.looked.add(queue)
                ids = sorted(self.store.listener_ids(queue))
            elif view.members[queue][0] > view.members[queue][1]:
                cursor, ids = self.store.scan_listeners(queue, self.cursors.get(queue, 0),
                                                        MEMBERS_PER_SWEEP)
                self.cursors[queue] = cursor
            else:
                continue
            for listener in ids:
                if listener in skip or parse_listener_id(listener)[0] != self.host:
                    continue
                local = local_process(listener, self.store.listener_info(listener), self.node,
                                      self.host)
                if local is not None:
                    found.append((queue, listener, local, self.alive(*local)))
        return found


def _run_queues(runs: dict[str, str]) -> set[str]:
    """The queues named in a node's run records (unreadable entries are skipped)."""
    queues = set()
    for raw in runs.values():
        try:
            queue = json.loads(raw).get("queue")
        except (ValueError, AttributeError):
            continue
        if isinstance(queue, str) and queue:
            queues.add(queue)
    return queues
