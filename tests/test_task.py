"""Contract tests: Task attributes (typed; None for a missing task), refresh() and wait()."""

from __future__ import annotations

import threading
import time

import pytest
import redis

import blueque
from blueque.errors import CorruptTask, TaskNotFound
from blueque.keys import Keys
from blueque.testing import wait_for
from tests.daemons import between

K = Keys()


def test_task_attributes_are_typed(contract_client: blueque.Client) -> None:
    before = time.time()
    eta = time.time() + 60
    task_id = contract_client.get_queue("q").schedule('{"x": 1}', eta)
    task = contract_client.get_task(task_id)
    assert (task.id, task.status, task.queue, task.parameters) == (
        task_id, "scheduled", "q", '{"x": 1}')
    assert isinstance(task.created, float) and between(before, task.created, time.time())
    assert isinstance(task.updated, float) and task.eta == eta
    assert (task.result, task.error, task.node, task.pid, task.attempts) == (
        None, None, None, None, None)
    assert task.exists and not task.finished and not task.cancelled


def test_running_task_attributes_are_typed(contract_client: blueque.Client) -> None:
    contract_client.get_queue("q").enqueue("p")
    task = contract_client.get_listener("q").reserve()
    assert task is not None
    contract_client.get_processor(task).start(31337)
    task.refresh()
    assert (task.status, task.pid, task.attempts) == ("started", 31337, 1)
    assert isinstance(task.pid, int) and isinstance(task.attempts, int)
    assert isinstance(task.started_at, float)


def test_a_missing_task_has_every_attribute_none(contract_client: blueque.Client) -> None:
    """As in blueque 1.0.1; but not silently: a MissingTaskWarning says the task does not
    exist (it answered status None without a word), unless missing_ok."""
    with pytest.warns(blueque.MissingTaskWarning,
                      match="task 'never-enqueued' does not exist .* task.exists tells"):
        task = contract_client.get_task("never-enqueued")
    assert "<Task never-enqueued (no such task)>" in repr(task)  # (the aio facade wraps it)
    assert contract_client.get_task("never-enqueued", missing_ok=True).exists is False
    assert task.id == "never-enqueued"
    for name in ("status", "queue", "parameters", "result", "error", "node", "pid",
                 "created", "updated", "eta", "attempts", "started_at", "finished_at",
                 "progress"):
        assert getattr(task, name) is None, name
    assert not task.exists and task.data == {}


def test_a_corrupt_typed_field_names_the_key_to_fix(contract_client: blueque.Client) -> None:
    contract_client.redis.hset(K.task("bad"), mapping={"status": "pending", "pid": "not-a-pid"})
    with pytest.raises(CorruptTask, match="blueque_task_bad"):
        _ = contract_client.get_task("bad").pid


def test_refresh_rereads_the_hash(contract_client: blueque.Client) -> None:
    task_id = contract_client.get_queue("q").enqueue("p")
    task = contract_client.get_task(task_id)
    contract_client.get_listener("q").reserve()
    assert task.status == "pending"
    assert task.refresh() is task and task.status == "reserved"


def test_wait_returns_when_another_thread_finishes_the_task(
    client: blueque.Client, redis_client: redis.Redis
) -> None:
    client.get_queue("q").enqueue("p")
    reserved = client.get_listener("q").reserve()
    assert reserved is not None
    processor = client.get_processor(reserved)
    processor.start(1)
    waited: list[blueque.Task] = []
    waiter = threading.Thread(target=lambda: waited.append(
        client.get_task(reserved.id).wait(timeout=30)))
    waiter.start()
    try:
        # complete only once the waiter listens on the done channel: the publish wakes it
        done = K.done_channel("q")
        wait_for(lambda: redis_client.pubsub_numsub(done)[0][1] == 1, timeout=10)
        processor.complete("finished elsewhere")
    finally:
        waiter.join(timeout=30)
    assert not waiter.is_alive()
    assert waited[0].status == "complete" and waited[0].result == "finished elsewhere"


def test_wait_on_a_finished_task_returns_at_once(contract_client: blueque.Client) -> None:
    contract_client.get_queue("q").enqueue("p")
    task = contract_client.get_listener("q").reserve()
    assert task is not None
    contract_client.get_processor(task).fail("no")
    assert contract_client.get_task(task.id).wait(timeout=0).status == "failed"


def test_wait_raises_timeout_error(contract_client: blueque.Client) -> None:
    task_id = contract_client.get_queue("q").enqueue("p")
    with pytest.raises(TimeoutError, match="still pending"):
        contract_client.get_task(task_id).wait(timeout=0.05)


def test_wait_on_a_missing_task_raises_task_not_found(contract_client: blueque.Client) -> None:
    with pytest.raises(TaskNotFound):
        contract_client.get_task("never-enqueued", missing_ok=True).wait(timeout=1)
