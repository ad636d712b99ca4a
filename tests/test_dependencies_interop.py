"""Task dependencies side by side with blueque 1.0.1 (PROTOCOL.md 5.21): the original never
takes a waiting task, and a parent it runs releases its dependents through the sweep."""

from __future__ import annotations

import pytest
import redis
from interop.harness import Implementation

import blueque
from blueque.recovery import Recovery

pytestmark = pytest.mark.interop
QUEUE = "interop-deps"


@pytest.fixture(scope="session")
def original() -> Implementation:
    return Implementation.original()


def test_the_original_never_sees_a_waiting_task_and_its_parents_release_through_the_sweep(
        original: Implementation, client: blueque.Client, redis_client: redis.Redis,
        redis_url: str) -> None:
    queue = client.get_queue(QUEUE)
    parent = queue.enqueue("a")
    child = queue.enqueue("b", after=parent)
    assert redis_client.lrange(client.keys.pending(QUEUE), 0, -1) == [parent]
    report = original.run(redis_url, "process", QUEUE, "1")  # takes what is pending: the parent
    assert report["ids"] == [parent]
    assert client.get_task(parent).result == "orig result: a"
    assert client.get_task(child).status == "waiting"  # the original told nobody
    redis_client.zadd(client.keys.waiting(QUEUE), {child: 0})  # its check is due (RECHECK)
    Recovery(client.store, host="sweeper.example").sweep([QUEUE])
    assert client.get_task(child).status == "pending"
    report = original.run(redis_url, "process", QUEUE, "1")
    assert report["ids"] == [child]
    assert client.get_task(child).result == "orig result: b"
