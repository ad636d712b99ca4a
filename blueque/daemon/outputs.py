"""The listener's side of a task process's output pipe (PROTOCOL.md 5.19, issue 20 item 4).

The listener reads each of its task processes' pipes in its loop (their read ends are among
what its wait polls), writes what comes to the attempt's file, capped exactly
(blueque.task_process.capture.CappedFile), and ships the file's tail to the task's log stream every
``interval`` (blueque.tasklog.Shipper): what a thread of each task process did before. A warm
process's pipe carries its successive attempts: ``follow`` moves to the next attempt's file
once the run before has ended (its outcome drained, ``end``).
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from blueque.task_process.capture import CappedFile
from blueque.tasklog import Shipper, TaskLogSettings

if TYPE_CHECKING:  # a task process imports this module (blueque.daemon.running), never the store
    from blueque.store import RedisStore

log = logging.getLogger("blueque.daemon")

#: The most one read of a pipe takes per step of the loop: a task writing as fast as it can
#: does not hold the loop (its other children, its lease) up.
READ_LIMIT = 1 << 20
#: After a shipment Redis did not take, the next waits this long (each try may wait for a
#: connection's timeout, in the listener's loop), the file growing meanwhile within its cap.
AWAY_SPACING = 5.0


_bounded: tuple[RedisStore, RedisStore] | None = None


def _shipping(store: RedisStore) -> RedisStore:
    """``store`` trying each shipment once (best effort: 5.19), made once, not per attempt."""
    global _bounded
    if _bounded is None or _bounded[0] is not store:
        _bounded = (store, store.bounded(0.0))
    return _bounded[1]


class TaskOutput:
    """One task process's output pipe, read by its listener (``read``, non-blocking), and
    the attempt it now carries: its file (opened at its first byte: a quiet attempt has
    none) and its shipper."""

    def __init__(self, read: int, settings: TaskLogSettings, store: RedisStore) -> None:
        self.fd = read
        os.set_blocking(read, False)
        self.settings, self.store = settings, store
        self.attempt: tuple[str, int] | None = None  # (task id, attempt) it carries now
        self.path: Path | None = None
        self.file: CappedFile | None = None
        self.shipper: Shipper | None = None
        self.unwritten = 0  # bytes in the file not shipped yet (0: nothing to ship)
        self.due = 0.0  # the loop's clock: its next shipment
        self.eof = False  # every writer is gone: nothing more to read
        self._unopenable = False

    @classmethod
    def of(cls, read: int | None, settings: TaskLogSettings | None,
           store: RedisStore) -> TaskOutput | None:
        """The listener's side of a pipe just made (None: output is not captured)."""
        return None if read is None or settings is None else cls(read, settings, store)

    def fileno(self) -> int:
        return self.fd

    @property
    def readable(self) -> bool:
        return self.fd >= 0 and not self.eof

    def follow(self, queue: str, task_id: str, attempt: int, ttl_ms: int | None,
               current: float) -> None:
        """From now on the pipe carries ``attempt`` of ``task_id`` (a no-op if it did)."""
        if self.attempt == (task_id, attempt):
            return
        self._close_file()
        self.attempt = (task_id, attempt)
        self.path = self.settings.path(queue, task_id, attempt)
        self.shipper = Shipper(_shipping(self.store), self.settings, task_id, attempt,
                               self.path, ttl_ms)
        self.unwritten, self._unopenable = 0, False
        self.due = current + self.settings.interval

    def read(self, limit: int | None = READ_LIMIT) -> None:
        """What the pipe holds (at most ``limit`` bytes; None: all of it) into the file."""
        moved = 0
        while self.readable and (limit is None or moved < limit):
            try:
                data = os.read(self.fd, 1 << 16)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                data = b""
            if not data:
                self.eof = True
                break
            moved += len(data)
            if self.file is None and self.path is not None and not self._unopenable:
                self._open()
            if self.file is not None:
                self.file.write(data)
        self.unwritten += moved

    def _open(self) -> None:
        assert self.path is not None
        try:
            # at the cap: shipped first (its shipper's rotate), then moved aside
            self.file = CappedFile(self.path, self.settings.max_bytes,
                                   self.shipper.rotate if self.shipper is not None else None)
        except OSError as error:  # a full or read-only disk, the directory a file...
            self._unopenable = True
            log.error("output not captured to %s (%s): it is dropped, never mixed into the "
                      "listener's log", self.path, error)
            return

    def ship_due(self, current: float, always: bool = False) -> None:
        """Every ``interval``: ship what the file gained (``always``: whether or not the pipe
        brought anything, for a task that writes its file itself) and touch the file (a quiet
        running attempt's file is not an old one)."""
        if self.shipper is None or current < self.due:
            return
        if self.unwritten or always:
            self.shipper.ship()
            self.unwritten = 1 if self.shipper.failed else 0  # failed: tried again later
        self.due = current + (max(self.settings.interval, AWAY_SPACING) if self.shipper.failed
                              else self.settings.interval)
        if self.path is not None and (self.file is not None or always):
            with contextlib.suppress(OSError):
                os.utime(self.path)

    def end(self) -> None:
        """The attempt is over (its outcome heard: the task process flushed its output into
        the pipe before it sent it; or it died): everything the pipe holds goes to its file,
        then the rest is shipped with the attempt's end mark (5.19)."""
        self.read(limit=None)
        self._close_file()
        if self.shipper is not None:
            self.shipper.ship(end=True)
            self.shipper = None

    def _close_file(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None

    def close(self) -> None:
        """Our read end and the file (the shipper stays, for an end still to be shipped)."""
        self._close_file()
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1
