"""The store's core: one Redis connection, one key layout, the retry policy around every
operation, the Lua scripts, and the runner of the operations blueque.protocol describes (the
async twin is blueque.aio.store). The operations themselves are grouped by role in the
modules beside this one; RedisStore (blueque.store) is all of them."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Concatenate, Literal, ParamSpec, Self, TypeVar

import redis
from redis.commands.core import Script

from blueque import keys as k
from blueque import protocol
from blueque.acl import Role
from blueque.clock import ServerClock
from blueque.errors import BluequeError
from blueque.ha import Durability
from blueque.retry import NoRetry, RetryPolicy, is_transient
from blueque.store.direct import NOT_SENT, DirectCalls, Resend, eligible
from blueque.store.errors import (
    check_version,
    describe,
    load_script,
    translate,
    translate_errors,
)
from blueque.store.health import Health
from blueque.store.permissions import check_permissions
from blueque.store.subscription import Subscription

log = logging.getLogger("blueque.store")

T = TypeVar("T")
S = TypeVar("S", bound="StoreCore")
P = ParamSpec("P")

#: How long a blocking pop waits per round trip; listen() loops, so this bounds only how
#: quickly a blocked listener notices a stop request, never how fast it sees a new task.
BLOCK_SLICE = 1.0
#: The largest checkpoint a task may save unless its own option, its queue's default or the
#: client says otherwise (``checkpoint_max_bytes``): checkpoints are resume points, not data.
CHECKPOINT_MAX_BYTES = 1024 * 1024

RedisLike = Any  # redis.Redis or redis.RedisCluster; both expose the same command methods


def _tolerating_wrong_types(pipe: Any) -> list[Any]:
    """A pipeline's replies, where a key of another type (a WRONGTYPE reply) is an Exception
    in its place; any other error is raised."""
    replies: list[Any] = pipe.execute(raise_on_error=False)
    for reply in replies:
        if isinstance(reply, Exception) and not str(reply).startswith("WRONGTYPE"):
            raise reply
    return replies


def _refused(error: Exception) -> bool:
    """A script's own refusal (an error reply it returned), not a transient error."""
    return isinstance(error, redis.exceptions.ResponseError) and not is_transient(error)


def _raise_errors(replies: Sequence[Any], refusal_at: int | None) -> None:
    """Raise a pipeline's first error reply, but a script's refusal at ``refusal_at``."""
    for at, item in enumerate(replies):
        if isinstance(item, Exception) and not (at == refusal_at and _refused(item)):
            raise item


@dataclass(frozen=True)
class ScriptCall:
    """A script to run after another in the same round trip (``_run_then``'s ``then``)."""

    name: str
    keys: Sequence[str]
    args: Sequence[Any]
    durable: bool = False


@dataclass(frozen=True)
class Reservation:
    """The outcome of stamping a task a listener moved into its reserved list."""

    task_id: str
    verdict: Literal["ok", "skip", "bad"]
    detail: str  # attempts for ok; the status or reason otherwise
    #: for ok: the task hash as the stamp left it (so the caller reads nothing more)
    fields: dict[str, str] | None = None

    @property
    def runnable(self) -> bool:
        return self.verdict == "ok"

    @property
    def attempt(self) -> int:
        return int(self.detail) if self.runnable else 0


class StoreCore:
    """One Redis connection and key layout, the retry policy, the scripts and the runner."""

    def __init__(self, client: RedisLike, keys: k.Keys | None = None,
                 retry: RetryPolicy | NoRetry | None = None,
                 durability: Durability | None = None) -> None:
        self.redis = client
        self.keys = keys or k.Keys()
        self.retry: RetryPolicy | NoRetry = retry or NoRetry()
        #: blueque.ha.Durability: enqueues, starts and outcomes wait for replicas (WAIT)
        self.durability = durability
        self._scripts: dict[str, Script] = {}
        #: script calls on a connection of the store's own (blueque.store.direct)
        self._direct = DirectCalls(client)
        self._server_checked = False
        self._roles_checked: set[Role] = set()  # ACL permissions (check_server)
        self.health = Health()
        #: the client-wide checkpoint size limit (Client(..., checkpoint_max_bytes=...))
        self.checkpoint_max_bytes = CHECKPOINT_MAX_BYTES
        self._unbounded: Self | None = None  # set on the copies bounded() makes
        self._owns_client = False  # a client apart() made: closed with the store
        #: Redis' clock (blueque.clock), shared by the copies bounded() makes
        self.clock = ServerClock()

    @property
    def unbounded(self) -> Self:
        """The store this one was made from by ``bounded``, with the client's whole
        ``retry_deadline``: what a task's own writes use (its checkpoints), as its child's
        start and outcome do, however the Task object was read."""
        return self if self._unbounded is None else self._unbounded

    def bounded(self, seconds: float, quiet: bool | None = None) -> Self:
        """This store (same connection, scripts and Health) retrying each operation for at most
        ``seconds``: daemons take it for their loop, which must keep enforcing time limits
        and hearing signals while Redis is away, and retries in its own steps. ``quiet``: its
        retries log at debug level only (the loop says once that Redis is away)."""
        view = copy.copy(self)
        view.retry = self.retry.bounded(seconds, quiet)
        view._unbounded = self.unbounded
        return view

    def now(self) -> float:
        """Unix seconds on Redis' clock, the clock of every task timestamp (PROTOCOL.md §1,
        "Time"): the host's clock plus the offset a TIME round trip measured, when first
        needed and then every minute. Never raises: a Redis that cannot answer leaves the
        last offset (at first the host's own clock) in place."""
        clock = self.clock
        if clock.due():
            before = clock.local()
            try:
                seconds, micros = self.redis.time()
            except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException,
                    OSError) as error:
                log.debug("Redis' clock not read (%s); using the last offset", error)
                clock.failed()
            else:
                clock.measured(before, float(seconds) + float(micros) / 1e6, clock.local())
        return clock.now()

    def close(self) -> None:
        """Disconnect the connection the store keeps for script calls (blueque.store.direct);
        the redis-py client's pool is its owner's to close (``apart``'s, this store's)."""
        self._direct.close()
        if self._owns_client:
            self.redis.close()

    @property
    def clustered(self) -> bool:
        """A Redis Cluster: a script touches one slot's keys, a pipeline sends no script."""
        return hasattr(self.redis, "get_nodes")

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
                    reply, error = self._perform(factory), None
                except BluequeError as refused:
                    reply, error = None, refused
        except StopIteration as done:
            result: T = done.value
            return result
        finally:
            procedure.close()

    def _run(self, name: str, keys: Sequence[str], args: Sequence[Any],
             durable: bool = False) -> Any:
        if durable and self.durability is not None:
            return self.durability.run(self.redis, self._script(name), keys, args)
        script = self._script(name)
        try:
            reply = self._direct.evalsha(script.sha, keys, args)
        except Resend:
            reply = NOT_SENT  # lost connection or script cache: the ordinary way repairs both
        if reply is NOT_SENT:
            return script(keys=list(keys), args=list(args))
        return reply

    def _run_with(self, name: str, keys: Sequence[str], args: Sequence[Any],
                  before: Sequence[Callable[[Any], object]] = (),
                  after: Sequence[Callable[[Any], object]] = (),
                  durable: bool = False) -> Any:
        """``_run_then``'s script reply alone."""
        return self._run_then(name, keys, args, before, after, durable)[0]

    def _run_then(self, name: str, keys: Sequence[str], args: Sequence[Any],
                  before: Sequence[Callable[[Any], object]] = (),
                  after: Sequence[Callable[[Any], object]] = (),
                  durable: bool = False, then: ScriptCall | None = None,
                  refusal: bool = False) -> tuple[Any, list[Any]]:
        """Run script ``name`` with plain commands before and after it in one round trip (a
        pipeline, not a transaction: each command is idempotent, so a repeat after a lost
        reply is harmless); returns the script's reply and the replies of ``after`` (and last,
        of ``then``: a second script after them). With
        ``refusal``, the first script's refusal (an error reply of its own, not a transient
        one) is returned in place of its reply, so that the caller still reads what ``then``
        did. ``EVALSHA`` directly, not redis-py's pipeline scripts, which cost a ``SCRIPT
        EXISTS`` round trip per pipeline: a server that lost its script cache (a restart)
        answers NOSCRIPT for the scripts it lost and runs the rest; those are loaded and sent
        again alone (``then`` that ran is never repeated: a take would take twice). With WAIT
        durability the script runs durably alone, and on a Redis Cluster (whose pipelines
        refuse scripts) each command goes on its own."""
        first = ScriptCall(name, keys, args, durable)
        if (durable and self.durability is not None) or self.clustered:
            return self._run_apart(first, before, after, then, refusal)
        calls = [first] + ([then] if then is not None else [])
        scripts = [self._script(call.name) for call in calls]
        pipe = self.redis.pipeline(transaction=False)
        for add in before:
            add(pipe)
        pipe.evalsha(scripts[0].sha, len(keys), *keys, *args)
        for add in after:
            add(pipe)
        if then is not None:
            pipe.evalsha(scripts[1].sha, len(then.keys), *then.keys, *then.args)
        replies = pipe.execute(raise_on_error=False)
        places = [len(before)] + ([len(replies) - 1] if then is not None else [])
        _send_lost(self.redis, replies, list(zip(places, calls, scripts, strict=True)))
        if not any(isinstance(reply, redis.exceptions.NoScriptError) for reply in replies):
            _raise_errors(replies, len(before) if refusal else None)
            return replies[len(before)], replies[len(before) + 1:]
        raise redis.exceptions.NoScriptError("the server keeps losing its scripts")

    def _run_apart(self, first: ScriptCall, before: Sequence[Callable[[Any], object]],
                   after: Sequence[Callable[[Any], object]], then: ScriptCall | None,
                   refusal: bool) -> tuple[Any, list[Any]]:
        """``_run_then``'s commands one by one (WAIT durability, a Redis Cluster)."""
        for add in before:
            add(self.redis)
        try:
            reply = self._run(first.name, first.keys, first.args, durable=first.durable)
        except redis.exceptions.ResponseError as error:
            if not (refusal and _refused(error)):
                raise
            reply = error
        replies = [add(self.redis) for add in after]
        if then is not None:
            replies.append(self._run(then.name, then.keys, then.args, durable=then.durable))
        return reply, replies

    def _queues_key(self, queue: str) -> tuple[str, str]:
        return protocol.queues_key(self.keys, queue)

    def _outcome_keys(self, queue: str, now: float) -> list[str]:
        return protocol.outcome_keys(self.keys, queue, now)

    # --- notifications --------------------------------------------------------------------
    def subscribe(self, channels: Sequence[str], keepalive: float | None = None
                  ) -> Subscription:
        """A Subscription to ``channels`` (done channels, queue channels, a listener's control
        channel) that subscribes again after an outage and, with ``keepalive``, notices a
        silently dropped connection; see Subscription."""
        return Subscription(self, channels, keepalive)


    def ping(self) -> None:
        """PING, then check the server once (check_server): RedisUnavailable,
        AuthenticationFailed, ConfigurationError or UnsupportedServer say what is wrong."""
        try:
            self.redis.ping()
        except redis.exceptions.RedisError as error:
            raise translate(error, self.where) from error
        self.check_server()

    def check_server(self, role: Role | None = None, queues: Iterable[str] = ()) -> None:
        """Once per store: refuse a server older than MIN_REDIS_VERSION (INFO server); once
        per ``role``, a user that may not run what it runs (store.permissions: ACL DRYRUN)."""
        if not self._server_checked:
            try:
                check_version(self.redis.info("server"), self.where)
            except redis.exceptions.RedisError as error:
                raise translate(error, self.where) from error
            self._server_checked = True
        if role is not None and role not in self._roles_checked:
            check_permissions(self, role, queues)
            self._roles_checked.add(role)


def _send_lost(client: Any, replies: list[Any],
               sent: list[tuple[int, ScriptCall, Any]]) -> None:
    """A server that lost its scripts (a restart) answered NOSCRIPT for them and ran the
    rest of the pipeline all the same: only the scripts it refused (``sent``: their place in
    ``replies``, call and cached script) are sent again, once loaded, their replies put in
    place. A script that ran is never repeated: a take that ran took a task."""
    lost = [(place, call, script) for place, call, script in sent
            if isinstance(replies[place], redis.exceptions.NoScriptError)]
    if not lost:
        return
    pipe = client.pipeline(transaction=False)
    for _, call, script in lost:
        script.sha = client.script_load(script.script)
        pipe.evalsha(script.sha, len(call.keys), *call.keys, *call.args)
    for (place, _, _), reply in zip(lost, pipe.execute(raise_on_error=False), strict=True):
        replies[place] = reply


def apart(store: S, timeout: float) -> S:
    """``store`` (same server, settings and key layout) on a connection pool of its own, whose
    calls time out after ``timeout`` seconds and are tried once, with a Health of its own:
    for a thread that must neither wait behind the others' calls nor count as their
    interruptions (the listener's lease keeper). A client whose connections cannot be made
    apart (a cluster, a single connection, fakeredis) is shared; the store's ``close``
    disconnects a pool made here."""
    view = copy.copy(store)
    view.retry, view.health = NoRetry(), Health()
    if eligible(store.redis):
        pool = store.redis.connection_pool
        kwargs = {**pool.connection_kwargs, "socket_timeout": timeout,
                  "socket_connect_timeout": timeout}
        view.redis = redis.Redis(connection_pool=redis.ConnectionPool(
            connection_class=pool.connection_class, **kwargs))
        view._direct, view._scripts, view._owns_client = DirectCalls(view.redis), {}, True
    return view
