"""Process liveness by pid plus create time, so a reused pid is not taken for the old process."""

from __future__ import annotations

import contextlib
import functools
import os
import time

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


def create_time(pid: int) -> float | None:
    """The process's create time, as psutil computes it (so values compare with psutil's),
    read straight from /proc where there is one: the listener asks for every child it forks,
    and psutil.Process costs ten times as much."""
    try:
        with open(_PROC_STAT.format(pid), "rb") as handle:
            data = handle.read()
        # the name, in parentheses, may hold spaces: fields count from the last ")"
        ticks = int(data[data.rfind(b")") + 2:].split()[19])
        return ticks / _CLOCK_TICKS + _boot_time(int(time.monotonic() // 60))
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


def signal_group(pid: int, signum: int) -> None:
    """Signal the process group ``pid`` leads (every task child leads its own); gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


def set_title(title: str) -> None:
    """The process title ps and top show, so that a node's task processes tell apart."""
    setproctitle.setproctitle(title)
