"""The asyncio client's script calls on a connection of its own, read by an asyncio protocol.

redis-py's asyncio connection reads a reply through a stream reader and, with a socket timeout
(Blueque's clients have one), wraps every write and every read in ``asyncio.wait_for``: a task
each, on top of the task that sends a batch. An awaited enqueue went round the event loop
about seven times and cost 2 to 3.5 times the sync client's CPU (issue 33). Here the
connection's bytes go to an ``asyncio.Protocol`` as they arrive: a call writes its command (the
calls made while others are in flight, in one write at the next turn of the loop) and awaits a
future that the protocol settles in the order Redis answers. One turn of the loop to read the
reply, one to resume the caller.

The connection is made and set up by redis-py (its connection class and settings: address,
TLS, AUTH, the database, the client name, Sentinel's master lookup), then taken over: its
transport is given to the protocol and the redis-py connection no longer owns it. Replies are
parsed by hiredis where it is installed (the ``fast`` extra), by ``Replies`` otherwise; errors
come out as redis-py's exception classes (``NOSCRIPT`` as ``NoScriptError``...).

What a caller sees when things go wrong: a connection lost with replies outstanding fails every
waiting call with ``ConnectionError`` (each script call is idempotent on a repeat, PROTOCOL.md
9: the store's retry sends it again on a new connection); a reply that takes longer than the
socket timeout fails them all with ``TimeoutError`` and closes the connection. A cancelled
caller stops waiting; its reply is read and dropped, so the connection stays in step.
"""

from __future__ import annotations

import asyncio
import importlib
from collections import deque
from typing import Any

import redis
from redis._parsers.base import BaseParser

hiredis: Any
try:  # the fast extra (imported by name: type checks need not have it installed)
    hiredis = importlib.import_module("hiredis")
except ImportError:  # not installed: Replies parses
    hiredis = None


#: A Redis error reply as redis-py's exception class (NOSCRIPT: NoScriptError...).
parse_error: Any = BaseParser.parse_error


class Unusable(Exception):
    """This connection cannot be taken over (a redis-py that keeps its stream elsewhere):
    the caller sends the ordinary way."""


#: What ``gets`` answers while no reply is whole.
INCOMPLETE: Any = object()


class Replies:
    """Replies parsed from the bytes as they come, in RESP2 or RESP3 (what a script and the
    commands Blueque sends can answer): hiredis.Reader's ``feed`` and ``gets`` (False while a
    reply is incomplete: INCOMPLETE, as RESP3's false is False), for when hiredis is not
    installed."""

    def __init__(self, encoding: str | None, errors: str) -> None:
        self._buffer = bytearray()
        self._encoding = encoding
        self._errors = errors

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def gets(self) -> Any:
        try:
            reply, end = self._parse(0)
        except _Incomplete:
            return INCOMPLETE
        del self._buffer[:end]
        return reply

    def _parse(self, at: int) -> tuple[Any, int]:
        buffer = self._buffer
        line_end = buffer.find(b"\r\n", at)
        if line_end < 0:
            raise _Incomplete
        kind, line, at = chr(buffer[at]), bytes(buffer[at + 1:line_end]), line_end + 2
        if kind in "$=!":  # a bulk string, verbatim string, bulk error
            return self._bulk(kind, int(line), at)
        if kind in "*~%>":  # an array, set, map, push message
            count = int(line)
            if count < 0:
                return None, at
            items = []
            for _ in range(count * 2 if kind == "%" else count):
                item, at = self._parse(at)
                items.append(item)
            if kind == "%":
                return dict(zip(items[::2], items[1::2], strict=True)), at
            return (Push(items) if kind == ">" else items), at
        if kind in SIMPLE:
            return SIMPLE[kind](self, line), at
        raise redis.exceptions.InvalidResponse(f"Protocol error, got {kind!r} as reply type")

    def _bulk(self, kind: str, size: int, at: int) -> tuple[Any, int]:
        if size < 0:
            return None, at
        if len(self._buffer) < at + size + 2:
            raise _Incomplete
        data, at = bytes(self._buffer[at:at + size]), at + size + 2
        if kind == "!":
            return parse_error(data.decode("utf-8", "replace")), at
        return self._text(data[4:] if kind == "=" else data), at  # "=": "txt:" first

    def _text(self, data: bytes) -> Any:
        return data if self._encoding is None else data.decode(self._encoding, self._errors)


#: The one-line replies: what each type's line is read as.
SIMPLE: dict[str, Any] = {
    ":": lambda _, line: int(line),
    "(": lambda _, line: int(line),
    ",": lambda _, line: float(line),
    "#": lambda _, line: line == b"t",
    "_": lambda _, line: None,
    "+": Replies._text,
    "-": lambda _, line: parse_error(line.decode("utf-8", "replace")),
}


class _Incomplete(Exception):
    pass


class Push(list[Any]):
    """A RESP3 push message (no call's reply: skipped)."""


#: What a push message is parsed as, by Replies and by hiredis.
PUSHES: tuple[type, ...] = (Push, *([hiredis.PushNotification]
                                    if hasattr(hiredis, "PushNotification") else []))


class Wire(asyncio.Protocol):
    """One taken-over connection: ``call`` writes a packed command and returns the future of
    its reply (an error reply as its exception)."""

    def __init__(self, writer: asyncio.StreamWriter, replies: Any, timeout: float | None,
                 where: str) -> None:
        #: kept: a StreamWriter that is collected closes its transport
        self._writer = writer
        self._transport = writer.transport
        self._replies = replies
        self._timeout = timeout
        self._where = where
        self._loop = asyncio.get_running_loop()
        #: the futures of the calls written and not answered, with when each was written
        self._waiting: deque[tuple[float, asyncio.Future[Any]]] = deque()
        self._unwritten: list[bytes] = []
        self._timer: asyncio.TimerHandle | None = None
        self.lost: Exception | None = None

    def call(self, packed: bytes) -> asyncio.Future[Any]:
        """Write a command (in the Redis protocol); its reply's future. Nothing in flight:
        written at once; else with the others of this turn of the loop, in one write."""
        future: asyncio.Future[Any] = self._loop.create_future()
        if self.lost is not None:
            future.set_exception(self.lost)
            return future
        if not self._waiting:
            self._transport.write(packed)
            if self._timeout and self._timer is None:
                self._timer = self._loop.call_later(self._timeout, self._expire)
        else:
            if not self._unwritten:
                self._loop.call_soon(self._write)
            self._unwritten.append(packed)
        self._waiting.append((self._loop.time(), future))
        return future

    def _write(self) -> None:
        if self._unwritten and self.lost is None:
            self._transport.write(b"".join(self._unwritten))
        self._unwritten = []

    def data_received(self, data: bytes) -> None:
        self._replies.feed(data)
        try:
            while (reply := self._replies.gets()) is not INCOMPLETE:
                if isinstance(reply, PUSHES):  # not a reply: RESP3 pushes come unasked
                    continue
                _, future = self._waiting.popleft()
                if future.done():  # its caller was cancelled: the reply is dropped
                    continue
                if isinstance(reply, Exception):
                    future.set_exception(reply)
                else:
                    future.set_result(reply)
        except (redis.exceptions.InvalidResponse, IndexError) as error:
            self._lose(redis.exceptions.ConnectionError(
                f"Protocol error from {self._where}: {error}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self._lose(redis.exceptions.ConnectionError(
            f"Connection to {self._where} closed" + (f": {exc}" if exc else "")))

    def _expire(self) -> None:
        self._timer = None
        if not self._waiting or self.lost is not None:
            return
        assert self._timeout
        left = self._waiting[0][0] + self._timeout - self._loop.time()
        if left <= 0:
            self._lose(redis.exceptions.TimeoutError(
                f"Timeout reading from {self._where} ({self._timeout:g} s)"))
        else:
            self._timer = self._loop.call_later(left, self._expire)

    def _lose(self, error: Exception) -> None:
        if self.lost is None:
            self.lost = error
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._transport.close()
        while self._waiting:
            _, future = self._waiting.popleft()
            if not future.done():
                future.set_exception(error)

    def close(self) -> None:
        """Close the connection; calls still waiting fail with ConnectionError."""
        self._lose(redis.exceptions.ConnectionError(f"Connection to {self._where} closed"))


async def open_wire(connection: Any, where: str) -> Wire:
    """Connect ``connection`` (a redis-py asyncio connection not yet connected), then take its
    transport over; ``Unusable`` when it cannot be (the connection is closed then)."""
    await connection.connect()
    writer = getattr(connection, "_writer", None)
    reader = getattr(connection, "_reader", None)
    buffered = getattr(reader, "_buffer", None)
    if not isinstance(writer, asyncio.StreamWriter) or buffered is None or len(buffered):
        await connection.disconnect()
        raise Unusable(f"a {type(connection).__name__} cannot be read by blueque.aio's wire")
    encoder = connection.encoder
    encoding = encoder.encoding if encoder.decode_responses else None
    replies: Any
    if hiredis is not None and (str(connection.protocol) != "3"
                                or hasattr(hiredis, "PushNotification")):
        replies = hiredis.Reader(protocolError=redis.exceptions.InvalidResponse,
                                 replyError=parse_error,
                                 notEnoughData=INCOMPLETE, encoding=encoding,
                                 errors=encoder.encoding_errors)
    else:
        replies = Replies(encoding, encoder.encoding_errors)
    wire = Wire(writer, replies, connection.socket_timeout, where)
    writer.transport.set_protocol(wire)
    connection._writer = connection._reader = None  # redis-py no longer owns the transport
    return wire
