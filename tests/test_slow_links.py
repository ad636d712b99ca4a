"""A listener behind a slow, distant link to Redis (blueque.testing.DelayingProxy: +300 ms per
round trip, 16 Mbit/s) keeps its lease while it runs a task with 5 MB of parameters: a lease
renewal is one round trip that reads no parameters (issue 19 item 4; PROTOCOL.md 6, step 2).
One whose loop takes many round trips a step keeps it too: its lease keeper renews it on time
(issue 30 item 3); and a link too slow for the --interval is said, at start and in `blueque
status`."""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

import blueque
from blueque.keys import Keys
from blueque.testing import DelayingProxy, RedisServer
from tests.conftest import Run
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
        far_redis, redis_client, tmp_path: Path, run: Run):
    """Before: about 16 round trips per renewal and the whole task hash re-read: at +300 ms
    and --interval 2 renewals came every 4.9 s against a 4-s lease, and the node was
    declared dead while its task ran; a nearby listener ran it again. A round trip of 300 ms
    is more than a tenth of that --interval: the listener says so at start and in `blueque
    status`, naming an --interval that would hold."""
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
        assert float(info["renewal_seconds"]) > 0.2  # measured, and shown by blueque status
        assert "more than a tenth of its --interval 2" in far.log()  # said at start
        status = run("status")
        row = next(line for line in status.stdout.splitlines()
                   if line.startswith("far.example_1"))
        assert re.search(r" SLOW \(--interval [\d.]+ would hold\) ", row), row


def watch_lease(redis_client: redis.Redis, queue: str, listener: str,
                until: Callable[[], bool], timeout: float) -> tuple[float, float]:
    """Read the listener's lease on ``queue`` until ``until()``: the least time it had left
    (s, Redis' clock; negative: it lapsed) and the longest time between two renewals (s)."""
    least, longest = float("inf"), 0.0
    deadline, renewed, last = time.monotonic() + timeout, None, time.monotonic()
    while not until():
        assert time.monotonic() < deadline, "timed out waiting for the tasks"
        lease = redis_client.zscore(KEYS.leases(queue), listener)
        seconds, micros = redis_client.time()
        if lease is not None:
            least = min(least, lease / 1000 - (seconds + micros / 1e6))
            if lease != renewed:
                longest, renewed, last = max(longest, time.monotonic() - last), lease, \
                    time.monotonic()
        time.sleep(0.05)
    return least, longest


def test_a_loop_of_many_round_trips_on_a_distant_redis_keeps_its_lease(  # type: ignore[no-untyped-def]
        redis_server, redis_client, tmp_path: Path):
    """Issue 30 item 3. +200 ms a round trip, under a tenth of --interval 3; four queues, four
    tasks reporting progress, their output shipped: one step of the loop is some forty round
    trips (its sweep, due tasks, progress, output), 8 to 10 s. Before: renewals came that far
    apart on a 6-s lease, the node was declared dead again and again, and its runs were
    stopped as superseded and run again from zero. Its lease keeper renews the lease on time
    whatever the loop is doing, on a connection of its own."""
    db = int(redis_client.connection_pool.connection_kwargs.get("db", 0))
    direct = f"redis://127.0.0.1:{redis_server.port}/{db}"
    client = blueque.Client(direct)
    journal = tmp_path / "journal"
    journal.mkdir()
    with DelayingProxy(redis_server.port, delay=0.1) as proxy, daemons(tmp_path) as started:
        far = Daemon(listen_command(proxy.url(db), "work,a,b,c", "tests.chaos_jobs:work",
                                    "--interval", "3", "--concurrency", "4", "--identity",
                                    "far.example_1"), tmp_path / "far.log")
        started.append(far)
        wait_until(lambda: redis_client.scard(KEYS.listeners("c")) == 1, timeout=60,
                   what="the distant listener registered on its four queues")
        queue = client.get_queue("work")
        ids = [queue.enqueue(json.dumps({"dir": str(journal), "seconds": 15}), max_attempts=3,
                             retry_backoff=0.01) for _ in range(4)]
        # a sweeper near Redis, which takes the distant listener for dead if its lease lapses
        scheduler = Daemon([sys.executable, "-m", "blueque.cli", "scheduler", "--url", direct,
                            "--interval", "0.5", "--recovery-interval", "0.5"],
                           tmp_path / "scheduler.log")
        started.append(scheduler)
        least, longest = watch_lease(
            redis_client, "work", "far.example_1",
            lambda: queue.stats().complete + queue.stats().failed == len(ids), timeout=120)
        print(f"lease: least left {least:.2f} s of 6, longest between renewals {longest:.2f} s")
        assert least > 0, f"the lease lapsed ({least:.2f} s)"
        tasks = [client.get_task(task_id) for task_id in ids]
        assert [(t.status, t.attempts, t.node) for t in tasks] == [
            ("complete", 1, "far.example_1")] * 4, [t.history for t in tasks]
        assert "lost its lease" not in far.log()
        assert "recovered listener" not in scheduler.log()
        assert "the lease keeper renewed its lease" in far.log()  # the loop was that slow
