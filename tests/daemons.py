"""Start and stop real `blueque listen` daemons for end-to-end tests (stopped by pid)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from blueque.keys import Keys
from blueque.process import signal_group, signal_pid

ROOT = Path(__file__).resolve().parent.parent
#: Options of a test's listener: renewals every 0.5 s, a poll every 0.1 s (the defaults wait
#: tens of seconds between looks).
FAST = ("--interval", "0.5", "--poll", "0.1")
#: In the environment of every daemon a test starts, and so of every task process it forks:
#: how leftovers are found even once orphaned (a test that failed halfway, a fenced run).
OWNER = "BLUEQUE_TEST_OWNER"
#: Listeners and task processes set their titles (setproctitle), which by default overwrites
#: the memory /proc/[pid]/environ reads: OWNER would vanish from every daemon and task process,
#: and every "nothing left behind" check would find nothing. setproctitle leaves the
#: environment alone when this is set (titles are then cut at the command line's length).
KEEP_ENVIRON = {"SPT_NOENV": "1"}


def listen_command(url: str, queues: str, function: str, *options: str) -> list[str]:
    return [sys.executable, "-m", "blueque.cli", "listen", queues, function, "--url", url,
            *options]


class Daemon:
    """One listener daemon process; ``kill()`` SIGKILLs it, ``stop()`` sends SIGTERM."""

    def __init__(self, command: Sequence[str], log_path: Path, cwd: Path = ROOT,
                 env: Mapping[str, str] | None = None) -> None:
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in close()
        # task output files (blueque listen --log-dir's default) go beside the log, not to ~
        env = {**os.environ, "PYTHONPATH": str(ROOT),
               "XDG_STATE_HOME": str(log_path.parent / "state"), OWNER: str(os.getpid()),
               **KEEP_ENVIRON, **(env or {})}
        self.process = subprocess.Popen(
            list(command), cwd=cwd, env=env, stdout=self._log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, signum: int) -> None:
        if self.alive():
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self, timeout: float = 20.0) -> int:
        self.signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def close(self) -> None:
        if self.alive():
            self.signal(signal.SIGCONT)
            self.kill()
        self._log.close()


def owned_processes() -> list[psutil.Process]:
    """Processes started by this test run's daemons (their own or inherited environment)."""
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if process.environ().get(OWNER) == str(os.getpid()):
                found.append(process)
    return found


def task_processes(queue: str = "work", busy: bool = False) -> list[psutil.Process]:
    """This test run's task processes of ``queue``, busy or idle (their titles say so);
    ``busy``: only those running a task, not an idle one (a spare made ahead of its task, a
    warm process between tasks: PROTOCOL.md 6.7)."""
    found = []
    for process in owned_processes():
        with contextlib.suppress(psutil.Error):
            title = process.cmdline()[:1]  # read once: a process may exit between two reads
            if title and title[0].startswith(f"blueque: {queue} ") and not (
                    busy and title[0].rstrip().endswith(" idle")):
                found.append(process)
    return found


def kill_session_children(pids: Sequence[int]) -> None:
    """SIGKILL task processes (and their groups) a test left behind."""
    for pid in pids:
        signal_group(pid, signal.SIGKILL)
        signal_pid(pid, signal.SIGKILL)


@contextmanager
def daemons(tmp_path: Path) -> Iterator[list[Daemon]]:
    """Collects daemons a test starts; on exit stops them and any task processes they left."""
    started: list[Daemon] = []
    try:
        yield started
    finally:
        leftovers: list[int] = []
        for daemon in started:
            with contextlib.suppress(psutil.NoSuchProcess):
                leftovers += [c.pid for c in psutil.Process(daemon.pid).children(recursive=True)]
            daemon.close()
        kill_session_children(leftovers)
        # orphans too: a task process whose listener was killed is no child of anyone here
        kill_session_children([p.pid for p in owned_processes()])


#: How far a time Blueque wrote may lie outside the host-clock interval a test read around the
#: write: Blueque writes Redis' clock, read as this host's plus an offset measured at the
#: midpoint of a TIME round trip (blueque.clock), so on one machine it is off by up to half a
#: round trip (a fraction of a millisecond on loopback, more on a busy CI machine).
CLOCK_SLACK = 0.05


def between(before: float, written: float, after: float) -> bool:
    """Whether a time Blueque wrote lies between two host-clock reads taken around the write,
    within CLOCK_SLACK of measurement error (never seconds: a wrong clock still fails)."""
    return before - CLOCK_SLACK <= written <= after + CLOCK_SLACK


def wait_until(predicate: object, timeout: float = 20.0, what: str = "") -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")
        time.sleep(0.02)


def lines(path: Path) -> list[str]:
    """The lines a task function marked in ``path`` (none if it has not written yet)."""
    return path.read_text().split("\n")[:-1] if path.exists() else []


def gone(pid: int) -> bool:
    """The process has exited (a zombie not yet reaped counts)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def adopted_by(client: Any, task_id: str) -> str:
    """The listener whose slots the live run of ``task_id`` occupies once its own listener
    died, as the run's record on its node says (PROTOCOL.md 6, "Recovery sweep"); "" when
    none counts it (yet)."""
    task = client.get_task(task_id)
    node = client.store.listener_info(task.node or "").get("node")
    raw = client.store.node_run(node, task.pid) if node and task.pid else None
    return str(json.loads(raw).get("adopted_by", "")) if raw else ""


def subscribed(redis_client: Any, queue: str) -> bool:
    """Someone (a listener's subscriber) listens on the queue's channel."""
    channel = Keys().channel(queue)
    return dict(redis_client.pubsub_numsub(channel)).get(channel, 0) > 0
