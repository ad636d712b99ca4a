"""blueque.aio in its own event loop: interoperation with the sync client on one Redis,
waiting without polling, cancellation safety (no connection leaked, no task half-written)
and the retry policy riding out a Redis restart.

The contract tests (test_enqueue, test_cancel, test_task, test_finish, test_errors) already
run every client-side operation through blueque.aio; these tests cover what only an asyncio
client has."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis

import blueque
import blueque.aio
from blueque import protocol
from blueque.errors import ConfigurationError, InvalidTaskState, RedisUnavailable, TaskNotFound
from blueque.keys import Keys
from blueque.testing import RedisServer

pytestmark = pytest.mark.anyio
K = Keys()
ORIGINAL_FIELDS = {"status", "queue", "parameters", "created", "updated"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def aio(redis_client: redis.Redis, redis_url: str) -> AsyncIterator[blueque.aio.Client]:
    """An asyncio client of the emptied private database, closed after the test."""
    async with blueque.aio.Client(redis_url) as client:
        yield client


async def until(predicate: Any, timeout: float = 10.0, what: str = "") -> None:
    """Await a condition without blocking the loop; AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")
        await asyncio.sleep(0.01)


def subscribers(r: redis.Redis, channel: str) -> int:
    return int(dict(r.pubsub_numsub(channel))[channel])


def in_use(client: blueque.aio.Client) -> int:
    """Connections the client's pool has handed out and not had back."""
    return len(client.redis.connection_pool._in_use_connections)


def finish(client: blueque.Client, queue: str, outcome: str = "complete") -> blueque.Task:
    """Reserve, start and finish the next task of ``queue`` through the sync client, as a
    listener would."""
    task = client.get_listener(queue).reserve()
    assert task is not None
    processor = client.get_processor(task)
    processor.start(1)
    if outcome == "complete":
        processor.complete(f"done {task.id}")
    else:
        processor.fail("it broke")
    return task


# --- one Redis, both clients -----------------------------------------------------------------
async def test_tasks_cross_between_the_sync_and_the_asyncio_client(
        aio: blueque.aio.Client, client: blueque.Client, redis_client: redis.Redis) -> None:
    made_async = await aio.get_queue("q").enqueue('{"by": "aio"}', task_id="from-aio")
    made_sync = client.get_queue("q").enqueue('{"by": "sync"}', task_id="from-sync")
    # one FIFO list: the sync listener takes the asyncio client's task first
    assert finish(client, "q").id == made_async
    assert (await aio.get_task(made_async)).result == "done from-aio"
    assert set(redis_client.hgetall(K.task(made_async))) >= ORIGINAL_FIELDS
    # what the sync client made, the asyncio one reads, cancels, retries and deletes
    task = await aio.get_task(made_sync)
    assert (task.status, task.parameters, task.queue) == ("pending", '{"by": "sync"}', "q")
    assert await aio.cancel_task(made_sync, "not needed") == "cancelled"
    assert client.get_task(made_sync).cancelled
    await aio.retry_task(made_sync)
    assert client.get_task(made_sync).status == "pending"
    assert redis_client.lrange(K.pending("q"), 0, -1) == [made_sync]
    finish(client, "q", "fail")
    failed = await aio.get_task(made_sync)
    assert failed.status == "failed"
    await aio.get_queue("q").delete_task(failed)
    assert not client.get_task(made_sync, missing_ok=True).exists
    stats = await aio.get_queue("q").stats()
    assert (stats.pending, stats.complete, stats.failed) == (0, 1, 0)
    assert client.get_queue("q").stats() == stats
    assert await aio.queue_names() == client.queue_names() == ["q"]


async def test_retry_task_refuses_what_is_not_failed(aio: blueque.aio.Client,
                                                     redis_client: redis.Redis) -> None:
    task_id = await aio.get_queue("q").enqueue("p")
    with pytest.raises(InvalidTaskState):
        await aio.retry_task(task_id)
    with pytest.raises(TaskNotFound):
        await aio.retry_task("never-enqueued")
    assert redis_client.lrange(K.pending("q"), 0, -1) == [task_id]


async def test_many_waiters_wake_on_the_done_channel(
        aio: blueque.aio.Client, client: blueque.Client, redis_client: redis.Redis) -> None:
    """Twenty waits on one loop, each subscribed to the done channel; each returns when its
    own task is finished by the sync client, the others keep waiting."""
    ids = (await aio.get_queue("q").enqueue_many([str(i) for i in range(20)])).task_ids
    waits = {i: asyncio.create_task((await aio.get_task(i)).wait(60)) for i in ids}
    done = K.done_channel("q")
    await until(lambda: subscribers(redis_client, done) == 20, what="20 subscribed")
    first = finish(client, "q")
    assert (await waits[first.id]).status == "complete"
    assert not any(w.done() for i, w in waits.items() if i != first.id)
    for _ in ids[1:]:
        finish(client, "q")
    finished = await asyncio.gather(*waits.values())
    assert {t.status for t in finished} == {"complete"}
    assert [t.result for t in finished] == [f"done {i}" for i in ids]
    await until(lambda: subscribers(redis_client, done) == 0, what="all unsubscribed")
    assert in_use(aio) == 0


async def test_updates_stream_progress_until_the_task_ends(
        aio: blueque.aio.Client, client: blueque.Client) -> None:
    task_id = await aio.get_queue("q").enqueue("p")
    reserved = client.get_listener("q").reserve()
    assert reserved is not None
    processor = client.get_processor(reserved)
    processor.start(1)
    seen: list[tuple[str | None, float | None]] = []
    task = await aio.get_task(task_id)
    async for update in task.updates(every=0.05):
        seen.append((update.status, update.progress))
        if update.progress is None:
            processor.progress(0.5, "half way")
        elif update.progress == 0.5:
            processor.complete("all done")
    assert seen == [("started", None), ("started", 0.5), ("complete", 0.5)]
    assert task.result == "all done"


async def test_a_refusal_in_a_shared_pipeline_reaches_only_its_caller(
        aio: blueque.aio.Client, redis_client: redis.Redis) -> None:
    """Concurrent calls share one pipeline; one refused (the id lives in another queue)
    raises for its caller only, the others are created."""
    await aio.get_queue("other").enqueue("first", task_id="taken")
    queue = aio.get_queue("q")
    calls = [queue.enqueue(str(i), task_id=f"t{i}") for i in range(10)]
    calls.insert(5, queue.enqueue("again", task_id="taken"))
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(results[5], InvalidTaskState) and "other" in str(results[5])
    assert [r for i, r in enumerate(results) if i != 5] == [f"t{i}" for i in range(10)]
    assert redis_client.llen(K.pending("q")) == 10
    assert redis_client.hget(K.task("taken"), "queue") == "other"


# --- cancellation safety ---------------------------------------------------------------------
async def test_cancelling_a_wait_closes_its_subscription(
        aio: blueque.aio.Client, redis_client: redis.Redis) -> None:
    task_id = await aio.get_queue("q").enqueue("p")
    clients_before = redis_client.info("clients")["connected_clients"]
    waiting = asyncio.create_task((await aio.get_task(task_id)).wait())
    done = K.done_channel("q")
    await until(lambda: subscribers(redis_client, done) == 1, what="the waiter subscribed")
    assert in_use(aio) == 1  # the subscription's connection
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert in_use(aio) == 0
    await until(lambda: subscribers(redis_client, done) == 0, what="unsubscribed")
    await until(lambda: redis_client.info("clients")["connected_clients"] <= clients_before,
                what="the subscription's connection closed")
    # the same through a timeout around wait()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for((await aio.get_task(task_id)).wait(), 0.2)
    assert in_use(aio) == 0
    assert redis_client.hget(K.task(task_id), "status") == "pending"


async def test_cancelled_enqueues_leak_no_connection_and_write_whole_tasks_or_none(
        aio: blueque.aio.Client, redis_client: redis.Redis) -> None:
    """Forty enqueues caught in flight (CLIENT PAUSE holds their scripts, pipelined on the
    store's one connection for script calls), half of them cancelled: the others still get
    their answers, every task exists whole or not at all, and no connection of the pool is
    taken."""
    queue = aio.get_queue("q")
    await queue.enqueue("warm-up")  # scripts loaded, one connection in the pool
    ids = [f"t{i}" for i in range(40)]
    redis_client.client_pause(3_000, all=False)  # writes wait; well within socket timeouts
    try:
        calls = [asyncio.create_task(queue.enqueue(json.dumps({"n": i}), task_id=task_id))
                 for i, task_id in enumerate(ids)]
        await until(lambda: redis_client.info("clients")["blocked_clients"] >= 1,
                    what="the enqueues held by the pause")
        # one connection carries them, the store's own: none of the pool's
        assert redis_client.info("clients")["blocked_clients"] == 1 and in_use(aio) == 0
        for call in calls[::2]:
            call.cancel()
        results = await asyncio.gather(*calls[::2], return_exceptions=True)
        assert all(isinstance(r, asyncio.CancelledError) for r in results)
    finally:
        redis_client.client_unpause()
    assert all(created.created for created in await asyncio.gather(*calls[1::2]))
    assert in_use(aio) == 0
    pending = redis_client.lrange(K.pending("q"), 0, -1)
    for task_id in ids:
        data = redis_client.hgetall(K.task(task_id))
        if data:  # whole: every field, and listed once
            assert set(data) == ORIGINAL_FIELDS and data["status"] == "pending", data
            assert pending.count(task_id) == 1
        else:  # or nothing at all
            assert task_id not in pending
    assert {t for t in ids if redis_client.exists(K.task(t))} >= set(ids[1::2])
    assert (await queue.stats()).pending == len(pending)


async def test_cancelled_reads_on_their_own_connections_give_them_back(
        aio: blueque.aio.Client, redis_client: redis.Redis) -> None:
    """A pipeline step (here task_data_many) has a connection of its own while it waits:
    cancelled mid-reply, redis-py drops that connection and the pool has it back."""
    ids = (await aio.get_queue("q").enqueue_many(["a", "b"])).task_ids
    # reads wait too, and so does CLIENT UNPAUSE: the test lasts the whole pause, 1.5 s (ten
    # reads are in flight within milliseconds)
    redis_client.client_pause(1_500, all=True)
    try:
        reads = [asyncio.create_task(aio.store.perform(protocol.task_data_many, ids))
                 for _ in range(10)]
        # (INFO would wait for the pause too: the pool says when all ten are in flight)
        await until(lambda: in_use(aio) == 10, what="ten reads held by the pause")
        for read in reads:
            read.cancel()
        results = await asyncio.gather(*reads, return_exceptions=True)
        assert all(isinstance(r, asyncio.CancelledError) for r in results)
        assert in_use(aio) == 0
    finally:
        redis_client.client_unpause()
    datas = await aio.store.perform(protocol.task_data_many, ids)  # the pool still works
    assert [d["parameters"] for d in datas] == ["a", "b"]


async def test_closing_the_client_closes_its_connections(redis_url: str,
                                                         redis_client: redis.Redis) -> None:
    """Its pool's connections and the one its store keeps for script calls. Told apart by
    their ids in CLIENT LIST: a connection another test left to the garbage collector may
    close meanwhile and change the count."""
    def ids() -> set[str]:
        return {entry["id"] for entry in redis_client.client_list()}

    before = ids()
    async with blueque.aio.Client(redis_url) as client:
        queue = client.get_queue("q")
        await asyncio.gather(*(queue.enqueue(str(i)) for i in range(10)))
        ours = ids() - before - {str(redis_client.client_id())}
        assert ours
    await until(lambda: not ours & ids(), what="every connection closed")


async def test_the_sync_clients_checkpoint_option_is_refused_with_where_it_belongs(
        redis_url: str, redis_client: redis.Redis) -> None:
    """blueque.Client's checkpoint_max_bytes limits the tasks run with that client; the asyncio
    client runs none. Given to it, the option said nothing at construction and then failed
    every operation with redis-py's TypeError: it is refused at once, saying where the limit
    is set for a service that enqueues (the task's option, the queue's default)."""
    with pytest.raises(ConfigurationError, match=r"checkpoint_max_bytes=.*enqueue.*configure"):
        blueque.aio.Client(redis_url, checkpoint_max_bytes=4096)
    async with blueque.aio.Client(redis_url) as aio:
        queue = aio.get_queue("q")
        await queue.enqueue("p", task_id="t", checkpoint_max_bytes=4096)
        await queue.configure(checkpoint_max_bytes=8192)
    assert redis_client.hget(K.task("t"), "checkpoint_max_bytes") == "4096"
    assert redis_client.hget(K.queue_config("q"), "checkpoint_max_bytes") == "8192"


# --- outages ---------------------------------------------------------------------------------
async def test_enqueue_and_wait_ride_out_a_redis_restart(aof_server: RedisServer) -> None:
    async with blueque.aio.Client(aof_server.url, socket_connect_timeout=1) as aio:
        queue = aio.get_queue("q")
        first = await queue.enqueue("before")
        waiting = asyncio.create_task((await aio.get_task(first)).wait(60))
        watcher = redis.Redis(port=aof_server.port, decode_responses=True)
        await until(lambda: subscribers(watcher, K.done_channel("q")) == 1, what="subscribed")
        watcher.close()
        aof_server.kill()
        during = asyncio.create_task(queue.enqueue("during", task_id="during"))
        await until(lambda: aio.store.health.disruptions >= 2,
                    what="the enqueue and the subscription failed and retry")
        assert not during.done() and not waiting.done()
        aof_server.start()
        assert (await during).created  # created once, by a retry
        sync = blueque.Client(aof_server.url)
        try:
            assert finish(sync, "q").id == first
            task = await waiting
            assert (task.status, task.result) == ("complete", f"done {first}")
            assert sync.redis.lrange(K.pending("q"), 0, -1) == ["during"]
        finally:
            sync.close()


async def test_an_outage_longer_than_the_deadline_is_redis_unavailable(
        aof_server: RedisServer) -> None:
    async with blueque.aio.Client(aof_server.url, socket_connect_timeout=1,
                                  retry_deadline=0.5) as aio:
        task = await aio.get_task(await aio.get_queue("q").enqueue("p"))
        aof_server.kill()
        with pytest.raises(RedisUnavailable, match=str(aof_server.port)) as raised:
            await aio.get_queue("q").enqueue("p")
        assert aio.store.health.disruptions > 1  # it retried before giving up
        assert not isinstance(raised.value, redis.exceptions.RedisError)
        with pytest.raises(RedisUnavailable):
            await task.refresh()
        with pytest.raises(RedisUnavailable):
            await task.wait(5)
        assert in_use(aio) == 0
