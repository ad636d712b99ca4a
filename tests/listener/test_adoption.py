"""A listener started where another left running task processes (--on-stop keep, or killed)
adopts them: it renews the old lease, keeps the old listener's pid create time, and still
cancels them and enforces their time limits."""

from __future__ import annotations

import json
import time

import psutil
import pytest

from blueque.keys import Keys
from tests.daemons import FAST, gone, kill_session_children, lines, wait_until

pytestmark = pytest.mark.slow

KEYS = Keys()


def test_on_stop_keep_then_restart_adopts_every_child(  # type: ignore[no-untyped-def]
        client, start, tmp_path, redis_client):
    marker, release = tmp_path / "marker", tmp_path / "release"
    first = start("work", "tests.jobs:waits_for_release", *FAST, "--concurrency", "2")
    queue = client.get_queue("work")
    ids = [queue.enqueue(json.dumps({"marker": str(marker), "release": str(release)}))
           for _ in range(2)]
    wait_until(lambda: len(lines(marker)) == 2, what="both running")
    pids = [client.get_task(task_id).pid for task_id in ids]
    assert first.stop() == 0  # on-stop=keep: exits at once, children keep running
    old_id = client.get_task(ids[0]).node
    try:
        assert all(psutil.pid_exists(pid) for pid in pids)
        assert old_id in redis_client.smembers(KEYS.listeners("work"))
        left_with = redis_client.zscore(KEYS.leases("work"), old_id)
        second = start("work", "tests.jobs:waits_for_release", *FAST, "--concurrency", "2")
        # adopting keeps the dead listener's 1 s lease alive, so no lease sweep retries them
        wait_until(lambda: (redis_client.zscore(KEYS.leases("work"), old_id) or 0)
                   > left_with + 2000, what="the old lease carried on by the adopter")
        assert [client.get_task(t).attempts for t in ids] == [1, 1]
        release.touch()
        tasks = [client.get_task(task_id).wait(20) for task_id in ids]
    finally:
        kill_session_children(pids)
    assert [(t.status, t.attempts, t.result) for t in tasks] == [("complete", 1, "released")] * 2
    assert sorted(line.split()[0] for line in lines(marker)) == ["end", "end", "start", "start"]
    wait_until(lambda: old_id not in redis_client.smembers(KEYS.listeners("work")),
               what="the old listener released once nothing of it runs")
    assert redis_client.zscore(KEYS.leases("work"), old_id) is None
    assert second.alive()


def test_adopted_listener_keeps_its_pid_create_time(  # type: ignore[no-untyped-def]
        client, start, tmp_path, redis_client):
    """A dead listener's info hash (pid_created) expires after 3 intervals, but its adopted
    tasks may run for hours: without it, a reused pid makes it look alive again, adoption
    stops, its lease lapses and a sweep re-runs tasks that are still running."""
    marker, release = tmp_path / "marker", tmp_path / "release"
    first = start("work", "tests.jobs:waits_for_release", *FAST)
    task_id = client.get_queue("work").enqueue(
        json.dumps({"marker": str(marker), "release": str(release), "seconds": 120}))
    wait_until(lambda: lines(marker), what="running")
    child, old_id = client.get_task(task_id).pid, client.get_task(task_id).node
    first.kill()
    try:
        start("work", "tests.jobs:waits_for_release", *FAST)
        died = time.monotonic()
        wait_until(lambda: time.monotonic() - died > 4.0, what="two info TTLs (2 s) later")
        assert redis_client.hget(KEYS.listener_info(old_id), "pid_created")
        assert client.get_task(task_id).status == "started"
        release.touch()
        task = client.get_task(task_id).wait(20)
    finally:
        kill_session_children([child])
    assert task.status == "complete" and task.attempts == 1


def test_cancelling_an_adopted_task_stops_it(  # type: ignore[no-untyped-def]
        client, start, tmp_path, redis_client):
    """The cancel message goes to the task's listener, which is dead: the adopter must stop
    the process group and record the task as cancelled, not let it run on and complete."""
    marker, release = tmp_path / "marker", tmp_path / "release"
    first = start("work", "tests.jobs:waits_for_release", *FAST)
    task_id = client.get_queue("work").enqueue(
        json.dumps({"marker": str(marker), "release": str(release), "seconds": 120}))
    wait_until(lambda: lines(marker), what="running")
    child, old_id = client.get_task(task_id).pid, client.get_task(task_id).node
    first.kill()
    try:
        left_with = redis_client.zscore(KEYS.leases("work"), old_id)
        start("work", "tests.jobs:waits_for_release", *FAST)
        wait_until(lambda: (redis_client.zscore(KEYS.leases("work"), old_id) or 0)
                   > left_with + 1000, what="adopted")
        assert client.cancel_task(task_id) == "requested"
        task = client.get_task(task_id).wait(20)
        wait_until(lambda: gone(child), what="the adopted process stopped")
    finally:
        kill_session_children([child])
    assert task.status == "failed" and task.cancelled and task.error.startswith("cancelled")
    assert "end" not in " ".join(lines(marker))  # it did not run on to its end


def test_adopted_task_still_has_its_time_limit(  # type: ignore[no-untyped-def]
        client, start, tmp_path, redis_client):
    """The dead listener enforced the time limit; the adopter must take that over, or an
    adopted job that hangs runs for ever."""
    marker = tmp_path / "marker"
    first = start("work", "tests.jobs:ignores_sigterm", *FAST)
    task_id = client.get_queue("work").enqueue(json.dumps({"marker": str(marker)}),
                                               time_limit=2, kill_grace=0.5)
    wait_until(lambda: lines(marker), what="running")
    child = client.get_task(task_id).pid
    first.kill()
    try:
        start("work", "tests.jobs:ignores_sigterm", *FAST)
        task = client.get_task(task_id).wait(20)
        wait_until(lambda: gone(child), what="the adopted process killed")
    finally:
        kill_session_children([child])
    assert task.status == "failed" and "time limit of 2 s exceeded" in task.error
    assert task.attempts == 1
