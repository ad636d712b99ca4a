"""AsyncRedisStore: the asyncio runner of blueque.protocol's operations, on redis.asyncio.

The twin of blueque.store.RedisStore for the client-side operations: the same operation
descriptions (keys, scripts, arguments, reply decoding), the same retry policy (awaited) and
the same translation of redis-py errors into the BluequeError tree.

Pipelining: script calls and single commands that coroutines make while a round trip is in
flight are sent together, in one pipeline on one connection (``Pipeliner``): a hundred
concurrent enqueues cost a few round trips, not a hundred connections.

Cancellation: each step is one command, one pipeline or one script call, and Redis runs a
script whole or not at all. A coroutine cancelled while it awaits a pipelined step stops
waiting; the pipeline, sent by a task of its own, still reads every reply, so its connection
stays clean. A coroutine cancelled while it awaits a reply on a connection of its own (a
pipeline step, a subscription) leaves that connection to redis-py, which disconnects it (a
reply may be pending on it) and gives it back to the pool. So a cancelled call leaks no
connection and leaves no task half-written.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

import redis
import redis.asyncio.cluster

from blueque import keys as k
from blueque import protocol
from blueque.aio import wire
from blueque.clock import ServerClock
from blueque.errors import BluequeError
from blueque.ha import Durability
from blueque.retry import NoRetry, RetryPolicy, is_transient
from blueque.store import (
    CLOSED_UNDER_US,
    MISSED,
    Health,
    Message,
    Resubscribing,
    check_version,
    describe,
    load_script,
    lost_connection,
    published,
    translate,
)
from blueque.store.direct import packed_evalsha

log = logging.getLogger("blueque.aio")

T = TypeVar("T")
P = ParamSpec("P")

_REDIS_ERRORS = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException)


class AsyncRedisStore:
    """blueque.protocol's operations over one redis.asyncio client and one key layout."""

    def __init__(self, client: Any, keys: k.Keys | None = None,
                 retry: RetryPolicy | NoRetry | None = None,
                 durability: Durability | None = None) -> None:
        self.redis = client
        self.keys = keys or k.Keys()
        self.retry: RetryPolicy | NoRetry = retry or NoRetry()
        #: blueque.ha.Durability: enqueues wait for replicas (WAIT), as in the sync store
        self.durability = durability
        self._scripts: dict[str, Any] = {}
        self._server_checked = False
        self.health = Health()
        #: Redis' clock (blueque.clock), shared by the copies bounded() makes
        self.clock = ServerClock()
        # a cluster routes each command to its slot's node; WAIT must follow its own script
        plain = not isinstance(client, redis.asyncio.cluster.RedisCluster)
        self._pipeliner = Pipeliner(client) if plain and durability is None else None

    async def now(self) -> float:
        """Unix seconds on Redis' clock (the sync store's ``now``, awaited): a TIME round
        trip when first needed and then every minute; never raises."""
        clock = self.clock
        if clock.due():
            before = clock.local()
            try:
                seconds, micros = await self.redis.time()
            except (*_REDIS_ERRORS, OSError) as error:
                log.debug("Redis' clock not read (%s); using the last offset", error)
                clock.failed()
            else:
                clock.measured(before, float(seconds) + float(micros) / 1e6, clock.local())
        return clock.now()

    def bounded(self, seconds: float) -> AsyncRedisStore:
        """This store (same connections, scripts and Health) retrying each operation for at
        most ``seconds``."""
        view = copy.copy(self)
        view.retry = self.retry.bounded(seconds)
        return view

    @property
    def where(self) -> str:
        return describe(self.redis)

    async def perform(self, operation: Callable[Concatenate[k.Keys, P], protocol.Operation[T]],
                      *args: P.args, **kwargs: P.kwargs) -> T:
        """``operation(self.keys, *args, **kwargs)`` of blueque.protocol, retried as a whole
        under the retry policy; redis-py errors come out as Blueque errors."""
        return await self._perform(lambda: operation(self.keys, *args, **kwargs))

    async def run(self, procedure: protocol.Procedure[T]) -> T:
        """A procedure of blueque.protocol (purge, enqueue_due_tasks, cancel_waiting...): each
        operation it yields runs under the retry policy on its own; its error (a Blueque
        error) is thrown into the procedure."""
        reply: Any = None
        error: BluequeError | None = None
        try:
            while True:
                # a refusal goes back into the procedure, which may step over it (a task
                # retried or deleted meanwhile); if it does not, it leaves from here
                factory = procedure.send(reply) if error is None else procedure.throw(error)
                try:
                    reply, error = await self._perform(factory), None
                except BluequeError as refused:
                    reply, error = None, refused
        except StopIteration as done:
            result: T = done.value
            return result
        finally:
            procedure.close()

    async def _perform(self, make: Callable[[], protocol.Operation[T]]) -> T:
        async def attempt() -> T:
            try:
                return await self._execute(make())  # a fresh generator for every try
            except Exception as error:
                if is_transient(error):
                    self.health.disrupted()
                raise

        try:
            result: T = await self.retry.acall(attempt)
            return result
        except _REDIS_ERRORS as error:
            raise translate(error, self.where) from error

    async def _execute(self, operation: protocol.Operation[T]) -> T:
        try:
            step = next(operation)
            while True:
                step = operation.send(await self._step(step))
        except StopIteration as done:
            result: T = done.value
            return result
        finally:
            operation.close()

    async def _step(self, step: protocol.Step) -> Any:
        if isinstance(step, protocol.Script):
            script = self._script(step.name)
            if step.durable and self.durability is not None:
                return await self.durability.arun(self.redis, script, step.keys, step.args)
            if self._pipeliner is not None:
                try:
                    return await self._pipeliner.evalsha(script.sha, step.keys, step.args)
                except redis.exceptions.NoScriptError:
                    pass  # a restarted or flushed server: the script call loads it again
            return await script(keys=list(step.keys), args=list(step.args))
        if isinstance(step, protocol.Command):
            if self._pipeliner is not None:
                return await self._pipeliner.call(step)
            return await getattr(self.redis, step.name)(*step.args, **step.kwargs)
        pipe = self.redis.pipeline(transaction=step.transaction)
        for item in step.commands:
            getattr(pipe, item.name)(*item.args, **item.kwargs)
        return await pipe.execute(raise_on_error=step.raise_on_error)

    def _script(self, name: str) -> Any:
        script = self._scripts.get(name)
        if script is None:
            script = self._scripts[name] = self.redis.register_script(load_script(name))
        return script

    def subscribe(self, channels: Sequence[str]) -> AsyncSubscription:
        """An AsyncSubscription to ``channels`` that subscribes again after an outage."""
        return AsyncSubscription(self, channels)

    async def aclose(self) -> None:
        """Disconnect the connection of its own that script calls go on (Pipeliner)."""
        if self._pipeliner is not None:
            await self._pipeliner.aclose()

    async def ping(self) -> None:
        """PING, then check the server once: RedisUnavailable, AuthenticationFailed,
        ConfigurationError or UnsupportedServer say what is wrong."""
        try:
            await self.redis.ping()
            if not self._server_checked:
                check_version(await self.redis.info("server"), self.where)
                self._server_checked = True
        except _REDIS_ERRORS as error:
            raise translate(error, self.where) from error


class Pipeliner:
    """Sends what coroutines ask for while a round trip is in flight together, and hands each
    caller its own reply or error. Script calls go on a connection of the store's own, taken
    over by blueque.aio.wire (written as they come, read by a protocol); other commands, and
    script calls where no wire can be had, go in one pipeline (not a transaction: each
    command, a script call included, is atomic on its own), at most one in flight per client.
    A caller that is cancelled stops waiting; its command is sent anyway if it had already
    left (as a reply lost to a crash)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._waiting: list[tuple[protocol.Command, asyncio.Future[Any]]] = []
        self._sender: asyncio.Task[None] | None = None
        #: the wire is made as the pool makes its own connections and kept apart from it
        pool = getattr(client, "connection_pool", None)
        kind = getattr(pool, "connection_class", None)
        self._pool: Any = pool if (
            isinstance(pool, redis.asyncio.ConnectionPool) and isinstance(kind, type)
            and kind.__module__.startswith("redis.")) else None
        self._wire: wire.Wire | None = None
        self._opening: asyncio.Future[wire.Wire | None] | None = None
        #: how the wire's connection encodes arguments (its redis-py encoder)
        self._encoder: Any = None

    async def evalsha(self, sha: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """A script call: on the wire, or in a pipeline where no wire can be had."""
        if self._pool is not None:
            line = self._wire if self._wire is not None and self._wire.lost is None else \
                await self._open()
            if line is not None:
                return await line.call(packed_evalsha(self._encoder, sha, keys, args))
        return await self.call(protocol.command("evalsha", sha, len(keys), *keys, *args))

    async def call(self, command: protocol.Command) -> Any:
        """A command, in the pipeline of the next round trip."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting.append((command, future))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.ensure_future(self._send())
        return await future

    async def _open(self) -> wire.Wire | None:
        """The wire, connected again if it was lost (a failure to connect is the call's, for
        the retry policy); None when this client's connections cannot be taken over (the call
        goes in a pipeline). Callers that come while it connects wait for the same
        connection."""
        if self._opening is None or self._opening.done():
            self._opening = asyncio.ensure_future(self._connect())
        return await asyncio.shield(self._opening)

    async def _connect(self) -> wire.Wire | None:
        connection = self._pool.connection_class(**self._pool.connection_kwargs)
        try:
            self._wire = await wire.open_wire(connection, describe(self._client))
        except wire.Unusable as error:
            log.debug("%s; script calls go in pipelines", error)
            self._pool = None
            return None
        self._encoder = connection.encoder
        return self._wire

    async def _send(self) -> None:
        while self._waiting:
            batch = [(c, f) for c, f in self._waiting if not f.done()]  # drop the cancelled
            self._waiting = []
            if not batch:
                continue
            pipe = self._client.pipeline(transaction=False)
            for command, _ in batch:
                getattr(pipe, command.name)(*command.args, **command.kwargs)
            try:
                replies = list(await pipe.execute(raise_on_error=False))
            except Exception as error:  # the connection failed: every caller hears it
                replies = [error] * len(batch)
            except BaseException:  # this task cancelled (the loop closing): so are they
                for _, future in batch + self._waiting:
                    future.cancel()
                raise
            for (_, future), reply in zip(batch, replies, strict=True):
                if future.done():
                    continue
                if isinstance(reply, Exception):
                    future.set_exception(reply)
                else:
                    future.set_result(reply)

    async def aclose(self) -> None:
        """Close the wire."""
        line, self._wire = self._wire, None
        if line is not None:
            line.close()


class AsyncSubscription:
    """blueque.store.Subscription, awaited (without its keepalive): ``get_message(timeout)``
    returns the next Message, or None once ``timeout`` seconds passed without one (at once
    after a lost connection). The first call subscribes and waits for Redis to confirm every
    channel (at most CONFIRM_WAIT); a lost connection is subscribed again at a later call,
    after a backoff while Redis stays away, and then ``get_message`` returns MISSED (what was
    published in between is lost). Cancelling a
    caller leaves the connection to redis-py, which disconnects it; ``close()`` (in the
    caller's ``finally``) gives it back."""

    def __init__(self, store: AsyncRedisStore, channels: Sequence[str]) -> None:
        self._store = store
        self._state = Resubscribing(store, channels)
        self._pubsub: Any = None

    async def get_message(self, timeout: float) -> Message | None:
        deadline = time.monotonic() + max(0.0, timeout)
        try:
            if self._pubsub is None and not await self._subscribe(deadline):
                return None
            heard = self._state.heard
            return heard.pop(0) if heard else await self._next(deadline)
        except _REDIS_ERRORS as error:
            await self._lost(error)
        except CLOSED_UNDER_US as error:
            await self._lost(lost_connection(error))
        return None

    async def _subscribe(self, deadline: float) -> bool:
        pause = self._state.pause(deadline)
        if pause > 0:
            await asyncio.sleep(pause)
        if not self._state.due():
            return False
        pubsub = self._pubsub = self._store.redis.pubsub()
        await pubsub.subscribe(*self._state.channels)
        confirmation = self._state.confirmation()
        while (patience := confirmation.wait()) is not None:
            confirmation.take(await pubsub.get_message(timeout=patience))
        self._state.subscribed()
        return True

    async def _next(self, deadline: float) -> Message | None:
        while True:
            raw = await self._pubsub.get_message(
                timeout=max(0.0, deadline - time.monotonic()))
            if raw is not None:
                message, again = published(raw, len(self._state.channels))
                if message is not None or again:
                    return message or MISSED
            elif time.monotonic() >= deadline:
                return None

    async def _lost(self, error: redis.exceptions.RedisError
                    | redis.exceptions.RedisClusterException) -> None:
        await self.close()
        self._state.lost(error)

    async def close(self) -> None:
        """Unsubscribe and give the connection back (also after a cancellation)."""
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            try:
                await pubsub.aclose()
            except _REDIS_ERRORS as error:
                log.debug("closing a lost subscription: %s", error)
