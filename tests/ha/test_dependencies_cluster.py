"""Task dependencies on a Redis Cluster (PROTOCOL.md 5.21, "Redis Cluster"): parents and
their dependent in queues whose slots live on three different masters; each step runs in its
own slot, and a dependent is released (or ended) exactly once."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from redis.cluster import RedisCluster

import blueque
from blueque import dependencies
from blueque.keys import Keys
from blueque.recovery import Recovery
from blueque.testing import ClusterTopology

pytestmark = [pytest.mark.ha, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterTopology]:
    with ClusterTopology() as running:
        yield running


@pytest.fixture
def client(cluster: ClusterTopology) -> Iterator[blueque.Client]:
    client = blueque.Client(cluster.url)
    client.redis.flushall(target_nodes=RedisCluster.PRIMARIES)
    yield client
    client.close()


def _three_queues(cluster: ClusterTopology) -> list[str]:
    keys, chosen = Keys(hash_tags=True), {}
    for n in range(200):
        chosen.setdefault(cluster.master_for_key(keys.pending(f"deps{n}")).port, f"deps{n}")
        if len(chosen) == 3:
            return list(chosen.values())
    raise AssertionError("could not spread queues over the masters")


def _run(client: blueque.Client, queue: str, fail: bool = False) -> str:
    task = client.get_listener(queue).reserve()
    assert task is not None
    processor = client.get_processor(task)
    processor.start(os.getpid())
    if fail:
        processor.fail("broken")
    else:
        processor.complete(f"made by {task.id}")
    return task.id


def test_parents_on_two_shards_release_a_dependent_on_a_third_once(
        cluster: ClusterTopology, client: blueque.Client) -> None:
    first, second, third = _three_queues(cluster)
    parents = [client.get_queue(first).enqueue("a"), client.get_queue(second).enqueue("b")]
    child = client.get_queue(third).enqueue("c", after=parents)
    assert client.get_task(child).status == "waiting"
    assert client.get_queue(third).stats().waiting == 1
    _run(client, first)
    assert client.get_task(child).awaiting() == [parents[1]]
    _run(client, second)
    assert client.get_task(child).status == "pending"
    assert [p.result for p in client.get_task(child).parents()] == [
        f"made by {p}" for p in parents]
    # telling again (a sweep, a repeated finish) changes nothing: released once
    store = client.store
    store.tell_dependents(parents, store.now())
    assert store.perform(dependencies.settle_waiting, third, store.now() + 3600) == 0
    assert client.redis.lrange(client.keys.pending(third), 0, -1) == [child]


def test_a_failure_cascades_across_shards_and_the_sweep_repairs_an_untold_ending(
        cluster: ClusterTopology, client: blueque.Client) -> None:
    first, second, third = _three_queues(cluster)
    root = client.get_queue(first).enqueue("root")
    middle = client.get_queue(second).enqueue("m", after=root)
    leaf = client.get_queue(third).enqueue("l", after=middle)
    _run(client, first, fail=True)
    assert client.get_task(middle).error == f"parent {root} failed: broken"
    assert client.get_task(leaf).error == f"parent {middle} failed: parent {root} failed: broken"
    # an ending nobody told (its teller died): the sweep of the dependent's queue tells it
    other = client.get_queue(first).enqueue("o")
    late = client.get_queue(third).enqueue("x", after=other)
    client.redis.hset(client.keys.task(other), "status", "complete")
    client.redis.zadd(client.keys.waiting(third), {late: 0})
    Recovery(client.store, host="sweeper.example").sweep([third])
    assert client.get_task(late).status == "pending"
