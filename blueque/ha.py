"""High availability: clients of a Sentinel master or a Redis Cluster, and replication waits
(WAIT) for writes that must survive a failover.

``blueque.config`` parses a ``redis+sentinel://`` or ``redis+cluster://`` URL (the forms, the
options and their defaults are described there) into an ``HAEndpoint``; this module turns one
into a redis-py client, sync or redis.asyncio, with redis-py's own retries switched off (the
retry policy of ``blueque.retry`` rides through failovers, with a deadline and logs), and runs
the scripts of writes that must reach replicas (``Durability``).

This module never formats a key and runs no protocol operation: the store calls
``Durability.run`` around each durable script.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.retry
import redis.asyncio.sentinel
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.commands.core import Script
from redis.retry import Retry
from redis.sentinel import Sentinel

from blueque import retry
from blueque.errors import ConfigurationError
from blueque.retry import is_transient

__all__ = ["Durability", "HAEndpoint", "NotReplicated"]

#: Names that moved to blueque.retry; still importable from here, with a DeprecationWarning.
_MOVED = {"RetryPolicy": retry, "TRANSIENT_REPLIES": retry}


def __getattr__(name: str) -> Any:
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"blueque.ha.{name} is deprecated: import it from {module.__name__}",
                  DeprecationWarning, stacklevel=2)
    return getattr(module, name)


@dataclass(frozen=True)
class HAEndpoint:
    """A Sentinel master or a Redis Cluster: where its nodes are and how to talk to them, as
    ``blueque.config`` parsed it from a URL. Secrets are kept out of ``repr``."""

    kind: Literal["sentinel", "cluster"]
    #: the sentinels (Sentinel) or the start-up nodes (Cluster)
    hosts: tuple[tuple[str, int], ...]
    master_name: str | None = None
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    sentinel_username: str | None = None
    sentinel_password: str | None = field(default=None, repr=False)
    ssl: bool = False
    ssl_options: Mapping[str, Any] = field(default_factory=dict)
    socket_timeout: float | None = 10.0
    socket_connect_timeout: float | None = 2.0

    @property
    def cluster(self) -> bool:
        return self.kind == "cluster"

    def _connection_kwargs(self, extra: Mapping[str, Any]) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "socket_timeout": self.socket_timeout,
            "socket_connect_timeout": self.socket_connect_timeout,
            "username": self.username,
            "password": self.password,
            **extra,
            "decode_responses": True,
        }
        if self.ssl:
            kwargs["ssl"] = True
            kwargs.update(self.ssl_options)
        return kwargs

    def connect(self, **redis_kwargs: Any) -> redis.Redis | RedisCluster:
        """A client of the current master (Sentinel) or of the whole cluster."""
        client: redis.Redis | RedisCluster = self._connect(_SYNC, redis_kwargs)
        return client

    def aconnect(self, **redis_kwargs: Any) -> Any:
        """``connect`` with redis.asyncio's classes (blueque.aio): a redis.asyncio.Redis of
        the current master, or a redis.asyncio.cluster.RedisCluster."""
        return self._connect(_ASYNC, redis_kwargs)

    def _connect(self, flavour: _Flavour, redis_kwargs: Mapping[str, Any]) -> Any:
        kwargs = self._connection_kwargs(redis_kwargs)
        if self.cluster:
            nodes = [flavour.node(host, port) for host, port in self.hosts]
            return flavour.cluster(startup_nodes=nodes, **kwargs)
        # redis-py would otherwise retry each connect and each command on its own, with
        # backoff, silently and without a deadline (nested, that is up to ~40 s): leave
        # retrying to RetryPolicy, which logs and keeps to retry_deadline
        kwargs.setdefault("retry", flavour.retry(NoBackoff(), 0))
        sentinel_kwargs: dict[str, Any] = {
            "retry": flavour.retry(NoBackoff(), 0),
            "socket_timeout": self.socket_timeout,
            "socket_connect_timeout": self.socket_connect_timeout,
            "username": self.sentinel_username,
            "password": self.sentinel_password,
            "decode_responses": True,
        }
        if self.ssl:
            sentinel_kwargs["ssl"] = True
            sentinel_kwargs.update(self.ssl_options)
        sentinel = flavour.sentinel(list(self.hosts), sentinel_kwargs=sentinel_kwargs)
        assert self.master_name is not None
        return sentinel.master_for(self.master_name, db=self.db, **kwargs)


@dataclass(frozen=True)
class Durability:
    """Make chosen writes wait until ``replicas`` replicas acknowledge them (Redis WAIT).

    What is promised: when an enqueue, a start or an outcome returns, the write is in the
    memory of the master and of at least ``replicas`` replicas. A master that is SIGKILLed
    and replaced by Sentinel or Cluster with one of those replicas loses none of them; with
    ``replicas`` equal to the number of replicas, every candidate for promotion has them.
    Not promised: survival of a write when every copy dies (use AOF, see
    docs/how-to/persistence.md), nor across a manual ``SENTINEL FAILOVER``/``CLUSTER
    FAILOVER FORCE`` promoting a replica that had not yet acknowledged it. If fewer replicas
    acknowledge within ``timeout_ms`` the write is on the master only: ``NotReplicated`` is
    raised, the retry policy repeats the (idempotent) operation, and the caller sees
    RedisUnavailable once its deadline passes.
    """

    replicas: int
    timeout_ms: int = 1000

    def __post_init__(self) -> None:
        if self.replicas < 1 or self.timeout_ms < 1:
            raise ConfigurationError(
                f"wait_replicas must be >= 1 and wait_timeout >= 1 ms, not {self.replicas} "
                f"and {self.timeout_ms}"
            )

    def run(self, client: Any, script: Script, keys: Sequence[str], args: Sequence[Any]
            ) -> Any:
        """Run ``script`` then WAIT on the same connection (one pipeline); return its result."""
        if not isinstance(client, RedisCluster):
            return self._run_on(client, script, keys, args)
        # WAIT counts the writes of its own connection: talk to the slot's master directly,
        # which bypasses RedisCluster's own redirection handling, so refresh its slot map here
        cluster: Any = client
        try:
            node = cluster.get_node_from_key(keys[0], replica=False)
            return self._run_on(node.redis_connection, script, keys, args)
        except NotReplicated:
            raise
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                redis.exceptions.ResponseError, redis.exceptions.RedisClusterException) as error:
            if is_transient(error):
                with contextlib.suppress(redis.exceptions.RedisError,
                                         redis.exceptions.RedisClusterException):
                    cluster.nodes_manager.initialize()
            raise

    def _run_on(self, client: Any, script: Script, keys: Sequence[str], args: Sequence[Any]
                ) -> Any:
        pipe = client.pipeline(transaction=False)
        script(keys=list(keys), args=list(args), client=pipe)
        pipe.wait(self.replicas, self.timeout_ms)
        return self._acknowledged(*pipe.execute())

    async def arun(self, client: Any, script: Any, keys: Sequence[str], args: Sequence[Any]
                   ) -> Any:
        """``run`` for a redis.asyncio client (blueque.aio): the script then WAIT, in one
        pipeline on one connection. A Redis Cluster has no per-node client in redis.asyncio:
        the slot's master gets a connection of its own for the call, closed after it."""
        if not isinstance(client, redis.asyncio.cluster.RedisCluster):
            return await self._arun_on(client, script, keys, args)
        node = client.get_node_from_key(keys[0], replica=False)
        assert node is not None  # SlotNotCoveredError otherwise
        direct = redis.asyncio.Redis(host=node.host, port=int(node.port),
                                     **_node_kwargs(client.get_connection_kwargs()))
        try:
            return await self._arun_on(direct, script, keys, args)
        except NotReplicated:
            raise
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                redis.exceptions.ResponseError, redis.exceptions.RedisClusterException) as error:
            if is_transient(error):  # a moved slot or a failover: learn the new map
                with contextlib.suppress(redis.exceptions.RedisError,
                                         redis.exceptions.RedisClusterException):
                    await client.nodes_manager.initialize()
            raise
        finally:
            await direct.aclose()

    async def _arun_on(self, client: Any, script: Any, keys: Sequence[str],
                       args: Sequence[Any]) -> Any:
        pipe = client.pipeline(transaction=False)
        await script(keys=list(keys), args=list(args), client=pipe)
        pipe.wait(self.replicas, self.timeout_ms)
        return self._acknowledged(*await pipe.execute())

    def _acknowledged(self, result: Any, acknowledged: Any) -> Any:
        """The script's result, once WAIT says enough replicas have the write."""
        if int(acknowledged) < self.replicas:
            raise NotReplicated(
                f"only {acknowledged} of {self.replicas} replicas acknowledged the write "
                f"within {self.timeout_ms} ms; it is on the master only"
            )
        return result


def _node_kwargs(cluster_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """A cluster client's connection settings that a plain client of one node takes."""
    wanted = ("username", "password", "socket_timeout", "socket_connect_timeout",
              "decode_responses", "ssl", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile",
              "ssl_cert_reqs", "ssl_check_hostname")
    kwargs = {name: cluster_kwargs[name] for name in wanted if name in cluster_kwargs}
    kwargs["decode_responses"] = True
    return kwargs


class NotReplicated(redis.exceptions.ConnectionError):
    """Fewer replicas than asked acknowledged a write (retried like a lost connection)."""


@dataclass(frozen=True)
class _Flavour:
    """redis-py's classes for one kind of I/O: the sync ones or redis.asyncio's."""

    node: Any
    cluster: Any
    sentinel: Any
    retry: Any


_SYNC = _Flavour(ClusterNode, RedisCluster, Sentinel, Retry)
_ASYNC = _Flavour(redis.asyncio.cluster.ClusterNode, redis.asyncio.cluster.RedisCluster,
                  redis.asyncio.sentinel.Sentinel, redis.asyncio.retry.Retry)
