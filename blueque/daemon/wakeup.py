"""What wakes a listener's loop, and its wait (PROTOCOL.md 6, step 7).

Signals arrive through the signal wakeup fd (SIGCHLD, SIGTERM, SIGINT, SIGUSR1: handlers only
note them; the loop acts); messages on its channels (enqueues, cancels, this node's
preemption) through a pipe a subscriber thread writes; its children's frames on their
sockets. ``wait`` selects on all of them, bounded by the loop's next deadline. The Inbox
sorts what the messages say; Cadence keeps the loop's timers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, Protocol

from blueque.errors import BluequeError
from blueque.keys import Keys
from blueque.preemption import NodePreemption
from blueque.retry import Backoff
from blueque.store import RedisStore

log = logging.getLogger("blueque.daemon")

Handler = Callable[[int, Any], None]
#: The listener loop's periodic work: lease renewal, the recovery sweep, moving due tasks.
Timer = Literal["renew", "sweep", "due"]



class Pollable(Protocol):
    """What the loop's wait watches besides its own pipes: a child's socket (ChildChannel),
    its fork server's (PROTOCOL.md 6.8)."""

    @property
    def wants_write(self) -> bool: ...

    def flush(self) -> None: ...

class Cadence:
    """The listener loop's timers, on its clock: lease renewal every half interval, the
    recovery sweep every interval, due tasks moved every ``poll``; and a Redis outage, during
    which the loop waits a backoff instead (the timers are overdue then), and after which the
    lease is renewed first (so that no sweeper takes it for lapsed: PROTOCOL.md 6,
    "Outages")."""

    def __init__(self, interval: float, poll: float) -> None:
        self._periods: dict[Timer, float] = {"renew": interval / 2, "sweep": interval,
                                             "due": poll}
        self._next: dict[Timer, float] = dict.fromkeys(self._periods, 0.0)
        self.down_since: float | None = None
        # while Redis is away: at most half an interval, back within a lease's slack once it is
        self._outage = Backoff(0.1, min(5.0, interval / 2))

    def due(self, timer: Timer, current: float) -> bool:
        return current >= self._next[timer] or (timer == "renew" and self.down_since is not None)

    def done(self, timer: Timer, current: float) -> None:
        self._next[timer] = current + self._periods[timer]

    def soon(self, timer: Timer) -> None:
        self._next[timer] = 0.0

    def outage(self, current: float) -> tuple[bool, float]:
        """A step found Redis away: whether the outage is news, and how long to wait."""
        news = self.down_since is None
        if news:
            self.down_since = current
        return news, self._outage.next()

    def back(self) -> bool:
        """A step succeeded: True if it ended an outage."""
        if self.down_since is None:
            return False
        self.down_since = None
        self._outage.reset()
        return True

    def deadlines(self) -> list[float]:
        """When the timers are due (none while Redis is away: the backoff rules then)."""
        return [] if self.down_since is not None else list(self._next.values())


class Inbox:
    """What a listener hears on its channels (PROTOCOL.md 6 step 7): enqueues on its queues'
    channels (they only wake the loop), cancels on its control channel, and news of its
    node's preemption (``NodePreemption.hear``: read at the next look). ``heard`` runs in the
    subscriber thread; the loop takes the cancels."""

    def __init__(self, keys: Keys, listener: str, queues: Iterable[str],
                 preemption: NodePreemption) -> None:
        self._control = keys.control(listener)
        self._preemption_channel = keys.preemption_channel(preemption.node_name)
        self.channels = [*(keys.channel(q) for q in queues), self._preemption_channel,
                         self._control]
        self._preemption = preemption
        self._cancels: deque[str] = deque()

    def heard(self, channel: str, data: str) -> None:
        if channel == self._control:
            self._cancels.append(data)
        elif channel == self._preemption_channel:
            self._preemption.hear()

    def cancel(self, task_ids: Iterable[str]) -> None:
        """Cancels found otherwise (a renewal reads each running task's cancel_requested)."""
        self._cancels.extend(task_ids)

    def cancels(self) -> list[str]:
        """The tasks to cancel heard of since the last call."""
        wanted = []
        while self._cancels:
            wanted.append(self._cancels.popleft())
        return wanted


class ProgramSignals:
    """SIGTERM and SIGINT for a listener that runs inside a program (ForkingRunner.run(), as
    blueque 1.0.1's did): what the program had installed keeps its meaning, at a safe point
    of the loop instead of anywhere in it.

    - A handler of the program's (Python's own SIGINT handler included) is called between
      two steps of the loop. If it raises (KeyboardInterrupt on Ctrl-C, SystemExit), the
      listener leaves cleanly (its running tasks keep running, to be adopted) and the
      exception comes out of run(); if it returns, the listener carries on, as 1.0.1's did.
    - SIG_IGN: the signal is ignored.
    - SIG_DFL: the listener stops as `blueque listen` does; then, with the program's
      disposition back, the signal is sent again: the process ends by it, as it would have.
    - Anything else (a handler not set from Python): the listener stops and run() returns.
    """

    def __init__(self, stop: Handler, signums: Iterable[int] = (signal.SIGTERM, signal.SIGINT)
                 ) -> None:
        self._stop = stop
        self.previous = {signum: signal.getsignal(signum) for signum in signums}
        self.pending: deque[tuple[int, Any]] = deque()  # for the program's handlers
        self.fatal: int | None = None  # a signal whose default action ends the process

    @property
    def signums(self) -> list[int]:
        return list(self.previous)

    def handler(self, signum: int, frame: Any) -> None:
        previous = self.previous[signum]
        if previous == signal.SIG_IGN:
            return
        if callable(previous):
            self.pending.append((signum, frame))
            return
        if previous == signal.SIG_DFL and self.fatal is None:
            self.fatal = signum
        self._stop(signum, frame)

    def deliver(self) -> None:
        """Call the program's handlers of the signals heard since the last call; whatever
        they raise goes up."""
        while self.pending:
            signum, frame = self.pending.popleft()
            previous = self.previous[signum]
            if callable(previous):
                previous(signum, frame)

    def end(self) -> None:
        """Once the listener has left and the program's dispositions are back: a signal
        whose default action ends the process is sent again."""
        if self.fatal is not None:
            signal.raise_signal(self.fatal)


class Wakeup:
    def __init__(self, store: RedisStore, interval: float) -> None:
        self._store = store
        self._interval = interval  # silence after which the subscriber proves its connection
        self._wake_r, self._wake_w = os.pipe()
        self._sig_r, self._sig_w = os.pipe()
        for fd in (self._wake_r, self._wake_w, self._sig_r, self._sig_w):
            os.set_blocking(fd, False)
        self._wake_lock = threading.Lock()
        self._previous_handlers: dict[int, Any] = {}  # what signal.signal() returned
        self._previous_wakeup_fd: int | None = None
        self.subscriber: threading.Thread | None = None
        self._closed = threading.Event()

    # --- signals ----------------------------------------------------------------------------
    def install_signals(self, handlers: Mapping[int, Handler]) -> None:
        """Take ``handlers`` (and SIGCHLD, whose arrival alone wakes the wait) until
        ``close``: a ForkingRunner runs in its caller's process, which gets them back."""
        self._previous_wakeup_fd = signal.set_wakeup_fd(self._sig_w)
        self._previous_handlers[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, lambda *_: None)
        for signum, handler in handlers.items():
            self._previous_handlers[signum] = signal.signal(signum, handler)

    def _restore_signals(self) -> None:
        while self._previous_handlers:
            signum, handler = self._previous_handlers.popitem()
            signal.signal(signum, handler)
        if self._previous_wakeup_fd is not None:
            signal.set_wakeup_fd(self._previous_wakeup_fd)
            self._previous_wakeup_fd = None

    # --- messages ---------------------------------------------------------------------------
    def subscribe(self, channels: Sequence[str],
                  on_message: Callable[[str, str], None]) -> None:
        """A thread that calls ``on_message(channel, data)`` for every message on
        ``channels`` and wakes the loop."""
        thread = threading.Thread(target=self._subscribe, args=(list(channels), on_message),
                                  name="blueque-subscriber", daemon=True)
        self.subscriber = thread
        thread.start()

    def _subscribe(self, channels: list[str], on_message: Callable[[str, str], None]) -> None:
        """Background thread. The store's Subscription subscribes again after an outage, and
        with its keepalive notices a connection a NAT or load balancer dropped without a word
        (a PING after an interval of silence; a new subscription without a reply)."""
        subscription = self._store.subscribe(channels, keepalive=self._interval)
        refusals = Backoff(1.0, 30.0)
        try:
            while self.subscriber is not None:
                try:
                    message = subscription.get_message(timeout=min(1.0, self._interval))
                except BluequeError as error:  # refused (ACL, auth): tried again after backoff
                    log.warning("subscriber: %s", error)
                    self._closed.wait(refusals.next())
                    continue
                refusals.reset()
                if message is None:
                    continue
                if not message.missed:
                    on_message(message.channel, message.data)
                self.wake()  # missed too: messages were lost, the main loop looks for itself
        finally:
            subscription.close()

    def wake(self) -> None:
        # under the lock: once close() has closed the pipe, its number may name another file
        with self._wake_lock, contextlib.suppress(OSError):  # a full pipe: it wakes anyway
            if self._wake_w >= 0:
                os.write(self._wake_w, b"\0")

    # --- the wait ---------------------------------------------------------------------------
    def wait(self, timeout: float, channels: Mapping[int, Pollable],
             outputs: Iterable[int] = ()) -> None:
        """Until a signal, a message, a child's frame (or room to write one), output in one
        of the children's ``outputs`` pipes (the loop reads them: 5.19), a word of the fork
        server (6.8) or ``timeout``."""
        # poll, not select: select refuses any descriptor past 1023, which a listener with
        # many children (or anything that left descriptors open) reaches
        poller = select.poll()
        for fd in (self._wake_r, self._sig_r):
            poller.register(fd, select.POLLIN)
        for fd, channel in channels.items():
            poller.register(fd, select.POLLIN | (select.POLLOUT if channel.wants_write else 0))
        pipes = set(outputs)
        for fd in pipes:
            poller.register(fd, select.POLLIN)
        try:
            events = poller.poll(max(0.0, timeout) * 1000)
        except InterruptedError:
            return
        ready = [fd for fd, event in events if event & ~select.POLLOUT]  # in, hang-up, error
        writable = [fd for fd, event in events if event & select.POLLOUT]
        for fd in writable:
            channels[fd].flush()
        for fd in ready:
            if fd in channels or fd in pipes:
                continue  # a child's socket or output pipe: the loop reads it
            try:
                while os.read(fd, 512):
                    pass
            except BlockingIOError:
                pass

    def close(self) -> None:
        """Stop the subscriber, give the signals back, close the pipes."""
        self.subscriber = None
        self._closed.set()
        self._restore_signals()
        with self._wake_lock:  # the subscriber thread may still hold a message for a second
            for fd in (self._wake_r, self._wake_w, self._sig_r, self._sig_w):
                os.close(fd)
            self._wake_w = -1
