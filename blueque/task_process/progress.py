"""A running task's progress (PROTOCOL.md 5.10, 6.2): best effort, and it never fails the task.

In a listener daemon's child, ``report_progress`` hands the latest value to a thread that
sends it to the listener (which writes it); once the listener is gone, or in a child that
records itself (1.0.1's fork_task, an orphan), a ProgressReporter writes it to Redis, keeping
the latest value while Redis is away.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from blueque.errors import BluequeError, RedisUnavailable
from blueque.processor import Processor, check_fraction
from blueque.reporting import ParentLink

log = logging.getLogger("blueque.child")

#: Longest pause between two tries to send a progress report Redis did not take.
PROGRESS_RETRY_MAX = 5.0


class ProgressReporter:
    """Sends a running task's progress; never raises into the task function.

    Progress is best effort: while Redis is away the latest value is kept (older ones are
    superseded) and a background thread sends it once Redis is back, with a backoff; a
    report made meanwhile replaces it and returns at once. A report Redis refuses (the run
    was superseded: StaleAttempt) is dropped and logged. Reports go through a store without
    retries, so that a task never waits for Redis in ``report_progress``."""

    def __init__(self, processor: Processor) -> None:
        self._processor = processor
        self._lock = threading.Lock()  # guards _pending, _retry_at, _closed
        self._sending = threading.Lock()  # one sender at a time
        self._pending: tuple[float, str] | None = None
        self._retry_at = 0.0
        from blueque.retry import Backoff  # redis-py's errors: only a child that writes itself

        self._backoff = Backoff(0.1, PROGRESS_RETRY_MAX)
        self._kept = False  # a send failed: the value waits for Redis
        self._closed = False
        self._wakeup = threading.Event()
        self._thread: threading.Thread | None = None

    def report(self, fraction: float, message: str) -> None:
        check_fraction(fraction)
        with self._lock:
            if self._closed:
                return
            self._pending = (fraction, message)
        self._send()

    def _send(self) -> None:
        """Send the latest value unless another send is under way (it picks the latest up)
        or a failed send's backoff has not passed (the background thread sends it then)."""
        if not self._sending.acquire(blocking=False):
            return
        try:
            while True:
                with self._lock:
                    value = self._pending
                    if value is None or time.monotonic() < self._retry_at:
                        return
                try:
                    self._processor.progress(*value)
                except RedisUnavailable as error:
                    self._postpone(error)
                    return
                except BluequeError as error:  # superseded (StaleAttempt), or not started
                    log.warning("progress of task %s not recorded: %s",
                                self._processor.task.id, error)
                with self._lock:
                    if self._kept:
                        log.info("task %s: kept progress recorded", self._processor.task.id)
                    self._kept = False
                    self._backoff.reset()
                    if self._pending is value:
                        self._pending = None
                        return
        finally:
            self._sending.release()

    def _postpone(self, error: BluequeError) -> None:
        with self._lock:
            if not self._kept:
                log.warning("task %s: progress kept until Redis is back: %s",
                            self._processor.task.id, error)
            self._kept = True
            self._retry_at = time.monotonic() + self._backoff.next()
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._retry, name="blueque-progress",
                                                daemon=True)
                self._thread.start()
        self._wakeup.set()

    def _retry(self) -> None:
        """Background: send the kept value each time its backoff has passed, until sent."""
        while True:
            with self._lock:
                if self._closed or self._pending is None:
                    self._thread = None
                    return
                wait = self._retry_at - time.monotonic()
                if wait <= 0:
                    self._retry_at = 0.0
            if wait > 0:
                self._wakeup.wait(wait)
                self._wakeup.clear()
            else:
                self._send()
                self._wakeup.wait(0.01)  # a concurrent report may be sending: let it finish
                self._wakeup.clear()

    def close(self) -> None:
        """The task function returned: one last try for a kept value, then drop it (the
        outcome, recorded next, is what counts)."""
        with self._lock:
            self._retry_at = 0.0
        self._send()
        with self._lock:
            self._closed = True
            if self._pending is not None:
                log.info("task %s: last progress report dropped (Redis unavailable)",
                         self._processor.task.id)
            self._pending = None
        self._wakeup.set()


class ParentProgress:
    """Progress of a listener daemon's child, sent to its listener (PROTOCOL.md 6.2).

    A thread sends the latest value, so ``report`` never waits for the listener; values that
    come faster than they can be sent are superseded. Once the listener is gone, a
    ProgressReporter writes to Redis instead (best effort, as ever)."""

    def __init__(self, link: ParentLink, direct: Callable[[], ProgressReporter]) -> None:
        self._link = link
        self._make_direct = direct
        self._direct: ProgressReporter | None = None
        self._lock = threading.Lock()  # guards _pending, _direct, _closed, _thread
        self._pending: tuple[float, str] | None = None
        self._closed = False
        self._wakeup = threading.Event()
        self._thread: threading.Thread | None = None

    def report(self, fraction: float, message: str) -> None:
        check_fraction(fraction)
        with self._lock:
            if self._closed:
                return
            direct = self._direct
            if direct is None:
                self._pending = (fraction, message)
                if self._thread is None:
                    self._thread = threading.Thread(target=self._send, name="blueque-progress",
                                                    daemon=True)
                    self._thread.start()
        if direct is not None:
            direct.report(fraction, message)
        else:
            self._wakeup.set()

    def _send(self) -> None:
        while True:
            self._wakeup.wait()
            self._wakeup.clear()
            with self._lock:
                value, self._pending, closed = self._pending, None, self._closed
            if value is not None and not self._link.send(
                    {"progress": value[0], "message": value[1]}):
                self._orphaned(value)
                return
            if closed:
                return

    def _orphaned(self, value: tuple[float, str]) -> None:
        """The listener is gone: from now on progress goes to Redis directly."""
        direct = self._make_direct()
        with self._lock:
            self._direct = direct
            latest, self._pending = self._pending or value, None
        direct.report(*latest)

    def close(self) -> None:
        """The task function returned: what is under way is sent before its outcome."""
        with self._lock:
            self._closed = True
            thread, direct = self._thread, self._direct
        self._wakeup.set()
        if thread is not None:
            thread.join()
        if direct is not None:
            direct.close()


_current: ProgressReporter | ParentProgress | None = None


def install(reporter: ProgressReporter | ParentProgress) -> None:
    """The running task's reporter (set by the task process before it calls the function)."""
    global _current
    _current = reporter


def report_progress(fraction: float, message: str = "") -> None:
    """Called from inside a task function: record how far the task has got (0.0 to 1.0).

    Best effort, and it never fails the task: while Redis is unavailable the latest value is
    kept and sent when Redis is back (or dropped when the task ends first); a report of a
    run that was superseded is dropped. Raises only for a fraction outside 0..1
    (ConfigurationError) and outside a running task (BluequeError)."""
    if _current is None:
        raise BluequeError("report_progress() is only available inside a running task")
    _current.report(fraction, message)
