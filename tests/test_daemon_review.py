"""A skeptical review of the listener daemon and recovery: scenarios test_daemon.py leaves out.

Real `blueque listen` daemons on the private redis-server (tests/daemons.py); the task functions
they run are defined below (``tests.test_daemon_review:NAME``). Each test asserts Redis state."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

import blueque
from blueque.daemon import ListenerDaemon
from blueque.keys import Keys
from blueque.policy import Policy
from blueque.recovery import Recovery, RecoveryReport
from blueque.runs import Running
from blueque.task import Task
from blueque.testing import RedisServer, free_port
from tests import jobs
from tests.daemons import ROOT, Daemon, daemons, kill_session_children, listen_command, wait_until

pytestmark = pytest.mark.slow

FAST = ("--interval", "0.5", "--poll", "0.1")
KEYS = Keys()


# --- task functions the daemons run -------------------------------------------------------
def _params(task: Task) -> dict[str, Any]:
    value = json.loads(task.parameters or "{}")
    return value if isinstance(value, dict) else {}


def _mark(params: dict[str, Any], text: str) -> None:
    if "marker" in params:
        with open(params["marker"], "a", encoding="utf-8") as handle:
            handle.write(f"{text} {os.getpid()}\n")


def returns_a_set(task: Task) -> object:
    _mark(_params(task), "ran")
    return {1, 2, 3}


def ignores_sigterm(task: Task) -> str:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _mark(_params(task), "ignoring")
    time.sleep(600)
    return "unreachable"


def waits_for_release(task: Task) -> str:
    params = _params(task)
    _mark(params, "start")
    deadline = time.monotonic() + float(params.get("seconds", 60))
    while time.monotonic() < deadline and not os.path.exists(params["release"]):
        time.sleep(0.01)
    _mark(params, "end")
    return "released"


# --- helpers ------------------------------------------------------------------------------
@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[Daemon]]:
    with daemons(tmp_path) as running:
        yield running


@pytest.fixture
def start(redis_url: str, tmp_path: Path, started: list[Daemon]):  # type: ignore[no-untyped-def]
    def start_daemon(queues: str, function: str, *options: str, url: str = redis_url
                     ) -> Daemon:
        log = tmp_path / f"daemon{len(started)}.log"
        daemon = Daemon(listen_command(url, queues, function, *options), log)
        started.append(daemon)
        return daemon

    return start_daemon


def lines(path: Path) -> list[str]:
    return path.read_text().split("\n")[:-1] if path.exists() else []


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def subscribed(redis_client: Any, queue: str) -> bool:
    return dict(redis_client.pubsub_numsub(KEYS.channel(queue))).get(KEYS.channel(queue), 0) > 0


ME = "tests.test_daemon_review"


# --- pickup -------------------------------------------------------------------------------
def test_idle_two_queue_listener_picks_up_through_pubsub(client, start, redis_client):  # type: ignore[no-untyped-def]
    # poll and interval of a minute: only the enqueue's PUBLISH can wake it within the wait
    daemon = start("first,second", "tests.jobs:text", "--poll", "60", "--interval", "60")
    wait_until(lambda: subscribed(redis_client, "first") and subscribed(redis_client, "second"),
               what="subscribed to both channels")
    warm = client.get_queue("first").enqueue("warm-up")
    client.get_task(warm).wait(15)  # its first timers have run; now it idles in select()
    idle_from = time.monotonic()
    wait_until(lambda: time.monotonic() - idle_from > 1.0, what="a second of idling")
    latencies = {}
    for name in ("second", "first"):
        begun = time.monotonic()
        task_id = client.get_queue(name).enqueue(f"to {name}")
        task = client.get_task(task_id).wait(15)  # far below the 60 s poll
        latencies[name] = time.monotonic() - begun
        assert task.status == "complete" and task.result == f"processed to {name}"
    print("\nidle 2-queue pickup to complete: " + ", ".join(
        f"{name} {seconds * 1000:.1f} ms" for name, seconds in latencies.items()))
    assert daemon.alive()


def test_pubsub_pickup_resumes_after_a_redis_restart(tmp_path):  # type: ignore[no-untyped-def]
    server = RedisServer(directory=str(tmp_path),
                         extra_args=("--appendonly", "yes", "--appendfsync", "always"))
    server.start()
    try:
        with daemons(tmp_path) as running:
            daemon = Daemon(listen_command(server.url, "first,second", "tests.jobs:text",
                                           "--poll", "60", "--interval", "60"),
                            tmp_path / "daemon.log")
            running.append(daemon)
            watcher = blueque.Client(server.url)
            wait_until(lambda: subscribed(watcher.redis, "second"), what="subscribed")
            server.kill()
            server.start()
            wait_until(lambda: subscribed(watcher.redis, "second"), timeout=30,
                       what="subscribed again after the restart")
            begun = time.monotonic()
            task_id = watcher.get_queue("second").enqueue("after the restart")
            assert watcher.get_task(task_id).wait(15).status == "complete"  # not the 60 s poll
            print(f"\npickup after a Redis restart: {(time.monotonic() - begun) * 1000:.1f} ms")
            assert daemon.alive()
    finally:
        server.stop()


class FreezingProxy:
    """A loopback TCP proxy to Redis whose established connections can be frozen: bytes stop
    flowing both ways but no side sees a close, as when a NAT or load balancer drops an idle
    connection's state. New connections still pass."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.frozen: set[socket.socket] = set()
        self.sockets: list[socket.socket] = []
        self.closing = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closing:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            self.sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        while not self.closing:
            try:
                data = source.recv(65536)
                if not data:
                    break
                if source not in self.frozen:
                    sink.sendall(data)
            except OSError:
                break

    def freeze(self) -> None:
        self.frozen.update(self.sockets)

    def close(self) -> None:
        self.closing = True
        for sock in [self.listener, *self.sockets]:
            sock.close()


def test_subscriber_notices_a_silently_dropped_connection(redis_server, redis_client):  # type: ignore[no-untyped-def]
    """Cloud load balancers and NATs drop idle connections without a word; the subscriber
    must notice (PING after an interval of silence, no reply within another) and subscribe
    again, or wakeups are lost and pickups fall back to --poll for good."""
    proxy = FreezingProxy(redis_server.port)
    client = blueque.Client(f"redis://127.0.0.1:{proxy.port}/0")
    daemon = ListenerDaemon(client, {"work": 1}, jobs.text, identity="nat.example_1",
                            interval=0.5)
    try:
        daemon.start_subscriber()
        wait_until(lambda: subscribed(redis_client, "work"), what="subscribed")
        proxy.freeze()
        wait_until(lambda: dict(redis_client.pubsub_numsub(KEYS.channel("work")))[
            KEYS.channel("work")] == 2, timeout=10, what="subscribed again on a new connection")
        while True:  # empty the wake pipe, then show a publish reaches it again
            try:
                os.read(daemon.wakeup._wake_r, 512)
            except BlockingIOError:
                break
        redis_client.publish(KEYS.channel("work"), "work")
        wait_until(lambda: select.select([daemon.wakeup._wake_r], [], [], 0)[0], what="woken")
    finally:
        daemon._finish()
        proxy.close()
        client.close()


# --- results and job controls -------------------------------------------------------------
def test_unencodable_result_fails_once_with_clear_error(client, start, tmp_path):  # type: ignore[no-untyped-def]
    marker = tmp_path / "marker"
    daemon = start("work", f"{ME}:returns_a_set", *FAST)
    task_id = client.get_queue("work").enqueue(json.dumps({"marker": str(marker)}),
                                               max_attempts=3, retry_backoff=0.01)
    task = client.get_task(task_id).wait(20)
    assert task.status == "failed"
    assert "returned a set" in task.error and "cannot be encoded as JSON" in task.error
    assert "not JSON serializable" in task.error and "Traceback" not in task.error
    # the function ran to the end: running it again would only fail the same way
    assert len(lines(marker)) == 1 and task.attempts == 1
    assert daemon.alive()


def test_child_ignoring_sigterm_is_killed_after_grace(client, start, tmp_path):  # type: ignore[no-untyped-def]
    marker = tmp_path / "marker"
    start("work", f"{ME}:ignores_sigterm", *FAST)
    task_id = client.get_queue("work").enqueue(json.dumps({"marker": str(marker)}),
                                               time_limit=0.3, kill_grace=0.3)
    wait_until(lambda: lines(marker), what="running and ignoring SIGTERM")
    pid = int(lines(marker)[0].split()[1])
    task = client.get_task(task_id).wait(20)
    assert task.status == "failed" and "time limit of 0.3 s exceeded" in task.error
    wait_until(lambda: gone(pid), what="the child SIGKILLed")


def test_listener_idles_while_a_killed_child_has_its_grace(client, start, tmp_path):  # type: ignore[no-untyped-def]
    """Between SIGTERM and SIGKILL (kill_grace, 30 s by default) the passed time limit must not
    turn the wait into a busy loop."""
    marker = tmp_path / "marker"
    daemon = start("work", f"{ME}:ignores_sigterm", *FAST)
    task_id = client.get_queue("work").enqueue(json.dumps({"marker": str(marker)}),
                                               time_limit=0.2, kill_grace=3)
    wait_until(lambda: lines(marker), what="running and ignoring SIGTERM")
    wait_until(lambda: "time limit, sending SIGTERM" in daemon.log(), what="SIGTERM sent")
    process = psutil.Process(daemon.pid)
    before, begun = process.cpu_times(), time.monotonic()
    wait_until(lambda: time.monotonic() - begun > 2.0, what="two seconds of the grace")
    after = process.cpu_times()
    busy = (after.user + after.system) - (before.user + before.system)
    print(f"\nlistener CPU during 2 s of a child's kill grace: {busy:.3f} s")
    assert busy < 1.0  # a spin burns all of it; idle is a few hundredths
    assert client.get_task(task_id).wait(20).status == "failed"


def test_time_limit_is_enforced_while_redis_is_down(tmp_path):  # type: ignore[no-untyped-def]
    server = RedisServer(directory=str(tmp_path),
                         extra_args=("--appendonly", "yes", "--appendfsync", "always"))
    server.start()
    marker = tmp_path / "marker"
    try:
        with daemons(tmp_path) as running:
            daemon = Daemon(listen_command(server.url, "work", f"{ME}:ignores_sigterm", *FAST),
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


@pytest.mark.parametrize("code", [0, 3])
def test_function_leaving_through_os_exit_is_recorded(client, start, redis_client, code):  # type: ignore[no-untyped-def]
    """0 is the child's own "reported" code and 3 its "not started" code; a task function that
    calls os._exit() with either must not leave its task started forever."""
    daemon = start("work", "tests.jobs:exit_code", *FAST)
    task_id = client.get_queue("work").enqueue(json.dumps({"code": code}))
    task = client.get_task(task_id).wait(20)
    assert task.status == "failed"
    assert f"process exited with code {code} without reporting an outcome" in task.error
    assert redis_client.scard(KEYS.started("work")) == 0
    assert daemon.alive()


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


# --- stopping, adoption, leases -----------------------------------------------------------
def test_on_stop_keep_then_restart_adopts_every_child(  # type: ignore[no-untyped-def]
        client, start, tmp_path, redis_client):
    marker, release = tmp_path / "marker", tmp_path / "release"
    first = start("work", f"{ME}:waits_for_release", *FAST, "--concurrency", "2")
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
        second = start("work", f"{ME}:waits_for_release", *FAST, "--concurrency", "2")
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
    first = start("work", f"{ME}:waits_for_release", *FAST)
    task_id = client.get_queue("work").enqueue(
        json.dumps({"marker": str(marker), "release": str(release), "seconds": 120}))
    wait_until(lambda: lines(marker), what="running")
    child, old_id = client.get_task(task_id).pid, client.get_task(task_id).node
    first.kill()
    try:
        start("work", f"{ME}:waits_for_release", *FAST)
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
    first = start("work", f"{ME}:waits_for_release", *FAST)
    task_id = client.get_queue("work").enqueue(
        json.dumps({"marker": str(marker), "release": str(release), "seconds": 120}))
    wait_until(lambda: lines(marker), what="running")
    child, old_id = client.get_task(task_id).pid, client.get_task(task_id).node
    first.kill()
    try:
        left_with = redis_client.zscore(KEYS.leases("work"), old_id)
        start("work", f"{ME}:waits_for_release", *FAST)
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
    first = start("work", f"{ME}:ignores_sigterm", *FAST)
    task_id = client.get_queue("work").enqueue(json.dumps({"marker": str(marker)}),
                                               time_limit=2, kill_grace=0.5)
    wait_until(lambda: lines(marker), what="running")
    child = client.get_task(task_id).pid
    first.kill()
    try:
        start("work", f"{ME}:ignores_sigterm", *FAST)
        task = client.get_task(task_id).wait(20)
        wait_until(lambda: gone(child), what="the adopted process killed")
    finally:
        kill_session_children([child])
    assert task.status == "failed" and "time limit of 2 s exceeded" in task.error
    assert task.attempts == 1


def test_listener_whose_lease_was_lost_registers_again(  # type: ignore[no-untyped-def]
        client, start, tmp_path, redis_client):
    marker, release = tmp_path / "marker", tmp_path / "release"
    frozen = start("work", f"{ME}:waits_for_release", *FAST)
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
        release.touch()  # the superseded run ends; it must not overwrite the recovery
        wait_until(lambda: gone(child), what="old run ended")
        later = queue.enqueue(json.dumps({"marker": str(marker), "release": str(release)}))
        assert client.get_task(later).wait(20).status == "complete"
        assert client.get_task(later).node == listener
    finally:
        frozen.signal(signal.SIGCONT)
        kill_session_children([child])
    task = client.get_task(first)
    assert task.status == "failed" and "stopped renewing its lease" in task.error
    assert frozen.alive()


def test_listener_back_from_the_dead_stops_its_superseded_runs(  # type: ignore[no-untyped-def]
        client, start, tmp_path, redis_client):
    """Its tasks were taken back while it was frozen: their runs can record nothing any more
    (fenced), so letting them go on for hours only duplicates work another attempt redoes."""
    marker, release = tmp_path / "marker", tmp_path / "release"
    frozen = start("work", f"{ME}:waits_for_release", *FAST)
    queue = client.get_queue("work")
    task_id = queue.enqueue(json.dumps({"marker": str(marker), "release": str(release),
                                        "seconds": 120}), max_attempts=2, retry_backoff=0.01)
    wait_until(lambda: lines(marker), what="running")
    child = client.get_task(task_id).pid
    frozen.signal(signal.SIGSTOP)
    try:
        wait_until(lambda: Recovery(client.store, host="elsewhere.example").sweep(
            ["work"]).retried == 1, what="its lease lapsed and the task taken back")
        frozen.signal(signal.SIGCONT)
        wait_until(lambda: gone(child), what="the superseded run stopped")
        assert "superseded" in frozen.log()
        assert "end" not in " ".join(lines(marker))
        release.touch()
        task = client.get_task(task_id).wait(20)  # attempt 2, in the thawed listener's slot
        assert task.attempts == 2
    finally:
        frozen.signal(signal.SIGCONT)
        kill_session_children([child])
    assert frozen.alive()


def test_dead_host_with_three_running_tasks_is_recovered(  # type: ignore[no-untyped-def]
        client, start, tmp_path, redis_client):
    marker, release = tmp_path / "marker", tmp_path / "release"
    dead = start("work", f"{ME}:waits_for_release", *FAST, "--concurrency", "3",
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
    survivor = start("work", f"{ME}:waits_for_release", *FAST, "--concurrency", "4")
    wait_until(lambda: all(client.get_task(t).attempts == 2 for t in ids)
               and client.get_task(waiting).status == "started", timeout=15,
               what="every task of the dead host running again")
    release.touch()
    tasks = [client.get_task(task_id).wait(20) for task_id in [*ids, waiting]]
    # started ones were retried (attempt 2, the error says why); the reserved one was requeued
    assert [(t.status, t.attempts) for t in tasks] == [("complete", 2)] * 4
    assert all("gone.example_4343 stopped renewing its lease" in t.error for t in tasks[:3])
    assert tasks[3].error is None
    assert not redis_client.exists(KEYS.reserved("work", "gone.example_4343"))
    assert redis_client.scard(KEYS.started("work")) == 0
    assert survivor.alive()


def test_recorded_ending_racing_a_recovery_does_not_stop_the_daemon(  # type: ignore[no-untyped-def]
        client, redis_client, monkeypatch):
    """A child died before starting its task (its start() met a Redis outage, exit 4); the
    parent reads the task (reserved), then another host's sweep puts it back to pending before
    the parent's finish, which is refused. The daemon must log that and go on."""
    queue = client.get_queue("work")
    task_id = queue.enqueue("{}")
    daemon = ListenerDaemon(client, {"work": 1}, "tests.jobs:echo", identity="racer.example_1")
    try:
        daemon.register()
        task = daemon.listeners["work"].reserve()
        assert task is not None and task.id == task_id
        running = Running(task_id, "work", 1, 0.0, 0.0, 1.0, Policy(), 4242)
        real_read = daemon.store.task_data
        report = RecoveryReport()

        def read_then_recovered(wanted: str) -> dict[str, str]:
            data = real_read(wanted)
            monkeypatch.undo()
            redis_client.zadd(KEYS.leases("work"), {"racer.example_1": 0})  # lapsed
            Recovery(client.store, host="elsewhere.example").recover_expired("work", report)
            return data

        monkeypatch.setattr(daemon.store, "task_data", read_then_recovered)
        daemon.unrecorded.append((running, "process exited with code 4"))
        daemon.supervisor.record_unrecorded()
        assert report.requeued == 1 and daemon.unrecorded == []
    finally:
        daemon._finish()
    assert client.get_task(task_id).status == "pending"
    assert redis_client.lrange(KEYS.pending("work"), 0, -1) == [task_id]


@pytest.mark.filterwarnings("ignore:.*fork:DeprecationWarning")  # Python >= 3.12
def test_fork_while_another_thread_is_inside_the_connection_pool(client, redis_client):  # type: ignore[no-untyped-def]
    """The subscriber thread takes and returns its connection under the shared pool's lock;
    a child forked at that moment must not inherit the lock held, or its pool reset (its first
    Redis call: here the task function's own read) waits forever and the task hangs."""
    task_id = client.get_queue("work").enqueue("held")
    daemon = ListenerDaemon(client, {"work": 1}, jobs.reread, identity="forker.example_1")
    lock = client.redis.connection_pool._lock
    held, pid = threading.Event(), 0
    daemon.register()
    assert client.store.move_pending("work", daemon.id, block=None) == task_id

    def hold_the_pool_lock() -> None:
        with lock:
            held.set()
            time.sleep(0.3)  # a thread preempted inside get_connection() or release()

    holder = threading.Thread(target=hold_the_pool_lock)

    def function_then_the_subscriber_steps_in() -> Any:
        holder.start()  # right before os.fork(): the last pool use is done
        held.wait(5)
        return jobs.reread

    daemon.load_function = function_then_the_subscriber_steps_in  # type: ignore[method-assign]
    try:
        daemon.supervisor.fork("work", task_id, daemon.load_function())
        (pid,) = daemon.children
        holder.join()

        def recorded() -> bool:
            daemon.run_once()  # takes in the child's outcome, records it, reaps the child
            return redis_client.hget(KEYS.task(task_id), "status") == "complete"

        wait_until(recorded, timeout=10, what="the forked child's result recorded")
        wait_until(lambda: (daemon.run_once(), not daemon.children)[1], timeout=10,
                   what="the child reaped")
        pid = 0
    finally:
        if holder.ident is not None:
            holder.join()
        if pid:
            kill_session_children([pid])
            os.waitpid(pid, 0)
        daemon._finish()
    assert client.get_task(task_id).result == "processed held while started"


def test_subscriber_never_writes_to_a_closed_wake_pipe(client, redis_client):  # type: ignore[no-untyped-def]
    """The subscriber thread outlives the loop by up to a second; a message in that second
    must not be written into whatever file reuses the wake pipe's descriptor numbers."""
    daemon = ListenerDaemon(client, {"work": 1}, jobs.text, identity="closer.example_1")
    daemon.start_subscriber()
    thread = daemon.wakeup.subscriber
    assert thread is not None
    wait_until(lambda: subscribed(redis_client, "work"), what="subscribed")
    wake_w = daemon.wakeup._wake_w
    daemon._finish()
    reused_r, reused_w = os.pipe()  # the lowest free numbers: those just closed
    os.set_blocking(reused_r, False)
    try:
        if reused_w != wake_w:
            pytest.skip("the wake pipe's write descriptor was not reused")
        client.get_queue("work").enqueue("wakes the lingering subscriber")
        thread.join(10)
        assert not thread.is_alive()
        with pytest.raises(BlockingIOError):
            os.read(reused_r, 16)  # nothing was written into the new pipe
    finally:
        os.close(reused_r)
        os.close(reused_w)


def test_run_gives_back_the_signal_handlers_it_took(client):  # type: ignore[no-untyped-def]
    """ForkingRunner.run() is called in-process: once it returns, SIGINT and SIGTERM must act
    as before (not be swallowed by a stopped daemon) and no signal may write a byte into the
    closed signal pipe's descriptor number."""
    before = {signum: signal.getsignal(signum)
              for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD)}
    daemon = ListenerDaemon(client, {"work": 1}, jobs.text, identity="signals.example_1",
                            interval=0.5, poll=0.05)
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        assert daemon.run() == 0
    finally:
        timer.cancel()
        for signum, handler in before.items():
            if signal.getsignal(signum) is not handler:
                signal.signal(signum, handler)
                pytest.fail(f"{signal.Signals(signum).name} handler left installed")
    assert signal.set_wakeup_fd(-1) == -1  # no wakeup fd left pointing at a closed pipe


def test_heal_leaves_an_ending_still_to_be_recorded_alone(client, redis_client):  # type: ignore[no-untyped-def]
    """Redis came back between a failed attempt to record a dead child's ending and the next
    lease renewal: the heal must not drop that started task from the reserved list (nothing
    would ever find it there again); the pending record settles it."""
    task_id = client.get_queue("work").enqueue("{}")
    daemon = ListenerDaemon(client, {"work": 1}, jobs.text, identity="healer.example_1")
    try:
        daemon.register()
        task = daemon.listeners["work"].reserve()
        assert task is not None
        client.get_processor(task).start(4242)
        running = Running(task_id, "work", 1, 0.0, 0.0, 1.0, Policy(), 4242, exit_code=9)
        daemon.unrecorded.append((running, "process exited with code 9"))
        daemon._heal()
        assert redis_client.lrange(KEYS.reserved("work", "healer.example_1"), 0, -1) == [task_id]
        daemon.supervisor.record_unrecorded()
    finally:
        daemon._finish()
    task = client.get_task(task_id)
    assert task.status == "failed" and task.error == "process exited with code 9"
    assert redis_client.scard(KEYS.started("work")) == 0


def test_failed_fork_puts_the_task_back_and_the_daemon_goes_on(  # type: ignore[no-untyped-def]
        client, redis_client, monkeypatch):
    """fork() fails with EAGAIN when the service hits its pids limit (systemd TasksMax) or
    memory is short: the reserved task must go back to pending, the listener must live on."""
    task_id = client.get_queue("work").enqueue("{}")
    daemon = ListenerDaemon(client, {"work": 1}, jobs.text, identity="forkless.example_1",
                            poll=0.05)

    def no_more_processes() -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", no_more_processes)
    try:
        daemon.run_once()
        assert daemon.children == {}
    finally:
        monkeypatch.undo()
        daemon._finish()
    assert client.get_task(task_id).status == "pending"
    assert redis_client.lrange(KEYS.pending("work"), 0, -1) == [task_id]
    assert redis_client.llen(KEYS.reserved("work", "forkless.example_1")) == 0


# --- bad input and the command line -------------------------------------------------------
def test_corrupt_policy_field_neither_stops_daemon_nor_sweep(client, start, redis_client):  # type: ignore[no-untyped-def]
    daemon = start("work", "tests.jobs:echo", *FAST)
    queue = client.get_queue("work")
    bad = queue.enqueue(json.dumps({"value": "odd"}))
    redis_client.hset(KEYS.task(bad), "max_attempts", "inf")  # float() reads it; int() cannot
    good = queue.enqueue(json.dumps({"value": "fine"}))
    assert client.get_task(good).wait(20).status == "complete"
    assert client.get_task(bad).wait(20).status == "complete"
    assert daemon.alive()


def listen(url: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(listen_command(url, "work", "tests.jobs:echo"), cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("url", ["http://localhost:6379", "redis://localhost:port/0",
                                 "redis://localhost:6379/zero"])
def test_listen_with_a_bad_url_exits_2_with_a_clear_error(url):  # type: ignore[no-untyped-def]
    done = listen(url)
    assert done.returncode == 2
    assert done.stderr.startswith("blueque: error: ") and "Redis URL" in done.stderr
    assert "Traceback" not in done.stderr


def test_listen_started_before_redis_waits_for_it(tmp_path, start):  # type: ignore[no-untyped-def]
    server = RedisServer(port=free_port())  # Redis comes up only later, on this port
    daemon = start("work", "tests.jobs:echo", *FAST, url=server.url)
    try:
        wait_until(lambda: "retrying" in daemon.log() or not daemon.alive(),
                   what="the outage noticed")
        assert daemon.alive(), daemon.log()
        server.start()
        client = blueque.Client(server.url)
        task_id = client.get_queue("work").enqueue(json.dumps({"value": 1}))
        assert client.get_task(task_id).wait(20).status == "complete"
        assert daemon.alive()
    finally:
        server.stop()


if __name__ == "__main__":  # pragma: no cover - the functions above are run by daemons
    sys.exit("run with pytest")
