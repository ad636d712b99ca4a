"""Connection settings: parse and check a Redis URL once, explicitly, never at import time.

``Settings.from_url`` takes every URL form Blueque accepts and gives a frozen, picklable
object (what Spark executors receive) that ``connect``/``aconnect`` turn into a redis-py
client; ``hide_password`` is the one way a URL is shown in a message or a log. Plain URLs
go to redis-py, checked first; Sentinel and Cluster URLs are parsed here into a
``blueque.ha.HAEndpoint``::

    redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/master_name[/db][?options]
    rediss+sentinel://...            TLS to the data nodes and to the sentinels
    redis+cluster://[[user]:password@]host[:port][,host[:port]...][/][?options]
    rediss+cluster://...             TLS to every cluster node

Sentinel hosts default to port 26379, cluster nodes to 6379. The user and password in the URL
authenticate to the data nodes; the sentinels take theirs from ``sentinel_username`` and
``sentinel_password``. Options (also accepted as keyword arguments of ``from_url``):
``db`` (Sentinel only; a cluster has database 0 only), ``socket_timeout``,
``socket_connect_timeout`` (seconds), ``retry_deadline`` (seconds every operation keeps
retrying through a failover, default 30; plain URLs take it too), ``wait_replicas`` and
``wait_timeout`` (replicas that must acknowledge enqueues and outcomes, and milliseconds to
wait for them; see ``blueque.ha.Durability``), and ``ssl_ca_certs``, ``ssl_certfile``,
``ssl_keyfile``, ``ssl_cert_reqs``, ``ssl_check_hostname`` for TLS.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

import redis
import redis.asyncio

try:  # redis-py >= 7 describes itself to the server (CLIENT SETINFO) through a DriverInfo
    from redis.driver_info import DriverInfo
except ImportError:  # redis-py 5 and 6 resolve their version once, at import
    DriverInfo = None  # type: ignore[misc,assignment]

from blueque.errors import ConfigurationError
from blueque.ha import Durability, HAEndpoint
from blueque.retry import RetryPolicy

DEFAULT_URL = "redis://localhost:6379/0"
#: How long an operation keeps retrying through a restart or failover before RedisUnavailable
#: (the ``retry_deadline`` URL option or Client argument; 0 = one try, no retry).
DEFAULT_RETRY_DEADLINE = 30.0
URL_ENVIRONMENT_VARIABLE = "BLUEQUE_URL"
SCHEMES = ("redis", "rediss", "unix")
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

#: A query option holding a secret: ``password`` (redis-py) or ``sentinel_password``.
_SECRET_OPTION = re.compile(r"([?&][^=&#]*password=)[^&#]*", re.IGNORECASE)


def hide_password(url: str) -> str:
    """``url`` as messages and logs show it: the password replaced by ``***`` (the user name
    kept; a lone credential, which redis-py would take for a user name, is most likely a
    misplaced password and is hidden whole), and so are password options of the query."""
    scheme, sep, rest = url.partition("://") if "://" in url else ("", "", url)
    credentials, at, tail = rest.rpartition("@")
    if at:
        user, colon, _ = credentials.partition(":")
        credentials = f"{user}:***@" if colon else "***@"
    return scheme + sep + credentials + _SECRET_OPTION.sub(r"\1***", tail)


def is_ha_url(url: str) -> bool:
    """True for the Sentinel and Cluster schemes (the scheme alone is inspected)."""
    return url.split("://", 1)[0].lower() in HA_SCHEMES


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
        raise ConfigurationError(f"bad Redis URL {hide_password(url)!r}: {error}") from error
    accepted = _accepted_options(options.pop("connection_class", redis.Connection))
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise ConfigurationError(
            f"unknown option(s) {', '.join(unknown)} in Redis URL {hide_password(url)!r}: a "
            "query may set redis-py connection options such as db, socket_timeout, "
            "socket_connect_timeout, health_check_interval, client_name or protocol"
        )


def _check_plain_url(url: str) -> None:
    """Refuse a plain URL redis-py would only fail on at the first command."""
    parts = urlsplit(url)
    if parts.scheme.lower() != "unix":
        try:
            parts.port  # noqa: B018 (urlsplit checks the port when it is read)
        except ValueError as error:
            raise ConfigurationError(
                f"bad port in Redis URL {hide_password(url)!r}: {error}"
            ) from error
        if not parts.hostname:
            raise ConfigurationError(f"no host in Redis URL {hide_password(url)!r}")
        db = parts.path.lstrip("/")
        if db and not db.isdigit():
            raise ConfigurationError(
                f"bad database {db!r} in Redis URL {hide_password(url)!r}: it must be a number"
            )
    elif not parts.path:
        raise ConfigurationError(f"no socket path in Redis URL {hide_password(url)!r}")
    _check_query(url)


def _retry_deadline(raw: Any) -> float:
    """The ``retry_deadline`` option in seconds: a number >= 0 (0: one try, no retry)."""
    try:
        deadline = float(raw)
    except (TypeError, ValueError):
        deadline = -1.0
    if not deadline >= 0 or deadline == float("inf"):
        raise ConfigurationError(
            f"retry_deadline must be a number of seconds >= 0 (0: no retry), not {raw!r}"
        )
    return deadline


def _pop_retry_deadline(url: str, redis_kwargs: dict[str, Any]) -> tuple[str, float]:
    """Take Blueque's ``retry_deadline`` out of a plain URL's query (and the keyword
    arguments, which win): redis-py would pass it on to the connection, which has no such
    argument. Returns the URL without it and the deadline in seconds."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    given = [value for name, value in query if name == "retry_deadline"]
    deadline = _retry_deadline(
        redis_kwargs.pop("retry_deadline", given[-1] if given else DEFAULT_RETRY_DEADLINE))
    if given:
        rest = urlencode([(name, value) for name, value in query if name != "retry_deadline"])
        url = url.partition("?")[0] + (f"?{rest}" if rest else "")
    return url, deadline


# --- Sentinel and Cluster URLs ------------------------------------------------------------------
def _parse_hosts(netloc: str, default_port: int, url: str) -> tuple[tuple[str, int], ...]:
    hosts = []
    for item in netloc.split(","):
        host, sep, port = item.strip().rpartition(":")
        if not sep:
            host, port = port, str(default_port)
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigurationError(
                f"bad host {item!r} in {hide_password(url)!r}: write host:port, separated "
                "by commas"
            )
        hosts.append((host, int(port)))
    return tuple(hosts)


def _ha_options(query: str, url: str, overrides: Mapping[str, Any]) -> dict[str, Any]:
    options: dict[str, Any] = dict(parse_qsl(query, keep_blank_values=True))
    options.update(overrides)
    unknown = set(options) - set(HA_OPTIONS)
    if unknown:
        raise ConfigurationError(
            f"unknown option(s) {sorted(unknown)} in {hide_password(url)!r}; known: "
            f"{sorted(HA_OPTIONS)}"
        )
    try:
        for name in _FLOAT_OPTIONS:
            if name in options:
                options[name] = float(options[name])
        for name in _INT_OPTIONS:
            if name in options:
                options[name] = int(options[name])
    except ValueError as error:
        raise ConfigurationError(f"bad option in {hide_password(url)!r}: {error}") from error
    check = options.get("ssl_check_hostname")
    if isinstance(check, str):
        if check.lower() not in ("true", "false", "yes", "no", "1", "0"):
            raise ConfigurationError(f"ssl_check_hostname must be true or false, not {check!r}")
        options["ssl_check_hostname"] = check.lower() in ("true", "yes", "1")
    return options


def _ha_path(kind: str, path: list[str], url: str) -> tuple[str | None, int]:
    """The master name and database a Sentinel URL's path names (a cluster's has none)."""
    if kind == "cluster":
        if path and path != ["0"]:
            raise ConfigurationError(
                f"a cluster URL has no path (database 0 only): {hide_password(url)!r}"
            )
        return None, 0
    if not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ConfigurationError(
            f"a Sentinel URL names its master and optionally a database: "
            f"redis+sentinel://host:26379,host:26380/master_name/0, not {hide_password(url)!r}"
        )
    return path[0], int(path[1]) if len(path) == 2 else 0


def _parse_ha_url(url: str, overrides: Mapping[str, Any]
                  ) -> tuple[HAEndpoint, float, Durability | None]:
    """A Sentinel or Cluster URL: its endpoint, retry deadline and replication wait."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    kind: Literal["sentinel", "cluster"] = (
        "sentinel" if scheme in SENTINEL_SCHEMES else "cluster")
    credentials, _, netloc = parts.netloc.rpartition("@")
    username, _, password = credentials.partition(":")
    if not netloc:
        raise ConfigurationError(f"no hosts in {hide_password(url)!r}")
    hosts = _parse_hosts(netloc, SENTINEL_PORT if kind == "sentinel" else REDIS_PORT, url)
    options = _ha_options(parts.query, url, overrides)
    master_name, db = _ha_path(kind, [unquote(p) for p in parts.path.split("/") if p], url)
    db = options.pop("db", db)
    if kind == "cluster" and db != 0:
        raise ConfigurationError(f"a Redis Cluster has database 0 only, not {db}")
    deadline = _retry_deadline(options.pop("retry_deadline", DEFAULT_RETRY_DEADLINE))
    replicas, timeout_ms = options.pop("wait_replicas", 0), options.pop("wait_timeout", 1000)
    wait = Durability(replicas, timeout_ms) if replicas else None
    ssl_options = {n: options.pop(n) for n in list(options) if n.startswith("ssl_")}
    endpoint = HAEndpoint(
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
    return endpoint, deadline, wait


# --- the settings -------------------------------------------------------------------------------
def hash_tags_option(hash_tags: bool, cluster: bool | None) -> bool:
    """The ``hash_tags`` option, given the deprecated ``cluster`` that was its name until
    2.0 (a name that read as "connect to a Redis Cluster", which a redis+cluster:// URL
    does). ``cluster=True`` still selects the hash-tagged layout, with a DeprecationWarning
    pointing at the caller of the function that took it."""
    if cluster is None:
        return hash_tags
    warnings.warn(
        "cluster= is deprecated: write hash_tags=True to select the hash-tagged key layout "
        "(a redis+cluster:// URL or a RedisCluster client selects it by itself)",
        DeprecationWarning, stacklevel=3,
    )
    return hash_tags or bool(cluster)


@dataclass(frozen=True, repr=False)
class Settings:
    """Where Redis is and how to talk to it. ``from_url`` checks the URL up front; the
    object is frozen and picklable (Spark hands it to its executors, as arq's RedisSettings),
    and its ``repr`` hides passwords."""

    url: str
    redis_kwargs: dict[str, Any] = field(default_factory=dict)
    #: the hash-tagged key layout (PROTOCOL.md 8): a Redis Cluster needs it, and a
    #: redis+cluster:// URL selects it; ``Client(url, hash_tags=True)`` does for any URL
    hash_tags: bool = False
    #: the Sentinel master or Redis Cluster a redis+sentinel:// or redis+cluster:// URL names
    ha: HAEndpoint | None = None
    #: seconds every operation keeps retrying a restart or failover (0: one try, no retry)
    retry_deadline: float = DEFAULT_RETRY_DEADLINE
    #: the replication wait (WAIT) of a Sentinel or Cluster URL's wait_replicas, if any
    durability: Durability | None = None

    @classmethod
    def from_url(cls, url: str | None = None, *, hash_tags: bool = False,
                 **redis_kwargs: Any) -> Settings:
        """``url`` (None: $BLUEQUE_URL, else redis://localhost:6379/0), checked; keyword
        arguments override its options or go to redis-py. Raises ConfigurationError."""
        if url is not None and not url.strip():
            raise ConfigurationError(
                "empty Redis URL: give one such as redis://localhost:6379/0, or leave it out "
                f"to use ${URL_ENVIRONMENT_VARIABLE} (else {DEFAULT_URL})"
            )
        url = url or default_url()
        if is_ha_url(url):
            overrides = {n: redis_kwargs.pop(n) for n in HA_OPTIONS if n in redis_kwargs}
            endpoint, deadline, wait = _parse_ha_url(url, overrides)
            return cls(url=url, redis_kwargs=dict(redis_kwargs),
                       hash_tags=hash_tags or endpoint.cluster, ha=endpoint,
                       retry_deadline=deadline, durability=wait)
        if urlsplit(url).scheme.lower() not in SCHEMES:
            raise ConfigurationError(
                f"unsupported Redis URL {hide_password(url)!r}: use redis://[user:password@]"
                "host:port/db, rediss:// for TLS, unix:///path/to/redis.sock?db=0, "
                "redis+sentinel://host:26379,host:26380/master_name/0 or "
                "redis+cluster://host:7000,host:7001"
            )
        url, deadline = _pop_retry_deadline(url, redis_kwargs)
        _check_plain_url(url)
        return cls(url=url, redis_kwargs=dict(redis_kwargs), hash_tags=hash_tags,
                   retry_deadline=deadline)

    def __repr__(self) -> str:
        kwargs = {n: "***" if "password" in n else v for n, v in self.redis_kwargs.items()}
        return (f"Settings(url={hide_password(self.url)!r}, redis_kwargs={kwargs!r}, "
                f"hash_tags={self.hash_tags!r}, ha={self.ha!r}, "
                f"retry_deadline={self.retry_deadline!r}, durability={self.durability!r})")

    def retry_policy(self) -> RetryPolicy | None:
        """Every URL form retries each operation through a restart or a failover, for up to
        ``retry_deadline`` seconds (default 30; None when it is 0)."""
        return RetryPolicy(deadline_s=self.retry_deadline) if self.retry_deadline > 0 else None

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
                f"cannot use Redis URL {hide_password(self.url)!r}: {error}"
            ) from error


def settings_for(url: str | Settings | None, hash_tags: bool = False,
                 **redis_kwargs: Any) -> Settings:
    """``url`` as Settings: parsed by ``Settings.from_url``, or as it is if it is one
    already (its redis options travel in it: none may be given beside it)."""
    if not isinstance(url, Settings):
        return Settings.from_url(url, hash_tags=hash_tags, **redis_kwargs)
    if redis_kwargs:
        raise ConfigurationError(
            f"redis options ({', '.join(sorted(redis_kwargs))}) go with a URL: a Settings "
            "object carries its own (Settings.from_url(url, **options))"
        )
    return replace(url, hash_tags=True) if hash_tags and not url.hash_tags else url
