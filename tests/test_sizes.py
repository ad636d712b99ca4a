"""Sizes with limits (issue 30 item 8): a queue's max_parameters_bytes and max_result_bytes
(16 MiB each unless Queue.configure says), refused at enqueue with nothing written, a result
over the limit failing its run with a clear error, and `blueque show` cutting long values
unless --full. On the code before, 200-MB parameters and a 50-MB result were stored, and
`show` printed all of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

import blueque
from blueque.errors import ConfigurationError, TooLarge
from blueque.keys import Keys
from blueque.policy import QUEUE_LIMITS
from tests.conftest import Run
from tests.daemons import Daemon, listen_command

KEYS = Keys()


def nothing_written(redis_client: redis.Redis, queue: str = "q", *known: str) -> bool:
    """No task of ``queue`` made (``known``: the ids of tasks the test made elsewhere)."""
    made = set(redis_client.scan_iter("blueque_task_*")) - {KEYS.task(i) for i in known}
    return (redis_client.llen(KEYS.pending(queue)) == 0
            and redis_client.zcard(KEYS.waiting(queue)) == 0
            and redis_client.zcard(KEYS.scheduled(queue)) == 0 and not made)


def test_the_default_limit_refuses_parameters_over_16_mib(client: blueque.Client,
                                                          redis_client: redis.Redis) -> None:
    queue = client.get_queue("q")
    big = "x" * (QUEUE_LIMITS["max_parameters_bytes"] + 1)
    with pytest.raises(TooLarge, match=r"parameters of 16777217 bytes, more than the "
                                       r"max_parameters_bytes of 16777216 of queue q"):
        queue.enqueue(big)
    assert nothing_written(redis_client)
    assert queue.enqueue("x" * QUEUE_LIMITS["max_parameters_bytes"])  # at the limit: taken


def test_a_queue_s_own_limit_is_kept_by_every_way_to_enqueue(
        client: blueque.Client, redis_client: redis.Redis) -> None:
    queue = client.get_queue("q")
    queue.configure(max_parameters_bytes=100)
    parent = client.get_queue("other").enqueue("p")
    for enqueue in (lambda: queue.enqueue("x" * 101),
                    lambda: queue.schedule("x" * 101, delay=60),
                    lambda: queue.enqueue_many(["small", "x" * 101]),
                    lambda: queue.enqueue("x" * 101, after=parent)):
        with pytest.raises(TooLarge, match="max_parameters_bytes of 100 of queue q"):
            enqueue()
        assert nothing_written(redis_client, "q", parent), enqueue
    queue.configure(max_parameters_bytes=0)  # no limit
    assert queue.enqueue("x" * 101)
    with pytest.raises(ConfigurationError, match="a queue's limit, not a task's option"):
        queue.enqueue("x", max_result_bytes=10)


def test_enqueue_over_the_limit_exits_2_and_writes_nothing(run: Run,
                                                           redis_client: redis.Redis) -> None:
    done = run("configure", "q", "--max-parameters-bytes", "1000", "--max-result-bytes", "50")
    assert done.returncode == 0, done.stderr
    assert redis_client.hgetall(KEYS.queue_config("q")) == {
        "max_parameters_bytes": "1000", "max_result_bytes": "50"}
    done = run("enqueue", "q", "-", stdin="y" * 5000)
    assert done.returncode == 2, done
    assert "parameters of 5000 bytes, more than the max_parameters_bytes of 1000" in done.stderr
    assert "nothing was enqueued" in done.stderr
    assert redis_client.llen(KEYS.pending("q")) == 0


@pytest.mark.slow
def test_a_result_over_the_limit_fails_its_run_and_is_not_retried(
        client: blueque.Client, redis_url: str, redis_client: redis.Redis, tmp_path: Path,
        started: list[Daemon]) -> None:
    queue = client.get_queue("q")
    queue.configure(max_result_bytes=1000)
    started.append(Daemon(listen_command(redis_url, "q", "tests.jobs:echo", "--interval",
                                         "0.5", "--poll", "0.1"), tmp_path / "listener.log"))
    big = queue.enqueue(json.dumps({"value": "z" * 5000}), max_attempts=3)
    small = queue.enqueue(json.dumps({"value": "z" * 900}))
    task = client.get_task(big).wait(30)
    assert task.status == "failed" and task.attempts == 1  # not retried: same work, same value
    assert task.error is not None and "result of 5000 bytes, more than the max_result_bytes " \
        "of 1000 of its queue: not stored" in task.error
    assert task.result is None
    assert client.get_task(small).wait(30).result == "z" * 900
    assert started[0].alive()
    assert "result of 5000 bytes" in started[0].log()


def test_show_cuts_long_values_unless_full(client: blueque.Client, run: Run) -> None:
    task_id = client.get_queue("q").enqueue("p" * 50_000)
    shown = run("show", task_id)
    assert shown.returncode == 0, shown.stderr
    assert "[cut: 50,000 characters in all; --full prints them]" in shown.stdout
    assert len(shown.stdout) < 5_000
    full = run("show", task_id, "--full")
    assert "p" * 50_000 in full.stdout and "[cut" not in full.stdout
    as_json = run("show", task_id, "--json")
    assert json.loads(as_json.stdout)["parameters"] == "p" * 50_000  # scripts get it whole
