"""Redis Sentinel and Redis Cluster topologies on loopback, for tests and benchmarks.

Every process is a child of this one, listens on a free 127.0.0.1 port, keeps its files in a
temporary directory and is stopped by pid. Nothing here touches the machine's own Redis.

``SentinelTopology``: one master, ``replicas`` replicas and ``sentinels`` sentinels watching
them (``down-after-milliseconds`` 1000, diskless replication without delay, so set-up takes about
two seconds and a killed master is replaced in about two more).

``ClusterTopology``: ``masters`` masters with ``replicas_per_master`` replicas each, created
with ``redis-cli --cluster create`` and ready once every node reports ``cluster_state:ok``.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field

from blueque.errors import ConfigurationError, RedisUnavailable
from blueque.private_redis import RedisServer
from blueque.testing.nodes import (
    FAST_REPLICATION,
    _ask,
    _slots,
    _Topology,
    free_cluster_port,
)
from blueque.testing.polling import wait_for
from blueque.testing.sentinel import SentinelProcess, SentinelTopology, TLSFiles

__all__ = ["ClusterTopology", "SentinelProcess", "SentinelTopology", "TLSFiles",
           "free_cluster_port"]


@dataclass
class ClusterTopology(_Topology):
    """A Redis Cluster of ``masters`` masters with ``replicas_per_master`` replicas each."""

    masters: int = 3
    replicas_per_master: int = 1
    node_timeout_ms: int = 1000
    extra_args: Sequence[str] = ()
    servers: list[RedisServer] = field(default_factory=list, init=False)

    @property
    def url(self) -> str:
        """The ``redis+cluster://`` URL naming every node as a start-up node."""
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.servers)
        return f"redis+cluster://{hosts}"

    def start(self, timeout: float = 60.0) -> ClusterTopology:
        cli = shutil.which("redis-cli")
        if cli is None:
            raise ConfigurationError("redis-cli not found on PATH (Debian: redis-tools)")
        args = (
            "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(self.node_timeout_ms),
            # a replica with a stale link may still be promoted: tests kill masters on purpose
            "--cluster-replica-validity-factor", "0",
            *FAST_REPLICATION, *self.extra_args,
        )
        for _ in range(self.masters * (1 + self.replicas_per_master)):
            self.servers.append(RedisServer(port=free_cluster_port(), extra_args=args).start())
        addresses = [f"127.0.0.1:{s.port}" for s in self.servers]
        subprocess.run(
            [cli, "--cluster", "create", *addresses,
             "--cluster-replicas", str(self.replicas_per_master), "--cluster-yes"],
            check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, timeout=timeout,
        )
        wait_for(self.is_healthy, timeout, interval=0.1)
        return self

    def alive(self) -> list[RedisServer]:
        return [s for s in self.servers if s.process is not None and s.process.poll() is None]

    def is_healthy(self) -> bool:
        """Every live node says ``cluster_state:ok`` and every master has an online replica."""
        alive = self.alive()
        for server in alive:
            info = _ask(server.port, "CLUSTER", "INFO")
            if not isinstance(info, str) or "cluster_state:ok" not in info:
                return False
        masters = [s for s in alive if self.role(s.port) == "master"]
        return len(masters) == self.masters and all(
            SentinelTopology._online_replicas(m.port) >= min(self.replicas_per_master, 1)
            or len(alive) < len(self.servers)
            for m in masters
        )

    @staticmethod
    def role(port: int) -> str | None:
        info = _ask(port, "INFO", "replication")
        return str(info.get("role")) if isinstance(info, dict) else None

    def master_for_key(self, key: str) -> RedisServer:
        """The live master serving the slot of ``key``."""
        for server in self.alive():
            slot = _ask(server.port, "CLUSTER", "KEYSLOT", key)
            if not isinstance(slot, int):
                continue
            for start, end, primary, *_ in _slots(server.port):
                if int(start) <= slot <= int(end):
                    return self._server(int(primary[1]))
        raise RedisUnavailable(f"no live node serves the slot of {key!r}")

    def _server(self, port: int) -> RedisServer:
        for server in self.servers:
            if server.port == port:
                return server
        raise RedisUnavailable(f"port {port} is not a node of this cluster")

    def kill_master_of(self, key: str) -> RedisServer:
        """SIGKILL the master serving ``key``; return it."""
        master = self.master_for_key(key)
        master.kill()
        return master

    def wait_for_failover(self, key: str, old_port: int, timeout: float = 30.0) -> RedisServer:
        """Wait until a replica serves ``key``'s slot as master and the cluster is ok again."""

        def promoted() -> bool:
            for server in self.alive():
                info = _ask(server.port, "CLUSTER", "INFO")
                if not isinstance(info, str) or "cluster_state:ok" not in info:
                    return False
            try:
                return self.master_for_key(key).port != old_port
            except RedisUnavailable:
                return False

        wait_for(promoted, timeout, interval=0.05)
        return self.master_for_key(key)

    def restart(self, server: RedisServer, timeout: float = 30.0) -> None:
        """Start a killed node again on its port and directory: its nodes.conf makes it
        rejoin, as a replica of whichever node took over its slots."""
        server.start()
        wait_for(lambda: self.role(server.port) == "slave" and self.is_healthy(), timeout,
                 interval=0.1)

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
        self.servers.clear()

    def __enter__(self) -> ClusterTopology:
        super().__enter__()
        return self


