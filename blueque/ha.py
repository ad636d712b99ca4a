"""High availability: Sentinel and Cluster URLs, a retry policy that rides through failovers,
and optional replication waits (WAIT) for writes that must survive a failover.

URL forms (``blueque.config.Settings`` hands these schemes to ``HASettings.from_url``)::

    redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/master_name[/db][?options]
    rediss+sentinel://...            TLS to the data nodes and to the sentinels
    redis+cluster://[[user]:password@]host[:port][,host[:port]...][/][?options]
    rediss+cluster://...             TLS to every cluster node

Sentinel hosts default to port 26379, cluster nodes to 6379. The user and password in the URL
authenticate to the data nodes; the sentinels take theirs from ``sentinel_username`` and
``sentinel_password``. Options (also accepted as keyword arguments of ``connect``):

``db`` (Sentinel only; a cluster has database 0 only), ``socket_timeout``,
``socket_connect_timeout`` (seconds), ``retry_deadline`` (seconds every operation keeps
retrying through a failover, default 30), ``wait_replicas`` and ``wait_timeout`` (replicas
that must acknowledge enqueues and outcomes, and milliseconds to wait for them; see
``Durability``), and ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``, ``ssl_cert_reqs``,
``ssl_check_hostname`` for TLS.

This module never formats a key and runs no protocol operation: the store calls
``RetryPolicy.call`` around each operation and ``Durability.run`` around each durable script.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

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

from blueque.errors import ConfigurationError
from blueque.retry import TRANSIENT_REPLIES, RetryPolicy, is_transient

#: The retry policy and the transient-error test live in blueque.retry (shared with the
#: asyncio client); they are still importable from here, where they started.
__all__ = ["TRANSIENT_REPLIES", "Durability", "HASettings", "NotReplicated", "RetryPolicy",
           "is_ha_url", "is_transient"]

log = logging.getLogger("blueque.ha")

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
HA_SCHEMES = SENTINEL_SCHEMES + CLUSTER_SCHEMES
SENTINEL_PORT = 26379
REDIS_PORT = 6379

_FLOAT_OPTIONS = ("socket_timeout", "socket_connect_timeout", "retry_deadline")
_INT_OPTIONS = ("db", "wait_replicas", "wait_timeout")
_TEXT_OPTIONS = (
    "sentinel_username", "sentinel_password", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile",
    "ssl_cert_reqs", "ssl_check_hostname",
)
#: Every option a Sentinel or Cluster URL (or keyword argument) may carry.
HA_OPTIONS = _FLOAT_OPTIONS + _INT_OPTIONS + _TEXT_OPTIONS


def is_ha_url(url: str) -> bool:
    """True for the Sentinel and Cluster schemes (the scheme alone is inspected)."""
    return url.split("://", 1)[0].lower() in HA_SCHEMES


def _hide_password(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    credentials, at, hosts = rest.rpartition("@")
    if not at:
        return url
    user = credentials.partition(":")[0]
    return f"{scheme}{sep}{user}:***@{hosts}"


def _parse_hosts(netloc: str, default_port: int, url: str) -> tuple[tuple[str, int], ...]:
    hosts = []
    for item in netloc.split(","):
        host, sep, port = item.strip().rpartition(":")
        if not sep:
            host, port = port, str(default_port)
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigurationError(
                f"bad host {item!r} in {_hide_password(url)!r}: write host:port, separated "
                "by commas"
            )
        hosts.append((host, int(port)))
    return tuple(hosts)


def _options(query: str, url: str, overrides: Mapping[str, Any]) -> dict[str, Any]:
    options: dict[str, Any] = dict(parse_qsl(query, keep_blank_values=True))
    options.update(overrides)
    unknown = set(options) - set(_FLOAT_OPTIONS + _INT_OPTIONS + _TEXT_OPTIONS)
    if unknown:
        raise ConfigurationError(
            f"unknown option(s) {sorted(unknown)} in {_hide_password(url)!r}; known: "
            f"{sorted(_FLOAT_OPTIONS + _INT_OPTIONS + _TEXT_OPTIONS)}"
        )
    try:
        for name in _FLOAT_OPTIONS:
            if name in options:
                options[name] = float(options[name])
        for name in _INT_OPTIONS:
            if name in options:
                options[name] = int(options[name])
    except ValueError as error:
        raise ConfigurationError(f"bad option in {_hide_password(url)!r}: {error}") from error
    check = options.get("ssl_check_hostname")
    if isinstance(check, str):
        if check.lower() not in ("true", "false", "yes", "no", "1", "0"):
            raise ConfigurationError(f"ssl_check_hostname must be true or false, not {check!r}")
        options["ssl_check_hostname"] = check.lower() in ("true", "yes", "1")
    return options


@dataclass(frozen=True)
class Durability:
    """Make chosen writes wait until ``replicas`` replicas acknowledge them (Redis WAIT).

    What is promised: when an enqueue, a start or an outcome returns, the write is in the
    memory of the master and of at least ``replicas`` replicas. A master that is SIGKILLed
    and replaced by Sentinel or Cluster with one of those replicas loses none of them; with
    ``replicas`` equal to the number of replicas, every candidate for promotion has them.
    Not promised: survival of a write when every copy dies (use AOF, see README), nor across
    a manual ``SENTINEL FAILOVER``/``CLUSTER FAILOVER FORCE`` promoting a replica that had
    not yet acknowledged it. If fewer replicas acknowledge within ``timeout_ms`` the write
    is on the master only: ``NotReplicated`` is raised, the retry policy repeats the
    (idempotent) operation, and the caller sees RedisUnavailable once its deadline passes.
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
class HASettings:
    """A parsed Sentinel or Cluster URL. Secrets are kept out of ``repr``."""

    kind: str  # "sentinel" | "cluster"
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
    retry_deadline: float = 30.0
    wait_replicas: int = 0
    wait_timeout: int = 1000

    @classmethod
    def from_url(cls, url: str, **overrides: Any) -> HASettings:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in HA_SCHEMES:
            raise ConfigurationError(
                f"{_hide_password(url)!r} is not a Sentinel or Cluster URL: use "
                "redis+sentinel://host:26379,host:26380/master_name/0 or "
                "redis+cluster://host:7000,host:7001"
            )
        kind = "sentinel" if scheme in SENTINEL_SCHEMES else "cluster"
        credentials, _, netloc = parts.netloc.rpartition("@")
        username, _, password = credentials.partition(":")
        if not netloc:
            raise ConfigurationError(f"no hosts in {_hide_password(url)!r}")
        hosts = _parse_hosts(netloc, SENTINEL_PORT if kind == "sentinel" else REDIS_PORT, url)
        options = _options(parts.query, url, overrides)
        path = [unquote(p) for p in parts.path.split("/") if p]
        master_name, db = cls._path(kind, path, url)
        db = options.pop("db", db)
        if kind == "cluster" and db != 0:
            raise ConfigurationError(f"a Redis Cluster has database 0 only, not {db}")
        ssl_options = {n: options.pop(n) for n in list(options) if n.startswith("ssl_")}
        return cls(
            kind=kind,
            hosts=hosts,
            master_name=master_name,
            db=db,
            username=unquote(username) or None,
            password=unquote(password) or None,
            ssl=scheme.startswith("rediss"),
            ssl_options=ssl_options,
            **options,
        )

    @staticmethod
    def _path(kind: str, path: list[str], url: str) -> tuple[str | None, int]:
        if kind == "cluster":
            if path and path != ["0"]:
                raise ConfigurationError(
                    f"a cluster URL has no path (database 0 only): {_hide_password(url)!r}"
                )
            return None, 0
        if not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
            raise ConfigurationError(
                f"a Sentinel URL names its master and optionally a database: "
                f"redis+sentinel://host:26379,host:26380/master_name/0, not {_hide_password(url)!r}"
            )
        return path[0], int(path[1]) if len(path) == 2 else 0

    @property
    def cluster(self) -> bool:
        return self.kind == "cluster"

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(deadline_s=self.retry_deadline)

    def durability(self) -> Durability | None:
        if not self.wait_replicas:
            return None
        return Durability(self.wait_replicas, self.wait_timeout)

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
class _Flavour:
    """redis-py's classes for one kind of I/O: the sync ones or redis.asyncio's."""

    node: Any
    cluster: Any
    sentinel: Any
    retry: Any


_SYNC = _Flavour(ClusterNode, RedisCluster, Sentinel, Retry)
_ASYNC = _Flavour(redis.asyncio.cluster.ClusterNode, redis.asyncio.cluster.RedisCluster,
                  redis.asyncio.sentinel.Sentinel, redis.asyncio.retry.Retry)

