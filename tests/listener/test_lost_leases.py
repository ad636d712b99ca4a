"""Listeners whose lease lapsed: one frozen and thawed registers again and stops its superseded
runs, a dead host's running and reserved tasks are recovered elsewhere, and a recorded ending
racing another host's recovery does not stop the daemon."""

from __future__ import annotations

import json
import signal
import time

import pytest

from blueque.daemon import ListenerDaemon
from blueque.daemon.options import ListenerOptions
from blueque.daemon.running import Running
from blueque.keys import Keys
from blueque.listener import Listener
from blueque.policy import Policy
from blueque.recovery import Recovery, RecoveryReport
from tests.daemons import (
    FAST,
    Daemon,
    gone,
    kill_session_children,
    lines,
    listen_command,
    wait_until,
)

pytestmark = pytest.mark.slow

KEYS = Keys()


def test_listener_whose_lease_was_lost_registers_again(  # type: ignore[no-untyped-def]
        client, start, tmp_path, redis_client):
    marker, release = tmp_path / "marker", tmp_path / "release"
    frozen = start("work", "tests.jobs:waits_for_release", *FAST)
    queue = client.get_queue("work")
    first = queue.enqueue(json.dumps({"marker": str(marker), "release": str(release)}),
                          max_attempts=1)
    wait_until(lambda: lines(marker), what="running")
    child = client.get_task(first).pid
    listener = client.get_task(first).node
    frozen.signal(signal.SIGSTOP)
    try:
        # its lease (1 s) and its info hash (2 s) run out; another host's sweep recovers it
        wait_until(lambda: not redis_client.exists(KEYS.listener_info(listener)), what="info gone")
        report = Recovery(client.store, host="elsewhere.example").sweep(["work"])
        assert report.listeners == [listener] and report.failed == 1
        frozen.signal(signal.SIGCONT)
        wait_until(lambda: "lost its lease" in frozen.log(), what="renew returned -1")
        wait_until(lambda: listener in redis_client.smembers(KEYS.listeners("work"))
                   and redis_client.zscore(KEYS.leases("work"), listener) is not None,
                   what="registered again")
        info = redis_client.hgetall(KEYS.listener_info(listener))
        assert info.get("pid") == str(frozen.pid) and info.get("pid_created")
        release.touch()  # its only run ends normally: a late ending (PROTOCOL.md 5.6)
        wait_until(lambda: gone(child), what="old run ended")
        later = queue.enqueue(json.dumps({"marker": str(marker), "release": str(release)}))
        assert client.get_task(later).wait(20).status == "complete"
        assert client.get_task(later).node == listener
    finally:
        frozen.signal(signal.SIGCONT)
        kill_session_children([child])
    # issue 19 item 5: recorded failed by the recovery, though its only run then completed;
    # no attempt followed, so the run's own ending is recorded after recover's guess
    task = client.get_task(first)
    assert task.status == "complete" and task.attempts == 1
    assert [entry["outcome"] for entry in task.history] == ["failed", "complete"]
    assert "stopped renewing its lease" in task.history[0]["error"]
    assert lines(marker)[-1].startswith("end")  # it was not stopped as superseded
    assert "superseded" not in frozen.log()
    assert frozen.alive()


def test_a_listener_killed_while_it_registers_leaves_no_member_without_a_lease(  # type: ignore[no-untyped-def]
        client, start, tmp_path, redis_client, redis_url):
    """Killed between its lease and its entry in the listeners set, a listener leaves a lease
    that lapses and is swept: never a member that no sweep would ever find dead (the stats,
    the dashboard and 1.0.1's readers would count it for ever)."""
    doomed = Daemon(listen_command(redis_url, "work", "tests.jobs:echo", *FAST),
                    tmp_path / "doomed.log", env={"BLUEQUE_FAILPOINTS": "listener-after-lease"})
    try:
        assert doomed.process.wait(20) == -signal.SIGKILL
    finally:
        doomed.close()
    dead = next(iter(redis_client.zrange(KEYS.leases("work"), 0, -1)))
    assert not redis_client.sismember(KEYS.listeners("work"), dead)
    start("work", "tests.jobs:echo", *FAST)  # its sweeps find the lapsed lease
    wait_until(lambda: redis_client.zscore(KEYS.leases("work"), dead) is None,
               what="the dead listener's lease swept")
    wait_until(lambda: len(client.store.listener_ids("work")) == 1, what="the sweeper listed")
    assert dead not in client.store.listener_ids("work")
    assert redis_client.zscore(KEYS.queues(), "work") == 1  # one listener, counted once
    task_id = client.get_queue("work").enqueue(json.dumps({"value": "hi"}))
    assert client.get_task(task_id).wait(20).result == "hi"


def test_listener_back_from_the_dead_stops_its_superseded_runs(  # type: ignore[no-untyped-def]
        client, start, tmp_path, redis_client):
    """Its tasks were taken back while it was frozen, and their retries started on another
    listener: their runs can record nothing any more (fenced), so letting them go on for hours
    only duplicates work the newer attempt does. (A run whose retry has not started is
    reclaimed instead: tests/test_exclusive.py.)"""
    marker, release = tmp_path / "marker", tmp_path / "release"
    frozen = start("work", "tests.jobs:waits_for_release", *FAST)
    queue = client.get_queue("work")
    task_id = queue.enqueue(json.dumps({"marker": str(marker), "release": str(release),
                                        "seconds": 120}), max_attempts=2, retry_backoff=0.01)
    wait_until(lambda: lines(marker), what="running")
    child = client.get_task(task_id).pid
    frozen.signal(signal.SIGSTOP)
    try:
        wait_until(lambda: Recovery(client.store, host="elsewhere.example").sweep(
            ["work"]).retried == 1, what="its lease lapsed and the task taken back")
        other = start("work", "tests.jobs:waits_for_release", *FAST)
        wait_until(lambda: len(lines(marker)) == 2, what="its retry running elsewhere")
        frozen.signal(signal.SIGCONT)
        wait_until(lambda: gone(child), what="the superseded run stopped")
        assert "superseded" in frozen.log()
        assert "end" not in " ".join(lines(marker))
        release.touch()
        task = client.get_task(task_id).wait(20)  # attempt 2, on the other listener
        assert task.attempts == 2 and (task.node or "").endswith(f"_{other.pid}")
    finally:
        frozen.signal(signal.SIGCONT)
        kill_session_children([child])
    assert frozen.alive()


def test_dead_host_with_three_running_tasks_is_recovered(  # type: ignore[no-untyped-def]
        client, start, tmp_path, redis_client):
    marker, release = tmp_path / "marker", tmp_path / "release"
    dead = start("work", "tests.jobs:waits_for_release", *FAST, "--concurrency", "3",
                 "--identity", "gone.example_4343")
    queue = client.get_queue("work")
    params = json.dumps({"marker": str(marker), "release": str(release), "seconds": 600})
    ids = [queue.enqueue(params, max_attempts=2, retry_backoff=0.01) for _ in range(3)]
    wait_until(lambda: len(lines(marker)) == 3, what="three running on the doomed host")
    children = [client.get_task(task_id).pid for task_id in ids]
    waiting = queue.enqueue(params, max_attempts=2)
    dead.signal(signal.SIGSTOP)
    # and a fourth it had reserved but not started yet when the host died
    assert client.store.move_pending("work", "gone.example_4343", block=None) == waiting
    assert client.store.stamp("work", "gone.example_4343", waiting, time.time()).runnable
    kill_session_children(children)
    dead.kill()
    survivor = start("work", "tests.jobs:waits_for_release", *FAST, "--concurrency", "4")
    wait_until(lambda: all(client.get_task(t).attempts == 2 for t in ids)
               and client.get_task(waiting).status == "started", timeout=15,
               what="every task of the dead host running again")
    release.touch()
    tasks = [client.get_task(task_id).wait(20) for task_id in [*ids, waiting]]
    # started ones were retried (attempt 2, the error says why); the reserved one was requeued
    assert [(t.status, t.attempts) for t in tasks] == [("complete", 2)] * 4
    assert all("gone.example_4343 stopped renewing its lease" in t.history[0]["error"]
               for t in tasks[:3])  # the first attempt's ending, kept in the history
    assert all(t.error is None for t in tasks)  # complete: no earlier attempt's error left
    assert [h["outcome"] for h in tasks[3].history] == ["requeued", "complete"]
    assert not redis_client.exists(KEYS.reserved("work", "gone.example_4343"))
    assert redis_client.scard(KEYS.started("work")) == 0
    assert survivor.alive()


def test_a_crowded_log_directory_does_not_keep_a_dead_listener_unrecovered(  # type: ignore[no-untyped-def]
        client, start, tmp_path, redis_client):
    """A node's log directory with tens of thousands of files (a week of output kept): the
    sweeper listed them all at every sweep, its sweeps came later than its lease, it took
    itself for stalled each time, and a dead listener's task was never run again."""
    logs = tmp_path / "task-logs"
    crowd = logs / "work"
    crowd.mkdir(parents=True)
    for n in range(40_000):
        (crowd / f"old-{n}.1.log").touch()
    marker, release = tmp_path / "marker", tmp_path / "release"
    dead = start("work", "tests.jobs:waits_for_release", "--interval", "0.2", "--poll", "0.05",
                 "--identity", "gone.example_4444", "--no-task-logs")
    queue = client.get_queue("work")
    params = json.dumps({"marker": str(marker), "release": str(release), "seconds": 600})
    task_id = queue.enqueue(params, max_attempts=2, retry_backoff=0.01)
    wait_until(lambda: len(lines(marker)) == 1, what="running on the doomed host")
    survivor = start("work", "tests.jobs:waits_for_release", "--interval", "0.2", "--poll",
                     "0.05", "--log-dir", str(logs))
    wait_until(lambda: len(redis_client.zrange(KEYS.leases("work"), 0, -1)) == 2,
               what="both listeners registered")
    kill_session_children([client.get_task(task_id).pid])
    dead.kill()
    wait_until(lambda: client.get_task(task_id).attempts == 2, timeout=15,
               what="the dead listener's task running again")
    release.touch()
    assert client.get_task(task_id).wait(20).status == "complete"
    assert survivor.alive()
    # its own sweep recovered it: one that listed the crowd took itself for stalled at every
    # sweep and recovered nobody (a single late sweep on a loaded machine is no failure)
    assert "recovered listener gone.example_4444" in survivor.log()


def test_recorded_ending_racing_a_recovery_does_not_stop_the_daemon(  # type: ignore[no-untyped-def]
        client, redis_client, monkeypatch):
    """A child died before starting its task (its start() met a Redis outage, exit 4); the
    parent reads the task (reserved), then another host's sweep puts it back to pending before
    the parent's finish, which is refused. The daemon must log that and go on."""
    queue = client.get_queue("work")
    task_id = queue.enqueue("{}")
    daemon = ListenerDaemon(client, ListenerOptions({"work": 1}, "tests.jobs:echo",
                                                    identity="racer.example_1"))
    try:
        daemon.step.register()
        task = Listener("work", daemon.step.store, daemon.id, register=False).reserve()
        assert task is not None and task.id == task_id
        running = Running(task_id, "work", 1, 0.0, 0.0, 1.0, Policy(), 4242)
        real_read = daemon.step.store.task_data
        report = RecoveryReport()

        def read_then_recovered(wanted: str) -> dict[str, str]:
            data = real_read(wanted)
            monkeypatch.undo()
            redis_client.zadd(KEYS.leases("work"), {"racer.example_1": 0})  # lapsed
            Recovery(client.store, host="elsewhere.example").recover_expired("work", report)
            return data

        monkeypatch.setattr(daemon.step.store, "task_data", read_then_recovered)
        daemon.step.supervisor.recorder.unrecorded.append((running, "process exited with code 4"))
        daemon.step.supervisor.recorder.record_unrecorded()
        assert report.requeued == 1 and daemon.step.supervisor.recorder.unrecorded == []
    finally:
        daemon._finish()
    assert client.get_task(task_id).status == "pending"
    assert redis_client.lrange(KEYS.pending("work"), 0, -1) == [task_id]
