"""wait_for_tasks: wait on a driver until a batch of tasks has finished, showing progress.

Three ways to say what "the batch" is: the task ids (each followed until it finishes), a
count (the queue's complete + failed lists reach it), or neither (the queue drains: nothing
scheduled, pending, reserved or started). This module needs no Spark, only Redis.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TextIO

from blueque import keys as k
from blueque.client import Client
from blueque.errors import ConfigurationError
from blueque.errors import WaitTimeout as BaseWaitTimeout
from blueque.store import RedisStore

#: HGETs per pipeline when following task ids.
STATUS_CHUNK = 5_000
#: States a task can still leave; "missing" means no hash (never made, deleted or expired).
ACTIVE = (k.SCHEDULED, k.PENDING, k.RESERVED, k.STARTED)
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
        return self.counts.get(k.COMPLETE, 0) + self.counts.get(k.FAILED, 0)

    @property
    def active(self) -> int:
        return sum(self.counts.get(status, 0) for status in ACTIVE)

    def line(self) -> str:
        """``queue pages: 812/1000 finished (complete 800, failed 12) | pending 150 ...``"""
        of = f"/{self.total}" if self.total is not None else ""
        parts = [
            f"queue {self.queue}: {self.finished}{of} finished "
            f"(complete {self.counts.get(k.COMPLETE, 0)}, failed {self.counts.get(k.FAILED, 0)})"
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
    """Follows a set of task ids: polls only those not finished yet (finished is final)."""

    def __init__(self, store: RedisStore, task_ids: Iterable[str]) -> None:
        self._store = store
        self._open = list(dict.fromkeys(task_ids))
        self.total = len(self._open)
        self._finished: Counter[str] = Counter()

    def poll(self) -> tuple[dict[str, int], bool]:
        current: Counter[str] = Counter(self._finished)
        still_open: list[str] = []
        for start in range(0, len(self._open), STATUS_CHUNK):
            chunk = self._open[start : start + STATUS_CHUNK]
            for task_id, status in zip(chunk, self._store.task_statuses(chunk), strict=True):
                if status in k.FINISHED_STATUSES:
                    self._finished[status] += 1
                    current[status] += 1
                else:
                    current[status or MISSING] += 1
                    still_open.append(task_id)
        self._open = still_open
        counts = dict(current)
        return counts, not any(counts.get(status) for status in ACTIVE)


class QueueFollower:
    """Follows a whole queue through its O(1) counts."""

    def __init__(self, store: RedisStore, queue: str, count: int | None) -> None:
        self._store = store
        self._queue = queue
        self.total = count

    def poll(self) -> tuple[dict[str, int], bool]:
        counts = self._store.counts(self._queue)
        values = {status: getattr(counts, status) for status in k.STATUSES}
        if self.total is None:
            return values, not any(values[status] for status in ACTIVE)
        return values, values[k.COMPLETE] + values[k.FAILED] >= self.total


@dataclass
class ProgressPrinter:
    """Prints BatchProgress lines: rewritten in place on a terminal, else one line every
    ``every`` seconds (and the last one), so logs stay readable."""

    stream: TextIO = field(default_factory=lambda: sys.stderr)
    every: float = 10.0
    _last: float = field(default=-1e9, init=False)

    def __call__(self, progress: BatchProgress) -> None:
        if self.stream.isatty():
            end = "\n" if progress.done else ""
            self.stream.write("\r\x1b[K" + progress.line() + end)
        elif progress.done or progress.seconds - self._last >= self.every:
            self._last = progress.seconds
            self.stream.write(progress.line() + "\n")
        self.stream.flush()


def wait_for_tasks(
    url: str | Client,
    queue: str,
    task_ids: Iterable[str] | None = None,
    count: int | None = None,
    timeout: float | None = None,
    progress: bool | Callable[[BatchProgress], Any] = True,
    interval: float = 1.0,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Any] = time.sleep,
) -> BatchProgress:
    """Block until the batch has finished and return the last BatchProgress.

    ``task_ids``: wait until none of them is scheduled, pending, reserved or started (ids with
    no hash are counted as ``missing``). ``count``: wait until the queue's complete and failed
    lists hold ``count`` tasks together (for a fresh queue, the number enqueued). Neither:
    wait until the queue has nothing scheduled, pending, reserved or started.
    ``progress``: True prints counts per state to stderr; a callable receives each
    BatchProgress (every ``interval`` seconds). Raises WaitTimeout after ``timeout`` seconds.

    Keys read: blueque_task_[id] (HGET status) for ids; otherwise the queue's lists and sets
    (store.counts)."""
    if task_ids is not None and count is not None:
        raise ConfigurationError("give task_ids or count, not both")
    if count is not None and count < 0:
        raise ConfigurationError(f"count must not be negative, not {count}")
    client = url if isinstance(url, Client) else Client(url)
    follower: TaskFollower | QueueFollower
    if task_ids is not None:
        follower = TaskFollower(client.store, task_ids)
    else:
        follower = QueueFollower(client.store, queue, count)
    report = (ProgressPrinter() if progress else None) if isinstance(progress, bool) else progress
    started = clock()
    try:
        while True:
            counts, done = follower.poll()
            elapsed = clock() - started
            snapshot = BatchProgress(queue, counts, follower.total, elapsed, done)
            if report is not None:
                report(snapshot)
            if done:
                return snapshot
            if timeout is not None and elapsed >= timeout:
                raise WaitTimeout(
                    f"the batch did not finish within {timeout} s: {snapshot.line()}", snapshot
                )
            sleep(interval if timeout is None else max(0.0, min(interval, timeout - elapsed)))
    finally:
        if client is not url:
            client.close()

