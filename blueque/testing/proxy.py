"""A TCP proxy on loopback that makes a Redis far away: each chunk of bytes is forwarded after
an added delay (in each direction, so a round trip gains twice ``delay``), at most
``bandwidth`` bytes a second, and the link can be cut (every connection dropped, new ones
refused) and restored. For tests of slow links and cut-off nodes:

    with DelayingProxy(server.port, delay=0.15) as proxy:   # +300 ms per round trip
        client = blueque.Client(proxy.url())
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time
from types import TracebackType

__all__ = ["DelayingProxy"]


class DelayingProxy:
    def __init__(self, upstream_port: int, delay: float = 0.0, bandwidth: float | None = None,
                 upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.delay = delay
        #: bytes a second in each direction (None: unlimited)
        self.bandwidth = bandwidth
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        self._accepting = threading.Thread(target=self._accept, args=(self._server,),
                                           daemon=True)
        self._accepting.start()

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def cut(self) -> None:
        """The link goes: every connection is dropped and new ones are refused. The port stays
        ours meanwhile (bound, not listening: a connect is refused), so that no other socket's
        ephemeral port takes it before ``restore`` (seen once in CI: EADDRINUSE)."""
        with contextlib.suppress(OSError):  # wakes the thread in accept(), which holds it
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        if not self._closed:  # after the connections on the port are gone
            self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._server.bind(("127.0.0.1", self.port))

    def restore(self) -> None:
        """The link is back: connections are accepted again on the same port."""
        self._server.listen()
        threading.Thread(target=self._accept, args=(self._server,), daemon=True).start()

    def close(self) -> None:
        self._closed = True
        self.cut()

    def __enter__(self) -> DelayingProxy:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return  # cut or closed
            try:
                upstream = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
            for source, target in ((client, upstream), (upstream, client)):
                chunks: queue.Queue[tuple[float, bytes]] = queue.Queue()
                threading.Thread(target=self._read, args=(source, chunks), daemon=True).start()
                threading.Thread(target=self._send, args=(target, chunks), daemon=True).start()

    def _read(self, source: socket.socket, chunks: queue.Queue[tuple[float, bytes]]) -> None:
        try:
            while data := source.recv(65536):
                chunks.put((time.monotonic() + self.delay, data))
        except OSError:
            pass
        chunks.put((0.0, b""))  # the end: the sender closes its side

    def _send(self, target: socket.socket, chunks: queue.Queue[tuple[float, bytes]]) -> None:
        try:
            while True:
                due, data = chunks.get()
                if not data:
                    break
                time.sleep(max(0.0, due - time.monotonic()))
                target.sendall(data)
                if self.bandwidth:
                    time.sleep(len(data) / self.bandwidth)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_RDWR)
        target.close()
