"""The nodes page's listener history: each listener, live or gone in the last 7 days, with the
runs it ended (complete, failed, retried, cancelled, preempted) and when its last run ended,
from the counters finish.lua keeps per queue and listener (PROTOCOL.md 5.6)."""

from __future__ import annotations

from collections.abc import Sequence, Set
from typing import Any

from blueque.keys import LISTENER_COUNTS_TTL
from blueque.store import RedisStore

#: Listeners read per queue from blueque_listeners_seen_[queue] (the latest first).
SEEN_PER_QUEUE = 200
#: Listeners the history shows, the latest first (a live one that ended no run yet is in the
#: page's listener cards only).
HISTORY_SHOWN = 50
#: The history's columns: outcomes as finish.lua counts them.
HISTORY_OUTCOMES = ("complete", "failed", "retry", "cancelled", "preempted")


def listener_history(store: RedisStore, queues: Sequence[str], live: Set[str]
                     ) -> list[dict[str, Any]]:
    """Two pipelines: the latest listeners of each queue, then the counters of the
    HISTORY_SHOWN latest of them in each queue where they ran something."""
    last: dict[str, float] = {}
    where: dict[str, list[str]] = {}
    # finish.lua drops the entries older than that only when a new listener joins the set
    since = store.now() - LISTENER_COUNTS_TTL
    for queue, entries in zip(queues, store.listeners_seen_many(queues, SEEN_PER_QUEUE),
                              strict=True):
        for listener, when in entries:
            if when < since:
                continue
            last[listener] = max(last.get(listener, when), when)
            where.setdefault(listener, []).append(queue)
    shown = sorted(last, key=lambda listener: (-last[listener], listener))[:HISTORY_SHOWN]
    pairs = [(queue, listener) for listener in shown for queue in where[listener]]
    counted = iter(store.listener_counts_many(pairs))
    rows = []
    for listener in shown:
        totals = dict.fromkeys(HISTORY_OUTCOMES, 0)
        for _ in where[listener]:
            for outcome, count in next(counted).items():
                if outcome in totals:
                    totals[outcome] += count
        rows.append({"id": listener, "live": listener in live, "last": last[listener],
                     "queues": where[listener], "counts": totals,
                     "runs": sum(totals.values()),
                     "failures": totals["failed"] + totals["retry"]})
    return rows
