"""What a task leaves behind (issue 19 item 7), with real `blueque listen` daemons: a
grandchild in the task's process group outlived a task that returned; one that left the group
(setsid) escaped time limits and cancels. Now what a run started is stopped when it ends
(unless its task keeps its processes), and what left its group is found and stopped with it.
Every process is asserted on by pid, with deadlines."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

import blueque
from blueque import run_processes
from blueque.errors import ConfigurationError
from blueque.forking_runner import ForkingRunner
from blueque.process import signal_pid
from tests import leftover_jobs
from tests.daemons import Daemon, gone, lines, wait_until

pytestmark = pytest.mark.slow

#: How long a leftover may take to be stopped: a look for escaped processes within a second
#: of the run's end, SIGTERM, and the listener reaping it (its child subreaper).
STOPPED_WITHIN = 15.0

Start = Callable[..., Daemon]


@pytest.fixture
def leftover(start: Callable[..., Daemon]) -> Start:
    """``leftover(function, *options)``: conftest's listener of queue work running
    tests.leftover_jobs' ``function``."""
    return lambda function, *options: start("work", f"tests.leftover_jobs:{function}",
                                            *options)


def pids(pidfile: Path) -> list[int]:
    wait_until(lambda: len(lines(pidfile)) > 0, what="the task to start its processes")
    return [int(line) for line in lines(pidfile)]


def all_gone(processes: list[int]) -> bool:
    return all(gone(pid) for pid in processes)


def enqueue(client: blueque.Client, pidfile: Path, seconds: float = 0, **options: object
            ) -> str:
    return client.get_queue("work").enqueue(
        json.dumps({"pidfile": str(pidfile), "seconds": seconds}), **options)


@pytest.mark.parametrize("reuse", ["1", "3"])
@pytest.mark.parametrize("function", ["in_group", "new_session", "daemon"])
def test_what_a_task_started_is_stopped_when_it_returns(
        function: str, reuse: str, client: blueque.Client, leftover: Start, tmp_path: Path
) -> None:
    """With the task process forked by the fork server (the default, once it is ready), as
    with a listener's own child. A kill_grace of 10 minutes: only the SIGTERM sent when the
    run ends can stop them within the deadline. A grandchild in the group outlived the task
    unlogged until the grace had passed (issue 30 item 7): the task process, a zombie its
    fork server keeps until the listener settled its exit, was taken for a new process of
    that pid, and its group was left alone."""
    listener = leftover(function, "--reuse", reuse)
    wait_until(lambda: "fork server" in listener.log() and "ready" in listener.log(),
               what="its fork server ready")
    task_id = enqueue(client, tmp_path / "pids", kill_grace=600)
    left = pids(tmp_path / "pids")
    assert client.get_task(task_id).wait(30).status == "complete"
    wait_until(lambda: all_gone(left), timeout=STOPPED_WITHIN,
               what=f"what the task left ({left}) stopped")
    # reaped by the listener (a child subreaper), not left as zombies
    wait_until(lambda: not any(psutil.pid_exists(pid) for pid in left), timeout=10,
               what="the leftovers reaped")
    assert listener.alive()
    if function == "in_group":
        assert "processes it started outlived it in its process group" in listener.log()


@pytest.mark.parametrize("function", ["new_session", "daemon"])
def test_a_time_limit_stops_what_left_the_group(function: str, client: blueque.Client,
                                                leftover: Start, tmp_path: Path) -> None:
    leftover(function)
    task_id = enqueue(client, tmp_path / "pids", seconds=600, time_limit=2, kill_grace=1)
    left = pids(tmp_path / "pids")
    assert not any(gone(pid) for pid in left)
    task = client.get_task(task_id).wait(30)
    assert task.status == "failed" and "time limit of 2 s exceeded" in (task.error or "")
    wait_until(lambda: all_gone(left), timeout=STOPPED_WITHIN,
               what=f"the escaped processes ({left}) stopped with the task")


def test_a_cancel_stops_what_left_the_group(client: blueque.Client, leftover: Start,
                                            tmp_path: Path) -> None:
    leftover("new_session")
    task_id = enqueue(client, tmp_path / "pids", seconds=600, kill_grace=1)
    left = pids(tmp_path / "pids")
    assert client.cancel_task(task_id) == "requested"
    task = client.get_task(task_id).wait(30)
    assert task.status == "failed" and task.cancelled
    wait_until(lambda: all_gone(left), timeout=STOPPED_WITHIN,
               what=f"the escaped processes ({left}) stopped with the cancelled task")


def test_a_task_that_keeps_its_processes_leaves_them_running(
        client: blueque.Client, leftover: Start, tmp_path: Path) -> None:
    listener = leftover("new_session", "--concurrency", "2")
    task_id = enqueue(client, tmp_path / "pids", keep_processes=1)
    left = pids(tmp_path / "pids")
    assert client.get_task(task_id).wait(30).status == "complete"
    # another task ends meanwhile and its look for leftovers passes over them
    other = enqueue(client, tmp_path / "other-pids")
    assert client.get_task(other).wait(30).status == "complete"
    other_left = pids(tmp_path / "other-pids")
    wait_until(lambda: all_gone(other_left), timeout=STOPPED_WITHIN, what="the other's gone")
    assert not any(gone(pid) for pid in left), "a kept process was stopped"
    # the escaped one is now the listener's own child (its subreaper), reaped when it exits
    assert psutil.Process(left[0]).ppid() == listener.pid
    for pid in left:
        os.kill(pid, signal.SIGTERM)
    wait_until(lambda: not any(psutil.pid_exists(pid) for pid in left), timeout=10,
               what="the kept processes reaped once they exit")


def test_a_run_left_to_the_next_listener_keeps_its_processes_until_it_ends(
        client: blueque.Client, leftover: Start, tmp_path: Path) -> None:
    """--on-stop=keep: the listener leaves and its runs run on, their processes with them;
    the next listener adopts the run (it is not their subreaper): when the run returns, its
    task process stops what it started itself."""
    first = leftover("new_session")
    release = tmp_path / "pids"
    task_id = enqueue(client, release, seconds=4)
    left = pids(release)
    assert first.stop() == 0
    assert not any(gone(pid) for pid in left), "--on-stop=keep stopped a running run's process"
    leftover("new_session")
    assert client.get_task(task_id).wait(30).status == "complete"
    wait_until(lambda: all_gone(left), timeout=STOPPED_WITHIN,
               what=f"what the adopted run left ({left}) stopped")


def test_fork_task_children_stop_what_they_leave(client: blueque.Client,
                                                  tmp_path: Path) -> None:
    """blueque 1.0.1's ForkingRunner.fork_task: the child records its own outcome, and stops
    what its task left before it exits."""
    enqueue(client, tmp_path / "pids", kill_grace=2)
    task = client.get_listener("work").listen()
    pid = ForkingRunner(client, "work", leftover_jobs.new_session).fork_task(task)
    try:
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0
        left = pids(tmp_path / "pids")
        assert client.get_task(task.id).status == "complete"
        wait_until(lambda: all_gone(left), timeout=STOPPED_WITHIN, what="its leftovers stopped")
    finally:
        for leftover in lines(tmp_path / "pids"):
            signal_pid(int(leftover), signal.SIGKILL)


def test_what_ignores_sigterm_is_killed_after_the_grace_and_holds_the_slot(
        client: blueque.Client, leftover: Start, tmp_path: Path) -> None:
    """A leftover that ignores SIGTERM gets SIGKILL once the task's kill_grace has passed;
    until then the run holds its slot: with --concurrency 1 the next task starts only once it
    is gone."""
    listener = leftover("stubborn")
    first = enqueue(client, tmp_path / "pids", kill_grace=2)
    second = client.get_queue("work").enqueue(json.dumps(
        {"check": str(tmp_path / "pids"), "pidfile": str(tmp_path / "check")}))
    left = pids(tmp_path / "pids")
    assert client.get_task(first).wait(30).status == "complete"
    assert client.get_task(second).wait(30).status == "complete"
    assert lines(tmp_path / "check") == ["alive "], "the next task started beside a leftover"
    assert all_gone(left)
    assert "processes it started outlived it in its process group" in listener.log()


def test_an_adopted_run_past_its_time_limit_is_stopped_with_what_left_its_group(
        client: blueque.Client, leftover: Start, tmp_path: Path) -> None:
    """A listener SIGKILLed: the next one on the node adopts its run (it is not the run's
    subreaper) and enforces its time limit; the signal reaches the processes that carry the
    run's mark outside its group too."""
    first = leftover("new_session")
    task_id = enqueue(client, tmp_path / "pids", seconds=600, time_limit=3, kill_grace=1)
    left = pids(tmp_path / "pids")
    first.kill()
    leftover("new_session")
    task = client.get_task(task_id).wait(30)
    assert task.status == "failed" and "time limit of 3 s exceeded" in (task.error or "")
    wait_until(lambda: all_gone(left), timeout=STOPPED_WITHIN,
               what=f"the adopted run's escaped processes ({left}) stopped")


def test_keep_processes_is_0_or_1_per_task_or_queue(client: blueque.Client, redis_url: str,
                                                     blueque_main: Callable[..., Any]) -> None:
    queue = client.get_queue("work")
    with pytest.raises(ConfigurationError, match="keep_processes=2 must be 0"):
        queue.enqueue("{}", keep_processes=2)
    done = blueque_main("enqueue", "work", "{}", "--keep-processes", "1", "--url", redis_url)
    assert done.returncode == 0, done.stderr
    assert client.get_task(done.stdout.strip()).data["keep_processes"] == "1"
    assert blueque_main("configure", "work", "--keep-processes", "1",
                        "--url", redis_url).returncode == 0
    assert queue.config()["keep_processes"] == "1"


def test_signal_pid_says_whether_the_signal_went() -> None:
    """blueque.process.signal_pid, every inline os.kill's replacement: a process gone is no
    error, only a False."""
    assert signal_pid(os.getpid(), 0)
    gone_child = subprocess.Popen(["true"])
    gone_child.wait()  # reaped: its pid names no process
    assert not signal_pid(gone_child.pid, 0)


def test_the_subreaper_check_starts_no_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """ctypes.util.find_library runs ``ldconfig -p``: looked up at every ended run, a listener
    started a process beside its tasks, which the chaos test counted over --concurrency."""
    run_processes.is_subreaper()  # the first look-up may start one

    def no_process(*args: object, **kwargs: object) -> None:
        raise AssertionError("a process was started")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    run_processes.is_subreaper()
