"""Redis errors as Blueque errors, said so that the reader knows what to do; and the check
that the server is a Redis Blueque can use (6.2 or later)."""

from __future__ import annotations

import functools
import importlib.resources
import re
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import redis

from blueque.errors import (
    AuthenticationFailed,
    BluequeError,
    ConfigurationError,
    InvalidTaskState,
    PermissionRefused,
    RedisUnavailable,
    StaleAttempt,
    TaskNotFound,
    TooLarge,
    UnsupportedServer,
    WritesRefused,
)
from blueque.retry import (
    WRITE_REFUSALS,
    certificate_refused,
    is_transient,
    write_refusal,
)

T = TypeVar("T")

#: The oldest server Blueque runs on: LMOVE and BLMOVE (the reserve step) came with Redis 6.2.
MIN_REDIS_VERSION = (6, 2)


class _Retry(Protocol):
    def call(self, operation: Callable[[], T]) -> T: ...


class _Health(Protocol):
    def disrupted(self) -> None: ...

    def asked(self) -> float: ...

    def answered(self, asked_at: float) -> None: ...


class _Guarded(Protocol):
    """What translate_errors needs of a store: its retry policy, health and address."""

    retry: _Retry
    health: _Health

    @property
    def where(self) -> str: ...


def load_script(name: str) -> str:
    """The source of ``blueque/lua/<name>.lua`` as Redis runs it (registered once per store):
    the libraries its ``-- uses: a, b`` line names (``blueque/lua/lib/a.lua``...: functions
    several scripts share, such as the task's history) first, then the script itself."""
    source = _lua(name)
    uses = [line.removeprefix("-- uses:") for line in source.splitlines()
            if line.startswith("-- uses:")]
    libraries = [_lua(f"lib/{used.strip()}") for line in uses for used in line.split(",")]
    return "".join(libraries) + source


def _lua(name: str) -> str:
    return importlib.resources.files("blueque").joinpath(f"lua/{name}.lua").read_text("utf-8")


def translate_errors(method: Callable[..., T]) -> Callable[..., T]:
    """Turn redis-py errors into Blueque errors whose message says what to do."""

    @functools.wraps(method)
    def wrapper(self: _Guarded, *args: Any, **kwargs: Any) -> T:
        def attempt() -> T:
            asked = self.health.asked()
            try:
                result = method(self, *args, **kwargs)
            except Exception as error:
                if is_transient(error):
                    self.health.disrupted()
                raise
            self.health.answered(asked)
            return result

        try:
            return self.retry.call(attempt)
        except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as error:
            raise translate(error, self.where) from error

    return wrapper


#: What redis-py says when a server that requires a password got none: NOAUTH (RESP2), or a
#: refused HELLO (RESP3), whose own words only confuse ("HELLO must be called...").
#: A long command from a client that gave none is refused as a protocol error instead.
NO_PASSWORD_GIVEN = ("Authentication required", "HELLO must be called with the client already "
                     "authenticated", "Protocol error: unauthenticated")


def translate(error: redis.exceptions.RedisError | redis.exceptions.RedisClusterException,
              where: str) -> BluequeError:
    """The Blueque error for a redis-py error: refusals, bad credentials or URLs, servers that
    are not (a recent enough) Redis, and unreachable ones each get their own."""
    if any(words in str(error) for words in NO_PASSWORD_GIVEN):
        return AuthenticationFailed(
            f"authentication failed at Redis {where}: it requires a password and none was "
            "given: put it in the URL (redis://:password@host:port/db, or "
            "redis://user:password@host:port/db)"
        )
    if isinstance(error, redis.exceptions.AuthenticationError) or (
        # the sentinels refused the sentinel_password: redis-py says so in a MasterNotFoundError
        type(error).__name__ == "MasterNotFoundError" and "AuthenticationError" in str(error)
    ):
        return AuthenticationFailed(
            f"authentication failed at Redis {where} ({error}): check the user name and "
            "password in the URL (redis://user:password@host:port/db)"
        )
    if isinstance(error, redis.exceptions.ResponseError) and not is_transient(error):
        return _protocol_error(error, where)
    refused = certificate_refused(error)
    if refused is not None:
        return ConfigurationError(
            f"TLS to Redis {where} failed: this client does not accept the server's certificate "
            f"({refused.verify_message or refused}): give the CA that signed it "
            "(ssl_ca_certs=/path/ca.pem in the URL) and a host name the certificate names, or "
            "ssl_cert_reqs=none to skip the check"
        )
    if isinstance(error, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
                  ) and not isinstance(error, redis.exceptions.BusyLoadingError):
        return _answered_but_refused(error, where) or RedisUnavailable(
            f"Redis at {where} is unreachable ({error}); check the URL and that "
            "redis-server is running"
        )
    unavailable = _cannot_serve(error, where)
    if unavailable is not None:
        return unavailable
    if isinstance(error, redis.exceptions.RedisClusterException):
        if "cluster mode is not enabled" in str(error).lower():
            # a node answered, but it is a plain Redis: waiting will not make it a cluster
            return ConfigurationError(
                f"the server in the Cluster URL {where} is not a Redis Cluster node (cluster "
                "mode is off): use redis://host:port/db for a plain Redis server, or the "
                "cluster's nodes in a redis+cluster:// URL"
            )
        # redis-py's cluster client gives up with this when no node answers
        return RedisUnavailable(f"Redis Cluster {where} cannot be reached ({error})")
    if isinstance(error, redis.exceptions.InvalidResponse):
        return UnsupportedServer(
            f"the server at {where} does not speak the Redis protocol ({error}): check the "
            "URL's host and port"
        )
    return BluequeError(f"Redis client error at {where}: {type(error).__name__}: {error}")


#: What a server that answered says when it will not take one more connection (its reply to a
#: new connection: redis-py raises it as a ConnectionError).
MAX_CLIENTS = "max number of clients reached"


def _answered_but_refused(error: BaseException, where: str) -> RedisUnavailable | None:
    """A server that is running and answered, though redis-py raised a connection error: at
    its maxclients, or refusing writes (MISCONF, OOM) in a reply redis-py took for a broken
    connection. Never "check the URL and that redis-server is running": both are fine."""
    text = str(error)
    if MAX_CLIENTS in text:
        return RedisUnavailable(
            f"Redis at {where} refuses new connections: it has reached its maxclients "
            f"({text}). Raise maxclients (CONFIG SET maxclients N, and in redis.conf; the "
            "process's open-file limit bounds it too) or find the clients that hold too many "
            "connections (CLIENT LIST); each Blueque listener holds a few")
    cause = next((meaning for reply, meaning in WRITE_REFUSALS.items()
                  if text.startswith(reply + " ") or f"error: {reply} " in text), None)
    return None if cause is None else _writes_refused(cause, where, text)


def _writes_refused(cause: str, where: str, reply: object) -> WritesRefused:
    return WritesRefused(
        f"{cause}: Redis at {where} refuses every write ({reply}); nothing was written. "
        "Free memory or disk space (or bring its replicas back): writes are accepted again "
        "at once, and daemons wait for that", cause)


def _cannot_serve(error: redis.exceptions.RedisError | redis.exceptions.RedisClusterException,
                  where: str) -> RedisUnavailable | None:
    """A server that answers but cannot serve us now: refusing writes (out of memory, cannot
    persist: WritesRefused, naming the cause), or loading, demoted, failing over."""
    cause = write_refusal(error)
    if cause is not None:
        return _writes_refused(cause, where, error)
    if is_transient(error):
        # READONLY, LOADING, MASTERDOWN, CLUSTERDOWN, TRYAGAIN, BUSY...: this server cannot
        # serve us right now (a demoted master, a restart loading its data, a failover); the
        # command was not run, and waiting is what helps: unavailability, not a refusal
        return RedisUnavailable(
            f"Redis at {where} cannot serve Blueque right now ({type(error).__name__}: "
            f"{error}): it is loading its data, was made a replica, or its cluster is failing "
            "over; retry later, or raise the URL's retry_deadline"
        )
    return None


def _protocol_error(error: redis.exceptions.ResponseError, where: str = "?") -> BluequeError:
    text = str(error)
    if isinstance(error, redis.exceptions.NoPermissionError) or any(
            words in text for words in ("NOPERM", "The user executing the script can't")):
        return PermissionRefused(
            f"Redis at {where} refused a command to this user ({text}): its ACL lacks a "
            "permission Blueque needs; docs/how-to/acl.md gives each role's ACL line")
    for marker, kind in (("BLUEQUE_STALE ", StaleAttempt), ("BLUEQUE_STATE ", InvalidTaskState)):
        if marker in text:
            return kind(text.split(marker, 1)[1].split("\n")[0].rstrip(". "))
    if "BLUEQUE_TOO_LARGE " in text:
        said = text.split("BLUEQUE_TOO_LARGE ", 1)[1].split("\n")[0].split(" script:")[0]
        return TooLarge(f"{said}: nothing was enqueued. Store large data elsewhere (a file, an "
                        "object store) and pass a reference, or raise the queue's limit "
                        "(blueque configure QUEUE --max-parameters-bytes N; 0: none)")
    if "BLUEQUE_MISSING " in text:
        return TaskNotFound(text.split("BLUEQUE_MISSING task ", 1)[1].split(" ")[0])
    if "DB index is out of range" in text:
        return ConfigurationError(
            f"the database number in the URL does not exist on Redis {where} ({text}): use "
            "one below its 'databases' setting (16 by default: /0 to /15)"
        )
    unknown = _UNKNOWN_COMMAND.search(text)
    command = unknown.group(1).lower() if unknown else ""
    if command == "sentinel":
        return ConfigurationError(
            f"a server in the Sentinel URL (for {where}) is not a Redis Sentinel ({text}): use "
            "redis://host:port/db for a plain Redis server, or the sentinels' ports (26379 by "
            "default) in a redis+sentinel:// URL"
        )
    if command in ("hello", "lmove", "blmove"):
        return _too_old(where, text)
    return BluequeError(f"Redis refused a Blueque command: {text}")


#: Redis 6+ quotes an unknown command with '', Redis 5 and older with ``.
_UNKNOWN_COMMAND = re.compile(r"unknown command [`']([^`']*)[`']", re.IGNORECASE)


def _too_old(where: str, detail: str) -> UnsupportedServer:
    wanted = ".".join(map(str, MIN_REDIS_VERSION))
    return UnsupportedServer(
        f"Redis at {where} is too old for Blueque ({detail}): Blueque needs Redis {wanted} or "
        "later (it reserves tasks with LMOVE/BLMOVE); upgrade the server"
    )


def describe(client: Any) -> str:
    """Where a redis-py client (sync or asyncio) talks to, for error messages: host:port,
    unix://path, a Sentinel master's name or a cluster's first nodes."""
    pool = getattr(client, "connection_pool", None)
    service = getattr(pool, "service_name", None)
    if service:  # Sentinel: name the master, not a host
        return f"Sentinel master {service!r}"
    if hasattr(client, "get_nodes"):  # RedisCluster
        nodes = sorted(f"{n.host}:{n.port}" for n in client.get_nodes())
        return "cluster " + ",".join(nodes[:3]) + (",..." if len(nodes) > 3 else "")
    kwargs = getattr(pool, "connection_kwargs", {})
    if "path" in kwargs:
        return f"unix://{kwargs['path']}"
    return f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"


def check_version(info: object, where: str) -> None:
    """Refuse a server older than MIN_REDIS_VERSION, from its INFO server reply."""
    if isinstance(info, dict) and isinstance(info.get("redis_version"), str):
        version = info["redis_version"]
        numbers = tuple(int(n) for n in re.findall(r"\d+", version)[:2])
        if numbers < MIN_REDIS_VERSION:
            raise _too_old(where, f"it runs Redis {version}")


