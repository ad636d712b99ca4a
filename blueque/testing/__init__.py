"""Helpers for tests of programs that use Blueque: real Redis servers on loopback.

Blueque's own suite uses them, and so can yours (as you would use fakeredis, but with the real
thing): ``RedisServer`` starts a private redis-server on a free 127.0.0.1 port, with its files
in a temporary directory and nothing persisted, and stops it by pid; ``SentinelTopology`` and
``ClusterTopology`` do the same for a Sentinel-watched master with replicas and for a Redis
Cluster, and can kill a master to show a failover. None of it touches the machine's own Redis.

    from blueque.testing import RedisServer

    with RedisServer() as server:
        client = blueque.Client(server.url)
        ...

Nothing in Blueque's runtime imports this package (a test holds it to that); the private
redis-server that ``blueque demo`` starts is ``blueque.private_redis``, which this re-exports.
"""

from __future__ import annotations

from blueque.private_redis import RedisServer, free_port, kill_process, stop_process
from blueque.testing.polling import wait_for
from blueque.testing.proxy import DelayingProxy
from blueque.testing.topology import (
    ClusterTopology,
    SentinelProcess,
    SentinelTopology,
    TLSFiles,
    free_cluster_port,
)

__all__ = [
    "ClusterTopology",
    "DelayingProxy",
    "RedisServer",
    "SentinelProcess",
    "SentinelTopology",
    "TLSFiles",
    "free_cluster_port",
    "free_port",
    "kill_process",
    "stop_process",
    "wait_for",
]
