"""blueque.aio on Sentinel and Cluster URLs: the same topologies as test_sentinel and
test_cluster (real servers and sentinels on loopback), driven from an event loop; the
listener side is the sync client's, as a daemon's would be."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import pytest
import redis.asyncio.cluster

import blueque
import blueque.aio
from blueque.testing import ClusterTopology, SentinelTopology

pytestmark = [pytest.mark.ha, pytest.mark.slow]


@pytest.fixture
def sentinel() -> Iterator[SentinelTopology]:
    with SentinelTopology(replicas=2, sentinels=3) as topology:
        yield topology


def finish(client: blueque.Client, queue: str, task_id: str) -> None:
    task = client.get_listener(queue).reserve()
    assert task is not None and task.id == task_id
    processor = client.get_processor(task)
    processor.start(os.getpid())
    processor.complete(f"done {task_id}")


async def until(predicate: object, timeout: float = 30.0) -> None:
    assert callable(predicate)
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"timed out: {predicate}"
        await asyncio.sleep(0.02)


def test_sentinel_url_with_replication_waits_and_a_failover(sentinel: SentinelTopology
                                                            ) -> None:
    """Enqueues wait for both replicas (Durability.arun); a wait started before the master
    is SIGKILLed returns once the task is finished on the promoted replica; an enqueue made
    during the failover rides it out (MasterNotFoundError is transient)."""
    sync = blueque.Client(sentinel.url)

    async def scenario() -> None:
        async with blueque.aio.Client(sentinel.url + "?wait_replicas=2") as both:
            first = await both.get_queue("q").enqueue('{"n": 1}')
        for server in sentinel.servers[1:]:  # acknowledged: each replica has it
            replica = blueque.Client(server.url)
            assert replica.store.task_data(first)["status"] == "pending"
            replica.close()
        # after the failover one replica is left: wait for it
        async with blueque.aio.Client(sentinel.url + "?wait_replicas=1") as client:
            queue = client.get_queue("q")
            waiting = asyncio.create_task((await client.get_task(first)).wait(120))
            old = sentinel.kill_master()
            during = asyncio.create_task(queue.enqueue('{"n": 2}', task_id="during"))
            await until(lambda: client.store.health.disruptions > 0)
            await asyncio.to_thread(sentinel.wait_for_failover, old.port)
            assert (await during).created
            finish(sync, "q", first)
            task = await waiting
            assert (task.status, task.result) == ("complete", f"done {first}")
            assert (await queue.stats()).pending == 1

    try:
        asyncio.run(scenario())
    finally:
        sync.close()


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterTopology]:
    with ClusterTopology() as topology:
        yield topology


def test_cluster_url_runs_every_client_operation(cluster: ClusterTopology) -> None:
    sync = blueque.Client(cluster.url)

    async def scenario() -> None:
        async with blueque.aio.Client(cluster.url + "?wait_replicas=1") as client:
            assert isinstance(client.redis, redis.asyncio.cluster.RedisCluster)
            assert client.keys.hash_tags
            await client.ping()
            names = [f"shard{n}" for n in range(6)]  # spread over the masters
            made = await asyncio.gather(*(client.get_queue(n).enqueue(n) for n in names))
            for name, task_id in zip(names, made, strict=True):
                assert task_id.startswith("{" + name + "}")  # the queue's slot
                assert sync.store.task_data(task_id)["queue"] == name
            bulk = await client.get_queue("shard0").enqueue_many(["a", "b"])
            assert bulk.created == 2
            waiting = asyncio.create_task((await client.get_task(made[1])).wait(60))
            await asyncio.sleep(0)  # let it subscribe: either way it must see the finish
            finish(sync, "shard1", made[1])
            assert (await waiting).status == "complete"
            assert await client.cancel_task(made[2]) == "cancelled"
            await client.retry_task(made[2])
            assert sync.get_task(made[2]).status == "pending"
            stats = await client.get_queue("shard0").stats()
            assert (stats.pending, stats.name) == (3, "shard0")
            assert set(names) <= set(await client.queue_names())
            await client.get_queue("shard1").delete_task(await client.get_task(made[1]))
            assert not sync.get_task(made[1], missing_ok=True).exists

    try:
        asyncio.run(scenario())
    finally:
        sync.close()
