"""Contract tests: cancel in each state (PROTOCOL.md section 5.9)."""

from __future__ import annotations

import time

import pytest

import blueque
from blueque.errors import InvalidTaskState, TaskNotFound
from blueque.keys import Keys

K = Keys()


def _assert_cancelled(client: blueque.Client, task_id: str) -> None:
    data = client.redis.hgetall(K.task(task_id))
    assert data["status"] == "failed"
    assert data["error"].startswith("cancelled")
    # its finish time is its updated (no finished_at since issue 29, PROTOCOL.md 3)
    assert float(data["cancelled"]) == float(data["updated"]) and "finished_at" not in data
    assert client.get_task(task_id).finished_at == float(data["updated"])
    assert "eta" not in data  # it is no longer scheduled
    # listed and counted apart from the failed tasks; 1.0.1 reads status failed
    assert client.redis.lrange(K.cancelled("q"), 0, -1) == [task_id]
    assert client.redis.llen(K.failed("q")) == 0
    stats = client.get_queue("q").stats()
    assert (stats.failed, stats.cancelled) == (0, 1)
    task = client.get_task(task_id)
    assert task.cancelled and task.finished and task.state == "cancelled"
    assert task.history[-1]["outcome"] == "cancelled"
    assert task.history[-1]["error"] == data["error"]


def test_cancel_a_pending_task(contract_client: blueque.Client) -> None:
    task_id = contract_client.get_queue("q").enqueue("p")
    assert contract_client.cancel_task(task_id, "not needed") == "cancelled"
    _assert_cancelled(contract_client, task_id)
    assert contract_client.redis.hget(K.task(task_id), "error") == "cancelled: not needed"
    assert contract_client.redis.llen(K.pending("q")) == 0
    assert contract_client.get_listener("q").reserve() is None


def test_cancel_a_scheduled_task(contract_client: blueque.Client) -> None:
    queue = contract_client.get_queue("q")
    task_id = queue.schedule("p", time.time() + 3600)
    assert contract_client.cancel_task(task_id) == "cancelled"
    _assert_cancelled(contract_client, task_id)
    assert contract_client.redis.zcard(K.scheduled("q")) == 0


def test_cancel_a_reserved_task_stops_it_from_starting(contract_client: blueque.Client) -> None:
    contract_client.get_queue("q").enqueue("p")
    listener = contract_client.get_listener("q")
    task = listener.reserve()
    assert task is not None
    assert contract_client.cancel_task(task.id) == "cancelled"
    _assert_cancelled(contract_client, task.id)
    with pytest.raises(InvalidTaskState, match="cannot start"):
        contract_client.get_processor(task).start(1)
    assert contract_client.redis.llen(K.reserved("q", listener.id)) == 0
    assert contract_client.redis.scard(K.started("q")) == 0


def test_cancel_a_started_task_asks_its_listener(client: blueque.Client) -> None:
    r = client.redis
    client.get_queue("q").enqueue("p")
    listener = client.get_listener("q")
    task = listener.reserve()
    assert task is not None
    client.get_processor(task).start(1)
    control = client.store.subscribe([K.control(listener.id)])
    try:
        assert control.get_message(timeout=0) is None  # subscribed, and confirmed
        assert r.pubsub_numsub(K.control(listener.id))[0][1] == 1
        assert client.cancel_task(task.id) == "requested"
        message = control.get_message(timeout=5)
    finally:
        control.close()
    assert message is not None
    assert (message.channel, message.data) == (K.control(listener.id), task.id)
    data = r.hgetall(K.task(task.id))
    assert data["status"] == "started" and "cancel_requested" in data
    assert r.llen(K.failed("q")) == 0 and r.llen(K.cancelled("q")) == 0


def test_cancel_records_the_request_without_a_subscriber(contract_client: blueque.Client) -> None:
    contract_client.get_queue("q").enqueue("p")
    task = contract_client.get_listener("q").reserve()
    assert task is not None
    contract_client.get_processor(task).start(1)
    assert contract_client.cancel_task(task.id) == "requested"
    assert contract_client.get_task(task.id).data["cancel_requested"]


@pytest.mark.parametrize("finish", ["complete", "fail"])
def test_cancel_a_finished_task_is_refused(contract_client: blueque.Client, finish: str) -> None:
    contract_client.get_queue("q").enqueue("p")
    task = contract_client.get_listener("q").reserve()
    assert task is not None
    processor = contract_client.get_processor(task)
    processor.start(1)
    getattr(processor, finish)("x")
    status = contract_client.get_task(task.id).status
    with pytest.raises(InvalidTaskState, match="cannot be cancelled"):
        contract_client.cancel_task(task.id)
    assert contract_client.get_task(task.id).status == status
    assert not contract_client.get_task(task.id).cancelled


def test_cancel_a_missing_task(contract_client: blueque.Client) -> None:
    with pytest.raises(TaskNotFound, match="does not exist"):
        contract_client.cancel_task("no-such-task")
