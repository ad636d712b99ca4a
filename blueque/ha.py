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
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.commands.core import Script
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError, Sentinel

from blueque.errors import ConfigurationError

log = logging.getLogger("blueque.ha")

T = TypeVar("T")

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
        result, acknowledged = pipe.execute()
        if int(acknowledged) < self.replicas:
            raise NotReplicated(
                f"only {acknowledged} of {self.replicas} replicas acknowledged the write "
                f"within {self.timeout_ms} ms; it is on the master only"
            )
        return result


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
        kwargs = self._connection_kwargs(redis_kwargs)
        if self.cluster:
            node: Any = ClusterNode
            nodes = [node(host, port) for host, port in self.hosts]
            return RedisCluster(startup_nodes=nodes, **kwargs)
        # redis-py would otherwise retry each connect and each command on its own, with
        # backoff, silently and without a deadline (nested, that is up to ~40 s): leave
        # retrying to RetryPolicy, which logs and keeps to retry_deadline
        kwargs.setdefault("retry", Retry(NoBackoff(), 0))
        sentinel_kwargs: dict[str, Any] = {
            "retry": Retry(NoBackoff(), 0),
            "socket_timeout": self.socket_timeout,
            "socket_connect_timeout": self.socket_connect_timeout,
            "username": self.sentinel_username,
            "password": self.sentinel_password,
            "decode_responses": True,
        }
        if self.ssl:
            sentinel_kwargs["ssl"] = True
            sentinel_kwargs.update(self.ssl_options)
        sentinel_class: Any = Sentinel
        sentinel = sentinel_class(list(self.hosts), sentinel_kwargs=sentinel_kwargs)
        assert self.master_name is not None
        client: redis.Redis = sentinel.master_for(self.master_name, db=self.db, **kwargs)
        return client


def connect(url: str, **kwargs: Any) -> redis.Redis | RedisCluster:
    """A redis-py client for any Blueque URL: Sentinel and Cluster here, the rest by redis-py.

    Keyword arguments override URL options (for the HA schemes) or go to ``Redis.from_url``."""
    if is_ha_url(url):
        names = set(_FLOAT_OPTIONS + _INT_OPTIONS + _TEXT_OPTIONS)
        options = {n: v for n, v in kwargs.items() if n in names}
        rest = {n: v for n, v in kwargs.items() if n not in names}
        return HASettings.from_url(url, **options).connect(**rest)
    return redis.Redis.from_url(url, **{**kwargs, "decode_responses": True})


# --- retrying ---------------------------------------------------------------------------------
#: Reply prefixes that mean "this node cannot serve you right now", not "your command is wrong".
#: BUSY (another client's script runs too long) is one too: the command was not run, and the
#: server answers again once that script ends or is killed.
TRANSIENT_REPLIES = ("READONLY", "MASTERDOWN", "UNBLOCKED", "NOREPLICAS", "LOADING", "TRYAGAIN",
                     "CLUSTERDOWN", "MOVED", "ASK", "BUSY")

_PERMANENT = (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError)
_TRANSIENT = (
    redis.exceptions.ConnectionError,  # includes MasterNotFoundError, BusyLoadingError
    redis.exceptions.TimeoutError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.ClusterError,  # ClusterDownError, MasterDownError, "TTL exhausted"
    redis.exceptions.TryAgainError,
    redis.exceptions.AskError,  # and MovedError
    redis.exceptions.SlotNotCoveredError,
)


def is_transient(error: BaseException) -> bool:
    """True if ``error`` is what a failover, a restart or a resharding looks like."""
    if isinstance(error, _PERMANENT):
        return False
    if isinstance(error, MasterNotFoundError) and "AuthenticationError" in str(error):
        return False  # the sentinels refused our credentials: waiting will not help
    if isinstance(error, _TRANSIENT):
        return True
    if isinstance(error, redis.exceptions.ResponseError):
        # a pipeline prefixes the reply with "Command # 1 (...) of pipeline caused error: "
        reply = str(error).rpartition("caused error: ")[2]
        return reply.split(" ", 1)[0] in TRANSIENT_REPLIES
    return False


@dataclass(frozen=True)
class RetryPolicy:
    """Repeat an operation that failed transiently until it succeeds or ``deadline_s`` passes.

    Every Blueque protocol operation is idempotent when repeated after a lost reply (see
    PROTOCOL.md), so the store wraps each one in ``call``. The waits grow from
    ``initial_backoff_s`` to ``max_backoff_s`` with jitter, so that a crowd of listeners does
    not stampede the new master. The first failure of an operation is logged as a warning,
    the following ones at debug level (a 30-s restart would otherwise log 60 lines per call),
    and a success after failures says how long it took."""

    deadline_s: float = 30.0
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 0.5
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False, compare=False)
    clock: Callable[[], float] = field(default=time.monotonic, repr=False, compare=False)

    def bounded(self, seconds: float) -> RetryPolicy:
        """The same policy with a deadline of at most ``seconds`` (a daemon's loop, which
        must keep enforcing time limits and hearing signals, retries in its own steps)."""
        return replace(self, deadline_s=min(self.deadline_s, seconds))

    def call(self, operation: Callable[[], T]) -> T:
        started = self.clock()
        deadline = started + self.deadline_s
        backoff = self.initial_backoff_s
        failures = 0
        while True:
            try:
                result = operation()
            except Exception as error:
                failures += 1
                left = deadline - self.clock()
                if not is_transient(error) or left <= 0:
                    raise
                wait = min(backoff * random.uniform(0.5, 1.0), left)
                log.log(logging.WARNING if failures == 1 else logging.DEBUG,
                        "Redis operation failed (%s: %s); retry %d in %.2f s (retrying for up "
                        "to %g s)", type(error).__name__, error, failures, wait, self.deadline_s)
                self.sleep(wait)
                backoff = min(backoff * 2, self.max_backoff_s)
            else:
                if failures:
                    log.info("Redis answered again after %d failed tr%s (%.1f s)", failures,
                             "y" if failures == 1 else "ies", self.clock() - started)
                return result
