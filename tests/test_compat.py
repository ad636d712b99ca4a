"""Programs written for blueque 1.0.1 run unchanged (issue 9 §5): its public ForkingRunner
.fork_task, its `error` text, its redis-py keyword arguments, a refused second start, and the
ids enqueue returns, which such programs hand to other processes (issue 21 §10)."""

from __future__ import annotations

import copy
import json
import multiprocessing
import os
import pickle

import pytest
import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

import blueque
from blueque.forking_runner import ForkingRunner
from blueque.keys import Keys
from blueque.queue import TaskId
from blueque.retry import RetryPolicy
from tests import jobs
from tests.test_cli import cli

KEYS = Keys()


def reserved_task(client: blueque.Client, queue: str = "work") -> blueque.Task:
    client.get_queue(queue).enqueue('{"value": 5}')
    task = client.get_listener(queue).listen(timeout=5)
    assert task is not None
    return task


@pytest.mark.parametrize(("callback", "status", "field", "text"), [
    (jobs.echo, "complete", "result", "5"),
    (jobs.some_error, "failed", "error", "some error"),
])
def test_fork_task_is_public_and_runs_one_task(client: blueque.Client, callback: object,
                                               status: str, field: str, text: str) -> None:
    task = reserved_task(client)
    runner = ForkingRunner(client, "work", callback)  # type: ignore[arg-type]
    pid = runner.fork_task(task)
    assert pid > 0 and pid != os.getpid()
    _, exit_status = os.waitpid(pid, 0)
    assert os.WIFEXITED(exit_status) and os.WEXITSTATUS(exit_status) == 0
    data = task.refresh().data
    assert (data["status"], data[field], data["pid"]) == (status, text, str(pid))


def test_exception_text_is_the_error_and_the_traceback_has_its_own_field(
        client: blueque.Client, redis_url: str) -> None:
    task = reserved_task(client)
    os.waitpid(ForkingRunner(client, "work", jobs.some_error).fork_task(task), 0)
    task.refresh()
    assert task.error == "some error"  # 1.0.1's str(exception), no file paths
    traceback = task.data["traceback"]
    assert traceback.startswith("Traceback (most recent call last):")
    assert traceback.rstrip().endswith("Exception: some error") and "jobs.py" in traceback
    shown = cli(redis_url, "show", task.id)
    assert shown.returncode == 0
    assert "some error" in shown.stdout and "Exception: some error" in shown.stdout
    assert "traceback" in shown.stdout


def test_a_later_failure_without_traceback_removes_the_old_one(client: blueque.Client) -> None:
    client.get_queue("work").configure(max_attempts=2, retry_backoff=0)
    task = reserved_task(client)
    os.waitpid(ForkingRunner(client, "work", jobs.some_error).fork_task(task), 0)
    assert task.refresh().status == "scheduled" and task.data["traceback"]
    client.get_queue("work").enqueue_due_tasks()
    again = client.get_listener("work").listen(timeout=5)
    assert again is not None and again.attempts == 2
    processor = client.get_processor(again)
    processor.start(os.getpid())
    processor.fail("given up by hand")
    assert again.refresh().error == "given up by hand" and "traceback" not in again.data


def test_redis_py_retry_keyword_is_forwarded_unchanged(redis_url: str,
                                                        redis_client: redis.Redis) -> None:
    retry = Retry(ExponentialBackoff(), 3)
    client = blueque.Client(redis_url, retry=retry)  # as with blueque 1.0.1's Client
    try:
        task_id = client.get_queue("work").enqueue("{}")
        assert client.get_task(task_id).status == "pending"
        assert client.redis.get_retry() is retry
    finally:
        client.close()
    policy = RetryPolicy(deadline_s=1.0)
    own = blueque.Client(redis_url, retry_policy=policy, socket_timeout=5)
    try:
        assert own.store.retry is policy
        assert own.redis.connection_pool.connection_kwargs["socket_timeout"] == 5
        own.get_queue("work").enqueue("{}")
    finally:
        own.close()


def test_refused_second_start_keeps_the_task_in_the_reserved_list(
        client: blueque.Client, redis_client: redis.Redis) -> None:
    task = reserved_task(client)
    listener_id = task.node
    assert listener_id is not None
    client.get_processor(task).start(os.getpid())
    with pytest.raises(blueque.InvalidTaskState, match="cannot start twice"):
        client.get_processor(client.get_task(task.id)).start(os.getpid() + 1)
    # still where recovery looks if this listener dies
    assert redis_client.lrange(KEYS.reserved("work", listener_id), 0, -1) == [task.id]
    assert task.refresh().status == "started" and task.pid == os.getpid()


# --- the ids enqueue returns (issue 21 §10) ------------------------------------------------
def echo_id(task_id: TaskId) -> tuple[TaskId, str, bool]:
    """Run in a multiprocessing pool's worker: the id as it arrived, its type and flag."""
    return task_id, type(task_id).__name__, task_id.created


@pytest.mark.parametrize("created", [True, False])
def test_task_ids_survive_pickle_copy_and_json(client: blueque.Client, created: bool) -> None:
    """A TaskId is a str with a ``created`` flag: pickle (every protocol), copy and deepcopy
    raised "TaskId.__new__() missing 1 required positional argument: 'created'"."""
    queue = client.get_queue("work")
    task_id = queue.enqueue("{}", task_id="mine")
    if not created:
        task_id = queue.enqueue("{}", task_id="mine")
    assert task_id.created is created
    copies = [pickle.loads(pickle.dumps(task_id, protocol))
              for protocol in range(pickle.HIGHEST_PROTOCOL + 1)]
    copies += [copy.copy(task_id), copy.deepcopy(task_id), copy.deepcopy({"id": task_id})["id"]]
    for again in copies:
        assert isinstance(again, TaskId) and again == "mine" and again.created is created
    assert json.loads(json.dumps({"id": task_id})) == {"id": "mine"}
    scheduled = queue.schedule("{}", eta=2e9)
    assert pickle.loads(pickle.dumps(scheduled)) == scheduled


def test_task_ids_go_through_a_multiprocessing_pool(client: blueque.Client) -> None:
    """What a 1.0.1 program does with the ids it enqueued: hand them to worker processes,
    which had died unpickling them (the pool then hung or lost the work)."""
    queue = client.get_queue("work")
    ids = [queue.enqueue("{}"), queue.enqueue("{}", task_id="again"),
           queue.enqueue("{}", task_id="again")]
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        # bounded: a worker that dies unpickling its work is replaced, and map waits for ever
        returned = pool.map_async(echo_id, ids, chunksize=1).get(timeout=60)
    assert [(str(i), kind, created) for i, kind, created in returned] == [
        (ids[0], "TaskId", True), ("again", "TaskId", True), ("again", "TaskId", False)]
    assert all(isinstance(i, TaskId) for i, _, _ in returned)
