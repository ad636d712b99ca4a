"""A node's records (PROTOCOL.md §2, 6): the runs its listeners forked
(``blueque_node_[node]``) and its listener daemons (``blueque_listeners_on_[node]``), which its
sweeps read in one round trip whatever the fleet's size."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from blueque.store.core import StoreCore
from blueque.store.errors import translate_errors


@dataclass(frozen=True)
class NodeView:
    """What a sweep reads of its node, and of the queues it sweeps, in one round trip
    (RedisStore.node_view)."""

    #: listener id -> its entry (blueque_listeners_on_[node]; blueque.node.NodeListener)
    listeners: dict[str, str]
    #: pid -> the run a listener of the node forked (blueque_node_[node])
    runs: dict[str, str]
    #: queue -> (members of blueque_listeners_[queue], leases in blueque_leases_[queue]): a
    #: member without a lease is a listener that writes none (blueque 1.0.1)
    members: dict[str, tuple[int, int]]


class NodeOperations(StoreCore):
    @translate_errors
    def record_runs(self, node: str, runs: dict[str, str], ttl_s: int) -> None:
        """HSET blueque_node_[node] pid -> run (JSON); EXPIRE: the node's runs, so that the
        next listener or scheduler on the node finds those whose listener died."""
        pipe = self.redis.pipeline(transaction=False)
        if runs:
            pipe.hset(self.keys.node_runs(node), mapping=runs)
        pipe.expire(self.keys.node_runs(node), ttl_s)
        pipe.execute()

    @translate_errors
    def forget_runs(self, node: str, pids: Sequence[str]) -> None:
        """HDEL ended runs from blueque_node_[node] (the hash goes with its last field)."""
        if pids:
            self.redis.hdel(self.keys.node_runs(node), *pids)

    @translate_errors
    def node_view(self, node: str, queues: Sequence[str]) -> NodeView:
        """In one round trip: the node's listeners (HGETALL blueque_listeners_on_[node]) and
        runs (HGETALL blueque_node_[node]), and for each queue SCARD of its listeners and ZCARD
        of its leases."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(self.keys.node_listeners(node))
        pipe.hgetall(self.keys.node_runs(node))
        for queue in queues:
            pipe.scard(self.keys.listeners(queue))
            pipe.zcard(self.keys.leases(queue))
        listeners, runs, *counts = pipe.execute()
        return NodeView(listeners, runs, {
            queue: (int(counts[2 * i]), int(counts[2 * i + 1]))
            for i, queue in enumerate(queues)})

    @translate_errors
    def join_node(self, node: str, listener_id: str, entry: str, ttl_s: int) -> None:
        """HSET blueque_listeners_on_[node] [listener id] [entry]; EXPIRE: the node's sweeps
        know the listener from now on (registration; the renewal writes it again)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(self.keys.node_listeners(node), listener_id, entry)
        pipe.expire(self.keys.node_listeners(node), ttl_s)
        pipe.execute()

    @translate_errors
    def leave_node(self, node: str, listener_id: str) -> None:
        """HDEL blueque_listeners_on_[node] [listener id]: it left cleanly, or a sweep of its
        node released it with nothing of it left running."""
        self.redis.hdel(self.keys.node_listeners(node), listener_id)

    @translate_errors
    def claim_run(self, node: str, pid: int, record: str) -> None:
        """HSET blueque_node_[node] [pid] [record]: a dead listener's live run, its record
        now naming the listener whose slots it occupies (``adopted_by``)."""
        self.redis.hset(self.keys.node_runs(node), str(pid), record)

    @translate_errors
    def node_run(self, node: str, pid: int) -> str | None:
        """HGET blueque_node_[node] [pid]: the run recorded for that process, if any."""
        return cast("str | None", self.redis.hget(self.keys.node_runs(node), str(pid)))

    @translate_errors
    def node_runs(self, node: str) -> dict[str, str]:
        return cast(dict[str, str], self.redis.hgetall(self.keys.node_runs(node)))
