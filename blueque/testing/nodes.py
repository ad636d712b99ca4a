"""What the Sentinel and Cluster topologies share: ports, configuration, their processes."""

from __future__ import annotations

import random
import socket
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import redis

from blueque.errors import RedisUnavailable

#: Replication settings for every data node: a replica is in sync moments after it starts.
FAST_REPLICATION = ("--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0")


def _as_args(directives: Sequence[str]) -> list[str]:
    return [f"--{d}" if n % 2 == 0 else d for n, d in enumerate(directives)]


def _as_config(directives: Sequence[str]) -> str:
    pairs = zip(directives[::2], directives[1::2], strict=True)
    return "".join(f"{name} {value}\n" for name, value in pairs)


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free too."""
    for _ in range(200):
        port = random.randrange(20000, 50000)
        if _port_is_free(port) and _port_is_free(port + 10000):
            return port
    raise RedisUnavailable("found no free loopback port pair for a cluster node")


def _redis(port: int, timeout: float = 1.0) -> redis.Redis:
    return redis.Redis(
        host="127.0.0.1", port=port, decode_responses=True,
        socket_timeout=timeout, socket_connect_timeout=timeout,
    )


def _ask(port: int, *command: str) -> object:
    """Send one command to a node, None if it does not answer."""
    client: Any = _redis(port)
    try:
        return client.execute_command(*command)
    except redis.RedisError:
        return None
    finally:
        client.close()


class _Topology:
    """Context-manager plumbing shared by both topologies."""

    def start(self, timeout: float = 30.0) -> _Topology:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> _Topology:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _slots(port: int) -> list[list[Any]]:
    reply = _ask(port, "CLUSTER", "SLOTS")
    return reply if isinstance(reply, list) else []

