"""Waiting for tasks to end: the one way every wait in Blueque decides what to read and when.

A wait listens on the done channels of the queues it follows (finish.lua publishes the id of
every task that ends, PROTOCOL.md 5.6) and re-reads at once what they told it about; at least
every ``every`` seconds (WAIT_REREAD) it re-reads everything it follows that has not ended,
for writers that publish nothing (blueque 1.0.1) and tasks that expire, and it re-reads
everything too when its subscription was lost (what was published meanwhile never arrived).
It subscribes before a read, never after, so no end goes unseen.

``follow`` is that decision, written once and without I/O: a generator that yields steps
(Subscribe, Read, Listen) and receives what each Listen heard. ``drive`` runs it with the
sync store and a Subscription; blueque.aio's Task runs the same steps awaited. What is
followed, and how to read it, is the caller's: a WaitResult follows task hashes (Task.wait,
blueque.aio's Task.wait and updates, ``wait_all`` and so ``blueque wait`` and ``enqueue
--wait``); blueque.spark follows statuses or a queue's counts.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TextIO, TypeVar

from blueque.display import ProgressLine, bar, format_seconds, shorten
from blueque.errors import CorruptTask
from blueque.statuses import CANCELLED, COMPLETE, FAILED, FINISHED_STATUSES, state_of

if TYPE_CHECKING:
    from blueque.store import RedisStore, Subscription

#: The longest a wait listens before it re-reads what it follows, whatever the done
#: channels said (1.0.1 writers do not publish).
WAIT_REREAD = 1.0

What = TypeVar("What")
Reply = TypeVar("Reply")
Reply_contra = TypeVar("Reply_contra", contravariant=True)


@dataclass(frozen=True)
class Subscribe:
    """Subscribe to the done channels of ``queues`` (waiting for Redis to confirm); a full
    Read follows, so what is heard while subscribing may be dropped."""

    queues: tuple[str, ...]


@dataclass(frozen=True)
class Read(Generic[What]):
    """Read ``what`` (the followed object's own description of it) and hand the reply to the
    followed object's ``took``."""

    what: What


@dataclass(frozen=True)
class Listen:
    """Listen on the done channels for up to ``seconds`` (sleep, without a subscription).
    Send back the task ids published meanwhile, or None when messages were missed (the
    subscription was lost and made again)."""

    seconds: float


Step = Subscribe | Read[Any] | Listen


class Followed(Protocol[What, Reply_contra]):
    """What a wait follows: it says what to read and learns from each reply. It does no I/O."""

    @property
    def done(self) -> bool:
        """Whether everything followed has ended."""

    def queues(self) -> list[str]:
        """The queues whose done channels announce its ends (empty while not known)."""

    def to_read(self, told: Sequence[str] | None) -> What | None:
        """What to read: everything that has not ended (``told`` None), or what the done
        channels told about; None when there is nothing to read."""

    def took(self, what: What, reply: Reply_contra) -> None:
        """Learn from the reply to a Read of ``what``."""


def follow(followed: Followed[Any, Any], timeout: float | None, every: float = WAIT_REREAD,
           clock: Callable[[], float] = time.monotonic) -> Generator[Step, Any, None]:
    """The steps of a wait, until ``followed.done`` or until ``timeout`` seconds have passed
    (``followed`` then is not done: that is how a caller tells a timeout)."""
    deadline = math.inf if timeout is None else clock() + timeout
    queues = followed.queues()
    if queues:  # known up front: subscribed before the first read
        yield Subscribe(tuple(queues))
    yield from _read(followed, None)
    if not queues and not followed.done:
        queues = followed.queues()  # learned from the first read
        if queues:
            yield Subscribe(tuple(queues))
            yield from _read(followed, None)  # an end between the first read and SUBSCRIBE
    next_full = clock() + every
    while not followed.done:
        current = clock()
        if current >= deadline:
            return
        told: Sequence[str] | None = None
        if current < next_full:
            told = yield Listen(min(next_full, deadline) - current)
            if told is not None and not told:
                continue
        yield from _read(followed, told)
        if told is None:
            next_full = clock() + every


def _read(followed: Followed[Any, Any], told: Sequence[str] | None
          ) -> Generator[Step, Any, None]:
    what = followed.to_read(told)
    if what is not None:
        yield Read(what)


def drive(store: RedisStore, followed: Followed[What, Reply], read: Callable[[What], Reply],
          timeout: float | None, every: float = WAIT_REREAD,
          on_read: Callable[[], object] | None = None) -> None:
    """Run ``follow`` with the sync store: each Read through ``read`` (a store method, so a
    Redis outage shorter than the client's ``retry_deadline`` goes unnoticed and a longer one
    raises RedisUnavailable), then ``on_read()``; each Listen on a Subscription to the done
    channels, closed at the end."""
    steps = follow(followed, timeout, every)
    subscription: Subscription | None = None
    heard: list[str] | None = None
    try:
        while (step := next_step(steps, heard)) is not None:
            heard = None
            if isinstance(step, Read):
                followed.took(step.what, read(step.what))
                if on_read is not None:
                    on_read()
            elif isinstance(step, Listen):
                heard = listen(subscription, step.seconds)
            else:
                subscription = store.subscribe(
                    [store.keys.done_channel(queue) for queue in step.queues])
                subscription.get_message(timeout=0)  # subscribed, and confirmed
    finally:
        steps.close()
        if subscription is not None:
            subscription.close()


def next_step(steps: Generator[Step, Any, None], heard: list[str] | None) -> Step | None:
    """The step after the last one (to which ``heard`` is the reply), or None at the end."""
    try:
        return steps.send(heard)
    except StopIteration:
        return None


def listen(subscription: Subscription | None, seconds: float) -> list[str] | None:
    """A Listen step: the ids published within ``seconds`` (returns at the first, with any
    already queued behind it), or None when messages were missed."""
    if subscription is None:
        time.sleep(seconds)
        return []
    told: list[str] = []
    message = subscription.get_message(timeout=seconds)
    while message is not None:
        if message.missed:
            return None
        told.append(message.data)
        message = subscription.get_message(timeout=0)
    return told


class WaitResult:
    """A wait for task hashes, followed (Followed[list[str], list[dict[str, str]]]) and then
    its result: ``tasks``, every task's last read hash ({} when it does not exist), and
    ``timed_out``. A task that does not exist has ended, as far as the wait goes; one that has
    not ended and has no queue field raises CorruptTask (no done channel to listen on)."""

    def __init__(self, task_ids: Iterable[str]) -> None:
        self.tasks: dict[str, dict[str, str]] = {task_id: {} for task_id in task_ids}
        self.timed_out = False
        self._unread = set(self.tasks)
        self._open = set(self.tasks)  # not read yet, or existing and not finished

    def finished(self) -> list[str]:
        return [i for i, d in self.tasks.items() if d.get("status") in FINISHED_STATUSES]

    def failed(self) -> list[str]:
        """The tasks that failed (not those cancelled: see ``cancelled``)."""
        return [i for i, d in self.tasks.items() if state_of(d) == FAILED]

    def cancelled(self) -> list[str]:
        return [i for i, d in self.tasks.items() if state_of(d) == CANCELLED]

    def missing(self) -> list[str]:
        return [i for i, d in self.tasks.items() if not d and i not in self._unread]

    @property
    def done(self) -> bool:
        return not self._open

    def queues(self) -> list[str]:
        if self._unread:
            return []
        queues = set()
        for task_id in self._open:
            queue = self.tasks[task_id].get("queue")
            if not queue:
                raise CorruptTask(f"task {task_id!r} has no queue field; cannot wait for it")
            queues.add(queue)
        return sorted(queues)

    def to_read(self, told: Sequence[str] | None) -> list[str] | None:
        ids = self.tasks if told is None else dict.fromkeys(told)
        return [i for i in ids if i in self._open] or None

    def took(self, what: list[str], reply: list[dict[str, str]]) -> None:
        for task_id, data in zip(what, reply, strict=True):
            self.tasks[task_id] = data
            self._unread.discard(task_id)
            if not data or data.get("status") in FINISHED_STATUSES:
                self._open.discard(task_id)


class HasStore(Protocol):
    @property
    def store(self) -> RedisStore: ...


def wait_all(
    client: HasStore,
    task_ids: Sequence[str],
    timeout: float | None = None,
    on_update: Callable[[WaitResult], object] | None = None,
    *,
    show: TextIO | None = None,
) -> WaitResult:
    """Block until every task is complete, failed or gone, or ``timeout`` seconds pass
    (then ``timed_out`` is set). ``on_update`` is called after every read. ``show``: a
    stream to draw WaitProgress on (``blueque wait``: stderr on a terminal; one task's own
    progress is re-read every half second).

    Keys: blueque_task_[id] (HGETALL, one pipeline per read), blueque_done_[queue]
    (SUBSCRIBE)."""
    store = client.store
    result = WaitResult(task_ids)
    progress = WaitProgress(list(result.tasks), show) if show is not None else None
    every = progress.refresh if progress is not None else WAIT_REREAD

    def on_read() -> None:
        if progress is not None:
            progress.update(result)
        if on_update is not None:
            on_update(result)

    try:
        drive(store, result, store.task_data_many, timeout, every, on_read)
    finally:
        if progress is not None:
            progress.close()
    result.timed_out = not result.done
    return result


class WaitProgress:
    """What a wait for tasks draws on a ProgressLine: one task's own progress (its fraction
    and message, re-read every ``refresh`` seconds), or, for several, how many finished."""

    def __init__(self, task_ids: Sequence[str], stream: TextIO) -> None:
        self._line = ProgressLine(stream)
        self._one = task_ids[0] if len(task_ids) == 1 else None
        self.refresh = 0.5 if self._one is not None else WAIT_REREAD
        self._started = time.monotonic()

    def update(self, result: WaitResult) -> None:
        elapsed = format_seconds(time.monotonic() - self._started)
        if self._one is None:
            finished, total = len(result.finished()), len(result.tasks)
            cancelled = len(result.cancelled())
            self._line.update(f"{bar(finished / max(1, total))} {finished}/{total} finished, "
                              f"{len(result.failed())} failed, "
                              + (f"{cancelled} cancelled, " if cancelled else "") + elapsed)
            return
        data = result.tasks[self._one]
        try:
            fraction = min(1.0, max(0.0, float(data.get("progress") or 0.0)))
        except ValueError:
            fraction = 0.0
        status = data.get("status") or ""
        if status in FINISHED_STATUSES:  # its last bar says how it ended, not its last step
            fraction = 1.0 if status == COMPLETE else fraction
            message = state_of(data) or status
        else:
            message = shorten(data.get("progress_message") or status, 40)
        self._line.update(f"{bar(fraction)} {fraction * 100:3.0f}% {message}, {elapsed}")

    def close(self) -> None:
        self._line.close()
