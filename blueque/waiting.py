"""Wait for many tasks at once: what ``blueque wait`` and the demo use.

Subscribes to the done channels of the tasks' queues (finish.lua publishes the task id there)
and re-reads only the tasks it is told about; every second it re-reads every unfinished task
anyway, for writers that do not publish (blueque 1.0.1) and tasks that expire.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from blueque import keys as k
from blueque.client import Client
from blueque.store import Subscription

#: How often every unfinished task is re-read, whatever the done channels said.
FULL_POLL = 1.0


@dataclass
class WaitResult:
    """Every task's last read hash ({} when the hash no longer exists)."""

    tasks: dict[str, dict[str, str]] = field(default_factory=dict)
    timed_out: bool = False

    def finished(self) -> list[str]:
        return [i for i, d in self.tasks.items() if d.get("status") in k.FINISHED_STATUSES]

    def failed(self) -> list[str]:
        return [i for i, d in self.tasks.items() if d.get("status") == k.FAILED]

    def missing(self) -> list[str]:
        return [i for i, d in self.tasks.items() if not d]

    @property
    def done(self) -> bool:
        return all(d.get("status") in k.FINISHED_STATUSES or not d for d in self.tasks.values())


def wait_all(
    client: Client,
    task_ids: Sequence[str],
    timeout: float | None = None,
    on_update: Callable[[WaitResult], None] | None = None,
    refresh: float | None = None,
) -> WaitResult:
    """Block until every task is complete, failed or gone, or ``timeout`` seconds pass
    (then ``timed_out`` is set). ``on_update`` is called after every read; ``refresh``
    re-reads unfinished tasks at least that often (to show their progress)."""
    store = client.store
    result = WaitResult(dict(zip(task_ids, store.task_data_many(task_ids), strict=True)))
    deadline = None if timeout is None else time.monotonic() + timeout
    queues = {d["queue"] for d in result.tasks.values() if d.get("queue")}
    subscription = store.subscribe([store.keys.done_channel(q) for q in sorted(queues)])
    try:
        if queues:
            subscription.get_message(timeout=0)  # subscribes
        # re-read once subscribed, so a finish between the first read and SUBSCRIBE is seen
        _read(client, result, list(result.tasks))
        every = min(FULL_POLL, refresh) if refresh else FULL_POLL
        next_poll = time.monotonic() + every
        while True:
            if on_update is not None:
                on_update(result)
            if result.done:
                return result
            current = time.monotonic()
            if deadline is not None and current >= deadline:
                result.timed_out = True
                return result
            if current >= next_poll:
                _read(client, result, _unfinished(result))
                next_poll = current + every
                continue
            if not queues:
                time.sleep(max(0.0, min(next_poll, deadline or next_poll) - current))
                continue
            told = _drain(subscription, min(next_poll, deadline or next_poll) - current)
            _read(client, result, [i for i in told if i in result.tasks])
    finally:
        subscription.close()


def _unfinished(result: WaitResult) -> list[str]:
    return [i for i, d in result.tasks.items() if d and d.get("status") not in k.FINISHED_STATUSES]


def _read(client: Client, result: WaitResult, task_ids: list[str]) -> None:
    if task_ids:
        datas = client.store.task_data_many(task_ids)
        result.tasks.update(zip(task_ids, datas, strict=True))


def _drain(subscription: Subscription, wait: float) -> list[str]:
    """Task ids published within ``wait`` seconds (returns at the first message, plus any
    already queued behind it)."""
    told: list[str] = []
    message = subscription.get_message(timeout=max(0.0, wait))
    while message is not None:
        if not message.missed:  # missed messages: the next full poll reads everything
            told.append(message.data)
        message = subscription.get_message(timeout=0)
    return told
