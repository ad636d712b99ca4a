"""Replies lost in a failover: the operation ran on the old master (and reached the replica),
but its caller never heard. Simulated on one private redis-server by doing the operation
behind the caller's back, then checking that the caller's next steps still end well."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import redis
from daemons import Daemon, daemons
from failover import listen_command

import blueque
from blueque.testing import RedisServer, wait_for

pytestmark = pytest.mark.ha


def test_a_move_whose_reply_was_lost_is_healed_by_the_daemon(
    redis_client: redis.Redis, redis_server: RedisServer, tmp_path: Path
) -> None:
    url = redis_client.connection_pool.connection_kwargs
    url = f"redis://127.0.0.1:{redis_server.port}/{url.get('db', 0)}"
    client = blueque.Client(url)
    identity = "lost-reply-host_1"
    with daemons(tmp_path) as started:
        started.append(Daemon(
            [*listen_command(url, "lost", 1, 1.0, "tests.jobs:echo"), "--identity", identity],
            tmp_path / "daemon.log"))
        daemon = started[0]
        wait_for(lambda: identity in client.store.listener_ids("lost"), timeout=20)
        daemon.signal(signal.SIGSTOP)  # so that it cannot take the task itself
        try:
            task_id = client.get_queue("lost").enqueue(json.dumps({"value": 1}))
            # the daemon's LMOVE ran but its reply was lost: the id sits in its reserved
            # list, still pending, and the daemon goes on asking for the next task
            assert client.store.move_pending("lost", identity, block=None) == task_id
        finally:
            daemon.signal(signal.SIGCONT)
        wait_for(lambda: client.get_task(task_id).status == "complete", timeout=20)
        assert daemon.alive()
    assert client.store.reserved_ids("lost", identity) == []
    client.close()


def test_a_finish_whose_reply_was_lost_can_be_repeated(client: blueque.Client) -> None:
    queue = client.get_queue("lost")
    task_id = queue.enqueue("{}")
    task = client.get_listener("lost").listen(timeout=5)
    assert task is not None
    processor = client.get_processor(task)
    processor.start(os.getpid())
    processor.complete("first")
    processor.complete("first")  # the retry after a lost reply: no error, nothing changes
    done = client.get_task(task_id)
    assert (done.status, done.result) == ("complete", "first")
    assert client.store.task_ids("lost", "complete") == [task_id]
