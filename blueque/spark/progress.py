"""wait_for_tasks: wait on a driver until a batch of tasks has finished, showing progress.

Three ways to say what "the batch" is: the task ids (each followed until it finishes), a
count (the queue's complete + failed lists reach it), or neither (the queue drains: nothing
scheduled, pending, reserved or started). The waiting is blueque.waiting's; this module says
what to read for each. It needs no Spark, only Redis.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from blueque.client import Client
from blueque.display import ProgressLine
from blueque.errors import ConfigurationError
from blueque.errors import WaitTimeout as BaseWaitTimeout
from blueque.protocol import QueueCounts
from blueque.statuses import (
    CANCELLED,
    COMPLETE,
    ENDED_LISTS,
    FAILED,
    PENDING,
    RESERVED,
    SCHEDULED,
    STARTED,
    STATES,
)
from blueque.store import RedisStore
from blueque.waiting import WAIT_REREAD, drive

#: HGETs per pipeline when following task ids.
STATUS_CHUNK = 5_000
#: States a task can still leave; "missing" means no hash (never made, deleted or expired).
ACTIVE = (SCHEDULED, PENDING, RESERVED, STARTED)
MISSING = "missing"


@dataclass(frozen=True)
class BatchProgress:
    """One look at the batch: counts per state, how many finished, and since when."""

    queue: str
    counts: dict[str, int]
    total: int | None  # tasks in the batch; None when waiting for the queue to drain
    seconds: float
    done: bool

    @property
    def finished(self) -> int:
        return sum(self.counts.get(state, 0) for state in ENDED_LISTS)

    @property
    def active(self) -> int:
        return sum(self.counts.get(status, 0) for status in ACTIVE)

    def line(self) -> str:
        """``queue pages: 812/1000 finished (complete 800, failed 12) | pending 150 ...``"""
        of = f"/{self.total}" if self.total is not None else ""
        cancelled = self.counts.get(CANCELLED, 0)
        parts = [
            f"queue {self.queue}: {self.finished}{of} finished "
            f"(complete {self.counts.get(COMPLETE, 0)}, failed {self.counts.get(FAILED, 0)}"
            + (f", cancelled {cancelled})" if cancelled else ")")
        ]
        parts += [f"{s} {self.counts[s]}" for s in (*ACTIVE, MISSING) if self.counts.get(s)]
        if self.seconds > 0 and self.finished:
            parts.append(f"{self.finished / self.seconds:.1f}/s")
        parts.append(f"{self.seconds:.0f}s" + (" done" if self.done else ""))
        return " | ".join(parts)


class WaitTimeout(BaseWaitTimeout):
    """The batch did not finish in time; ``progress`` is the last look at it."""

    def __init__(self, message: str, progress: BatchProgress) -> None:
        super().__init__(message)
        self.progress = progress


class TaskFollower:
    """Follows a set of task ids by their status: re-reads only those not finished yet
    (finished is final), those the done channel names as soon as it does. Its counts are
    kept up to date at each reply, so a look at them costs nothing however large the batch."""

    def __init__(self, queue: str, task_ids: Iterable[str]) -> None:
        self._queue = queue
        self._open: dict[str, str | None] = dict.fromkeys(task_ids)  # id -> last status
        self.total = len(self._open)
        self._unread = self.total
        self._counts: Counter[str] = Counter()

    def counts(self) -> dict[str, int]:
        return {status: n for status, n in self._counts.items() if n}

    @property
    def done(self) -> bool:
        return not self._unread and not any(self._counts[status] for status in ACTIVE)

    def queues(self) -> list[str]:
        return [self._queue]

    def to_read(self, told: Sequence[str] | None) -> list[str] | None:
        ids = self._open if told is None else dict.fromkeys(told)
        return [i for i in ids if i in self._open] or None

    def took(self, what: list[str], statuses: list[str | None]) -> None:
        for task_id, status in zip(what, statuses, strict=True):
            last = self._open[task_id]
            if last is None:
                self._unread -= 1
            else:
                self._counts[last] -= 1
            self._counts[status or MISSING] += 1
            if status in ENDED_LISTS:
                del self._open[task_id]
            else:
                self._open[task_id] = status or MISSING


def read_statuses(store: RedisStore, task_ids: list[str]) -> list[str | None]:
    """The state of each id (its status, or cancelled), STATUS_CHUNK per pipeline."""
    return [status for start in range(0, len(task_ids), STATUS_CHUNK)
            for status in store.task_statuses(task_ids[start : start + STATUS_CHUNK])]


class QueueFollower:
    """Follows a whole queue through its O(1) counts, re-read whenever a task of it ends."""

    def __init__(self, queue: str, count: int | None) -> None:
        self._queue = queue
        self.total = count
        self._counts: dict[str, int] = {}

    def counts(self) -> dict[str, int]:
        return dict(self._counts)

    @property
    def done(self) -> bool:
        if not self._counts:
            return False
        if self.total is None:
            return not any(self._counts[status] for status in ACTIVE)
        return sum(self._counts[state] for state in ENDED_LISTS) >= self.total

    def queues(self) -> list[str]:
        return [self._queue]

    def to_read(self, told: Sequence[str] | None) -> str:
        return self._queue

    def took(self, queue: str, counts: QueueCounts) -> None:
        self._counts = {state: getattr(counts, state) for state in STATES}


def _follower(queue: str, task_ids: Iterable[str] | None, count: int | None
              ) -> TaskFollower | QueueFollower:
    """What a batch wait follows: the given tasks, or the queue's counts."""
    if task_ids is not None and count is not None:
        raise ConfigurationError("give task_ids or count, not both")
    if count is not None and count < 0:
        raise ConfigurationError(f"count must not be negative, not {count}")
    if task_ids is not None:
        return TaskFollower(queue, task_ids)
    return QueueFollower(queue, count)


def wait_for_tasks(
    url: str | Client,
    queue: str,
    task_ids: Iterable[str] | None = None,
    count: int | None = None,
    timeout: float | None = None,
    progress: bool | Callable[[BatchProgress], Any] = True,
    interval: float = WAIT_REREAD,
) -> BatchProgress:
    """Block until the batch has finished and return the last BatchProgress.

    ``task_ids``: wait until none of them is scheduled, pending, reserved or started (ids with
    no hash are counted as ``missing``). ``count``: wait until the queue's complete and failed
    lists hold ``count`` tasks together (for a fresh queue, the number enqueued). Neither:
    wait until the queue has nothing scheduled, pending, reserved or started.
    ``progress``: True prints counts per state to stderr (a ProgressLine); a callable
    receives each BatchProgress. Raises WaitTimeout after ``timeout`` seconds.

    The wait of blueque.waiting: listens on blueque_done_[queue], reading again as soon as a
    task of the queue ends, and at least every ``interval`` seconds. Keys read:
    blueque_task_[id] (HMGET status cancelled) for ids; otherwise the queue's lists and sets
    (store.counts)."""
    follower = _follower(queue, task_ids, count)
    client = url if isinstance(url, Client) else Client(url)
    store = client.store
    printer = ProgressLine(sys.stderr) if progress is True else None
    started = time.monotonic()
    seen: list[BatchProgress] = []

    def look() -> None:
        seen[:] = [BatchProgress(queue, follower.counts(), follower.total,
                                 time.monotonic() - started, follower.done)]
        if printer is not None:
            printer.update(seen[0].line())
        elif callable(progress):
            progress(seen[0])

    try:
        if isinstance(follower, TaskFollower):
            drive(store, follower, lambda ids: read_statuses(store, ids), timeout, interval,
                  look)
        else:
            drive(store, follower, store.counts, timeout, interval, look)
    finally:
        if printer is not None:
            printer.close()
        if client is not url:
            client.close()
    if not follower.done:
        raise WaitTimeout(
            f"the batch did not finish within {timeout} s: {seen[0].line()}", seen[0])
    return seen[0]
