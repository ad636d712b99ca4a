"""Who a Supervisor works for (its listener: id, node, process, lease), the queue defaults it
reads once per renewal, and how long a node's run records outlive their last write."""

from __future__ import annotations

from dataclasses import dataclass

from blueque.keys import NODE_RUNS_TTL
from blueque.store import RedisStore

__all__ = ["NODE_RUNS_TTL", "Defaults", "Owner"]


class Defaults(dict[str, dict[str, str]]):
    """Queue defaults as read from blueque_queue_config_[queue], one read per queue until
    cleared; called with a queue, it gives that queue's."""

    def __init__(self, store: RedisStore) -> None:
        super().__init__()
        self._store = store

    def __call__(self, queue: str) -> dict[str, str]:
        if queue not in self:
            self[queue] = self._store.queue_config(queue)
        return self[queue]


@dataclass(frozen=True)
class Owner:
    """The listener a Supervisor works for: its id, node identity and process."""

    id: str
    node: str
    pid: int
    created: float | None
    lease_s: float  # a child waits this long for a word before counting it gone
