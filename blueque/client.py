"""Client: the entry point; holds the Redis connection and builds the other objects."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis.cluster import RedisCluster

from blueque import dependencies, keyed
from blueque.config import Settings, hash_tags_option, hide_password, settings_for
from blueque.errors import ConfigurationError, TaskNotFound
from blueque.ha import Durability
from blueque.keys import Keys
from blueque.listener import Listener
from blueque.policy import field_float
from blueque.processor import Processor
from blueque.queue import Queue
from blueque.retry import RetryPolicy
from blueque.store import RedisStore, translate
from blueque.task import Task, warn_missing


def decodes_text(client: Any) -> bool:
    """Whether a redis-py client (sync or asyncio) was made with decode_responses=True."""
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        return bool(pool.connection_kwargs.get("decode_responses"))
    return bool(getattr(client, "get_encoder", lambda: None)() and
                client.get_encoder().decode_responses)


#: Seconds a preemption request outlives its deadline (blueque_preempt_[node name]).
PREEMPTION_KEPT = 3600


@dataclass(frozen=True)
class ListenerStatus:
    """One listener of one queue, as ``Client.listeners()`` found it: its lease (a listener
    serving three queues has three) and its description (``blueque_listener_[id]``: host,
    pid, queues, renewed, preempting_until... empty once it has expired)."""

    listener: str
    queue: str
    #: The lease's deadline (Redis server time, ms); None: no lease (registered only).
    lease_deadline_ms: float | None
    #: Seconds left on the lease by the server's clock; negative: expired that long ago.
    lease_remaining: float | None
    #: Seconds since the listener last renewed (else started), by this machine's clock.
    renewed_age: float | None
    info: dict[str, str]

    @property
    def host(self) -> str | None:
        return self.info.get("host")

    @property
    def expired(self) -> bool:
        return self.lease_remaining is not None and self.lease_remaining < 0

    @property
    def slots(self) -> int | None:
        """Its task slots (``--concurrency``), as its info hash says; None for a listener
        that writes none (1.0.1) or whose hash has expired."""
        return _whole(self.info.get("concurrency"))

    @property
    def busy(self) -> int | None:
        """Its slots in use at its last renewal (running children, adopted runs and fenced
        runs it is stopping); None when its info hash does not say."""
        return _whole(self.info.get("busy"))

    @property
    def preempting_until(self) -> float | None:
        """When its node goes away (Unix s), if it was told so (``blueque preempt``,
        SIGUSR1); None otherwise."""
        return field_float(self.info.get("preempting_until"))


class Client:
    """``Client(url)``, ``Client()`` ($BLUEQUE_URL, else redis://localhost:6379/0),
    ``Client(settings)`` (a ``blueque.config.Settings``) or ``Client(redis_client)`` (a ready
    redis-py client made with decode_responses=True).

    Other keyword arguments go to redis-py unchanged, as in blueque 1.0.1 (``retry=``,
    ``socket_timeout=``...). Blueque's own options have names redis-py does not use:
    ``hash_tags`` (the hash-tagged key layout a Redis Cluster needs, for a URL that does not
    select it itself; ``cluster`` is its deprecated former name, still accepted),
    ``retry_policy`` (a ``blueque.retry.RetryPolicy``), ``durability``, ``retry_deadline``
    (seconds each operation keeps retrying through a Redis restart or failover before
    RedisUnavailable; default 30, 0 = no retry; also a URL option) and
    ``checkpoint_max_bytes`` (the largest checkpoint a task run with this client may save
    unless the task's option or its queue's default says otherwise; default 1 MiB). A ready
    redis-py client gets no retry policy unless ``retry_policy`` is given."""

    def __init__(
        self,
        url: str | Settings | Any | None = None,
        *,
        hash_tags: bool = False,
        cluster: bool | None = None,
        retry_policy: RetryPolicy | None = None,
        durability: Durability | None = None,
        checkpoint_max_bytes: int | None = None,
        **redis_kwargs: Any,
    ) -> None:
        if checkpoint_max_bytes is not None and (
                isinstance(checkpoint_max_bytes, bool) or not isinstance(checkpoint_max_bytes, int)
                or checkpoint_max_bytes < 1):
            raise ConfigurationError(
                f"checkpoint_max_bytes must be a whole number of bytes >= 1, not "
                f"{checkpoint_max_bytes!r}"
            )
        hash_tags = hash_tags_option(hash_tags, cluster)
        if url is None or isinstance(url, (str, Settings)):
            self.settings: Settings | None = settings_for(url, hash_tags, **redis_kwargs)
            try:  # a cluster client connects at once, to learn the slot map
                self.redis = self.settings.connect()
            except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as error:
                raise translate(error, hide_password(self.settings.url)) from error
        else:
            if not decodes_text(url):
                raise ConfigurationError(
                    "pass a redis client made with decode_responses=True: Blueque's fields "
                    "are text"
                )
            self.settings = None
            self.redis = url
        if self.settings is not None:  # a URL brings its layout, retry deadline and WAIT
            hash_tags = self.settings.hash_tags
            retry_policy = retry_policy or self.settings.retry_policy()
            durability = durability or self.settings.durability
        self.keys = Keys(hash_tags=hash_tags or isinstance(self.redis, RedisCluster))
        self.store = RedisStore(self.redis, self.keys, retry=retry_policy, durability=durability)
        if checkpoint_max_bytes is not None:
            self.store.checkpoint_max_bytes = checkpoint_max_bytes

    def __repr__(self) -> str:
        return f"<blueque.Client {self.store.where}>"

    def bounded(self, seconds: float) -> Client:
        """This client (same connection) with each operation retried for at most ``seconds``:
        what daemons and the dashboard use, so that a loop or a page is never held for the
        whole ``retry_deadline`` while Redis is away."""
        view = copy.copy(self)
        view.store = self.store.bounded(seconds)
        return view

    def close(self) -> None:
        self.store.close()
        self.redis.close()

    def ping(self) -> None:
        """Raise RedisUnavailable with a clear message if Redis cannot be reached."""
        self.store.ping()

    def get_queue(self, name: str) -> Queue:
        return Queue(name, self.store)

    def get_task(self, task_id: str, *, missing_ok: bool = False) -> Task:
        """The task's hash, read now. A task that does not exist (never enqueued, deleted, or
        its result expired) still comes back, every attribute None, as in blueque 1.0.1,
        but with a MissingTaskWarning, unless ``missing_ok`` (then ``task.exists`` says)."""
        task = Task(task_id, self.store)
        if not task.exists and not missing_ok:
            warn_missing(task_id)
        return task

    def get_listener(self, queue_name: str) -> Listener:
        return Listener(queue_name, self.store)

    def get_processor(self, task: Task) -> Processor:
        return Processor(task, self.store)

    def cancel_task(self, task_id: str, reason: str = "cancelled") -> str:
        """Cancel a task: returns "cancelled" (it will never run; recorded as failed with a
        ``cancelled`` field) or "requested" (running: its listener stops it and records it).
        Raises TaskNotFound or InvalidTaskState (already finished)."""
        task = self.get_task(task_id, missing_ok=True)
        if task.queue is None:
            raise TaskNotFound(task_id)
        verdict, _ = self.store.perform(dependencies.cancel, task.queue, task_id, task.status,
                                        self.store.now(), f"cancelled: {reason}")
        return verdict

    def preempt_node(self, node_name: str, grace: float, reason: str = "") -> float:
        """Announce that the node named ``node_name`` (its listeners' --node-name, by default
        its fully qualified host name) goes away in ``grace`` seconds: its listeners take no
        more tasks and tell their task processes, which may save a checkpoint and stop
        (blueque.Preempted) to resume elsewhere without spending an attempt; at the deadline
        the rest are terminated and their tasks put back (PROTOCOL.md 6.3). Returns the
        deadline (Unix s). An earlier deadline replaces a later one at the listeners."""
        if not grace >= 0:
            raise ConfigurationError(f"the grace must be 0 seconds or more, not {grace!r}")
        current = self.store.now()
        deadline = current + grace
        fields = {"deadline": repr(deadline), "grace": repr(grace),
                  "requested_at": repr(current), "reason": reason or "blueque preempt"}
        # kept past the deadline for a while: a listener starting then sees the request is over
        self.store.request_preemption(node_name, fields, int(grace) + PREEMPTION_KEPT)
        return deadline

    def withdraw_preemption(self, node_name: str) -> bool:
        """Forget a node's preemption request (a false alarm): listeners started from now on
        take tasks again; those already preempting finish handing back their work and exit.
        False if there was none."""
        return self.store.withdraw_preemption(node_name)

    def retry_task(self, task_id: str) -> None:
        """Put a failed task back in its queue's pending list, its attempts kept
        (retry_failed.lua); a cancelled one too, since it is asked for by its id (bulk
        retries leave cancelled tasks alone). Raises TaskNotFound or InvalidTaskState (not
        failed)."""
        task = self.get_task(task_id, missing_ok=True)
        if task.queue is None:
            raise TaskNotFound(task_id)
        self.store.retry_failed(task.queue, task_id, self.store.now())

    def set_limit(self, key: str, limit: int | None) -> int:
        """At most ``limit`` runs of the tasks enqueued with ``concurrency_key=key`` at once,
        across every listener of every queue (PROTOCOL.md 5.22); None clears it (no limit),
        0 lets none start. Runs already holding a slot go on: a lowered limit starts no new
        run until they are under it. Returns how many hold one. ConfigurationError for a bad
        key or limit."""
        return self.store.perform(keyed.set_limit, key, limit)

    def key_states(self, keys: Sequence[str] | None = None) -> list[keyed.KeyState]:
        """Each concurrency key's limit, holders and waiters (``keys``, or every key with a
        limit or in use), as Redis has them now."""
        return self.store.perform(keyed.key_states, keys)

    def queue_names(self) -> list[str]:
        """Every queue in blueque_queues."""
        return [name for name, _ in self.store.known_queues()]

    def listeners(self, queues: Sequence[str] | None = None) -> list[ListenerStatus]:
        """Every listener of every queue in blueque_queues (or of ``queues``): one record per
        listener and queue, by queue then listener id; not those that left (``left`` in their
        info: they exited and left their runs to the node, PROTOCOL.md 3.3). Reads, in one
        pipeline, each queue's blueque_listeners_[queue] and blueque_leases_[queue] and, in
        another, every listener's blueque_listener_[id]: round trips that do not grow with the
        fleet."""
        store = self.store
        server_now = store.server_time()
        names = self.queue_names() if queues is None else list(queues)
        found: list[tuple[str, str, float | None]] = []
        for queue, work in zip(names, store.listeners_at_work(names, started=False),
                               strict=True):
            found += [(queue, listener, work.leases.get(listener))
                      for listener in sorted(work.registered | set(work.leases))]
        ids = sorted({listener for _, listener, _ in found})
        infos = dict(zip(ids, store.listener_infos(ids), strict=True))
        records = []
        for queue, listener, deadline in found:
            info = infos[listener]
            if info.get("left"):  # gone: its runs are the node's (adopted, or waiting to be)
                continue
            renewed = field_float(info.get("renewed") or info.get("started"))
            records.append(ListenerStatus(
                listener=listener, queue=queue, lease_deadline_ms=deadline,
                lease_remaining=None if deadline is None else deadline / 1000 - server_now,
                renewed_age=None if renewed is None else server_now - renewed, info=dict(info)))
        return records


def _whole(raw: str | None) -> int | None:
    return int(raw) if raw and raw.isdigit() else None
