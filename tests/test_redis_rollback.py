"""Redis comes back older than it went away: restored from an earlier copy of its files, or a
replica promoted before the last writes reached it (Redis replication is asynchronous, so a
failover may lose acknowledged writes). A run that ended meanwhile is still `started` there, in
the reserved list of a listener that is alive and has no such run any more: the listener must
settle it by the task's retry policy instead of holding it for ever (issue 9: no task lost).
End to end: a real `blueque listen`, a real redis-server restarted from an older AOF."""

from __future__ import annotations

import json
import shutil

import pytest
import redis

import blueque
from blueque.keys import Keys
from tests.daemons import FAST, Daemon, daemons, lines, listen_command, wait_until

pytestmark = pytest.mark.slow

KEYS = Keys()


def test_a_run_whose_ending_redis_lost_is_settled_by_its_listener(  # type: ignore[no-untyped-def]
        aof_server, tmp_path):
    client = blueque.Client(aof_server.url)
    queue = client.get_queue("work")
    admin = redis.Redis(port=aof_server.port, decode_responses=True)
    marker, release = tmp_path / "marker", tmp_path / "release"
    params = json.dumps({"marker": str(marker), "release": str(release)})
    with daemons(tmp_path) as started:
        daemon = Daemon(listen_command(aof_server.url, "work", "tests.jobs:hold", *FAST,
                                       "--concurrency", "2"), tmp_path / "listen.log")
        started.append(daemon)
        again = queue.enqueue(params, max_attempts=2, retry_backoff=0.01)
        once = queue.enqueue(params, max_attempts=1)
        wait_until(lambda: len(lines(marker)) == 2, what="both tasks running")
        listener = client.get_task(again).node
        admin.bgrewriteaof()
        wait_until(lambda: not (persistence := admin.info("persistence"))[
            "aof_rewrite_in_progress"] and not persistence["aof_rewrite_scheduled"],
            what="the AOF rewritten")
        older = tmp_path / "older"
        shutil.copytree(tmp_path / "redis", older, ignore=shutil.ignore_patterns("*.log"))
        release.touch()  # both runs end and are recorded...
        for task_id in (again, once):
            assert client.get_task(task_id).wait(30).status == "complete"
        wait_until(lambda: admin.llen(KEYS.reserved("work", listener)) == 0,
                   what="the listener's reserved list empty")
        release.unlink()
        aof_server.kill()  # ...and Redis comes back without those writes
        shutil.rmtree(tmp_path / "redis")
        shutil.copytree(older, tmp_path / "redis")
        aof_server.start()
        assert {client.get_task(i).status for i in (again, once)} == {"started"}  # the premise

        wait_until(lambda: len(lines(marker)) == 5, timeout=30,
                   what="the task with an attempt left running again")
        release.touch()
        task = client.get_task(again).wait(30)
        assert (task.status, task.attempts) == ("complete", 2), task.error
        task = client.get_task(once).wait(30)
        assert task.status == "failed" and task.attempts == 1
        assert f"listener {listener} has no run of it" in (task.error or ""), task.error
        assert admin.llen(KEYS.reserved("work", listener)) == 0
        assert admin.scard(KEYS.started("work")) == 0
        assert daemon.alive(), daemon.log()


def test_a_task_whose_hash_redis_lost_is_said_once_not_every_second(  # type: ignore[no-untyped-def]
        aof_server, tmp_path):
    """Issue 19 item 8: after Redis came back empty, each running task's listener logged
    "progress of task X not recorded: task is false on attempt false" at every report. Now
    one clear line per task says it is gone, and its run goes on."""
    client = blueque.Client(aof_server.url)
    admin = redis.Redis(port=aof_server.port, decode_responses=True)
    marker, release, phase = tmp_path / "marker", tmp_path / "release", tmp_path / "phase"
    with daemons(tmp_path) as started:
        daemon = Daemon(listen_command(aof_server.url, "work", "tests.jobs:keeps_reporting",
                                       *FAST), tmp_path / "listen.log")
        started.append(daemon)
        task_id = client.get_queue("work").enqueue(json.dumps(
            {"marker": str(marker), "release": str(release), "phase": str(phase)}))
        wait_until(lambda: client.get_task(task_id).progress_message == "phase none",
                   what="progress reported")
        admin.flushall()  # Redis lost everything (its files, or a replica's empty copy)
        gone = f"task {task_id} is gone from Redis (its hash was lost)"
        wait_until(lambda: gone in daemon.log(), what="the loss said")
        phase.write_text("after")  # its reports go on: each would have logged a line
        wait_until(lambda: "reported after" in " ".join(lines(marker)), what="reports go on")
        release.touch()
        wait_until(lambda: f"task {task_id} queue work attempt 1" in daemon.log(),
                   what="the run's end logged")
        assert daemon.alive() and lines(marker)[-1].startswith("end")
        log = daemon.log()
        assert log.count(gone) == 1, log
        assert "on attempt false" not in log, log
