"""Script calls on the store's own connection (blueque.store.direct): what the ordinary path
of redis-py did for every call (a lost connection repaired, a lost script cache loaded, one
caller per connection) still holds when the kept connection meets it."""

from __future__ import annotations

import os
import threading

import pytest
import redis
import redis.asyncio

import blueque
from blueque.keys import Keys
from blueque.store.direct import packed_evalsha

K = Keys()


def pending(r: redis.Redis, queue: str) -> list[str]:
    return list(r.lrange(K.pending(queue), 0, -1))


def test_enqueues_go_through_the_kept_connection(client: blueque.Client) -> None:
    queue = client.get_queue("q")
    first = queue.enqueue("{}")
    assert client.store._direct._connection is not None  # the direct path was taken
    second = queue.enqueue("{}")
    assert pending(client.redis, "q") == [second, first]


def test_an_enqueue_after_redis_dropped_the_kept_connection_creates_its_task_once(
        client: blueque.Client, redis_url: str) -> None:
    queue = client.get_queue("q")
    first = queue.enqueue("{}")
    killer = redis.Redis.from_url(redis_url, decode_responses=True)
    assert killer.client_kill_filter(_type="normal", skipme=True) >= 1
    killer.close()
    second = queue.enqueue("{}")  # the kept connection is dead: sent the ordinary way
    assert second.created
    assert pending(client.redis, "q") == [second, first]
    third = queue.enqueue("{}")  # and the kept connection is made again
    assert pending(client.redis, "q") == [third, second, first]


def test_an_enqueue_after_the_server_lost_its_scripts_loads_them(client: blueque.Client
                                                                  ) -> None:
    queue = client.get_queue("q")
    first = queue.enqueue("{}")
    client.redis.script_flush()
    second = queue.enqueue("{}")
    assert pending(client.redis, "q") == [second, first]
    assert client.redis.hget(K.task(second), "status") == "pending"


def test_threads_enqueueing_at_once_each_get_their_task(client: blueque.Client) -> None:
    queue = client.get_queue("q")
    made: list[str] = []
    lock = threading.Lock()

    def enqueue_many() -> None:
        for _ in range(200):
            task_id = queue.enqueue("{}")
            with lock:
                made.append(task_id)

    threads = [threading.Thread(target=enqueue_many) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(made)) == 1200
    assert sorted(pending(client.redis, "q")) == sorted(made)
    assert all(client.redis.hget(K.task(task_id), "queue") == "q" for task_id in made)


def test_a_forked_child_enqueues_on_a_connection_of_its_own(client: blueque.Client) -> None:
    queue = client.get_queue("q")
    first = queue.enqueue("{}")
    pid = os.fork()
    if pid == 0:  # the child: its task, on its own connection, then leave at once
        ok = False
        try:
            child_task = queue.enqueue('{"child": 1}')
            ok = client.redis.hget(K.task(child_task), "parameters") == '{"child": 1}'
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    last = queue.enqueue("{}")  # the parent's kept connection still answers its own calls
    ids = pending(client.redis, "q")
    assert len(ids) == 3 and ids[0] == last and ids[-1] == first
    assert client.redis.hget(K.task(ids[1]), "parameters") == '{"child": 1}'


def test_a_child_forked_while_another_thread_was_sending_still_sends_directly(
        client: blueque.Client) -> None:
    queue = client.get_queue("q")
    queue.enqueue("{}")
    direct = client.store._direct
    direct._lock.acquire()  # as if another thread were mid-call when the process forked
    try:
        pid = os.fork()
        if pid == 0:
            ok = False
            try:
                queue.enqueue('{"child": 1}')
                ok = direct._connection is not None and direct._connection.pid == os.getpid()
            finally:
                os._exit(0 if ok else 1)
    finally:
        direct._lock.release()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert client.redis.llen(K.pending("q")) == 2


def test_a_pool_bounded_to_one_connection_still_serves_every_command(redis_url: str) -> None:
    pool = redis.BlockingConnectionPool.from_url(redis_url, max_connections=1, timeout=2,
                                                 decode_responses=True)
    client = blueque.Client(redis.Redis(connection_pool=pool))
    try:
        task_id = client.get_queue("bounded").enqueue("{}")  # a script call, kept apart
        assert client.get_task(task_id).status == "pending"  # a plain command, from the pool
        assert client.get_queue("bounded").stats().pending >= 1
    finally:
        client.close()


def test_closing_the_client_closes_the_kept_connection(client: blueque.Client) -> None:
    client.get_queue("q").enqueue("{}")
    kept = client.store._direct._connection
    assert kept is not None and kept._sock is not None
    client.close()
    assert kept._sock is None


@pytest.mark.parametrize("encoding", ["utf-8", "latin-1"])
def test_script_calls_are_packed_byte_for_byte_as_redis_py_packs_them(encoding: str) -> None:
    """packed_evalsha (both clients' kept connections) writes what redis-py's pack_command
    writes for the same arguments (the asyncio connection's encodes str in the connection's
    encoding; the sync one's, through hiredis where installed, always in UTF-8, Blueque's
    clients' encoding), and refuses what redis-py's encoder refuses."""
    connection = redis.asyncio.Connection(encoding=encoding)
    keys = ["blueque_task_é", "blueque_pending_q"]
    args = ["", "x" * 70_000, 0, -7, 2**70, 1.5, 1732800000.123456, float("inf"), b"\x00\xff",
            memoryview(b"view"), "\r\n*3"]
    packers = [connection] + ([redis.Connection()] if encoding == "utf-8" else [])
    for packer in packers:
        expected = b"".join(bytes(chunk) for chunk in packer.pack_command(
            "EVALSHA", "a" * 40, len(keys), *keys, *args))
        assert packed_evalsha(connection.encoder, "a" * 40, keys, args) == expected, packer
    for refused in (True, None, object()):
        with pytest.raises(redis.exceptions.DataError):
            packed_evalsha(connection.encoder, "a" * 40, [], [refused])
