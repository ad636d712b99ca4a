"""Process liveness by pid plus create time, so a reused pid is not taken for the old process."""

from __future__ import annotations

import contextlib
import os

import psutil
import setproctitle

#: Create times are compared with this slack (psutil rounds them; clocks tick).
CREATE_TIME_SLACK = 1.0


def create_time(pid: int) -> float | None:
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
