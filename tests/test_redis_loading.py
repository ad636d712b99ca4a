"""A Redis restarted from an append-only file large enough that it answers LOADING for longer
than a lease (issue 9 §1: LOADING is unavailability, not a refusal, and an outage is not a
death), end to end: real `blueque listen` daemons on two nodes, real task processes reporting
progress, a real redis-server made to load slowly (its key-load-delay debugging setting). One
node comes back two leases after the other: the first must not take it for dead."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time

import pytest
import redis

import blueque
from blueque.errors import RedisUnavailable
from blueque.keys import Keys
from tests.daemons import daemons, gone, wait_until
from tests.test_redis_outages import cli, lines, listener

pytestmark = pytest.mark.slow

KEYS = Keys()
LEASE_S = 1.0  # the listeners' --interval 0.5
#: 1,500 keys at 2 ms each: the restarted server answers LOADING for about 3 s (3 leases)
PADDING_KEYS, LOAD_DELAY_US = 1500, 2000


def answers_loading(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"-LOADING")
    except OSError:
        return False


def pad_and_rewrite(admin: redis.Redis) -> None:
    """Enough keys that loading them takes a while, written into the AOF's base."""
    pipe = admin.pipeline(transaction=False)
    for n in range(PADDING_KEYS):
        pipe.set(f"padding:{n}", "x")
    pipe.execute()
    admin.bgrewriteaof()
    wait_until(lambda: not (persistence := admin.info("persistence"))["aof_rewrite_in_progress"]
               and not persistence["aof_rewrite_scheduled"], what="the AOF rewritten")


def test_a_restart_loading_for_longer_than_a_lease_kills_no_task(  # type: ignore[no-untyped-def]
        aof_server, tmp_path):
    marker, release, phase = tmp_path / "marker", tmp_path / "release", tmp_path / "phase"
    client = blueque.Client(aof_server.url)
    queue = client.get_queue("work")
    admin = redis.Redis(port=aof_server.port, decode_responses=True)
    with daemons(tmp_path) as started:
        nodes = [listener(started, tmp_path, aof_server.url, "--identity", f"node{n}.example_{n}")
                 for n in range(2)]
        ids = [queue.enqueue(json.dumps({"marker": str(marker), "release": str(release),
                                         "phase": str(phase), "n": n}),
                             max_attempts=2, retry_backoff=0.01) for n in range(2)]
        wait_until(lambda: all(client.get_task(i).progress_message == "phase none"
                               for i in ids), what="both tasks reporting")
        pids = {i: client.get_task(i).pid for i in ids}
        assert len({client.get_task(i).node for i in ids}) == 2  # one on each node
        pad_and_rewrite(admin)

        aof_server.kill()
        # node1 comes back last (a listener with the default --interval waits up to 5 s
        # between tries): frozen through the load and for two leases after it
        nodes[1].signal(signal.SIGSTOP)
        phase.write_text("loading")
        aof_server.extra_args = (*aof_server.extra_args, "--key-load-delay", str(LOAD_DELAY_US),
                             "--loading-process-events-interval-bytes", "1024")
        restart = threading.Thread(target=aof_server.start, kwargs={"timeout": 120})
        restart.start()  # returns once the server answers PONG, its data loaded
        wait_until(lambda: answers_loading(aof_server.port), what="the server answering LOADING")
        loading_since = time.monotonic()
        # a client past its retry bound: RedisUnavailable that says why, exit 3 on the CLI
        short = aof_server.url + "?retry_deadline=0.2"
        with pytest.raises(RedisUnavailable, match="loading"):
            blueque.Client(short).get_queue("work").enqueue("{}")
        enqueue = cli("enqueue", "work", "{}", "--url", short)
        _, err = enqueue.communicate(timeout=60)
        assert enqueue.returncode == 3 and "loading" in err and "Traceback" not in err, err
        restart.join(120)
        assert time.monotonic() - loading_since > LEASE_S  # the premise: longer than a lease
        lapsed = admin.zscore(KEYS.leases("work"), "node1.example_1")
        assert lapsed is not None and lapsed / 1000 < time.time()  # its lease lapsed meanwhile
        wait_until(lambda: "Redis is back" in nodes[0].log(), what="node0 back")
        time.sleep(2 * LEASE_S)  # node1 still away: its lease lapsed, but Redis was not up
        nodes[1].signal(signal.SIGCONT)  # long enough for it to renew (RECONNECT_GRACE)

        wait_until(lambda: all(client.get_task(i).progress_message == "phase loading"
                               for i in ids), what="progress kept and sent after the load")
        wait_until(lambda: all((admin.zscore(KEYS.leases("work"), f"node{n}.example_{n}")
                                or 0) / 1000 > time.time() for n in range(2)),
                   what="both listeners renewing again")
        release.touch()
        for task_id in ids:
            task = client.get_task(task_id).wait(30)
            assert (task.status, task.attempts, task.pid) == ("complete", 1, pids[task_id])
        assert [line.split()[:2] for line in lines(marker) if line.startswith("start")] == [
            ["start", "1"], ["start", "1"]]
        for daemon in nodes:
            assert daemon.alive(), daemon.log()
            log = daemon.log()
            assert "recovered listener" not in log and "lost its lease" not in log
            assert "superseded" not in log and "Traceback" not in log
        assert admin.dbsize() > PADDING_KEYS  # the same data, loaded
    # each task process exits once its listener has recorded its outcome: soon, not at once
    wait_until(lambda: all(gone(pid or 0) for pid in pids.values()), timeout=10,
               what="the task processes exited after their outcomes")
