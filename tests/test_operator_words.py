"""Words that misled an operator at 3 a.m. (issue 30 item 9), each with the real thing behind
it: a 3-s blip stopping an exclusive run was logged as "preempted: its node goes away"; a Redis
at its maxclients was "unreachable: check the URL and that redis-server is running"; a run
whose task a Redis restarted empty had lost was "deleted"; a task process whose listener was
only frozen said it "is gone"; and a memory policy changed to an evicting one while listeners
ran went unnoticed (it was checked at start only)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import blueque
from blueque.keys import Keys
from blueque.store.errors import translate
from blueque.testing import DelayingProxy, RedisServer
from tests.daemons import ROOT, Daemon, daemons, lines, listen_command, wait_until

pytestmark = pytest.mark.slow

KEYS = Keys()
FAST = ("--interval", "1", "--poll", "0.1")


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own: it is made to forget everything or fill its
    connections."""
    with RedisServer(extra_args=("--maxclients", "40")) as server:
        yield server


def starts(marker: Path) -> list[str]:
    return [line for line in lines(marker) if line.startswith("start")]


def test_an_exclusive_run_stopped_by_a_blip_says_its_lease_not_its_node(
        redis_server: RedisServer, redis_client: redis.Redis, tmp_path: Path) -> None:
    """A 3-s cut of the link (lease 2 s): the exclusive run is stopped before its lease can
    lapse, as it must be; its ending and its process's notice say why (the lease), not that
    its node goes away (nobody preempted it)."""
    marker, release = tmp_path / "marker", tmp_path / "release"
    db = int(redis_client.connection_pool.connection_kwargs.get("db", 0))
    client = blueque.Client(redis_client)
    with DelayingProxy(redis_server.port) as proxy, daemons(tmp_path) as started:
        listener = Daemon(listen_command(proxy.url(db), "work", "tests.jobs:hold", *FAST,
                                         "--exclusive"), tmp_path / "listener.log")
        started.append(listener)
        task_id = client.get_queue("work").enqueue(
            json.dumps({"marker": str(marker), "release": str(release)}))
        wait_until(lambda: len(starts(marker)) == 1, what="the run started")
        proxy.cut()
        wait_until(lambda: "sending SIGTERM to its group" in listener.log(), timeout=10,
                   what="the exclusive run stopped")
        proxy.restore()  # a 3-s blip at most: the stop comes 1.25 s into it
        wait_until(lambda: len(starts(marker)) == 2, timeout=30, what="it ran again")
        release.touch()
        task = client.get_task(task_id).wait(30)
        assert task.status == "complete" and task.attempts == 2
        first = json.loads(redis_client.hget(KEYS.task(task_id), "history") or "[]")[0]
        assert first["outcome"] == "preempted", first
        assert "could not renew its lease" in first["error"], first
        output = subprocess.run([sys.executable, "-m", "blueque.cli", "logs", task_id,
                                 "--attempt", "1", "--url", proxy.url(db)], cwd=ROOT,
                                capture_output=True, text=True,
                                env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin",
                                     "XDG_STATE_HOME": str(tmp_path / "state")})
        log = listener.log() + output.stdout
        assert "goes away" not in log, log
        assert "cannot renew its lease" in output.stdout, output


def test_a_redis_at_its_maxclients_is_not_called_unreachable(
        own_server: RedisServer, blueque_main) -> None:  # type: ignore[no-untyped-def]
    held = [redis.Redis.from_url(own_server.url) for _ in range(40)]
    try:
        for connection in held:
            connection.ping()
        done = blueque_main("status", "--url", own_server.url)
        assert done.returncode == 3, done
        assert "reached its maxclients" in done.stderr, done.stderr
        assert "redis-server is running" not in done.stderr
    finally:
        for connection in held:
            connection.close()


def test_a_run_whose_task_an_empty_restart_lost_is_not_called_deleted(
        own_server: RedisServer, tmp_path: Path) -> None:
    """Redis restarted empty under a running task (FLUSHALL stands for it: the data is gone,
    the server the same): the run's ending says the hash is not in Redis and why it may be,
    at warning, not that the task was deleted."""
    marker, release = tmp_path / "marker", tmp_path / "release"
    client = blueque.Client(own_server.url)
    with daemons(tmp_path) as started:
        listener = Daemon(listen_command(own_server.url, "work", "tests.jobs:hold", *FAST,
                                         "--log-format", "json"), tmp_path / "listener.log")
        started.append(listener)
        client.get_queue("work").enqueue(
            json.dumps({"marker": str(marker), "release": str(release)}))
        wait_until(lambda: len(starts(marker)) == 1, what="the run started")
        redis.Redis.from_url(own_server.url).flushall()
        release.touch()
        wait_until(lambda: '"event": "ended"' in listener.log(), what="its ending logged")
        ended = [json.loads(line) for line in listener.log().splitlines()
                 if line.startswith("{") and '"event": "ended"' in line]
        assert [e["outcome"] for e in ended] == ["missing"], ended
        assert ended[0]["level"] == "warning", ended
        assert "lost with Redis' data" in ended[0]["ending"]
        assert "deleted)" not in listener.log()


def test_a_task_process_whose_listener_is_frozen_does_not_call_it_gone(
        redis_url: str, client: blueque.Client, tmp_path: Path) -> None:
    """SIGSTOP the listener while its task ends: the task process waits a lease for it to
    record the outcome, then records it itself, saying its listener did not answer (it is
    alive, stopped), not that it is gone."""
    marker, release = tmp_path / "marker", tmp_path / "release"
    with daemons(tmp_path) as started:
        listener = Daemon(listen_command(redis_url, "work", "tests.jobs:hold", *FAST,
                                         "--no-task-logs"), tmp_path / "listener.log")
        started.append(listener)
        task_id = client.get_queue("work").enqueue(
            json.dumps({"marker": str(marker), "release": str(release)}))
        wait_until(lambda: len(starts(marker)) == 1, what="the run started")
        listener.signal(signal.SIGSTOP)
        try:
            release.touch()
            wait_until(lambda: client.get_task(task_id).status == "complete", timeout=20,
                       what="the outcome recorded by the task process")
            wait_until(lambda: "recording the outcome itself" in listener.log(),
                       what="the task process's word")
        finally:
            listener.signal(signal.SIGCONT)
        log = listener.log()
        assert "did not answer its outcome" in log, log
        assert "is gone" not in log, log
        assert listener.alive()


def test_an_evicting_policy_set_while_a_listener_runs_is_said_at_its_next_renewal(
        own_server: RedisServer, tmp_path: Path) -> None:
    admin = redis.Redis.from_url(own_server.url)
    with daemons(tmp_path) as started:
        listener = Daemon(listen_command(own_server.url, "work", "tests.jobs:hold", *FAST),
                          tmp_path / "listener.log")
        started.append(listener)
        wait_until(lambda: "listening on work" in listener.log(), what="it started")
        admin.config_set("maxmemory-policy", "allkeys-lru")
        wait_until(lambda: "maxmemory-policy was changed to allkeys-lru" in listener.log(),
                   timeout=5, what="the change said")
        admin.config_set("maxmemory-policy", "noeviction")
        wait_until(lambda: "maxmemory-policy is noeviction again" in listener.log(),
                   timeout=5, what="the way back said")
        log = listener.log()
        assert log.count("was changed to allkeys-lru") == 1, log  # once, not at each renewal
        assert "ERROR" in next(line for line in log.splitlines() if "changed to" in line)
        assert listener.alive()


@pytest.mark.parametrize(("reply", "says"), [
    ("max number of clients reached", "reached its maxclients"),
    ("MISCONF Errors writing to the AOF file: No space left on device", "cannot persist"),
    ("OOM command not allowed when used memory > 'maxmemory'.", "out of memory"),
])
def test_a_server_s_refusal_raised_as_a_connection_error_is_not_called_unreachable(
        reply: str, says: str) -> None:
    """However redis-py raises a reply of a server that answered (a connection error), it is
    said as the server's refusal; only a server that did not answer is 'unreachable'."""
    error = translate(redis.exceptions.ConnectionError(reply), "127.0.0.1:6390")
    assert says in str(error) and "redis-server is running" not in str(error), error
    assert "is unreachable" in str(translate(redis.exceptions.ConnectionError(
        "Error 111 connecting to 127.0.0.1:6390. Connection refused."), "127.0.0.1:6390"))
