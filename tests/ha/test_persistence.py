"""Persistence on a single Redis: with AOF on, a SIGKILLed and restarted redis-server still
holds every task whose enqueue (or outcome) Blueque acknowledged.

A SIGKILL loses the process, not the machine: with ``appendfsync everysec`` each reply
is sent only after its write reached the kernel (Redis writes the AOF buffer before it
answers), so both settings pass here; ``always`` also survives power loss, ``everysec`` may
lose the last second then (not testable on loopback, stated in the README)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import pytest

import blueque
from blueque.errors import RedisUnavailable
from blueque.testing import RedisServer, wait_for


@pytest.fixture(params=["everysec", "always"])
def aof_server(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    args = ("--appendonly", "yes", "--appendfsync", request.param)
    with RedisServer(extra_args=args) as server:
        yield server


def test_every_acknowledged_task_survives_a_sigkill_and_restart(aof_server: RedisServer
                                                                ) -> None:
    # the producer stops at its first RedisUnavailable: one second of retrying through the
    # SIGKILL is enough (the default 30 s only made the test wait)
    client = blueque.Client(aof_server.url, socket_timeout=5, retry_deadline=1)
    queue = client.get_queue("durable")
    acknowledged: list[str] = []
    completed: list[str] = []
    stop = threading.Event()

    def produce() -> None:
        n = 0
        while not stop.is_set():
            try:
                acknowledged.append(queue.enqueue(f'{{"n": {n}}}'))
            except RedisUnavailable:
                return
            n += 1

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        listener = client.get_listener("durable")
        while len(completed) < 50:
            task = listener.listen(timeout=5)
            assert task is not None
            processor = client.get_processor(task)
            processor.start(os.getpid())
            processor.complete("ok")
            completed.append(task.id)
        wait_for(lambda: len(acknowledged) > 500, timeout=30)
        aof_server.kill()  # SIGKILL while the producer is mid-stream
    finally:
        stop.set()
        producer.join(30)
    client.close()

    aof_server.start()  # same port, same directory: it loads the AOF
    client = blueque.Client(aof_server.url)
    data = client.store.task_data_many(acknowledged)
    missing = [i for i, d in zip(acknowledged, data, strict=True) if not d]
    assert missing == [], f"{len(missing)} acknowledged tasks lost"
    for task_id in completed:
        assert client.get_task(task_id).status == "complete"
    stats = queue.stats()
    assert stats.complete == len(completed)
    assert stats.pending >= len(acknowledged) - len(completed)
    client.close()


def test_restart_time_with_aof_is_reported(aof_server: RedisServer,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    client = blueque.Client(aof_server.url)
    client.get_queue("durable").enqueue_many([f'{{"n": {n}}}' for n in range(20000)])
    client.close()
    aof_server.kill()
    began = time.monotonic()
    aof_server.start()
    restart = time.monotonic() - began
    client = blueque.Client(aof_server.url)
    assert client.get_queue("durable").stats().pending == 20000
    client.close()
    with capsys.disabled():
        print(f"\nAOF restart with 20,000 tasks: {restart:.2f} s")
