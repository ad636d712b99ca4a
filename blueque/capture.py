"""A task process's stdout and stderr, kept to ``--log-max-bytes`` exactly (PROTOCOL.md 5.19).

The attempt's file was the task's fds 1 and 2, cut by the shipper every half second: a task
that wrote as fast as it could filled 200 MB against a 10 MB cap between two looks. Now fds 1
and 2 are a pipe, and a thread of the task process writes what comes through it to the file:
never more than ``max_bytes``; at the cap the file's content is shipped, moved to ``.1``
(replacing the one before) and the file starts again empty. A writer faster than the disk
waits on the full pipe; nothing it writes is lost but what ``.1`` replaces.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import select
import sys
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("blueque.child")

#: ``rotate(move)``: the file is full; ``move()`` moves it aside and opens a new one (the
#: shipper ships what the file holds first, and starts the new one from its head).
Rotate = Callable[[Callable[[], None]], None]


def _no_shipper(move: Callable[[], None]) -> None:
    move()


class CappedOutput:
    """Make ``path`` the process's stdout and stderr through a pipe, capped at ``max_bytes``
    per file. ``drain()`` writes everything written so far to the file (before the attempt's
    end is shipped, and before the process leaves)."""

    def __init__(self, path: Path, max_bytes: int,
                 pipe: tuple[int, int] | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.max_bytes = path, max(1, max_bytes)
        self._file = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
        self.size = os.fstat(self._file).st_size
        self.rotate: Rotate = _no_shipper
        self._lock = threading.Lock()
        # the listener's pipe (it keeps a read end: what a crash leaves in it is not lost)
        read, write = pipe or os.pipe()
        os.set_blocking(read, False)
        self._read = read
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(write, 1)
        os.dup2(write, 2)
        os.close(write)
        _line_buffered()
        self._thread = threading.Thread(target=self._loop, name="blueque-capture", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        open_ = True
        while open_:
            with contextlib.suppress(InterruptedError):
                select.select([self._read], [], [], 1.0)
            with self._lock:
                open_ = self._pump()

    def _pump(self) -> bool:
        """Write what the pipe holds to the file; False once every writer is gone."""
        while True:
            try:
                data = os.read(self._read, 1 << 16)
            except BlockingIOError:
                return True
            except OSError:
                return False
            if not data:
                return False
            self._write(data)

    def _write(self, data: bytes) -> None:
        while data:
            room = self.max_bytes - self.size
            if room <= 0:
                self.rotate(self._move)
                continue
            part, data = data[:room], data[room:]
            try:
                written = os.write(self._file, part)
            except OSError:  # a full disk: this output is lost, the task goes on
                return
            self.size += written
            data = part[written:] + data

    def _move(self) -> None:
        """The full file moves to ``.1`` (replacing the older one); a new one starts."""
        try:
            os.replace(self.path, self.path.with_name(self.path.name + ".1"))
        except OSError:  # gone or not movable: the output starts it again
            with contextlib.suppress(OSError):
                os.truncate(self._file, 0)
        else:
            with contextlib.suppress(OSError):
                new = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
                os.close(self._file)
                self._file = new
        self.size = 0

    def switch(self, path: Path) -> None:
        """A warm process's next attempt (PROTOCOL.md 6.7): what the pipe holds goes to the
        file of the attempt before; from now on the output goes to ``path``."""
        self.drain()
        path.parent.mkdir(parents=True, exist_ok=True)
        new = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
        with self._lock:
            os.close(self._file)
            self._file, self.path = new, path
            self.size = os.fstat(new).st_size
            self.rotate = _no_shipper

    def drain(self) -> None:
        """Flush Python's streams and write what the pipe holds to the file, now."""
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # closed or broken by the task
                stream.flush()
        with self._lock:
            self._pump()


def drain_ended(read: int, path: Path, max_bytes: int) -> None:
    """In the listener, once a task process has ended: what it wrote last and its reader
    thread had not taken (a crash, a SIGKILL, ``os._exit``) goes to its file, within the cap
    (beyond it, dropped). Closes ``read``; never raises."""
    try:
        with contextlib.suppress(OSError), open(path, "ab") as handle:
            room = max_bytes - handle.tell()
            while True:
                try:
                    data = os.read(read, 1 << 16)
                except (BlockingIOError, InterruptedError):
                    break
                if not data:
                    break
                if room > 0:
                    handle.write(data[:room])
                    room -= len(data[:room])
    finally:
        with contextlib.suppress(OSError):
            os.close(read)


def capture(path: Path) -> None:
    """In the child: make ``path`` its stdout and stderr (fds 1 and 2), line-buffered, with
    no cap of its own (the shipper cuts it): for a task that keeps processes running past
    its end (``keep_processes``), whose writes a pipe read by the task process would lose."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    _line_buffered()


def _line_buffered() -> None:
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            with contextlib.suppress(ValueError):
                stream.reconfigure(line_buffering=True)


#: this task process's capped output, drained before its attempt's end is shipped
current: CappedOutput | None = None


def capture_attempt(path: Path, max_bytes: int, keep_processes: bool,
                    pipe: tuple[int, int] | None = None) -> bool:
    """In a task process: its attempt's file as stdout and stderr, capped exactly through a
    pipe, but for a task that keeps its processes past its end (they would write to a pipe
    nobody reads). False: the file cannot be opened, and the output goes to /dev/null."""
    global current
    try:
        if current is not None and pipe is None and not keep_processes:
            current.switch(path)  # a warm process's next attempt: the same pipe
        elif keep_processes:
            for fd in pipe or ():
                os.close(fd)
            capture(path)
        else:
            current = CappedOutput(path, max_bytes, pipe)
    except OSError as error:  # a full or read-only disk must not stop the task
        log.error("output not captured to %s (%s): it is dropped, never mixed into the "
                  "listener's log", path, error)
        capture(Path(os.devnull))
        return False
    return True


def drain() -> None:
    """What the task process wrote so far, into its file (before its end is shipped)."""
    if current is not None:
        current.drain()


def _forked() -> None:
    """A process the task forks has no reader thread (its lock may have been held at the
    fork): its writes go through the pipe to its parent's, and it drains nothing itself."""
    global current
    current = None


os.register_at_fork(after_in_child=_forked)
