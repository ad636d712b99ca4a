"""The socket between a listener and each task process it forks (PROTOCOL.md 6.2), and the
exit codes of that process: the contract both sides speak.

The listener records a run's start, progress and outcome; the task process tells it what
happened in frames: a 4-byte big-endian length, then that many bytes of one JSON object, each
kind declared below as a TypedDict (one key names the kind).

- listener -> child (``ToChild``): ``Go`` ``{"go": fields, "defaults": queue defaults}`` (the
  task is started: run it), ``Stop`` ``{"stop": why}`` (do not run it), ``Preempt``
  ``{"preempt": deadline}`` (its node goes away at that local Unix time; sent just before a
  SIGUSR1), ``Recorded`` ``{"recorded": status}`` (your outcome is recorded: exit); to a
  warm process (6.7), after ``Recorded``: ``Assign`` ``{"task": id, "queue": queue}`` (your
  next task: wait for its word) or ``Retire`` ``{"retire": why}`` (exit);
- child -> listener (``ToListener``): any number of ``Progress`` ``{"progress": fraction,
  "message": text}``, then one ``Reported`` ``{"outcome": "complete" | "failed" |
  "preempted", "text", "traceback", "retry"}`` (its output is in its pipe by then: the
  listener reads it there, PROTOCOL.md 5.19; an ``"output"`` a child of an older version
  sent is ignored).

The listener's end (``ChildChannel``) never blocks: it is read and written from the
listener's select loop. The child's end (``ParentLink``) blocks: the child has nothing else to
do while it waits for its listener, and a listener that is gone shows as end of file.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections.abc import Mapping
from typing import Any, TypedDict, cast, final

from blueque.endings import Ran

HEADER = struct.Struct(">I")
#: Bytes read per recv; a frame may span many.
READ_SIZE = 256 * 1024

#: Exit codes of a task process; anything else (or a signal) means it died without reporting.
EXIT_REPORTED = 0
EXIT_NOT_STARTED = 3  # the task could not be started (cancelled, superseded): nothing ran
EXIT_REPORT_FAILED = 4  # ran, but its outcome could not be recorded (see the log)


# --- listener -> child ----------------------------------------------------------------------
@final
class GoFrame(TypedDict):
    """The word: the task is started for this child (its fields as the stamp left them, and
    its queue's defaults): run it."""

    go: dict[str, str]
    defaults: dict[str, str]


@final
class StopFrame(TypedDict):
    """Do not run the task (why: refused by the stamp, the listener leaving...)."""

    stop: str


@final
class PreemptFrame(TypedDict):
    """The child's node goes away at ``preempt`` (local Unix time); a SIGUSR1 follows."""

    preempt: float


@final
class RecordedFrame(TypedDict):
    """The child's outcome is recorded (the status written, "" if refused): it may exit."""

    recorded: str


@final
class AssignFrame(TypedDict):
    """To a warm process whose outcome is recorded (6.7): its next task (wait for its word)."""

    task: str
    queue: str


@final
class RetireFrame(TypedDict):
    """To a warm process whose outcome is recorded (6.7): take no other task, exit (why)."""

    retire: str


#: What a listener sends its child.
ToChild = GoFrame | StopFrame | PreemptFrame | RecordedFrame | AssignFrame | RetireFrame


# --- child -> listener ----------------------------------------------------------------------
@final
class ProgressFrame(TypedDict):
    """The task's latest progress (0 to 1) and message, for the listener to write."""

    progress: float
    message: str


@final
class OutcomeFrame(TypedDict):
    """What the task function came to (the child's last frame): its outcome, its result or
    error text, traceback, and whether a failure may be retried."""

    outcome: Ran
    text: str
    traceback: str | None
    retry: bool


#: What a child sends its listener.
ToListener = ProgressFrame | OutcomeFrame


def encode(message: Mapping[str, object]) -> bytes:
    body = json.dumps(message, separators=(",", ":")).encode("utf-8")
    return HEADER.pack(len(body)) + body


class FrameReader:
    """Splits a byte stream into frames as it arrives (the listener's non-blocking reads)."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buffer += data
        frames = []
        while len(self._buffer) >= HEADER.size:
            (size,) = HEADER.unpack_from(self._buffer)
            end = HEADER.size + size
            if len(self._buffer) < end:
                break
            body = bytes(self._buffer[HEADER.size:end])
            del self._buffer[:end]
            message = json.loads(body)
            if isinstance(message, dict):
                frames.append(message)
        return frames


class ChildChannel:
    """The listener's end of one child's socket: non-blocking, read and written by its loop.

    ``receive`` returns the frames that arrived; ``send`` queues a frame and writes what the
    socket takes now, ``flush`` the rest when the loop finds the socket writable. Once the
    child is gone (end of file, a reset) the channel is ``closed`` and sends are dropped."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.closed = False
        self._reader = FrameReader()
        self._outbox = bytearray()

    def fileno(self) -> int:
        return self.sock.fileno()

    @property
    def wants_write(self) -> bool:
        return bool(self._outbox) and not self.closed

    def send(self, message: ToChild) -> None:
        if self.closed:
            return
        self._outbox += encode(message)
        self.flush()

    def flush(self) -> None:
        while self._outbox and not self.closed:
            try:
                sent = self.sock.send(self._outbox)
            except BlockingIOError:
                return
            except OSError:  # the child is gone: nobody to tell
                self._gone()
                return
            del self._outbox[:sent]

    def receive(self) -> list[ToListener]:
        """The frames that arrived, as the child declares them (a reader still checks the
        values it uses: a task process may be anything)."""
        frames: list[ToListener] = []
        while not self.closed:
            try:
                data = self.sock.recv(READ_SIZE)
            except BlockingIOError:
                break
            except OSError:
                self._gone()
                break
            if not data:
                self._gone()
                break
            try:
                frames += cast(list[ToListener], self._reader.feed(data))
            except ValueError:  # not our frames: the child is not a Blueque task process
                self._gone()
        return frames

    def _gone(self) -> None:
        self.closed = True
        self._outbox.clear()

    def close(self) -> None:
        self._gone()
        self.sock.close()


class ParentLink:
    """The child's end: blocking frames to and from its listener. A listener that is gone
    (end of file, EPIPE) or does not take or give a frame within ``patience`` seconds (it is
    frozen: its lease runs out meanwhile, and its task may be taken back) counts as gone for
    good: ``send`` returns False and ``receive`` None; they never raise."""

    def __init__(self, sock: socket.socket, patience: float) -> None:
        self._sock = sock
        self._patience = patience
        sock.settimeout(patience)
        self._lock = threading.Lock()  # one writer at a time: the progress thread and main
        self._reader = FrameReader()
        self._ready: list[ToChild] = []  # frames read, not yet taken
        self.gone = False
        #: gone because the listener's end was closed (end of file, a reset): it died or let
        #: us go; not merely silent past our patience (it may be frozen and come back)
        self.hung_up = False

    def send(self, message: ToListener) -> bool:
        data = encode(message)
        with self._lock:
            if self.gone:
                return False
            try:
                self._sock.sendall(data)
            except OSError:  # a timeout too: a frame cut short leaves the stream unusable
                self.gone = True
                return False
        return True

    def receive(self, forever: bool = False) -> ToChild | None:
        """The next frame; None if the listener is gone or says nothing within the link's
        patience (``forever``: only end of file ends the wait)."""
        if self.gone:
            return None
        self._sock.settimeout(None if forever else self._patience)
        try:
            return self._receive()
        finally:
            self._sock.settimeout(self._patience)

    def _receive(self) -> ToChild | None:
        while True:
            if self._ready:
                return self._ready.pop(0)
            try:
                data = self._sock.recv(READ_SIZE)
            except TimeoutError:  # the listener is frozen, or gone
                data = None
            except OSError:  # a reset: gone
                data = b""
            if not data:
                self.gone, self.hung_up = True, data is not None
                return None
            try:
                self._ready += cast(list[ToChild], self._reader.feed(data))
            except ValueError:
                self.gone = True
                return None

    def pending(self) -> list[ToChild]:
        """Frames that have arrived, read without waiting (a notice sent with a signal);
        a frame that has only partly arrived stays for the next read."""
        if self.gone:
            return []
        self._sock.setblocking(False)
        try:
            while True:
                data = self._sock.recv(READ_SIZE)
                if not data:
                    self.gone = True
                    break
                self._ready += cast(list[ToChild], self._reader.feed(data))
        except (BlockingIOError, ValueError, OSError):
            pass
        finally:
            self._sock.settimeout(self._patience)
        frames, self._ready = self._ready, []
        return frames

    def peer_closed(self) -> bool:
        """Whether the listener's end is closed with nothing left to read (it died), seen
        without waiting and without taking a frame."""
        self._sock.setblocking(False)  # with a timeout, recv would wait for data first
        try:
            return self._sock.recv(1, socket.MSG_PEEK) == b""
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True
        finally:
            self._sock.settimeout(self._patience)

    def close(self) -> None:
        self.gone = True
        self._sock.close()
