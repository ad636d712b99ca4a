"""Process liveness by pid plus create time, so a reused pid is not taken for the old process."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import psutil
import setproctitle

#: Create times are compared with this slack (psutil rounds them; clocks tick).
CREATE_TIME_SLACK = 1.0


#: Where /proc shows a process's start, in clock ticks after boot (Linux).
_PROC_STAT = "/proc/{}/stat"
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@functools.lru_cache(maxsize=1)
def _boot_time(minute: int) -> float:
    """psutil's boot time, read again once a minute (it follows the wall clock's steps)."""
    return float(psutil.boot_time())


def created_from_stat(data: bytes) -> float:
    """The create time in a /proc/[pid]/stat line, as psutil computes it. Raises ValueError
    or IndexError for a line that is not one."""
    # the name, in parentheses, may hold spaces: fields count from the last ")"
    ticks = int(data[data.rfind(b")") + 2:].split()[19])
    return ticks / _CLOCK_TICKS + _boot_time(int(time.monotonic() // 60))


def create_time(pid: int) -> float | None:
    """The process's create time, as psutil computes it (so values compare with psutil's),
    read straight from /proc where there is one: the listener asks for every child it forks,
    and psutil.Process costs ten times as much."""
    try:
        with open(_PROC_STAT.format(pid), "rb") as handle:
            return created_from_stat(handle.read())
    except (OSError, ValueError, IndexError):
        pass
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def process_alive(pid: int, created: float | None = None) -> bool:
    """True if ``pid`` runs and, when ``created`` is given, is the process started then.

    A zombie (exited, not yet reaped) counts as dead: it will never report anything."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        return created is None or abs(process.create_time() - created) <= CREATE_TIME_SLACK
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True  # it exists; we may not inspect it


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes(pid: int) -> int | None:
    """The resident memory (RSS) of process ``pid`` in bytes; None once it is gone. One read
    of /proc/[pid]/statm on Linux, psutil elsewhere."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as handle:
            return int(handle.read().split()[1]) * _PAGE
    except FileNotFoundError:
        return None
    except (OSError, IndexError, ValueError):
        with contextlib.suppress(psutil.Error):
            return int(psutil.Process(pid).memory_info().rss)
        return None


def signal_pid(pid: int, signum: int) -> bool:
    """Signal the one process ``pid``; gone (or no longer ours to signal) is fine: False."""
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def signal_group(pid: int, signum: int) -> None:
    """Signal the process group ``pid`` leads (every task child leads its own); gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


def set_title(title: str) -> None:
    """The process title ps and top show, so that a node's task processes tell apart."""
    setproctitle.setproctitle(title)


class Stopping:
    """Process groups being stopped, one rule for all (PROTOCOL.md 6): SIGTERM to the group,
    then SIGKILL once its grace has passed. ``step`` is called at each look (a listener's
    step, a sweep); ``repeat`` sends SIGTERM again at each look until then (a sweeper's runs
    are not its children: it cannot tell that a signal arrived). Keyed by whatever names the
    run: a pid, a task id."""

    def __init__(self, kill: Callable[[int, int], None] = signal_group,
                 clock: Callable[[], float] = time.monotonic, repeat: bool = False) -> None:
        self._kill, self._clock, self._repeat = kill, clock, repeat
        self._runs: dict[Hashable, _Stop] = {}

    def begin(self, key: Hashable, pid: int, grace: float, reason: str = "") -> bool:
        """Start stopping ``pid``'s group (SIGTERM now); False if it is being stopped."""
        if key in self._runs:
            return False
        self._runs[key] = _Stop(pid, grace, reason, self._clock())
        self._kill(pid, signal.SIGTERM)
        return True

    def step(self, key: Hashable, pid: int, grace: float, reason: str = "") -> int:
        """Begin if need be, then escalate: the signal sent now (0 for none). ``grace`` is
        the run's own (its task's kill_grace), read anew at each look."""
        if self.begin(key, pid, grace, reason):
            return signal.SIGTERM
        stop = self._runs[key]
        stop.grace = grace
        if self._clock() - stop.since > stop.grace:
            if not stop.killed or self._repeat:
                stop.killed = True
                self._kill(stop.pid, signal.SIGKILL)
                return signal.SIGKILL
            return 0
        if self._repeat:
            self._kill(stop.pid, signal.SIGTERM)
            return signal.SIGTERM
        return 0

    def escalate(self) -> None:
        """SIGKILL every group whose grace has passed (once each, unless ``repeat``)."""
        for key, stop in list(self._runs.items()):
            self.step(key, stop.pid, stop.grace, stop.reason)

    def deadlines(self) -> list[float]:
        """When the next SIGKILLs are due (for a loop's wait)."""
        return [s.since + s.grace for s in self._runs.values() if not s.killed]

    def reason(self, key: Hashable) -> str | None:
        stop = self._runs.get(key)
        return None if stop is None else stop.reason

    def forget(self, key: Hashable, kill: bool = True) -> bool:
        """The process is gone: SIGKILL its group once more (grandchildren left in it; not
        with ``kill`` False) and forget it; False if it was not being stopped."""
        stop = self._runs.pop(key, None)
        if stop is None:
            return False
        if kill:
            self._kill(stop.pid, signal.SIGKILL)
        return True

    def __contains__(self, key: Hashable) -> bool:
        return key in self._runs


@dataclass
class _Stop:
    pid: int
    grace: float
    reason: str
    since: float
    killed: bool = False


def kill_process(process: subprocess.Popen[Any] | None) -> None:
    """SIGKILL a child process we started (a crash) and reap it."""
    if process is not None and process.poll() is None:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()


def stop_process(process: subprocess.Popen[Any] | None, timeout: float = 10.0) -> None:
    """SIGTERM a child process we started; SIGKILL it if it has not exited within timeout:
    the blocking form of Stopping's rule, for the servers and daemons a program starts (the
    demo's, the tests')."""
    if process is not None and process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_process(process)
