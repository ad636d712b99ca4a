"""blueque.aio's Client, Queue and Task: blueque.Client's shape, awaited.

Every call runs an operation of blueque.protocol through an AsyncRedisStore, so the keys,
scripts and arguments are the sync client's, and a task enqueued here is run by any
listener (and by blueque 1.0.1's, as far as 1.0.1 understands the task).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import AsyncGenerator, Sequence
from types import TracebackType
from typing import Any

import redis
import redis.asyncio.cluster

from blueque import dependencies, ended, keyed, pausing, protocol, waiting
from blueque.aio.store import AsyncRedisStore, AsyncSubscription
from blueque.client import decodes_text
from blueque.config import Settings, hash_tags_option, hide_password, settings_for
from blueque.errors import ConfigurationError, TaskNotFound
from blueque.ha import Durability
from blueque.keys import Keys
from blueque.protocol import CancelledWaiting
from blueque.queue import (
    BulkEnqueue,
    QueueStats,
    TaskId,
    bulk_cancel,
    bulk_submission,
    check_deletable,
    check_limit,
    check_queue_name,
    due_time,
    given_queue_name,
    purge_cutoff,
    submission,
)
from blueque.retry import RetryPolicy
from blueque.store import translate
from blueque.task import TaskView, warn_missing
from blueque.waiting import WAIT_REREAD, WaitResult


class Client:
    """``Client(url)``, ``Client()`` ($BLUEQUE_URL, else redis://localhost:6379/0),
    ``Client(settings)`` (a ``blueque.config.Settings``) or ``Client(redis_client)`` (a ready
    ``redis.asyncio`` client made with decode_responses=True), the asyncio twin of
    ``blueque.Client``.

    The same URLs (redis, rediss, unix, redis+sentinel, redis+cluster), the same options
    (``hash_tags``, its deprecated alias ``cluster``, ``retry_policy``, ``durability``,
    ``retry_deadline`` and redis-py's own)
    and the same errors. ``async with Client(url) as client`` closes its connections at the
    end; a ready client passed in stays open (it is the caller's)."""

    def __init__(
        self,
        url: str | Settings | Any | None = None,
        *,
        hash_tags: bool = False,
        cluster: bool | None = None,
        retry_policy: RetryPolicy | None = None,
        durability: Durability | None = None,
        **redis_kwargs: Any,
    ) -> None:
        if "checkpoint_max_bytes" in redis_kwargs:  # not redis-py's: it would fail at first use
            raise ConfigurationError(
                "checkpoint_max_bytes= limits the checkpoints of tasks run with a blueque.Client; "
                "the asyncio client runs no tasks. Give it per task (enqueue(..., "
                "checkpoint_max_bytes=N)) or per queue (Queue.configure(checkpoint_max_bytes=N))"
            )
        hash_tags = hash_tags_option(hash_tags, cluster)
        self.settings: Settings | None = None
        if url is None or isinstance(url, (str, Settings)):
            self.settings = settings_for(url, hash_tags, **redis_kwargs)
            try:
                self.redis = self.settings.aconnect()
            except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as error:
                raise translate(error, hide_password(self.settings.url)) from error
            hash_tags = self.settings.hash_tags
            retry_policy = retry_policy or self.settings.retry_policy()
            durability = durability or self.settings.durability
        elif not decodes_text(url):
            raise ConfigurationError(
                "pass a redis.asyncio client made with decode_responses=True: Blueque's "
                "fields are text"
            )
        else:
            self.redis = url
        self.keys = Keys(hash_tags=hash_tags or isinstance(
            self.redis, redis.asyncio.cluster.RedisCluster))
        self.store = AsyncRedisStore(self.redis, self.keys, retry=retry_policy,
                                     durability=durability)

    def __repr__(self) -> str:
        return f"<blueque.aio.Client {self.store.where}>"

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connections this client opened (its pool, a Sentinel URL's sentinels,
        its store's for script calls); a ready client passed to it is left open."""
        await self.store.aclose()
        if self.settings is None:
            return
        manager = getattr(getattr(self.redis, "connection_pool", None), "sentinel_manager", None)
        await self.redis.aclose()
        for sentinel in getattr(manager, "sentinels", ()):
            await sentinel.aclose()

    def bounded(self, seconds: float) -> Client:
        """This client (same connections) with each operation retried for at most
        ``seconds`` (a web request should not hang for the whole ``retry_deadline``)."""
        view = copy.copy(self)
        view.store = self.store.bounded(seconds)
        return view

    async def ping(self) -> None:
        """Raise RedisUnavailable (or AuthenticationFailed...) if Redis cannot be used."""
        await self.store.ping()

    def get_queue(self, name: str) -> Queue:
        return Queue(name, self.store)

    async def get_task(self, task_id: str, *, missing_ok: bool = False) -> Task:
        """The task's hash, read now. A missing task has every attribute None and comes with a
        MissingTaskWarning, unless ``missing_ok`` (blueque.Client.get_task)."""
        task = Task(task_id, self.store, await self.store.perform(protocol.task_data, task_id))
        if not task.exists and not missing_ok:
            warn_missing(task_id)
        return task

    async def cancel_task(self, task_id: str, reason: str = "cancelled") -> str:
        """Cancel a task: "cancelled" (it will never run; recorded as failed with a
        ``cancelled`` field) or "requested" (running: its listener stops it and records it).
        Raises TaskNotFound or InvalidTaskState (already finished)."""
        task = await self.get_task(task_id, missing_ok=True)
        if task.queue is None:
            raise TaskNotFound(task_id)
        verdict, _ = await self.store.perform(dependencies.cancel, task.queue, task_id,
                                              task.status, await self.store.now(),
                                              f"cancelled: {reason}")
        return verdict

    async def retry_task(self, task_id: str) -> None:
        """Put a failed task back in its queue's pending list, its attempts kept
        (retry_failed.lua); a cancelled one too, since it is asked for by its id. Raises
        TaskNotFound or InvalidTaskState (not failed)."""
        queue = (await self.get_task(task_id, missing_ok=True)).queue
        if queue is None:
            raise TaskNotFound(task_id)
        await self.store.perform(ended.retry_failed, queue, task_id,
                                 await self.store.now())

    async def queue_names(self) -> list[str]:
        """Every queue in blueque_queues."""
        return [name for name, _ in await self.store.perform(protocol.known_queues)]


class Queue:
    """blueque.Queue's operations, awaited; see there for what each one writes."""

    def __init__(self, name: str, store: AsyncRedisStore) -> None:
        self._name = given_queue_name(name)
        self._store = store

    @property
    def name(self) -> str:
        return self._name

    def __repr__(self) -> str:
        return f"<blueque.aio.Queue {self._name}>"

    async def enqueue(self, parameters: object, task_id: str | None = None, *,
                      after: object = None, after_any: object = False,
                      **options: object) -> TaskId:
        """Create a pending task; a ``TaskId`` whose ``created`` is False if it existed.
        ``options``: max_attempts, retry_backoff, retry_backoff_max, time_limit,
        kill_grace, result_ttl, max_preemptions, keep_processes, exclusive,
        checkpoint_max_bytes.
        ``after``, ``after_any``: it waits for those tasks (blueque.Queue.enqueue)."""
        task_id, text, fields = submission(self._store.keys, self._name, parameters, task_id,
                                           options)
        if after is not None:
            return await self._submit_after(task_id, text, fields, after, after_any)
        created = await self._store.perform(protocol.submit, self._name, task_id, text,
                                            await self._store.now(), fields=fields)
        return TaskId(task_id, created)

    async def _submit_after(self, task_id: str, text: str, fields: dict[str, str],
                            after: object, after_any: object,
                            eta: float | None = None) -> TaskId:
        created = await self._store.perform(
            dependencies.submit_after, self._name, task_id, text, await self._store.now(),
            dependencies.wanted(task_id, after, after_any), eta, fields)
        return TaskId(task_id, created)

    async def enqueue_many(self, parameters: Sequence[object],
                           task_ids: Sequence[str] | None = None, *,
                           after: object = None,
                           after_any: object = False, **options: object) -> BulkEnqueue:
        """Create many pending tasks, 1,000 per script call; ids that exist are left alone.
        With ``after``, every task waits for those tasks (one call per task); enqueue's options."""
        tasks = bulk_submission(self._store.keys, self._name, parameters, task_ids)
        fields = keyed.task_options(self._store.keys, options)
        if after is not None:
            ids = [await self._submit_after(i, text, fields, after, after_any) for i, text in tasks]
            return BulkEnqueue([str(i) for i in ids], [i.created for i in ids])
        flags = await self._store.perform(protocol.submit_many, self._name, tasks,
                                          await self._store.now(), fields)
        return BulkEnqueue([task_id for task_id, _ in tasks], flags)

    async def schedule(self, parameters: object, eta: float | None = None,
                       task_id: str | None = None, *, delay: float | str | None = None,
                       after: object = None, after_any: object = False,
                       **options: object) -> TaskId:
        """Create a task to run at ``eta`` (Unix time, on Redis' clock) or ``delay`` seconds
        from now by Redis' clock (one of the two); an eta in the past enqueues at once.
        With ``after``, it waits for those tasks first (blueque.Queue.schedule)."""
        current = await self._store.now()
        eta = due_time(eta, delay, current)
        if eta < current:
            return await self.enqueue(parameters, task_id, after=after, after_any=after_any,
                                      **options)
        task_id, text, fields = submission(self._store.keys, self._name, parameters, task_id,
                                           options)
        if after is not None:
            return await self._submit_after(task_id, text, fields, after, after_any,
                                            float(eta))
        created = await self._store.perform(protocol.submit, self._name, task_id, text,
                                            current, eta=float(eta), fields=fields)
        return TaskId(task_id, created)

    async def enqueue_due_tasks(self) -> list[str]:
        """Move every scheduled task whose eta has passed to pending; returns their ids."""
        return await self._store.run(protocol.enqueue_due_tasks(
            self._store.keys, self._name, await self._store.now()))

    async def delete_task(self, task: TaskView) -> None:
        """Delete a complete or failed task (its hash and its entry in the complete, failed
        or cancelled list)."""
        state = check_deletable(self._name, task.id, task.queue, task.status, task.cancelled)
        await self._store.perform(ended.delete, self._name, task.id, state)

    async def stats(self) -> QueueStats:
        """Counts per state and listeners, from O(1) commands; cancelled tasks apart from
        failed ones."""
        counts = await self._store.perform(protocol.counts, self._name)
        return QueueStats(**vars(counts), name=self._name)

    async def pause(self, reason: str | None = None) -> None:
        """Stop listeners starting this queue's tasks (blueque.Queue.pause)."""
        await self._store.perform(pausing.pause, self._name, reason, await self._store.now())

    async def resume(self) -> bool:
        """Let listeners start them again (blueque.Queue.resume); False if not paused."""
        return await self._store.perform(pausing.resume, self._name)

    async def task_ids(self, status: str, start: int = 0, stop: int = -1) -> list[str]:
        """Ids of the tasks in one state: a status, or ``cancelled`` (statuses.STATES)."""
        return await self._store.perform(protocol.task_ids, self._name, status, start, stop)

    async def retry_failed(self, limit: int | None = None, include_cancelled: bool = False
                           ) -> list[str]:
        """Make this queue's failed tasks pending again, oldest first; cancelled ones only
        with ``include_cancelled``. See blueque.Queue.retry_failed."""
        await self._store.now()  # measures Redis' clock if due: the steps read it as measured
        return await self._store.run(ended.retry_failed_tasks(
            self._store.keys, self._name, self._store.clock.now, check_limit(limit),
            include_cancelled))

    async def cancel_waiting(self, older_than: float | None = None, match: str | None = None,
                             reason: str = "cancelled", scheduled: bool = True
                             ) -> CancelledWaiting:
        """Cancel the queue's pending and scheduled tasks (or those older than
        ``older_than`` seconds and/or whose id matches ``match``), a batch per script call:
        see blueque.Queue.cancel_waiting."""
        cutoff, match, error, sources = bulk_cancel(older_than, match, reason, scheduled,
                                                    await self._store.now())
        return await self._store.run(protocol.cancel_waiting(
            self._store.keys, self._name, self._store.clock.now, error, cutoff, match, sources))

    async def configure(self, **options: object) -> None:
        """Set queue defaults (as blueque.Queue.configure); a value of None removes one."""
        check_queue_name(self._name)
        removed = [name for name, value in options.items() if value is None]
        await self._store.perform(protocol.set_queue_config, self._name,
                                  keyed.task_options(self._store.keys, options, True), removed)

    async def config(self) -> dict[str, str]:
        return await self._store.perform(protocol.queue_config, self._name)

    async def purge(self, status: str, older_than: float, batch: int = 500) -> int:
        """Delete finished tasks of ``status`` that finished more than ``older_than``
        seconds ago, oldest first; returns how many."""
        cutoff = purge_cutoff(status, older_than, await self._store.now())
        return await self._store.run(ended.purge(self._store.keys, self._name, status,
                                                    cutoff, batch))


class Task(TaskView):
    """A task hash read through the asyncio client; the attributes are blueque.Task's."""

    def __init__(self, task_id: str, store: AsyncRedisStore, data: dict[str, str]) -> None:
        super().__init__(task_id, data)
        self._store = store

    async def refresh(self) -> Task:
        """Re-read the task hash (one HGETALL); returns self."""
        self._data = await self._store.perform(protocol.task_data, self._id)
        return self

    async def parents(self) -> list[Task]:
        """The tasks this one was enqueued after, read now (blueque.Task.parents)."""
        datas = await self._store.perform(protocol.task_data_many, self.after)
        return [Task(i, self._store, d) for i, d in zip(self.after, datas, strict=True)]

    async def awaiting(self) -> list[str]:
        """The parents a waiting task was not yet told the ending of (blueque.Task)."""
        return await self._store.perform(dependencies.awaited, self._id)

    async def wait(self, timeout: float | None = None) -> Task:
        """Wait until the task is complete or failed, without blocking the event loop;
        WaitTimeout (a TimeoutError) after ``timeout``, TaskNotFound if it does not exist
        or is deleted meanwhile. Listens on blueque_done_[queue], and re-reads the hash at
        least once a second for writers that do not publish (blueque 1.0.1): the wait of
        blueque.waiting, awaited. Cancelling the waiting coroutine closes its subscription."""
        result = WaitResult([self._id])
        async with contextlib.aclosing(self._reads(result, timeout, WAIT_REREAD)) as reads:
            async for _ in reads:
                pass
        self._waited(result, timeout)
        return self

    async def updates(self, every: float = WAIT_REREAD) -> AsyncGenerator[Task, None]:
        """Yield this task now and after each change of its status or progress (re-read at
        least every ``every`` seconds, at once when a finish is published), until it is
        complete or failed. TaskNotFound if it does not exist or is deleted meanwhile.
        Close it (``contextlib.aclosing``) when stopping early."""
        result = WaitResult([self._id])
        seen: tuple[Any, ...] | None = None
        async with contextlib.aclosing(self._reads(result, None, every)) as reads:
            async for _ in reads:
                if not self.exists:
                    break
                state = (self.status, self._get("progress"), self.progress_message)
                if state != seen:
                    seen = state
                    yield self
        self._waited(result, None)

    async def _reads(self, result: WaitResult, timeout: float | None, every: float
                     ) -> AsyncGenerator[None, None]:
        """blueque.waiting.follow's steps, awaited: yields after each read of the task (this
        Task then holds it); between reads, listens on its done channel."""
        steps = waiting.follow(result, timeout, every)
        subscription: AsyncSubscription | None = None
        heard: list[str] | None = None
        try:
            while (step := waiting.next_step(steps, heard)) is not None:
                heard = None
                if isinstance(step, waiting.Read):
                    result.took(step.what, [await self._store.perform(protocol.task_data, i)
                                            for i in step.what])  # HGETALL, via the Pipeliner
                    self._data = result.tasks[self._id]
                    yield None
                elif isinstance(step, waiting.Listen):
                    heard = await _listen(subscription, step.seconds)
                else:
                    subscription = self._store.subscribe(
                        [self._store.keys.done_channel(queue) for queue in step.queues])
                    await subscription.get_message(timeout=0)  # subscribed, and confirmed
        finally:
            steps.close()
            if subscription is not None:
                await subscription.close()


async def _listen(subscription: AsyncSubscription | None, seconds: float) -> list[str] | None:
    """blueque.waiting.listen, awaited."""
    if subscription is None:
        await asyncio.sleep(seconds)
        return []
    told: list[str] = []
    message = await subscription.get_message(timeout=seconds)
    while message is not None:
        if message.missed:
            return None
        told.append(message.data)
        message = await subscription.get_message(timeout=0)
    return told
