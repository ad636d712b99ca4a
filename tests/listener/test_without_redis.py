"""A listener while Redis is away: it still enforces time limits, backs off without a busy loop,
waits for a Redis that is not up yet when it starts, and, once Redis is back, leaves an ending
still to be recorded alone when it heals."""

from __future__ import annotations

import json
import signal
import time

import psutil
import pytest

import blueque
from blueque.daemon import ListenerDaemon
from blueque.daemon.options import ListenerOptions
from blueque.daemon.running import Running
from blueque.keys import Keys
from blueque.listener import Listener
from blueque.policy import Policy
from blueque.testing import RedisServer, free_port
from tests import jobs
from tests.daemons import FAST, Daemon, daemons, gone, lines, listen_command, subscribed, wait_until

pytestmark = pytest.mark.slow

KEYS = Keys()


def test_time_limit_is_enforced_while_redis_is_down(tmp_path):  # type: ignore[no-untyped-def]
    server = RedisServer(directory=str(tmp_path),
                         extra_args=("--appendonly", "yes", "--appendfsync", "always"))
    server.start()
    marker = tmp_path / "marker"
    try:
        with daemons(tmp_path) as running:
            daemon = Daemon(listen_command(server.url, "work", "tests.jobs:ignores_sigterm", *FAST),
                            tmp_path / "daemon.log")
            running.append(daemon)
            client = blueque.Client(server.url)
            task_id = client.get_queue("work").enqueue(
                json.dumps({"marker": str(marker)}), time_limit=2, kill_grace=0.2)
            wait_until(lambda: lines(marker), what="running")
            pid = int(lines(marker)[0].split()[1])
            server.kill()
            wait_until(lambda: gone(pid), what="time limit enforced without Redis")
            server.start()
            task = client.get_task(task_id).wait(30)
            assert task.status == "failed" and "time limit of 2 s exceeded" in task.error
            assert daemon.alive()
    finally:
        server.stop()


def test_listener_backs_off_while_redis_is_down(tmp_path):  # type: ignore[no-untyped-def]
    """While Redis is away the loop retries with backoff (0.1 s doubling to 5 s); the timers
    it could not run must not turn that wait into a busy loop."""
    server = RedisServer(directory=str(tmp_path))
    server.start()
    try:
        with daemons(tmp_path) as running:
            daemon = Daemon(listen_command(server.url, "work", "tests.jobs:text", *FAST),
                            tmp_path / "daemon.log")
            running.append(daemon)
            watcher = blueque.Client(server.url)
            wait_until(lambda: subscribed(watcher.redis, "work"), what="listening")
            server.kill()
            wait_until(lambda: "retrying" in daemon.log(), what="the outage noticed")
            process = psutil.Process(daemon.pid)
            before, begun = process.cpu_times(), time.monotonic()
            wait_until(lambda: time.monotonic() - begun > 2.0, what="two seconds of outage")
            after = process.cpu_times()
            busy = (after.user + after.system) - (before.user + before.system)
            print(f"\nlistener CPU during 2 s without Redis: {busy:.3f} s")
            assert busy < 1.0
            server.start()
            task_id = watcher.get_queue("work").enqueue("after the outage")
            assert watcher.get_task(task_id).wait(20).status == "complete"
    finally:
        server.stop()


def test_listen_started_before_redis_waits_for_it(tmp_path, start):  # type: ignore[no-untyped-def]
    server = RedisServer(port=free_port())  # Redis comes up only later, on this port
    daemon = start("work", "tests.jobs:echo", *FAST, url=server.url)
    try:
        wait_until(lambda: "retrying" in daemon.log() or not daemon.alive(),
                   what="the outage noticed")
        assert daemon.alive(), daemon.log()
        # it has no children yet: not "children keep running"
        assert "not started yet: it takes no task until Redis answers" in daemon.log()
        assert "children keep running" not in daemon.log()
        server.start()
        client = blueque.Client(server.url)
        task_id = client.get_queue("work").enqueue(json.dumps({"value": 1}))
        assert client.get_task(task_id).wait(20).status == "complete"
        assert daemon.alive()
    finally:
        server.stop()


def test_heal_leaves_an_ending_still_to_be_recorded_alone(client, redis_client):  # type: ignore[no-untyped-def]
    """Redis came back between a failed attempt to record a dead child's ending and the next
    lease renewal: the heal must not drop that started task from the reserved list (nothing
    would ever find it there again); the pending record settles it."""
    task_id = client.get_queue("work").enqueue("{}")
    daemon = ListenerDaemon(client, ListenerOptions({"work": 1}, jobs.text,
                                                    identity="healer.example_1"))
    try:
        daemon.step.register()
        task = Listener("work", daemon.step.store, daemon.id, register=False).reserve()
        assert task is not None
        client.get_processor(task).start(4242)
        running = Running(task_id, "work", 1, 0.0, 0.0, 1.0, Policy(), 4242, exit_code=9)
        daemon.step.supervisor.recorder.unrecorded.append((running, "process exited with code 9"))
        daemon.step.heal()
        assert redis_client.lrange(KEYS.reserved("work", "healer.example_1"), 0, -1) == [task_id]
        daemon.step.supervisor.recorder.record_unrecorded()
    finally:
        daemon._finish()
    task = client.get_task(task_id)
    assert task.status == "failed" and task.error == "process exited with code 9"
    assert redis_client.scard(KEYS.started("work")) == 0


def test_a_run_that_ended_during_an_outage_leaves_no_false_warning(tmp_path):  # type: ignore[no-untyped-def]
    """A task reporting progress ends during an outage longer than the lease: its process
    records its outcome itself once Redis is back (its listener was silent a lease), and the
    listener then has its last progress to write. That write is refused (the task is finished
    on that very attempt): nothing was lost, so nothing is to be warned about (it read
    "progress of task ... not recorded" for every task that ended during the outage)."""
    server = RedisServer(directory=str(tmp_path),
                         extra_args=("--appendonly", "yes", "--appendfsync", "always"))
    server.start()
    marker, release, phase = tmp_path / "marker", tmp_path / "release", tmp_path / "phase"
    try:
        with daemons(tmp_path) as running:
            daemon = Daemon(listen_command(server.url, "work", "tests.jobs:keeps_reporting",
                                           *FAST), tmp_path / "daemon.log")
            running.append(daemon)
            client = blueque.Client(server.url)
            task_id = client.get_queue("work").enqueue(json.dumps(
                {"marker": str(marker), "release": str(release), "phase": str(phase)}))
            wait_until(lambda: client.get_task(task_id).progress_message == "phase none",
                       what="progress reported")
            server.kill()
            phase.write_text("outage")
            wait_until(lambda: "reported outage" in " ".join(lines(marker)),
                       what="progress reported during the outage")
            release.touch()
            wait_until(lambda: "end" in " ".join(lines(marker)), what="the run's work done")
            # a lease (1 s) without the listener's word: the process records it itself (it
            # says so in its output, the attempt's file under the daemon's state directory)
            output = tmp_path / "state" / "blueque" / "task-logs" / "work" / f"{task_id}.1.log"
            wait_until(lambda: output.exists() and "recording the outcome itself"
                       in output.read_text(), what="the process recording on its own")
            daemon.signal(signal.SIGSTOP)  # the process gets to Redis first
            try:
                server.start()
                task = client.get_task(task_id).wait(30)
                assert (task.status, task.attempts) == ("complete", 1)
            finally:
                daemon.signal(signal.SIGCONT)
            wait_until(lambda: "complete in" in daemon.log(), what="the ending logged")
            assert "not recorded" not in daemon.log(), daemon.log()
            assert daemon.alive()
    finally:
        server.stop()
