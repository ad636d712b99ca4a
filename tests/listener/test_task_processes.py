"""The task processes a listener forks: a result that cannot be recorded, a child that ignores
SIGTERM past its time limit (and the listener idling through its kill grace), a function that
leaves through os._exit, a fork racing a thread inside the connection pool, a fork that
fails."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import psutil
import pytest

from blueque.daemon import ListenerDaemon
from blueque.daemon.options import ListenerOptions
from blueque.keys import Keys
from tests import jobs
from tests.daemons import FAST, gone, kill_session_children, lines, wait_until

pytestmark = pytest.mark.slow

KEYS = Keys()


def test_unencodable_result_fails_once_with_clear_error(client, start, tmp_path):  # type: ignore[no-untyped-def]
    marker = tmp_path / "marker"
    daemon = start("work", "tests.jobs:returns_a_set", *FAST)
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
    start("work", "tests.jobs:ignores_sigterm", *FAST)
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
    daemon = start("work", "tests.jobs:ignores_sigterm", *FAST)
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


@pytest.mark.filterwarnings("ignore:.*fork:DeprecationWarning")  # Python >= 3.12
def test_fork_while_another_thread_is_inside_the_connection_pool(client, redis_client):  # type: ignore[no-untyped-def]
    """The subscriber thread takes and returns its connection under the shared pool's lock;
    a child forked at that moment must not inherit the lock held, or its pool reset (its first
    Redis call: here the task function's own read) waits forever and the task hangs."""
    task_id = client.get_queue("work").enqueue("held")
    daemon = ListenerDaemon(client, ListenerOptions(
        {"work": 1}, jobs.reread, identity="forker.example_1"))
    lock = client.redis.connection_pool._lock
    held, pid = threading.Event(), 0
    daemon.step.register()
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

    daemon.step.load_function = function_then_the_subscriber_steps_in  # type: ignore[method-assign]
    try:
        daemon.step.supervisor.fork("work", task_id, daemon.step.load_function())
        (pid,) = daemon.step.supervisor.children
        holder.join()

        def recorded() -> bool:
            daemon.step.run_once()  # takes in the child's outcome, records it, reaps the child
            return redis_client.hget(KEYS.task(task_id), "status") == "complete"

        wait_until(recorded, timeout=10, what="the forked child's result recorded")
        step = daemon.step
        wait_until(lambda: (step.run_once(), not step.supervisor.children)[1], timeout=10,
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


def test_failed_fork_puts_the_task_back_and_the_daemon_goes_on(  # type: ignore[no-untyped-def]
        client, redis_client, monkeypatch):
    """fork() fails with EAGAIN when the service hits its pids limit (systemd TasksMax) or
    memory is short: the reserved task must go back to pending, the listener must live on."""
    task_id = client.get_queue("work").enqueue("{}")
    daemon = ListenerDaemon(client, ListenerOptions(
        {"work": 1}, jobs.text, identity="forkless.example_1", poll=0.05))

    def no_more_processes() -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", no_more_processes)
    try:
        daemon.step.run_once()
        assert daemon.step.supervisor.children == {}
    finally:
        monkeypatch.undo()
        daemon._finish()
    assert client.get_task(task_id).status == "pending"
    assert redis_client.lrange(KEYS.pending("work"), 0, -1) == [task_id]
    assert redis_client.llen(KEYS.reserved("work", "forkless.example_1")) == 0
