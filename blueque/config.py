"""Connection settings: parse and check a Redis URL once, explicitly, never at import time."""

from __future__ import annotations

import functools
import inspect
import os
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import redis
import redis.asyncio

try:  # redis-py >= 7 describes itself to the server (CLIENT SETINFO) through a DriverInfo
    from redis.driver_info import DriverInfo
except ImportError:  # redis-py 5 and 6 resolve their version once, at import
    DriverInfo = None  # type: ignore[misc,assignment]

from blueque.errors import ConfigurationError
from blueque.ha import HA_OPTIONS, Durability, HASettings, RetryPolicy, is_ha_url

DEFAULT_URL = "redis://localhost:6379/0"
#: How long an operation keeps retrying through a restart or failover before RedisUnavailable
#: (the ``retry_deadline`` URL option or Client argument; 0 = one try, no retry).
DEFAULT_RETRY_DEADLINE = 30.0
URL_ENVIRONMENT_VARIABLE = "BLUEQUE_URL"
SCHEMES = ("redis", "rediss", "unix")


@functools.cache
def _shared_driver_info() -> Any:
    return DriverInfo() if DriverInfo is not None else None


def _driver_info(redis_kwargs: dict[str, Any]) -> dict[str, Any]:
    """redis-py >= 7 looks its own version up with importlib.metadata for every connection a
    URL-built pool opens: about 1 ms, 3 to 6 ms of CPU in a freshly forked task child (which
    always opens one), measured by benchmarks/. Resolve it once per process and share it."""
    if DriverInfo is None or {"driver_info", "lib_name", "lib_version"} & set(redis_kwargs):
        return {}
    return {"driver_info": _shared_driver_info()}


def default_url() -> str:
    """``$BLUEQUE_URL``, else redis://localhost:6379/0 (the CLI's documented default)."""
    return os.environ.get(URL_ENVIRONMENT_VARIABLE) or DEFAULT_URL


def _describe(url: str) -> str:
    """The URL without its password, for error messages."""
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return parts._replace(netloc=netloc).geturl()
    return url


def _accepted_options(connection_class: type) -> set[str]:
    """Keyword arguments a redis-py connection (and its pool) take: what a URL query may set."""
    names: set[str] = set()
    for cls in (*connection_class.__mro__, redis.ConnectionPool):
        init = cls.__dict__.get("__init__")
        if init is not None:
            names.update(inspect.signature(init).parameters)
    return names - {"self", "args", "kwargs"}


def _check_query(url: str) -> None:
    """redis-py passes unknown query options on to the connection, which fails with a
    TypeError at the first command; refuse them here, with the ones that exist."""
    try:
        options: dict[str, Any] = redis.connection.parse_url(url)  # type: ignore[no-untyped-call]
    except ValueError as error:
        raise ConfigurationError(f"bad Redis URL {_describe(url)!r}: {error}") from error
    accepted = _accepted_options(options.pop("connection_class", redis.Connection))
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise ConfigurationError(
            f"unknown option(s) {', '.join(unknown)} in Redis URL {_describe(url)!r}: a query "
            "may set redis-py connection options such as db, socket_timeout, "
            "socket_connect_timeout, health_check_interval, client_name or protocol"
        )


def _pop_retry_deadline(url: str, redis_kwargs: dict[str, Any]) -> tuple[str, float]:
    """Take Blueque's ``retry_deadline`` out of a plain URL's query (and the keyword
    arguments, which win): redis-py would pass it on to the connection, which has no such
    argument. Returns the URL without it and the deadline in seconds."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    given = [value for name, value in query if name == "retry_deadline"]
    raw: Any = redis_kwargs.pop("retry_deadline", given[-1] if given else DEFAULT_RETRY_DEADLINE)
    try:
        deadline = float(raw)
    except (TypeError, ValueError):
        deadline = -1.0
    if not deadline >= 0 or deadline == float("inf"):
        raise ConfigurationError(
            f"retry_deadline must be a number of seconds >= 0 (0: no retry), not {raw!r}"
        )
    if given:
        rest = urlencode([(name, value) for name, value in query if name != "retry_deadline"])
        url = url.partition("?")[0] + (f"?{rest}" if rest else "")
    return url, deadline


@dataclass(frozen=True)
class Settings:
    """Where Redis is and how to talk to it. ``from_url`` checks the URL up front."""

    url: str
    redis_kwargs: dict[str, Any] = field(default_factory=dict)
    cluster: bool = False
    #: Sentinel or Cluster settings when the URL uses one of their schemes (see blueque.ha)
    ha: HASettings | None = None
    #: plain URLs: seconds every operation keeps retrying a restart or failover (0: off)
    retry_deadline: float = DEFAULT_RETRY_DEADLINE

    @classmethod
    def from_url(cls, url: str | None = None, **redis_kwargs: Any) -> Settings:
        if url is not None and not url.strip():
            raise ConfigurationError(
                "empty Redis URL: give one such as redis://localhost:6379/0, or leave it out "
                f"to use ${URL_ENVIRONMENT_VARIABLE} (else {DEFAULT_URL})"
            )
        url = url or default_url()
        if is_ha_url(url):
            options = {n: redis_kwargs.pop(n) for n in HA_OPTIONS if n in redis_kwargs}
            ha = HASettings.from_url(url, **options)
            return cls(url=url, redis_kwargs=dict(redis_kwargs), cluster=ha.cluster, ha=ha)
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme in SCHEMES:
            url, retry_deadline = _pop_retry_deadline(url, redis_kwargs)
            parts = urlsplit(url)
        if scheme not in SCHEMES:
            raise ConfigurationError(
                f"unsupported Redis URL {_describe(url)!r}: use redis://[user:password@]host"
                f":port/db, rediss:// for TLS, unix:///path/to/redis.sock?db=0, "
                "redis+sentinel://host:26379,host:26380/master_name/0 or "
                "redis+cluster://host:7000,host:7001"
            )
        if scheme != "unix":
            try:
                port = parts.port
            except ValueError as error:
                raise ConfigurationError(
                    f"bad port in Redis URL {_describe(url)!r}: {error}"
                ) from error
            if not parts.hostname:
                raise ConfigurationError(f"no host in Redis URL {_describe(url)!r}")
            del port
            db = parts.path.lstrip("/")
            if db and not db.isdigit():
                raise ConfigurationError(
                    f"bad database {db!r} in Redis URL {_describe(url)!r}: it must be a number"
                )
        elif not parts.path:
            raise ConfigurationError(f"no socket path in Redis URL {_describe(url)!r}")
        _check_query(url)
        return cls(url=url, redis_kwargs=dict(redis_kwargs), retry_deadline=retry_deadline)

    def retry_policy(self) -> RetryPolicy | None:
        """Every URL form retries each operation through a restart or a failover, for up to
        ``retry_deadline`` seconds (default 30; None when it is 0)."""
        if self.ha is not None:
            return self.ha.retry_policy()
        return RetryPolicy(deadline_s=self.retry_deadline) if self.retry_deadline > 0 else None

    def durability(self) -> Durability | None:
        """The WAIT setting of a Sentinel or Cluster URL (``wait_replicas``), if any."""
        return self.ha.durability() if self.ha is not None else None

    def connect(self) -> Any:
        """A redis-py client with decode_responses=True (parameters and results are text):
        redis.Redis, or redis.RedisCluster for a cluster URL."""
        if self.ha is not None:
            return self.ha.connect(**self.redis_kwargs)
        return self._from_url(redis.Redis)

    def aconnect(self) -> Any:
        """``connect`` for blueque.aio: redis.asyncio.Redis, or its RedisCluster. It opens
        no connection yet (the first command does)."""
        if self.ha is not None:
            return self.ha.aconnect(**self.redis_kwargs)
        return self._from_url(redis.asyncio.Redis)

    def _from_url(self, client_class: Any) -> Any:
        kwargs = {**_driver_info(self.redis_kwargs), **self.redis_kwargs,
                  "decode_responses": True}
        try:
            return client_class.from_url(self.url, **kwargs)
        except ValueError as error:
            raise ConfigurationError(
                f"cannot use Redis URL {_describe(self.url)!r}: {error}"
            ) from error
