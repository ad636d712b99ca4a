"""The one module that talks to Redis: every Blueque protocol operation is a method here.

Each method names the keys it touches (see PROTOCOL.md for the exact command sequences).
Multi-key read-modify-write steps are Lua scripts in ``blueque/lua``, registered once, with
every key passed in through KEYS. Redis errors are translated into Blueque errors here.
"""

from __future__ import annotations

import copy
import functools
import importlib.resources
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

import redis
from redis.commands.core import Script

from blueque import keys as k
from blueque import protocol
from blueque.errors import (
    AuthenticationFailed,
    BluequeError,
    ConfigurationError,
    InvalidTaskState,
    RedisUnavailable,
    StaleAttempt,
    TaskNotFound,
    UnsupportedServer,
)
from blueque.protocol import BULK_CHUNK, CHECKPOINT_KEEP, DELETE_WINDOW, QueueCounts
from blueque.retry import Backoff, NoRetry, is_transient

log = logging.getLogger("blueque.store")

T = TypeVar("T")
P = ParamSpec("P")

#: The oldest server Blueque runs on: LMOVE and BLMOVE (the reserve step) came with Redis 6.2.
MIN_REDIS_VERSION = (6, 2)
# where they were first defined; the protocol module (shared with blueque.aio) owns them now
__all__ = ["BULK_CHUNK", "DELETE_WINDOW", "NoRetry", "QueueCounts", "RedisStore"]
#: How long a blocking pop waits per round trip; listen() loops, so this bounds only how
#: quickly a blocked listener notices a stop request, never how fast it sees a new task.
BLOCK_SLICE = 1.0
#: The largest checkpoint a task may save unless its own option, its queue's default or the
#: client says otherwise (``checkpoint_max_bytes``): checkpoints are resume points, not data.
CHECKPOINT_MAX_BYTES = 1024 * 1024

RedisLike = Any  # redis.Redis or redis.RedisCluster; both expose the same command methods


def load_script(name: str) -> str:
    """The source of ``blueque/lua/<name>.lua`` (registered once per store)."""
    return importlib.resources.files("blueque").joinpath(f"lua/{name}.lua").read_text("utf-8")


def translate_errors(method: Callable[..., T]) -> Callable[..., T]:
    """Turn redis-py errors into Blueque errors whose message says what to do."""

    @functools.wraps(method)
    def wrapper(self: RedisStore, *args: Any, **kwargs: Any) -> T:
        def attempt() -> T:
            try:
                return method(self, *args, **kwargs)
            except Exception as error:
                if is_transient(error):
                    self.health.disrupted()
                raise

        try:
            return self.retry.call(attempt)
        except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as error:
            raise translate(error, self.where) from error

    return wrapper


def translate(error: redis.exceptions.RedisError | redis.exceptions.RedisClusterException,
              where: str) -> BluequeError:
    """The Blueque error for a redis-py error: refusals, bad credentials or URLs, servers that
    are not (a recent enough) Redis, and unreachable ones each get their own."""
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
    if isinstance(error, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
                  ) and not isinstance(error, redis.exceptions.BusyLoadingError):
        return RedisUnavailable(
            f"Redis at {where} is unreachable ({error}); check the URL and that "
            "redis-server is running"
        )
    if is_transient(error):
        # READONLY, LOADING, MASTERDOWN, CLUSTERDOWN, TRYAGAIN, BUSY...: this server cannot
        # serve us right now (a demoted master, a restart loading its data, a failover); the
        # command was not run, and waiting is what helps: unavailability, not a refusal
        return RedisUnavailable(
            f"Redis at {where} cannot serve Blueque right now ({type(error).__name__}: "
            f"{error}): it is loading its data, was made a replica, or its cluster is failing "
            "over; retry later, or raise the URL's retry_deadline"
        )
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


def _protocol_error(error: redis.exceptions.ResponseError, where: str = "?") -> BluequeError:
    text = str(error)
    for marker, kind in (("BLUEQUE_STALE ", StaleAttempt), ("BLUEQUE_STATE ", InvalidTaskState)):
        if marker in text:
            return kind(text.split(marker, 1)[1].split("\n")[0].rstrip(". "))
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


def _tolerating_wrong_types(pipe: Any) -> list[Any]:
    """A pipeline's replies, where a key of another type (a WRONGTYPE reply) is an Exception
    in its place; any other error is raised."""
    replies: list[Any] = pipe.execute(raise_on_error=False)
    for reply in replies:
        if isinstance(reply, Exception) and not str(reply).startswith("WRONGTYPE"):
            raise reply
    return replies


@dataclass(frozen=True)
class ListenersAtWork:
    """One queue's listeners as the nodes page reads them (store.listeners_at_work)."""

    registered: set[str]
    leases: dict[str, float]
    started: list[tuple[str, str, str]]


def _started_entries(members: Iterable[str]) -> list[tuple[str, str, str]]:
    """Started-set members ("[listener id] [pid] [task id]") as tuples, sorted."""
    entries = []
    for member in sorted(members):
        parts = member.rsplit(" ", 2)
        if len(parts) == 3:
            entries.append((parts[0], parts[1], parts[2]))
    return entries


def _counts(reply: object) -> dict[str, int]:
    """An outcome-counter hash as numbers; a value that is no integer, or a key that is no
    hash (a WRONGTYPE reply), counts as nothing rather than failing the page or scrape."""
    if not isinstance(reply, dict):
        return {}
    counts = {}
    for name, count in reply.items():
        try:
            counts[str(name)] = int(count)
        except ValueError:
            continue
    return counts


class Health:
    """Counts operations that failed transiently (a lost connection, READONLY, LOADING...),
    shared by a store and its bounded copies: a recovery sweep that sees the count move
    knows its view of the leases was interrupted (PROTOCOL.md 6, "Outages")."""

    def __init__(self) -> None:
        self.disruptions = 0

    def disrupted(self) -> None:
        self.disruptions += 1


#: How long a new subscription waits for Redis to confirm its channels before it listens
#: anyway (its callers re-read what they wait for, which covers a confirmation that is late).
CONFIRM_WAIT = 1.0
#: The waits before subscribing again while Redis stays away: 0.1 s, doubling up to 5 s.
RESUBSCRIBE_BACKOFF = (0.1, 5.0)


@dataclass(frozen=True)
class Message:
    """What a Subscription hears: ``data`` published on ``channel``; or, with ``missed`` set
    (``channel`` and ``data`` empty), word that its connection was lost and a new one
    subscribed, so that whatever was published in between never arrived: look at Redis."""

    channel: str
    data: str
    missed: bool = False


MISSED = Message("", "", missed=True)
#: What redis-py lets through, instead of a ConnectionError, when another thread closes a
#: pub/sub connection under a reader (a client closed while its subscriber thread reads).
CLOSED_UNDER_US = (OSError, TypeError, AttributeError, ValueError)


def lost_connection(error: Exception) -> redis.exceptions.ConnectionError:
    return redis.exceptions.ConnectionError(f"connection closed under the reader ({error!r})")


def published(raw: dict[str, Any], count: int) -> tuple[Message | None, bool]:
    """A redis-py pub/sub reply as a Message (None for a confirmation or a PONG), and whether
    it is the first confirmation of a new connection's subscription (``count``: how many
    channels the subscription has): redis-py, reconnecting on its own, subscribes again."""
    kind = raw.get("type")
    if kind in ("message", "pmessage"):
        return Message(str(raw["channel"]), str(raw["data"])), False
    return None, kind == "subscribe" and raw.get("data") == 1 and count > 0


class Subscription:
    """A pub/sub subscription to ``channels`` that outlives its connection (RedisStore.subscribe).

    ``get_message(timeout)`` returns the next Message, or None once ``timeout`` seconds passed
    without one (or at once when it has just lost its connection, so a caller's loop can
    check whether it should stop). The first call subscribes and waits for Redis to confirm
    every channel (at most CONFIRM_WAIT), so nothing published after it is missed. A lost
    connection (a restart, a failover) is subscribed again on a new one at a later call,
    after a backoff while Redis stays away (RESUBSCRIBE_BACKOFF); once it is, ``get_message``
    returns MISSED (``missed``): what
    was published in between is lost. With ``keepalive`` (seconds), a connection silent that
    long gets a PING, and one that does not answer within another ``keepalive`` is taken for
    dropped (a NAT or load balancer may drop an idle connection without a word) and
    subscribed again on a new one; so is a connection closed under it by another thread. An
    error that is not transient is raised as a Blueque error (the connection is closed; a
    later call subscribes again after the backoff).
    ``close()`` unsubscribes and gives the connection back."""

    def __init__(self, store: RedisStore, channels: Sequence[str],
                 keepalive: float | None = None) -> None:
        self._store = store
        self._channels = list(channels)
        self._keepalive = keepalive
        self._pubsub: Any = None
        self._heard: list[Message] = []  # messages read, not handed out yet
        self._subscribed_once = False
        self._retry_at = 0.0
        self._delays: Iterator[float] | None = None
        self._silent_since = 0.0  # the connection's last reply of any kind
        self._pinged: float | None = None  # a PING not answered yet

    def get_message(self, timeout: float) -> Message | None:
        deadline = time.monotonic() + max(0.0, timeout)
        try:
            if self._pubsub is None and not self._subscribe(deadline):
                return None
            return self._heard.pop(0) if self._heard else self._next(deadline)
        except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException
                ) as error:
            self._lost(error)
        except CLOSED_UNDER_US as error:
            self._lost(lost_connection(error))
        return None

    def _subscribe(self, deadline: float) -> bool:
        """Subscribe on a new connection, unless the backoff says not before ``deadline``."""
        wait = self._retry_at - time.monotonic()
        if wait > 0:
            time.sleep(max(0.0, min(wait, deadline - time.monotonic())))
            if time.monotonic() < self._retry_at:
                return False
        pubsub = self._pubsub = self._store.redis.pubsub()
        pubsub.subscribe(*self._channels)
        confirmed, until = 0, time.monotonic() + CONFIRM_WAIT
        while confirmed < len(self._channels) and time.monotonic() < until:
            raw = pubsub.get_message(timeout=max(0.0, until - time.monotonic()))
            if raw is None:
                continue
            if raw.get("type") == "subscribe":
                confirmed += 1
            message, _ = published(raw, 0)
            if message is not None:  # published on a channel confirmed already
                self._heard.append(message)
        if self._subscribed_once:
            self._heard.insert(0, MISSED)
        self._subscribed_once, self._delays = True, None
        self._silent_since, self._pinged = time.monotonic(), None
        return True

    def _next(self, deadline: float) -> Message | None:
        while True:
            wait = deadline - time.monotonic()
            if self._keepalive is not None:
                wait = min(wait, self._keep_alive())
            raw = self._pubsub.get_message(timeout=max(0.0, wait))
            if raw is not None:
                self._silent_since, self._pinged = time.monotonic(), None
                message, again = published(raw, len(self._channels))
                if message is not None or again:
                    return message or MISSED
            elif time.monotonic() >= deadline:
                return None

    def _keep_alive(self) -> float:
        """PING a connection silent for ``keepalive`` seconds; raise ConnectionError when the
        PING is not answered within another. Returns how long to listen before asking again."""
        assert self._keepalive is not None
        current = time.monotonic()
        if self._pinged is not None:
            if current - self._pinged >= self._keepalive:
                raise redis.exceptions.ConnectionError(
                    f"no reply to PING within {self._keepalive:g} s")
            return self._pinged + self._keepalive - current
        if current - self._silent_since >= self._keepalive:
            self._pubsub.ping()
            self._pinged = current
            return self._keepalive
        return self._silent_since + self._keepalive - current

    def _lost(self, error: redis.exceptions.RedisError | redis.exceptions.RedisClusterException
              ) -> None:
        self.close()
        if self._delays is None:
            self._delays = Backoff(*RESUBSCRIBE_BACKOFF, jitter=True)
        self._retry_at = time.monotonic() + next(self._delays)
        if not is_transient(error):
            raise translate(error, self._store.where) from error
        self._store.health.disrupted()
        log.debug("subscription to %s lost (%s); subscribing again", self._channels, error)

    def close(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            try:
                pubsub.close()
            except redis.exceptions.RedisError as error:
                log.debug("closing a lost subscription: %s", error)


@dataclass(frozen=True)
class Reservation:
    """The outcome of stamping a task a listener moved into its reserved list."""

    task_id: str
    verdict: str  # ok | skip | bad
    detail: str  # attempts for ok; the status or reason otherwise
    #: for ok: the task hash as the stamp left it (so the caller reads nothing more)
    fields: dict[str, str] | None = None

    @property
    def runnable(self) -> bool:
        return self.verdict == "ok"

    @property
    def attempt(self) -> int:
        return int(self.detail) if self.runnable else 0


class RedisStore:
    """Named protocol operations over one Redis connection and one key layout."""

    def __init__(self, client: RedisLike, keys: k.Keys | None = None, retry: Any = None,
                 durability: Any = None) -> None:
        self.redis = client
        self.keys = keys or k.Keys()
        self.retry = retry or NoRetry()
        #: blueque.ha.Durability: enqueues, starts and outcomes wait for replicas (WAIT)
        self.durability = durability
        self._scripts: dict[str, Script] = {}
        self._server_checked = False
        self.health = Health()
        #: the client-wide checkpoint size limit (Client(..., checkpoint_max_bytes=...))
        self.checkpoint_max_bytes = CHECKPOINT_MAX_BYTES
        self._unbounded = self

    @property
    def unbounded(self) -> RedisStore:
        """The store this one was made from by ``bounded``, with the client's whole
        ``retry_deadline``: what a task's own writes use (its checkpoints), as its child's
        start and outcome do, however the Task object was read."""
        return self._unbounded

    def bounded(self, seconds: float) -> RedisStore:
        """This store (same connection, scripts and Health) retrying each operation for at most
        ``seconds``: daemons take it for their loop, which must keep enforcing time limits
        and hearing signals while Redis is away, and retries in its own steps."""
        view = copy.copy(self)
        view.retry = self.retry.bounded(seconds)
        return view

    @property
    def where(self) -> str:
        return describe(self.redis)

    def _script(self, name: str) -> Script:
        script = self._scripts.get(name)
        if script is None:
            script = self._scripts[name] = self.redis.register_script(load_script(name))
        return script

    # --- running the protocol module's operations (blueque.aio.store has the async twin) ---
    def _execute(self, operation: protocol.Operation[T]) -> T:
        """Run an operation's steps in order, sending each step's reply back into it."""
        try:
            step = next(operation)
            while True:
                step = operation.send(self._step(step))
        except StopIteration as done:
            result: T = done.value
            return result
        finally:
            operation.close()

    def _step(self, step: protocol.Step) -> Any:
        if isinstance(step, protocol.Script):
            return self._run(step.name, step.keys, step.args, durable=step.durable)
        if isinstance(step, protocol.Command):
            return getattr(self.redis, step.name)(*step.args, **step.kwargs)
        pipe = self.redis.pipeline(transaction=step.transaction)
        for item in step.commands:
            getattr(pipe, item.name)(*item.args, **item.kwargs)
        return pipe.execute(raise_on_error=step.raise_on_error)

    def perform(self, operation: Callable[Concatenate[k.Keys, P], protocol.Operation[T]],
                *args: P.args, **kwargs: P.kwargs) -> T:
        """``operation(self.keys, *args, **kwargs)`` of blueque.protocol, retried as a whole
        and its errors translated, like every method here."""
        result: T = self._perform(lambda: operation(self.keys, *args, **kwargs))
        return result

    @translate_errors
    def _perform(self, make: Callable[[], protocol.Operation[T]]) -> T:
        return self._execute(make())  # a fresh generator for every try

    def run(self, procedure: protocol.Procedure[T]) -> T:
        """A procedure of blueque.protocol (purge, enqueue_due_tasks): each operation it
        yields runs under the retry policy on its own."""
        reply: Any = None
        try:
            while True:
                factory = procedure.send(reply)
                reply = self._perform(factory)
        except StopIteration as done:
            result: T = done.value
            return result
        finally:
            procedure.close()

    def _run(self, name: str, keys: Sequence[str], args: Sequence[Any],
             durable: bool = False) -> Any:
        if durable and self.durability is not None:
            return self.durability.run(self.redis, self._script(name), keys, args)
        return self._script(name)(keys=list(keys), args=list(args))

    def _run_with(self, name: str, keys: Sequence[str], args: Sequence[Any],
                  before: Sequence[Callable[[Any], object]] = (),
                  after: Sequence[Callable[[Any], object]] = (),
                  durable: bool = False) -> Any:
        """Run script ``name`` with plain commands before and after it in one round trip (a
        pipeline, not a transaction: each command is idempotent, so a repeat after a lost
        reply is harmless); returns the script's reply. ``EVALSHA`` directly, not redis-py's
        pipeline scripts, which cost a ``SCRIPT EXISTS`` round trip per pipeline: a server
        that lost its script cache (a restart) answers NOSCRIPT once, and the pipeline is
        sent again after loading it. With WAIT durability the script runs durably alone, and
        on a Redis Cluster (whose pipelines refuse scripts) each command goes on its own."""
        if (durable and self.durability is not None) or hasattr(self.redis, "get_nodes"):
            for add in before:
                add(self.redis)
            reply = self._run(name, keys, args, durable=durable)
            for add in after:
                add(self.redis)
            return reply
        script = self._script(name)
        for _ in range(2):
            pipe = self.redis.pipeline(transaction=False)
            for add in before:
                add(pipe)
            pipe.evalsha(script.sha, len(keys), *keys, *args)
            for add in after:
                add(pipe)
            replies = pipe.execute(raise_on_error=False)
            reply = replies[len(before)]
            if isinstance(reply, redis.exceptions.NoScriptError):
                script.sha = self.redis.script_load(script.script)
                continue
            for item in replies:
                if isinstance(item, Exception):
                    raise item
            return reply
        raise reply

    def _queues_key(self, queue: str) -> tuple[str, str]:
        return protocol.queues_key(self.keys, queue)

    def _outcome_keys(self, queue: str, now: float) -> list[str]:
        return protocol.outcome_keys(self.keys, queue, now)

    # --- creating tasks -------------------------------------------------------------------
    @translate_errors
    def submit(
        self,
        queue: str,
        task_id: str,
        parameters: str,
        now: float,
        eta: float | None = None,
        fields: dict[str, str] | None = None,
    ) -> bool:
        """Create a pending (or, with an eta, scheduled) task: protocol.submit."""
        return self._execute(protocol.submit(self.keys, queue, task_id, parameters, now, eta,
                                             fields))

    @translate_errors
    def submit_many(
        self, queue: str, tasks: Sequence[tuple[str, str]], now: float
    ) -> list[bool]:
        """Create many pending tasks; a created flag per task: protocol.submit_many."""
        return self._execute(protocol.submit_many(self.keys, queue, tasks, now))

    @translate_errors
    def enqueue_due(self, queue: str, now: float, limit: int = 1000) -> list[str]:
        """Move scheduled tasks whose eta has passed to pending: protocol.enqueue_due."""
        return self._execute(protocol.enqueue_due(self.keys, queue, now, limit))

    @translate_errors
    def due_count(self, queue: str, now: float) -> int:
        """ZCOUNT of the scheduled entries whose eta has passed: protocol.due_count."""
        return self._execute(protocol.due_count(self.keys, queue, now))

    # --- reading --------------------------------------------------------------------------
    @translate_errors
    def task_data(self, task_id: str) -> dict[str, str]:
        """HGETALL of one task hash ({} if missing)."""
        return self._execute(protocol.task_data(self.keys, task_id))

    @translate_errors
    def task_data_many(self, task_ids: Sequence[str]) -> list[dict[str, str]]:
        """HGETALL of many task hashes in one pipeline ({} for a missing or foreign key)."""
        return self._execute(protocol.task_data_many(self.keys, task_ids))

    @translate_errors
    def task_fields(self, task_id: str, fields: Sequence[str]) -> dict[str, str]:
        """HMGET of some fields of one task hash (the missing ones left out)."""
        values = self.redis.hmget(self.keys.task(task_id), list(fields))
        return {name: value for name, value in zip(fields, values, strict=True)
                if value is not None}

    @translate_errors
    def task_statuses(self, task_ids: Sequence[str]) -> list[str | None]:
        """HGET status of many task hashes in one pipeline (None where the hash is missing):
        how blueque.spark.wait_for_tasks follows a batch without reading results."""
        pipe = self.redis.pipeline(transaction=False)
        for task_id in task_ids:
            pipe.hget(self.keys.task(task_id), "status")
        return cast(list["str | None"], pipe.execute())

    @translate_errors
    def counts(self, queue: str) -> QueueCounts:
        """Counts per state from O(1) commands (plus one LLEN per listener)."""
        return self._execute(protocol.counts(self.keys, queue))

    @translate_errors
    def task_ids(self, queue: str, status: str, start: int = 0, stop: int = -1) -> list[str]:
        """Ids of a queue's tasks in one state, from the list, set or zset that holds them."""
        return self._execute(protocol.task_ids(self.keys, queue, status, start, stop))

    @translate_errors
    def known_queues(self) -> list[tuple[str, float]]:
        """blueque_queues: every queue with its listener count."""
        return self._execute(protocol.known_queues(self.keys))

    @translate_errors
    def listener_ids(self, queue: str) -> set[str]:
        return cast(set[str], self.redis.smembers(self.keys.listeners(queue)))

    @translate_errors
    def listener_ids_many(self, queues: Sequence[str]) -> set[str]:
        """The listeners of any of these queues (a pipeline of SMEMBERS)."""
        pipe = self.redis.pipeline(transaction=False)
        for queue in queues:
            pipe.smembers(self.keys.listeners(queue))
        return set().union(*pipe.execute())

    # --- listeners ------------------------------------------------------------------------
    @translate_errors
    def add_listener(self, queue: str, listener_id: str) -> None:
        """SADD blueque_listeners_[queue]; ZINCRBY blueque_queues 1 (as blueque 1.0.1)."""
        pipe = self.redis.pipeline(transaction=not self.keys.hash_tags)
        pipe.sadd(self.keys.listeners(queue), listener_id)
        pipe.zincrby(self.keys.queues(), 1, queue)
        pipe.execute()

    @translate_errors
    def remove_listener(self, queue: str, listener_id: str) -> bool:
        """SREM the listener; only the caller that removed it decrements blueque_queues."""
        removed = bool(self.redis.srem(self.keys.listeners(queue), listener_id))
        if removed:
            self.redis.zincrby(self.keys.queues(), -1, queue)
        return removed

    @translate_errors
    def lease(self, queue: str, listener_id: str, ttl_ms: int, mode: str) -> int:
        """register | renew | release a listener's lease (server clock). -1: lease was lost."""
        return int(self._run("lease", [self.keys.leases(queue)], [listener_id, ttl_ms, mode]))

    @translate_errors
    def expired_listeners(self, queue: str) -> list[str]:
        """Listeners whose lease deadline has passed by the Redis server's clock."""
        seconds, micros = self.redis.time()
        now_ms = seconds * 1000 + micros // 1000
        return cast(list[str], self.redis.zrangebyscore(self.keys.leases(queue), "-inf", now_ms))

    @translate_errors
    def leases(self, queue: str) -> dict[str, float]:
        """Every lease of a queue: listener id -> deadline (server ms)."""
        return dict(self.redis.zrange(self.keys.leases(queue), 0, -1, withscores=True))

    @translate_errors
    def server_run(self) -> tuple[str, float]:
        """(run id, start time by the server clock in Unix s) from INFO server: a Redis
        restart changes both, even one this client never saw as a lost connection. For a
        cluster, every master's run ids and the latest start."""
        info: dict[str, Any] = self.redis.info("server")
        nodes = [info] if "run_id" in info else [v for v in info.values() if isinstance(v, dict)]
        seconds, micros = self.redis.time()
        clock = float(seconds) + float(micros) / 1e6
        run_ids = sorted(str(node.get("run_id", "")) for node in nodes)
        uptime = min((float(node.get("uptime_in_seconds", 0)) for node in nodes), default=0.0)
        return ",".join(run_ids), clock - uptime - 1.0  # whole seconds: the earliest start

    @translate_errors
    def server_time(self) -> float:
        seconds, micros = self.redis.time()
        return float(seconds) + float(micros) / 1e6

    @translate_errors
    def write_listener_info(self, listener_id: str, info: dict[str, str], ttl_s: int) -> None:
        """The listener's description (host, pid, create time, queues), expiring with it."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(self.keys.listener_info(listener_id), mapping=info)
        pipe.expire(self.keys.listener_info(listener_id), ttl_s)
        pipe.execute()

    @translate_errors
    def listener_info(self, listener_id: str) -> dict[str, str]:
        return cast(dict[str, str], self.redis.hgetall(self.keys.listener_info(listener_id)))

    @translate_errors
    def delete_listener_info(self, listener_id: str) -> None:
        self.redis.delete(self.keys.listener_info(listener_id))

    @translate_errors
    def record_runs(self, node: str, runs: dict[str, str], ttl_s: int) -> None:
        """HSET blueque_node_[node] pid -> run (JSON); EXPIRE: the node's runs, so that the
        next listener or scheduler on the node finds those whose listener died."""
        pipe = self.redis.pipeline(transaction=False)
        if runs:
            pipe.hset(self.keys.node_runs(node), mapping=runs)
        pipe.expire(self.keys.node_runs(node), ttl_s)
        pipe.execute()

    @translate_errors
    def forget_runs(self, node: str, pids: Sequence[str]) -> None:
        """HDEL ended runs from blueque_node_[node] (the hash goes with its last field)."""
        if pids:
            self.redis.hdel(self.keys.node_runs(node), *pids)

    @translate_errors
    def node_runs(self, node: str) -> dict[str, str]:
        return cast(dict[str, str], self.redis.hgetall(self.keys.node_runs(node)))

    @translate_errors
    def reserved_ids(self, queue: str, listener_id: str) -> list[str]:
        return cast(list[str], self.redis.lrange(self.keys.reserved(queue, listener_id), 0, -1))

    # --- reserving and running ------------------------------------------------------------
    @translate_errors
    def move_pending(self, queue: str, listener_id: str, block: float | None) -> str | None:
        """LMOVE (or BLMOVE for up to ``block`` seconds) the oldest pending id into the
        listener's reserved list. Follow with stamp(); a crash in between is recovered."""
        source, target = self.keys.pending(queue), self.keys.reserved(queue, listener_id)
        if block is None:
            return cast("str | None", self.redis.lmove(source, target, "RIGHT", "LEFT"))
        return cast("str | None", self.redis.blmove(source, target, block, "RIGHT", "LEFT"))

    @translate_errors
    def stamp(self, queue: str, listener_id: str, task_id: str, now: float) -> Reservation:
        """Mark a moved task reserved by this listener and count the attempt (stamp.lua);
        an ok Reservation carries the task's fields."""
        return self._reservation(task_id, self._run("stamp", *self._stamp_call(
            queue, listener_id, task_id, now, None, None)))

    @translate_errors
    def begin_run(self, queue: str, listener_id: str, task_id: str, now: float, pid: int,
                  pid_created: float | None, node: str, record: str, ttl_s: int
                  ) -> Reservation:
        """The listener daemon's start of a run (PROTOCOL.md 6.2), in one round trip: record
        the forked process on its node (HSET blueque_node_[node] pid record; EXPIRE), then
        stamp.lua with its pid: pending -> started by that process (durable like start)."""
        runs = self.keys.node_runs(node)
        keys, args = self._stamp_call(queue, listener_id, task_id, now, pid, pid_created)
        reply = self._run_with(
            "stamp", keys, args, durable=True,
            before=[lambda pipe: pipe.hset(runs, str(pid), record),
                    lambda pipe: pipe.expire(runs, ttl_s)])
        return self._reservation(task_id, reply)

    def _stamp_call(self, queue: str, listener_id: str, task_id: str, now: float,
                    pid: int | None, pid_created: float | None
                    ) -> tuple[list[str], list[Any]]:
        keys = [self.keys.task(task_id), self.keys.reserved(queue, listener_id),
                self.keys.failed(queue), *self._outcome_keys(queue, now)]
        if pid is not None:
            keys.append(self.keys.started(queue))
        return keys, [task_id, listener_id, repr(now), queue, k.FINISHED_MINUTE_TTL,
                      "" if pid is None else pid,
                      "" if pid_created is None else repr(pid_created)]

    @staticmethod
    def _reservation(task_id: str, reply: Sequence[Any]) -> Reservation:
        verdict, detail = reply[0], reply[1]
        fields = None
        if verdict == "ok" and len(reply) > 2:
            flat = reply[2]
            fields = dict(zip(flat[::2], flat[1::2], strict=True))
        return Reservation(task_id, verdict, str(detail), fields)

    @translate_errors
    def start(
        self,
        queue: str,
        task_id: str,
        listener_id: str,
        pid: int,
        now: float,
        attempt: int | None = None,
        pid_created: float | None = None,
    ) -> None:
        """Reserved -> started with the process id (start.lua); raises if it may not run."""
        self._run(
            "start",
            [self.keys.task(task_id), self.keys.started(queue),
             self.keys.reserved(queue, listener_id)],
            [task_id, listener_id, pid, repr(now), "" if attempt is None else attempt,
             "" if pid_created is None else repr(pid_created)],
            durable=True,
        )

    @translate_errors
    def finish(
        self,
        queue: str,
        task_id: str,
        listener_id: str,
        pid: int | None,
        outcome: str,
        text: str,
        now: float,
        attempt: int | None = None,
        retry_eta: float | None = None,
        result_ttl_ms: int | None = None,
        extra: tuple[str, str] | None = None,
        traceback: str | None = None,
        forget_run: tuple[str, int] | None = None,
    ) -> str:
        """Record complete | failed | retry for one run (finish.lua); returns the new status.
        ``traceback`` goes to its own field beside a failure's ``error``. ``forget_run``
        (node identity, pid): the listener daemon drops the run's record from
        blueque_node_[node] in the same round trip (PROTOCOL.md 6.2)."""
        if outcome == "complete":
            target = self.keys.complete(queue)
        elif outcome == "failed":
            target = self.keys.failed(queue)
        elif outcome == "retry" and retry_eta is not None:
            target = self.keys.scheduled(queue)
        elif outcome == "preempted":
            target = self.keys.pending(queue)
        else:
            raise ValueError(f"unknown outcome {outcome!r} (or retry without an eta)")
        field, value = extra or ("", "")
        keys = [self.keys.task(task_id), self.keys.reserved(queue, listener_id),
                self.keys.started(queue), target, *self._outcome_keys(queue, now),
                self.keys.checkpoint(task_id)]
        args = [task_id, listener_id, "" if pid is None else pid, outcome, text, repr(now),
                "" if attempt is None else attempt, "" if retry_eta is None else repr(retry_eta),
                "" if result_ttl_ms is None else result_ttl_ms, self.keys.done_channel(queue),
                field, value, k.FINISHED_MINUTE_TTL, traceback or "",
                self.keys.channel(queue), queue]
        if forget_run is None:
            return str(self._run("finish", keys, args, durable=True))
        runs, run = self.keys.node_runs(forget_run[0]), str(forget_run[1])
        return str(self._run_with("finish", keys, args, durable=True,
                                  after=[lambda pipe: pipe.hdel(runs, run)]))

    # --- preemption (PROTOCOL.md 6.3) --------------------------------------------------------
    @translate_errors
    def request_preemption(self, node_name: str, fields: dict[str, str], ttl_s: int) -> None:
        """HSET blueque_preempt_[node name] (deadline, grace, requested_at, reason); EXPIRE;
        PUBLISH blueque_preempt_channel_[node name]: its listeners hear it at once, or read
        the hash at their next renewal."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(self.keys.preemption(node_name), mapping=fields)
        pipe.expire(self.keys.preemption(node_name), ttl_s)
        pipe.publish(self.keys.preemption_channel(node_name), node_name)
        pipe.execute()

    @translate_errors
    def preemption(self, node_name: str) -> dict[str, str]:
        """HGETALL blueque_preempt_[node name] ({}: no preemption announced)."""
        return cast(dict[str, str], self.redis.hgetall(self.keys.preemption(node_name)))

    @translate_errors
    def withdraw_preemption(self, node_name: str) -> bool:
        """DEL blueque_preempt_[node name]; False if there was none."""
        return bool(self.redis.delete(self.keys.preemption(node_name)))

    @translate_errors
    def progress(self, task_id: str, attempt: int, fraction: float, message: str,
                 now: float) -> None:
        """Record a running task's progress (progress.lua, fenced by attempt)."""
        self._run("progress", [self.keys.task(task_id)],
                  [attempt, repr(fraction), message, repr(now)])

    @translate_errors
    def save_checkpoint(self, task_id: str, attempt: int, listener_id: str, state: str,
                        now: float) -> int:
        """Store a running attempt's checkpoint (checkpoint.lua, fenced by attempt and
        listener); returns its size in bytes. Keys: task hash, blueque_checkpoint_[id].
        Raises StaleAttempt when the run was superseded or has ended: nothing is written."""
        return int(self._run(
            "checkpoint", [self.keys.task(task_id), self.keys.checkpoint(task_id)],
            [task_id, attempt, listener_id, state, repr(now), int(CHECKPOINT_KEEP * 1000)],
        ))

    @translate_errors
    def checkpoint(self, task_id: str) -> dict[str, str]:
        """HGETALL blueque_checkpoint_[id]: state, saved_at, attempt, size ({} if none)."""
        return cast(dict[str, str], self.redis.hgetall(self.keys.checkpoint(task_id)))

    @translate_errors
    def checkpoint_info(self, task_id: str) -> dict[str, str]:
        """HMGET blueque_checkpoint_[id] saved_at attempt size: what a checkpoint is without
        its state, which may be a mebibyte ({} if none)."""
        names = ("saved_at", "attempt", "size")
        values = self.redis.hmget(self.keys.checkpoint(task_id), list(names))
        return {name: value for name, value in zip(names, values, strict=True)
                if value is not None}

    @translate_errors
    def recover(
        self,
        queue: str,
        listener_id: str,
        verdicts: Iterable[tuple[str, str, str, float | None, str]],
        now: float,
        mode: str,
        release: bool = True,
    ) -> list[int]:
        """Apply verdicts (id, attempts seen, pending|retry|failed|drop, eta, error) to a dead
        listener's reserved tasks (recover.lua). ``mode`` is "lease" (its lease expired) or
        "host" (death proven on its host). Returns [requeued, retried, failed, skipped], or
        [-1] when the claim failed (the lease is live, or someone else recovered it)."""
        queues_key, use_queues = self._queues_key(queue)
        keys = [self.keys.leases(queue), self.keys.listeners(queue),
                self.keys.reserved(queue, listener_id), self.keys.pending(queue),
                self.keys.started(queue), self.keys.scheduled(queue), self.keys.failed(queue),
                queues_key, *self._outcome_keys(queue, now)]
        args: list[Any] = [listener_id, repr(now), mode, queue, use_queues,
                           self.keys.channel(queue), "1" if release else "0",
                           k.FINISHED_MINUTE_TTL]
        for task_id, attempts, verdict, eta, error in verdicts:
            keys.append(self.keys.task(task_id))
            args += [task_id, attempts, verdict, "" if eta is None else repr(eta), error]
        counts = [int(n) for n in self._run("recover", keys, args)]
        if counts != [-1] and release and self.keys.hash_tags:
            self.redis.zincrby(self.keys.queues(), -1, queue)
        return counts

    @translate_errors
    def claim_reserved(self, queue: str, dead_listener: str, new_listener: str) -> str | None:
        """blueque 1.0.1's orphan claim: the dead listener's first reserved task, marked with
        reclaimed_node (the caller has already won the claim with remove_listener)."""
        task_id = cast("str | None", self.redis.lindex(self.keys.reserved(queue, dead_listener), 0))
        if task_id is not None:
            self.redis.hset(self.keys.task(task_id), "reclaimed_node", new_listener)
        return task_id

    @translate_errors
    def cancel(self, queue: str, task_id: str, now: float, error: str) -> tuple[str, str]:
        """cancel.lua; for a running task also PUBLISH its id on its listener's channel."""
        return self._execute(protocol.cancel(self.keys, queue, task_id, now, error))

    # --- finished tasks -------------------------------------------------------------------
    @translate_errors
    def delete(self, queue: str, task_id: str, status: str) -> bool:
        """DEL the task hash, its output stream and checkpoint, and its complete/failed list
        entry (delete.lua)."""
        return self._execute(protocol.delete(self.keys, queue, task_id, status))

    @translate_errors
    def drop_finished_entry(self, queue: str, status: str, task_id: str) -> None:
        """LREM one entry from the old end of a finished list, leaving the hash alone."""
        self._execute(protocol.drop_finished_entry(self.keys, queue, status, task_id))

    @translate_errors
    def oldest_finished(self, queue: str, status: str, count: int) -> list[str]:
        """The ``count`` oldest ids of a finished list, oldest first (from its right end)."""
        return self._execute(protocol.oldest_finished(self.keys, queue, status, count))

    # --- queue configuration --------------------------------------------------------------
    @translate_errors
    def queue_config(self, queue: str) -> dict[str, str]:
        return self._execute(protocol.queue_config(self.keys, queue))

    @translate_errors
    def set_queue_config(self, queue: str, values: dict[str, str], remove: Sequence[str] = ()
                         ) -> None:
        self._execute(protocol.set_queue_config(self.keys, queue, values, remove))

    @translate_errors
    def forget_queue(self, queue: str) -> bool:
        """Remove an empty queue with no listeners from blueque_queues, with its defaults and
        outcome counts (forget_queue.lua); False if it was not listed. InvalidTaskState if it
        holds tasks or has listeners."""
        queues_key, use_queues = self._queues_key(queue)
        k_ = self.keys
        keys = [k_.pending(queue), k_.scheduled(queue), k_.started(queue), k_.complete(queue),
                k_.failed(queue), k_.listeners(queue), k_.leases(queue), k_.queue_config(queue),
                k_.outcome_counts(queue), queues_key]
        known = bool(self._run("forget_queue", keys, [queue, use_queues]))
        if self.keys.hash_tags:
            known = bool(self.redis.zrem(self.keys.queues(), queue))
        return known

    # --- scheduler and operator tools -----------------------------------------------------
    @translate_errors
    def cron_ticks(self) -> dict[str, str]:
        """blueque_cron: periodic task name -> last tick fired (Unix s)."""
        return cast(dict[str, str], self.redis.hgetall(self.keys.cron()))

    @translate_errors
    def advance_cron(self, name: str, expected: str | None, tick: int) -> bool:
        """Compare-and-set a periodic task's last fired tick (cron_advance.lua); False if
        another scheduler moved it first. Keys: blueque_cron."""
        return bool(self._run("cron_advance", [self.keys.cron()],
                              [name, expected or "", str(tick)]))

    @translate_errors
    def retry_failed(self, queue: str, task_id: str, now: float) -> None:
        """Failed -> pending again, attempts kept, checkpoint kept for the re-run
        (retry_failed.lua). Raises TaskNotFound or InvalidTaskState (not failed)."""
        self._execute(protocol.retry_failed(self.keys, queue, task_id, now))

    # --- watching: reads for the dashboard and the metrics (windows, never whole lists) --
    # Each read of many queues is a fixed number of pipelines, whatever the number of queues.
    @translate_errors
    def counts_many(self, queues: Sequence[str]) -> list[QueueCounts]:
        """counts() of many queues in two pipelines."""
        return self._execute(protocol.counts_many(self.keys, queues))

    @translate_errors
    def outcomes_per_minute_many(self, queues: Sequence[str], minutes: Sequence[int]
                                 ) -> list[list[dict[str, int]]]:
        """blueque_finished_per_minute_[queue]_[minute] for each queue and minute (its first
        second), in one pipeline: per queue, per minute, outcome -> count ({} for a minute in
        which nothing ended)."""
        pipe = self.redis.pipeline(transaction=False)
        for queue in queues:
            for minute in minutes:
                pipe.hgetall(self.keys.finished_per_minute(queue, str(minute)))
        counts = [_counts(reply) for reply in _tolerating_wrong_types(pipe)]
        return [counts[n * len(minutes):(n + 1) * len(minutes)] for n in range(len(queues))]

    def outcomes_per_minute(self, queue: str, minutes: Sequence[int]
                            ) -> list[dict[str, int]]:
        return self.outcomes_per_minute_many([queue], minutes)[0]

    @translate_errors
    def outcome_counts_many(self, queues: Sequence[str]) -> list[dict[str, int]]:
        """blueque_outcome_counts_[queue] of each queue, in one pipeline: outcome -> tasks
        that ever ended so."""
        pipe = self.redis.pipeline(transaction=False)
        for queue in queues:
            pipe.hgetall(self.keys.outcome_counts(queue))
        return [_counts(reply) for reply in _tolerating_wrong_types(pipe)]

    def outcome_counts(self, queue: str) -> dict[str, int]:
        return self.outcome_counts_many([queue])[0]

    @translate_errors
    def oldest_pending_many(self, queues: Sequence[str]
                            ) -> list[tuple[str, dict[str, str]] | None]:
        """Per queue, the task next in line (the right end of the pending list) with its
        ``created`` and ``updated`` (none for a key that is no hash), or None when nothing is
        pending: a pipeline of LINDEX -1, then one of HMGET."""
        pipe = self.redis.pipeline(transaction=False)
        for queue in queues:
            pipe.lindex(self.keys.pending(queue), -1)
        heads = cast(list["str | None"], pipe.execute())
        pipe = self.redis.pipeline(transaction=False)
        for task_id in heads:
            if task_id is not None:
                pipe.hmget(self.keys.task(task_id), "created", "updated")
        replies = iter(_tolerating_wrong_types(pipe))
        found: list[tuple[str, dict[str, str]] | None] = []
        for task_id in heads:
            if task_id is None:
                found.append(None)
                continue
            reply = next(replies)
            values = reply if isinstance(reply, list) else [None, None]
            found.append((task_id, {name: value for name, value in zip(
                ("created", "updated"), values, strict=True) if value is not None}))
        return found

    def oldest_pending(self, queue: str) -> tuple[str, dict[str, str]] | None:
        """The task next in line with its ``created`` and ``updated`` (LINDEX -1, HMGET)."""
        return self.oldest_pending_many([queue])[0]

    @translate_errors
    def started_entries(self, queue: str) -> list[tuple[str, str, str]]:
        """blueque_started_tasks_[queue] as (listener id, pid, task id), sorted."""
        return _started_entries(self.redis.smembers(self.keys.started(queue)))

    @translate_errors
    def listeners_at_work(self, queues: Sequence[str]) -> list[ListenersAtWork]:
        """Per queue, its registered listeners, its leases (listener id -> deadline, server
        ms) and its started entries (as started_entries), in one pipeline."""
        pipe = self.redis.pipeline(transaction=False)
        for queue in queues:
            pipe.smembers(self.keys.listeners(queue))
            pipe.zrange(self.keys.leases(queue), 0, -1, withscores=True)
            pipe.smembers(self.keys.started(queue))
        replies = pipe.execute()
        return [ListenersAtWork(set(replies[n]), dict(replies[n + 1]),
                                _started_entries(replies[n + 2]))
                for n in range(0, len(replies), 3)]

    @translate_errors
    def listener_infos(self, listener_ids: Sequence[str]) -> list[dict[str, str]]:
        """HGETALL blueque_listener_[id] for many listeners in one pipeline."""
        pipe = self.redis.pipeline(transaction=False)
        for listener in listener_ids:
            pipe.hgetall(self.keys.listener_info(listener))
        return cast(list[dict[str, str]], pipe.execute())

    @translate_errors
    def scheduled_counts(self, queues: Sequence[str]) -> list[int]:
        """ZCARD blueque_scheduled_tasks_[queue] of each queue, in one pipeline."""
        pipe = self.redis.pipeline(transaction=False)
        for queue in queues:
            pipe.zcard(self.keys.scheduled(queue))
        return cast(list[int], pipe.execute())

    @translate_errors
    def scheduled_windows(self, queues: Sequence[str], count: int
                          ) -> list[list[tuple[str, float]]]:
        """The ``count`` soonest scheduled tasks (id, eta) of each queue, in one pipeline."""
        pipe = self.redis.pipeline(transaction=False)
        for queue in queues:
            pipe.zrange(self.keys.scheduled(queue), 0, count - 1, withscores=True)
        return cast(list[list[tuple[str, float]]], pipe.execute())

    # --- task output (blueque_task_log_[id], a stream) ---------------------------------------
    @translate_errors
    def append_output(self, task_id: str, attempt: str, text: str, offset: int,
                      end: bool = False, ttl_ms: int | None = None) -> str:
        """XADD one chunk of an attempt's output (``end``: the attempt's last entry) and
        PEXPIRE the stream, in one transaction; returns the entry id."""
        fields = {"attempt": attempt, "data": text, "offset": str(offset)}
        if end:
            fields["end"] = "1"
        pipe = self.redis.pipeline(transaction=True)
        pipe.xadd(self.keys.task_log(task_id), dict(fields))
        if ttl_ms:
            pipe.pexpire(self.keys.task_log(task_id), ttl_ms)
        return str(pipe.execute()[0])

    @translate_errors
    def drop_output(self, task_id: str, entry_ids: Sequence[str]) -> None:
        """XDEL older chunks of an attempt: each keeps only its last TAIL_BYTES."""
        self.redis.xdel(self.keys.task_log(task_id), *entry_ids)

    @translate_errors
    def last_output(self, task_id: str) -> dict[str, str]:
        """The stream's newest entry's fields ({} if none)."""
        entries = self.redis.xrevrange(self.keys.task_log(task_id), count=1)
        return dict(entries[0][1]) if entries else {}

    @translate_errors
    def output_after(self, task_id: str, after: str = "-", count: int | None = None
                     ) -> list[tuple[str, dict[str, str]]]:
        """Entries after ``after`` (an entry id, exclusive; "-" for all), oldest first."""
        start = "-" if after == "-" else "(" + after
        entries = self.redis.xrange(self.keys.task_log(task_id), start, "+", count=count)
        return [(str(entry), dict(fields)) for entry, fields in entries]

    # --- notifications --------------------------------------------------------------------
    def subscribe(self, channels: Sequence[str], keepalive: float | None = None
                  ) -> Subscription:
        """A Subscription to ``channels`` (done channels, queue channels, a listener's control
        channel) that subscribes again after an outage and, with ``keepalive``, notices a
        silently dropped connection; see Subscription."""
        return Subscription(self, channels, keepalive)

    def pubsub(self) -> Any:
        """redis-py's raw pub/sub object (ignore_subscribe_messages). Deprecated: only the
        listener daemon's subscriber thread still uses it, until it switches to
        ``subscribe(channels, keepalive=interval)``; then this method goes."""
        return self.redis.pubsub(ignore_subscribe_messages=True)

    def ping(self) -> None:
        """PING, then check the server once (check_server): RedisUnavailable,
        AuthenticationFailed, ConfigurationError or UnsupportedServer say what is wrong."""
        try:
            self.redis.ping()
        except redis.exceptions.RedisError as error:
            raise translate(error, self.where) from error
        self.check_server()

    def check_server(self) -> None:
        """Once per store: refuse a server older than MIN_REDIS_VERSION with a clear error
        (INFO server), rather than failing at the first reserve."""
        if self._server_checked:
            return
        try:
            info = self.redis.info("server")
        except redis.exceptions.RedisError as error:
            raise translate(error, self.where) from error
        check_version(info, self.where)
        self._server_checked = True


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


def now() -> float:
    """Task timestamps use the client's clock, as blueque 1.0.1 does."""
    return time.time()
