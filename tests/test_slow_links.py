"""A listener behind a slow, distant link to Redis (blueque.testing.DelayingProxy: +300 ms per
round trip, 16 Mbit/s) keeps its lease while it runs a task with 5 MB of parameters: a lease
renewal is one round trip that reads no parameters (issue 19 item 4; PROTOCOL.md 6, step 2)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import blueque
from blueque.keys import Keys
from blueque.testing import DelayingProxy, RedisServer
from tests.daemons import Daemon, daemons, lines, listen_command, wait_until

pytestmark = pytest.mark.slow

KEYS = Keys()


@pytest.fixture
def far_redis(redis_server: RedisServer, redis_client: redis.Redis
              ) -> Iterator[tuple[str, DelayingProxy]]:
    """The test's database, and a proxy that puts it 300 ms away at 16 Mbit/s."""
    db = int(redis_client.connection_pool.connection_kwargs.get("db", 0))
    with DelayingProxy(redis_server.port, delay=0.15, bandwidth=2_000_000) as proxy:
        yield f"redis://127.0.0.1:{redis_server.port}/{db}", proxy


def test_a_distant_listener_with_big_parameters_keeps_its_lease(  # type: ignore[no-untyped-def]
        far_redis, redis_client, tmp_path: Path):
    """Before: about 16 round trips per renewal and the whole task hash re-read: at +300 ms
    and --interval 2 renewals came every 4.9 s against a 4-s lease, and the node was
    declared dead while its task ran; a nearby listener ran it again."""
    direct, proxy = far_redis
    marker, release = tmp_path / "marker", tmp_path / "release"
    client = blueque.Client(direct)
    with daemons(tmp_path) as started:
        far = Daemon(listen_command(proxy.url(int(direct.rsplit("/", 1)[1])), "work",
                                    "tests.jobs:waits_for_release", "--interval", "2",
                                    "--identity", "far.example_1", "--no-task-logs"),
                     tmp_path / "far.log")
        started.append(far)
        wait_until(lambda: redis_client.scard(KEYS.listeners("work")) == 1, timeout=60,
                   what="the distant listener")
        task_id = client.get_queue("work").enqueue(json.dumps(
            {"marker": str(marker), "release": str(release), "seconds": 12,
             "padding": "x" * 5_000_000}), max_attempts=2, retry_backoff=0.01)
        wait_until(lambda: lines(marker), timeout=60, what="running on the distant listener")
        near = Daemon(listen_command(direct, "work", "tests.jobs:waits_for_release",
                                     "--interval", "0.5", "--identity", "near.example_2",
                                     "--no-task-logs"), tmp_path / "near.log")
        started.append(near)
        task = client.get_task(task_id).wait(60)  # it ends by itself after 12 s
        assert task.status == "complete" and task.attempts == 1, task.history
        assert task.node == "far.example_1"
        assert "lost its lease" not in far.log()
        assert "recovered listener" not in near.log()
        info = redis_client.hgetall(KEYS.listener_info("far.example_1"))
        assert float(info["renewal_seconds"]) > 0  # measured, and shown by blueque status
