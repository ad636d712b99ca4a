"""What wakes a listener's loop, and its wait (PROTOCOL.md 6, step 7).

Signals arrive through the signal wakeup fd (SIGCHLD, SIGTERM, SIGINT, SIGUSR1: handlers only
note them; the loop acts); messages on its channels (enqueues, cancels, this node's
preemption) through a pipe a subscriber thread writes; its children's frames on their
sockets. ``wait`` selects on all of them, bounded by the loop's next deadline.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from blueque.errors import BluequeError
from blueque.reporting import ChildChannel
from blueque.retry import Backoff
from blueque.store import RedisStore

log = logging.getLogger("blueque.daemon")

Handler = Callable[[int, Any], None]


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
    def wait(self, timeout: float, channels: Mapping[int, ChildChannel]) -> None:
        """Until a signal, a message, a child's frame (or room to write one) or ``timeout``."""
        try:
            ready, writable, _ = select.select(
                [self._wake_r, self._sig_r, *channels],
                [fd for fd, channel in channels.items() if channel.wants_write], [],
                max(0.0, timeout))
        except InterruptedError:
            return
        for fd in writable:
            channels[fd].flush()
        for fd in ready:
            if fd in channels:
                continue  # a child's socket: the loop reads it
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
