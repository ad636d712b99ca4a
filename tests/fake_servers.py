"""Servers on the Redis port that are not (a recent enough) Redis, for the bad-URL tests: each
runs in a thread on a free loopback port and answers what a real one would."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from types import TracebackType

from blueque.testing import free_port

Answer = Callable[[list[bytes]], bytes]


def _read_command(reader: socket.SocketIO | object) -> list[bytes] | None:
    """One RESP command (an array of bulk strings) from a buffered socket file."""
    header = reader.readline()  # type: ignore[attr-defined]
    if not header.startswith(b"*"):
        return None
    arguments = []
    for _ in range(int(header[1:])):
        length = int(reader.readline()[1:])  # type: ignore[attr-defined]
        arguments.append(reader.read(length + 2)[:-2])  # type: ignore[attr-defined]
    return arguments


def old_redis(version: str) -> Answer:
    """A Redis of ``version``: Redis 6.0 and 6.1 know HELLO but not LMOVE; 5 knows neither
    (and quotes unknown commands with backquotes, as Redis 5 does)."""

    def answer(command: list[bytes]) -> bytes:
        name = command[0].upper()
        if name == b"HELLO" and not version.startswith("5."):
            return (b"%3\r\n+server\r\n+redis\r\n+version\r\n+" + version.encode()
                    + b"\r\n+proto\r\n:3\r\n")
        if name in (b"CLIENT", b"SELECT"):
            return b"+OK\r\n"
        if name == b"PING":
            return b"+PONG\r\n"
        if name == b"INFO":
            text = f"# Server\r\nredis_version:{version}\r\n".encode()
            return b"$%d\r\n%s\r\n" % (len(text), text)
        quote = b"`" if version.startswith("5.") else b"'"
        return b"-ERR unknown command " + quote + command[0] + quote + b"\r\n"

    return answer


class FakeServer:
    """``with FakeServer(answer) as server: server.url``; ``answer=None`` speaks HTTP."""

    def __init__(self, answer: Answer | None = None) -> None:
        self.answer = answer
        self.port = free_port()
        self._socket = socket.create_server(("127.0.0.1", self.port))
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self._socket.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._talk, args=(connection,), daemon=True).start()

    def _talk(self, connection: socket.socket) -> None:
        with connection, connection.makefile("rb") as reader:
            try:
                while True:
                    command = _read_command(reader)
                    if command is None or self.answer is None:
                        connection.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                        return
                    connection.sendall(self.answer(command))
            except (OSError, ValueError):
                return

    def __enter__(self) -> FakeServer:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._socket.close()


class FreezingProxy:
    """A loopback TCP proxy to Redis whose established connections can be frozen: bytes stop
    flowing both ways but no side sees a close, as when a NAT or load balancer drops an idle
    connection's state. New connections still pass."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.frozen: set[socket.socket] = set()
        self.sockets: list[socket.socket] = []
        self.closing = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closing:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            self.sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        while not self.closing:
            try:
                data = source.recv(65536)
                if not data:
                    break
                if source not in self.frozen:
                    sink.sendall(data)
            except OSError:
                break

    def freeze(self) -> None:
        self.frozen.update(self.sockets)

    def close(self) -> None:
        self.closing = True
        for sock in [self.listener, *self.sockets]:
            sock.close()
