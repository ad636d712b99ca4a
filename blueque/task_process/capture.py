"""A task process's stdout and stderr, kept to ``--log-max-bytes`` exactly (PROTOCOL.md 5.19).

The attempt's file was the task's fds 1 and 2, cut by the shipper every half second: a task
that wrote as fast as it could filled 200 MB against a 10 MB cap between two looks. Then fds
1 and 2 became a pipe read by a thread of the task process (1.5 ms of CPU per task, issue 20).
Now the pipe is the listener's to read (blueque.daemon.outputs): a listener's task process only
makes
the pipe its fds 1 and 2 and starts no thread. It keeps the read end without reading it, so
that the pipe outlives its listener: when that listener is gone (its death is signalled to it,
``TAKE_OVER``; or a frame finds it gone) the task process starts reading its own pipe only
then (``take_over``), writing the attempt's file and shipping its tail as its listener did.
``CappedFile`` is the file either side writes: never more than ``max_bytes``; at the cap the
file's content is shipped, moved to ``.1`` (replacing the one before) and the file starts again
empty. A writer faster than the disk waits on the full pipe; nothing it writes is lost but
what ``.1`` replaces.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from blueque.run_processes import libc_prctl
from blueque.tasklog import Shipper

log = logging.getLogger("blueque.child")

#: ``rotate(move)``: the file is full; ``move()`` moves it aside and opens a new one (the
#: shipper ships what the file holds first, and starts the new one from its head).
Rotate = Callable[[Callable[[], None]], None]

#: The signal a task process gets when its parent dies (PR_SET_PDEATHSIG): its listener, or
#: the fork server it was made by (6.8), whose children then come to the listener; it reads
#: its own output pipe from then on (5.19) only if its listener is gone.
TAKE_OVER = signal.SIGRTMIN + 6 if hasattr(signal, "SIGRTMIN") else signal.SIGUSR2
#: The signal of a listener that leaves its task processes running (--on-stop keep): they read
#: their own output pipes from then on.
LEAVING = signal.SIGRTMIN + 7 if hasattr(signal, "SIGRTMIN") else TAKE_OVER
_PR_SET_PDEATHSIG = 1


def _no_shipper(move: Callable[[], None]) -> None:
    move()


class CappedFile:
    """An attempt's output file, written up to ``max_bytes``; at the cap ``rotate`` moves it
    aside (``.1``) and a new one starts (``rotate``: a shipper's, which ships what it holds
    first). Raises OSError only when it cannot be opened."""

    def __init__(self, path: Path, max_bytes: int, rotate: Rotate | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.max_bytes = path, max(1, max_bytes)
        self._file = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
        self.size = os.fstat(self._file).st_size
        self.rotate: Rotate = rotate or _no_shipper

    def write(self, data: bytes) -> None:
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

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._file)


def pump(read: int, into: CappedFile | None, limit: int | None = None) -> tuple[int, bool]:
    """Move what the pipe ``read`` (non-blocking) holds into ``into`` (None: dropped), at most
    ``limit`` bytes: how many, and whether every writer is gone (end of file)."""
    moved = 0
    while limit is None or moved < limit:
        try:
            data = os.read(read, 1 << 16)
        except (BlockingIOError, InterruptedError):
            return moved, False
        except OSError:
            return moved, True
        if not data:
            return moved, True
        moved += len(data)
        if into is not None:
            into.write(data)
    return moved, False


# --- the task process's side ----------------------------------------------------------------
def capture(path: Path) -> None:
    """In the child: make ``path`` its stdout and stderr (fds 1 and 2), line-buffered, with
    no cap of its own (the shipper cuts it): for a task that keeps processes running past
    its end (``keep_processes``), whose writes would otherwise fill a pipe nobody reads."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
    _redirect(fd)


def _redirect(fd: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            with contextlib.suppress(ValueError):
                stream.reconfigure(line_buffering=True)


#: Makes the Shipper of the current attempt for a process reading its own pipe (its first
#: shipment resumes where the stream's last entry says: it reads Redis, in the reader thread).
ShipperFactory = Callable[[], Shipper | None]


class OwnPipe:
    """A task process's output pipe, its fds 1 and 2 (its listener reads the other end). It
    keeps the read end, unread, until ``take_over`` starts a thread that reads it. ``read``
    -1: no pipe, the process writes its file itself (``keep_processes``): the thread only
    ships it (and cuts it at the cap, blueque.tasklog)."""

    def __init__(self, read: int, path: Path, max_bytes: int) -> None:
        self.read, self.path, self.max_bytes = read, path, max_bytes
        if read >= 0:
            os.set_blocking(read, False)
        self.shipper_factory: ShipperFactory = lambda: None
        self.interval = 0.5
        self.file: CappedFile | None = None
        self.shipper: Shipper | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def take_over(self) -> None:
        """Read our own pipe from now on (the listener is gone): a thread writes what comes
        into the attempt's file, capped, and ships it every ``interval``. Idempotent; safe
        in a signal handler (it starts a thread, nothing more)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="blueque-orphan-output",
                                            daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        with self._lock:
            self.shipper = self.shipper_factory()
            if self.read >= 0:
                with contextlib.suppress(OSError):
                    self.file = CappedFile(self.path, self.max_bytes,
                                           self.shipper.rotate if self.shipper else None)
        due, open_ = time.monotonic() + self.interval, self.read >= 0
        poller = select.poll()  # not select(): the listener's pipe may be past fd 1023
        if open_:
            poller.register(self.read, select.POLLIN)
        while not self._stop.is_set():
            if open_:
                with contextlib.suppress(InterruptedError, OSError):
                    # at most 0.1 s: end() waits for this thread
                    poller.poll(min(0.1, max(0.0, due - time.monotonic())) * 1000)
                with self._lock:
                    open_ = not pump(self.read, self.file)[1]
            else:
                self._stop.wait(max(0.0, due - time.monotonic()))
            if time.monotonic() >= due and self.shipper is not None:
                self.shipper.ship()
                with contextlib.suppress(OSError):  # a quiet attempt's file is not an old one
                    os.utime(self.path)
                due = time.monotonic() + self.interval

    def pump(self) -> None:
        if self._thread is not None and self.read >= 0:
            with self._lock:
                pump(self.read, self.file)

    def end(self) -> Shipper | None:
        """Once the attempt is over, in a process that records itself: stop the thread, take
        what the pipe holds into the file; the attempt's Shipper (None: none could be made),
        for the end mark."""
        if self._thread is None:
            return None
        self._stop.set()
        self._thread.join(timeout=5)
        with self._lock:
            if self.read >= 0:
                pump(self.read, self.file)
            if self.file is not None:
                self.file.close()
            return self.shipper


#: this task process's output pipe (None: not captured through one)
current: OwnPipe | None = None


def capture_attempt(path: Path, max_bytes: int, keep_processes: bool,
                    pipe: tuple[int, int] | None = None) -> bool:
    """In a task process: its attempt's output. Through the listener's ``pipe`` (the first
    attempt) or the same pipe as before (a warm process's next: the listener moves to the new
    file), but for a task that keeps its processes past its end (they would write to a pipe
    nobody reads then): the file itself. Without a listener's pipe, a pipe of its own, for the
    caller to ``take_over`` (a process that records itself). The listener opens the file of
    what comes through its pipe (and says so when it cannot). False: the file cannot be
    opened, and the output goes to /dev/null."""
    global current
    try:
        if keep_processes:
            close_pipe(pipe)
            capture(path)
            if current is not None and current.read >= 0:
                os.close(current.read)
            current = OwnPipe(-1, path, max_bytes)  # shipped by itself only once orphaned
        elif pipe is not None or current is None:
            read, write = pipe or os.pipe()
            if pipe is None:  # read by this process only: the file must open now
                CappedFile(path, max_bytes).close()
            _redirect(write)
            current = OwnPipe(read, path, max_bytes)
        else:
            flush()
            current.path = path  # a warm process's next attempt (PROTOCOL.md 6.7)
    except OSError as error:  # a full or read-only disk must not stop the task
        log.error("output not captured to %s (%s): it is dropped, never mixed into the "
                  "listener's log", path, error)
        capture(Path(os.devnull))
        return False
    return True


def close_pipe(pipe: tuple[int, int] | None) -> None:
    for fd in pipe or ():
        with contextlib.suppress(OSError):
            os.close(fd)


def watch_listener(listener: int = -1) -> None:
    """In a task process, first thing: TAKE_OVER when its parent dies (its listener, whose
    read end of our pipe goes with it, or its fork server), LEAVING when its listener tells it
    so. ``listener``: our socket to the listener, by which TAKE_OVER tells a dead listener
    from a dead fork server (-1: none; the parent is the listener). One that died before this
    was set is found by the caller (``ParentLink.peer_closed``)."""
    global _listener
    _listener = listener
    signal.signal(TAKE_OVER, _parent_died)
    signal.signal(LEAVING, _taken_over)
    prctl = libc_prctl()  # looked up by our listener or fork server: inherited
    if prctl is not None:
        prctl(_PR_SET_PDEATHSIG, int(TAKE_OVER), 0, 0, 0)


_gone = False  # the listener is gone: TAKE_OVER (with the listener gone) or LEAVING came
_listener = -1  # our socket to the listener (watch_listener)


def _parent_died(signum: int, frame: object) -> None:
    """Our parent died. A fork server's children come to the listener, which still reads
    their pipes: only a listener gone (its end of our socket closed) leaves them to us. The
    signal comes again when the listener, our parent then, dies."""
    if _listener >= 0 and _peer_open(_listener):
        return
    _taken_over(signum, frame)


def _peer_open(fd: int) -> bool:
    """Whether the other end of socket ``fd`` is open: polled, nothing read, no flag changed
    (the main thread may be waiting on it)."""
    poller = select.poll()
    closed = select.POLLHUP | select.POLLERR | select.POLLNVAL | getattr(select, "POLLRDHUP", 0)
    poller.register(fd, select.POLLIN | getattr(select, "POLLRDHUP", 0))
    try:
        return not any(event & closed for _, event in poller.poll(0))
    except OSError:
        return False


def _taken_over(signum: int, frame: object) -> None:
    global _gone
    _gone = True
    take_over()


def listener_gone() -> bool:
    """TAKE_OVER came (before the pipe was ours to read, too)."""
    return _gone


def take_over() -> None:
    """The listener is gone: this process reads its own pipe from now on."""
    if current is not None:
        current.take_over()


def flush() -> None:
    """Python's streams into the pipe (a last line without its newline is output too); in a
    process reading its own pipe, what the pipe holds into the file."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or broken by the task
            stream.flush()
    if current is not None:
        current.pump()


def _forked() -> None:
    """A process the task forks reads no pipe (its writes go through the pipe as its
    parent's do) and takes nothing over."""
    global current, _gone
    current, _gone = None, False


os.register_at_fork(after_in_child=_forked)
