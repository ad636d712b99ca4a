"""A task's output: captured per attempt to a file on the node, shipped to Redis as it comes.

The child's stdout and stderr go to the attempt's file (``[dir]/[queue]/[task id].[attempt].log``)
through a pipe its listener reads (blueque.daemon.outputs; the task process itself once its listener
is gone: blueque.task_process.capture), so output is never mixed into the listener's own log. What
the file
gains is shipped to the task's log stream in Redis (``blueque_task_log_[id]``) every
``interval`` seconds while the attempt runs, keeping its last TAIL_BYTES there; when it ends,
that tail moves to the task's output tails (``blueque_output_[id]``, one string for every
ended attempt). Those are what ``blueque logs`` (and ``--follow``, from any machine) and the
dashboard read (blueque.tails). The file is
capped at ``max_bytes`` (what it holds moves to ``.1``, replacing the one before, and it starts
again empty); files older than ``keep`` seconds are removed by the listener.
PROTOCOL.md §5.19 specifies the stream.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from blueque.errors import BluequeError
from blueque.tails import parse_tails

if TYPE_CHECKING:
    from blueque.store import RedisStore

log = logging.getLogger("blueque.tasklog")

#: How much of each attempt's output the task's log stream keeps in Redis.
TAIL_BYTES = 64 * 1024
#: Largest chunk one stream entry holds.
CHUNK_BYTES = 16 * 1024
#: Longest file name (one path component, in bytes) most file systems take.
NAME_MAX = 255


def path_component(text: str, room: int = NAME_MAX) -> str:
    """``text`` (a queue name or task id, which may hold any character) as one path
    component of at most ``room`` bytes: ``/`` and NUL escaped, ``.`` and ``..`` spelt out,
    and a longer name cut, with a digest of the whole so that two long names stay apart."""
    safe = text.replace("/", "%2F").replace("\0", "%00")
    if safe in ("", ".", ".."):
        safe = safe.replace(".", "%2E") or "_"
    encoded = safe.encode("utf-8", "surrogatepass")
    if len(encoded) <= room:
        return safe
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return encoded[:room - len(digest) - 1].decode("utf-8", "ignore") + "~" + digest


def default_directory() -> Path:
    """``$XDG_STATE_HOME/blueque/task-logs`` (``~/.local/state/...`` without it)."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(Path.home(), ".local", "state")
    return Path(state) / "blueque" / "task-logs"


@dataclass(frozen=True)
class TaskLogSettings:
    """Where and how much of a node's task output is kept (``blueque listen --log-dir``...)."""

    directory: Path
    max_bytes: int = 10 * 1024 * 1024  # per attempt's file on the node
    keep: float = 7 * 86400.0  # seconds the node's files, and an unfinished stream, are kept
    interval: float = 0.5  # seconds between two shipments to Redis

    def path(self, queue: str, task_id: str, attempt: int | None) -> Path:
        """``[directory]/[queue]/[task id].[attempt].log``, each part one path component that
        leaves room for the ``.1`` of the capped file's older half."""
        suffix = f".{attempt or 0}.log"
        name = path_component(task_id, NAME_MAX - len(suffix) - len(".1")) + suffix
        return self.directory / path_component(queue) / name

    def cleaning_period(self, interval: float) -> float:
        """How often a listener sweeping every ``interval`` looks for old files: a tenth of
        ``keep``, between one interval and 5 minutes (a look lists every file: at every sweep
        it held the listener's loop up on a node with many files)."""
        return min(max(interval, self.keep / 10), 300.0)

    def clean(self, current: float | None = None, running: Iterable[Path] = ()) -> int:
        """Remove files older than ``keep``, except those of ``running`` attempts (and their
        ``.1``); returns how many. Never raises."""
        cutoff = (time.time() if current is None else current) - self.keep
        spared = {str(path) for path in running} | {f"{path}.1" for path in running}
        removed = 0
        with contextlib.suppress(OSError):
            for path in self.directory.glob("*/*.log*"):
                if str(path) in spared:
                    continue
                with contextlib.suppress(OSError):
                    if path.stat().st_mtime < cutoff:
                        path.unlink()
                        removed += 1
        return removed


class Shipper:
    """Ships an attempt's file to the task's log stream: ``ship()`` sends what is new (its
    reader calls it every ``interval``), ``ship(end=True)`` ends the attempt's output: its
    entries and the rest of the file go to the task's output tails. Redis errors are logged
    and retried at the next shipment, never raised: output is best effort, like progress."""

    def __init__(self, store: RedisStore, settings: TaskLogSettings, task_id: str,
                 attempt: int | None, path: Path, ttl_ms: int | None,
                 offset: int = 0, kept: Sequence[tuple[str, int]] = ()) -> None:
        self.store, self.settings, self.path = store, settings, path
        self.task_id, self.attempt = task_id, str(attempt or 0)
        self.ttl_ms = ttl_ms
        self.offset = offset
        #: (entry id, bytes) of this attempt's entries in the stream, oldest first
        self._kept: deque[tuple[str, int]] = deque(kept)
        self._kept_bytes = sum(size for _, size in kept)
        self._lock = threading.Lock()
        self._warned = False  # about a file that cannot be read or cut
        self.failed = False  # the last shipment found Redis away or refusing

    def ship(self, end: bool = False) -> None:
        """Send what the file gained; with ``end``, end the attempt's output — unless the
        attempt wrote nothing and nothing was shipped: then Redis is left alone."""
        with self._lock:
            try:
                self._ship_new(end)
            finally:
                # after shipping (what moves to .1 is in the stream already), and while Redis
                # is away too: the file stays bounded whatever Redis does
                self._cap_file()

    def _ship_new(self, end: bool) -> None:
        try:
            begin, data = self._read_new(whole=not end)
            if end:
                self._end(begin, data)
                return
            start = 0
            while start < len(data):
                stop = _cut(data, start + CHUNK_BYTES, after=start)
                self._send(data[start:stop], begin + stop)
                self.offset = begin + stop  # shipped: only now it counts
                start = stop
            self.failed = False
        except BluequeError as error:  # the same bytes are read again next time
            self.failed = True
            log.debug("task %s: output not shipped yet: %s", self.task_id, error)

    def rotate(self, move: Callable[[], None]) -> None:
        """The file is full (blueque.task_process.capture): ship what it holds, let ``move`` put it
        aside, and start again from the new file's head."""
        with self._lock:
            self._ship_new(end=False)
            move()
            self.offset = 0

    def _read_new(self, whole: bool) -> tuple[int, bytes]:
        """Where the unshipped part of the file begins, and what it holds (at most the tail
        Redis keeps, from a character's start); with ``whole``, without a last character
        still incomplete (its writer flushed mid-character: the rest comes next time)."""
        try:
            with open(self.path, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                if size < self.offset:  # truncated under us: start again from its head
                    self.offset = 0
                start = max(self.offset, size - TAIL_BYTES)  # Redis keeps no more anyway
                handle.seek(start)
                data = handle.read(size - start)
        except OSError as error:  # not written yet; or a directory, permission, disk error
            if not isinstance(error, FileNotFoundError):
                self._unreadable(error)
            return self.offset, b""
        if start > self.offset:  # the tail's head may fall inside a character
            skip = _continuations(data)
            start, data = start + skip, data[skip:]
        return start, data[:_whole(data)] if whole else data

    def _end(self, begin: int, data: bytes) -> None:
        """The attempt's entries in the stream and ``data`` (the rest, from ``begin`` in the
        file) into the task's output tails, in one step (5.19); nothing for an attempt that
        wrote nothing and shipped nothing."""
        if data or self.offset or self._kept:
            self.store.end_output(self.task_id, self.attempt, data.decode("utf-8", "replace"),
                                  begin + len(data),
                                  self.ttl_ms or int(self.settings.keep * 1000), TAIL_BYTES)
        self.offset = begin + len(data)
        self._kept.clear()
        self._kept_bytes = 0
        self.failed = False

    def _send(self, data: bytes, offset: int) -> None:
        entry = self.store.append_output(
            self.task_id, self.attempt, data.decode("utf-8", "replace"), offset,
            ttl_ms=int(self.settings.keep * 1000),
        )
        # shipped: only now does this chunk count (a failed send is read again next time)
        if data:
            self._kept.append((entry, len(data)))
            self._kept_bytes += len(data)
        old: list[str] = []
        while self._kept_bytes > TAIL_BYTES and len(self._kept) > 1:
            entry_id, size = self._kept.popleft()
            self._kept_bytes -= size
            old.append(entry_id)
        if old:
            self.store.drop_output(self.task_id, old)

    def _cap_file(self) -> None:
        """Copy-truncate past max_bytes: the file's content moves to ``.1`` (replacing the
        older one) and the file starts again empty; its writers keep their descriptors."""
        try:
            if self.path.stat().st_size <= self.settings.max_bytes:
                return
            rotated = self.path.with_name(self.path.name + ".1")
            with open(self.path, "rb") as source, open(rotated, "wb") as target:
                target.write(source.read())
            os.truncate(self.path, 0)
        except FileNotFoundError:
            return
        except OSError as error:  # a full disk: the file grows until the next try
            self._unreadable(error)
            return
        self.offset = 0

    def _unreadable(self, error: OSError) -> None:
        """Log once that the attempt's file cannot be read or cut: its writer (the task
        process) or its listener goes on, the output is what is lost."""
        if not self._warned:
            self._warned = True
            log.warning("task %s: its output file cannot be read or cut: %s", self.task_id,
                        error)


def _is_continuation(byte: int) -> bool:
    """A UTF-8 byte that is not the first of its character."""
    return 0x80 <= byte < 0xC0


def _continuations(data: bytes) -> int:
    """How many bytes at the head of ``data`` end a character begun before it (at most 3)."""
    count = 0
    while count < min(3, len(data)) and _is_continuation(data[count]):
        count += 1
    return count


def _cut(data: bytes, index: int, after: int) -> int:
    """Where to cut ``data`` at ``index`` or just before: the start of the UTF-8 character
    ``index`` falls inside, if that is after ``after`` (else ``index``: output that is not
    UTF-8 is cut anywhere)."""
    if index >= len(data):
        return len(data)
    cut = index
    while cut > max(after + 1, index - 3) and _is_continuation(data[cut]):
        cut -= 1
    return index if _is_continuation(data[cut]) else cut


def _whole(data: bytes) -> int:
    """The length of ``data`` without a last UTF-8 character that is not complete yet."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if not _is_continuation(byte):
            size = 2 if 0xC0 <= byte < 0xE0 else 3 if 0xE0 <= byte < 0xF0 else (
                4 if 0xF0 <= byte < 0xF8 else 1)
            return len(data) - back if size > back else len(data)
    return len(data)


def drop_if_empty(path: Path) -> None:
    """Once an attempt's process has ended: an attempt that wrote nothing leaves no file (a
    node running millions of quiet tasks would otherwise keep millions of empty files for
    ``keep`` seconds, and list them all at every cleanup). Never raises."""
    with contextlib.suppress(OSError):  # gone already, or not ours to remove: kept
        if path.stat().st_size == 0 and not path.with_name(path.name + ".1").exists():
            path.unlink()


def resumed_shipper(store: RedisStore, settings: TaskLogSettings, queue: str, task_id: str,
                    attempt: int | None, ttl_ms: int | None) -> Shipper | None:
    """A Shipper that goes on from where another one (the listener's, or the task process's)
    left the attempt in the task's stream: from its last entry's offset, its entries kept
    (the older ones go as it ships: the attempt keeps its last TAIL_BYTES); None when the
    attempt's output was ended (it is in the task's output tails, or an older stream's last
    entry is its end mark: nothing more to ship) or cannot be read."""
    try:
        tails, entries = store.outputs(task_id)
    except BluequeError as error:
        log.warning("task %s: output tail not shipped: %s", task_id, error)
        return None
    number = str(attempt or 0)
    if number in parse_tails(tails):
        return None
    ours = [(entry, fields) for entry, fields in entries if fields.get("attempt") == number]
    if ours and entries[-1] == ours[-1] and ours[-1][1].get("end") == "1":
        return None
    try:
        offset = int(ours[-1][1].get("offset") or 0) if ours else 0
    except ValueError:
        offset = 0
    kept = [(entry, len(fields.get("data", "").encode("utf-8", "replace")))
            for entry, fields in ours if fields.get("data")]
    return Shipper(store, settings, task_id, attempt, settings.path(queue, task_id, attempt),
                   ttl_ms, offset=offset, kept=kept)


def ship_rest(store: RedisStore, settings: TaskLogSettings, queue: str, task_id: str,
              attempt: int | None, ttl_ms: int | None) -> None:
    """After a task process died without reporting, what its listener had not shipped (its
    own shipments, or the process's once it read its own pipe): what the file holds beyond
    the stream's last entry, and the attempt's output ended."""
    shipper = resumed_shipper(store, settings, queue, task_id, attempt, ttl_ms)
    if shipper is not None:
        shipper.ship(end=True)
