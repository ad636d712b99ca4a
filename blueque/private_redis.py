"""A private redis-server on a free loopback port: ``blueque demo`` and the Spark example run
on one when no Redis URL is given, and ``blueque.testing`` (the test helpers) builds on it.

It never touches the machine's own Redis: it picks a free port, keeps its files in a temporary
directory, persists nothing unless asked to, and is stopped by pid.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType

from blueque.errors import ConfigurationError, RedisUnavailable
from blueque.process import kill_process, stop_process


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


__all__ = ["RedisServer", "free_port", "kill_process", "stop_process"]


@dataclass
class RedisServer:
    """A redis-server child process; use as a context manager or call start()/stop()."""

    port: int = 0
    extra_args: Sequence[str] = ()
    directory: str | None = None
    executable: str = "redis-server"
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)
    _own_directory: bool = field(default=False, init=False)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        assert self.process is not None, "server not started"
        return self.process.pid

    def start(self, timeout: float = 10.0) -> RedisServer:
        path = shutil.which(self.executable)
        if path is None:
            raise ConfigurationError(
                f"{self.executable} not found on PATH: install it (Debian: apt-get install "
                "redis-server) or pass a Redis URL"
            )
        if not self.port:
            self.port = free_port()
        if self.directory is None:
            self.directory = tempfile.mkdtemp(prefix="blueque-redis-")
            self._own_directory = True
        args = [
            path, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.directory,
            "--save", "", "--appendonly", "no", "--daemonize", "no",
            "--logfile", os.path.join(self.directory, "redis.log"),
            *self.extra_args,
        ]
        self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RedisUnavailable(f"redis-server on port {self.port} did not start")
            time.sleep(0.01)
        return self

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL the server (a crash), keeping its directory for a restart."""
        kill_process(self.process)

    def stop(self) -> None:
        stop_process(self.process)
        if self._own_directory and self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None
            self._own_directory = False

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
