"""Task functions that leave processes behind (tests.leftover_jobs:NAME), for
tests/test_leftovers.py. Each writes the pid of what it started to ``pidfile`` (one line each),
then returns at once, or sleeps ``seconds`` (to be stopped by a time limit or a cancel)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from blueque.task import Task

SLEEPER = [sys.executable, "-c", "import time; time.sleep(300)"]


def _finish(task: Task, pids: list[int]) -> str:
    params = json.loads(task.parameters or "{}")
    with open(params["pidfile"], "w", encoding="utf-8") as handle:
        handle.write("".join(f"{pid}\n" for pid in pids))
    time.sleep(float(params.get("seconds", 0)))
    return "left " + " ".join(map(str, pids))


def in_group(task: Task) -> str:
    """A grandchild in the task's own process group."""
    return _finish(task, [subprocess.Popen(SLEEPER).pid])


def new_session(task: Task) -> str:
    """A grandchild that leaves the group (setsid, as start_new_session does), and one that
    stays in it."""
    escaped = subprocess.Popen(SLEEPER, start_new_session=True)
    return _finish(task, [escaped.pid, subprocess.Popen(SLEEPER).pid])


def daemon(task: Task) -> str:
    """A daemon's double fork without exec: fork, setsid, fork again, the middle process
    exits; the daemon sleeps on in a session of its own, its parent gone."""
    read, write = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(write, f"{os.getpid()}\n".encode())
            time.sleep(300)
        os._exit(0)
    os.waitpid(middle, 0)
    os.close(write)
    with os.fdopen(read) as pipe:
        pid = int(pipe.readline())
    return _finish(task, [pid])


STUBBORN = [sys.executable, "-c", "import signal, sys, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
            "time.sleep(300)"]


def stubborn(task: Task) -> str:
    """A grandchild in the group that ignores SIGTERM (it is ready once it says so). With
    ``check``, instead: whether the pids in that file still run as this task starts."""
    params = json.loads(task.parameters or "{}")
    if "check" in params:
        with open(params["check"], encoding="utf-8") as handle:
            left = [int(line) for line in handle.read().split()]
        alive = [pid for pid in left if _running(pid)]
        with open(params["pidfile"], "w", encoding="utf-8") as handle:
            handle.write(f"alive {' '.join(map(str, alive))}\n")
        return "checked"
    child = subprocess.Popen(STUBBORN, stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline().strip() == b"ready"
    return _finish(task, [child.pid])


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:
        return False
