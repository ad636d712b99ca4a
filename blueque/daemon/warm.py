"""A listener's warm task processes (PROTOCOL.md 6.7, ``blueque listen --reuse N``), its side:
the processes that wait for their next task (``Idle``), whether one whose outcome was just
recorded may take another (``WarmProcesses.retire_reason``), and whether a run left a process
behind (``left_behind``): such a process is retired, so that what the run left is stopped as
for any ended run (blueque.leftovers). The task process's side is
blueque.task_process.warm (``run_warm_child``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass

from blueque.daemon.outputs import TaskOutput
from blueque.daemon.running import Running
from blueque.display import format_bytes
from blueque.errors import ConfigurationError
from blueque.process import process_alive, resident_bytes
from blueque.reporting import ChildChannel
from blueque.run_processes import RunMark, direct_children, signs

log = logging.getLogger("blueque.daemon")


@dataclass
class Idle:
    """A warm process waiting for its next task: no run, no record in blueque_node_[node]."""

    pid: int
    created: float | None
    channel: ChildChannel
    output: TaskOutput | None  # our read end of its output pipe (blueque.outputs)
    runs: int  # tasks it has run

    def assign(self, task_id: str, queue: str) -> None:
        self.channel.send({"task": task_id, "queue": queue})

    def close(self) -> None:
        self.channel.close()
        if self.output is not None:
            self.output.close()
            self.output = None


#: How a retirement for memory reads (logged at warning, the others at debug).
MEMORY_REASON = "its resident memory"


class WarmProcesses:
    """A listener's warm processes (6.7): those idle, and how many tasks each task process
    has run; whether one that has just had its outcome recorded may take another."""

    def __init__(self, reuse: int, patience: float = float("inf"),
                 max_memory: int | None = None) -> None:
        """``patience``: how long a task process waits for its outcome to be recorded before
        it records it itself, and then exits (Assignment.patience: the listener's lease).
        ``max_memory``: a process whose resident memory is over it once its task has ended
        retires (``--max-memory-per-process``, bytes; None: no bound)."""
        if reuse < 1:
            raise ConfigurationError(f"reuse must be at least 1, not {reuse}")
        self.reuse = reuse
        self.patience = patience
        self.max_memory = max_memory
        self.idle: dict[int, Idle] = {}
        self._runs: dict[int, int] = {}

    def take(self, task_id: str, queue: str, pid: int | None = None) -> Idle | None:
        """An idle process (``pid``: that one), told its next task; None if none is (one
        found gone is dropped: it is reaped)."""
        while self.idle if pid is None else pid in self.idle:
            idle = self.idle.pop(next(iter(self.idle)) if pid is None else pid)
            idle.channel.receive()  # an idle process says nothing: this sees one that is gone
            # or dying: a killed process's first thread is a zombie while its others still
            # hold its socket open (told to go then, its death would count as its task's)
            if idle.channel.closed or not _alive(idle.pid):
                idle.close()
                continue
            idle.assign(task_id, queue)
            self._runs[idle.pid] = idle.runs + 1
            return idle
        return None

    def last_tasks(self, running: Iterable[int]) -> bool:
        """Whether one of the ``running`` task processes runs its last task (``reuse``
        reached: it exits after it, and its slot needs another process)."""
        return any(self._runs.get(pid, 1) >= self.reuse for pid in running)

    def add_spare(self, pid: int, created: float | None, channel: ChildChannel,
                  output: TaskOutput | None) -> None:
        """A process made before its task (6.8): idle, no task run yet."""
        self.idle[pid] = Idle(pid, created, channel, output, 0)

    def retire_reason(self, running: Running, task_processes: set[int], now: float) -> str:
        """Why the process of ``running`` (its outcome recorded at ``now``) must not take
        another task; '' if it may."""
        run, runs = running.mark(), self._runs.get(running.pid, 1)
        if running.channel is None or running.channel.closed:
            return "it is gone"
        if now - (running.reported_at or now) >= self.patience / 2:
            # recorded late (Redis was away): the process may have stopped waiting, recorded
            # its outcome itself and be leaving; a task given to it would be lost (6.7)
            return "its outcome was recorded late"
        if runs >= self.reuse:
            return f"it ran {runs} tasks"
        resident = resident_bytes(running.pid) if self.max_memory else None
        if self.max_memory and resident is not None and resident > self.max_memory:
            return (f"{MEMORY_REASON} {format_bytes(resident)} is over "
                    f"--max-memory-per-process {format_bytes(self.max_memory)}")
        if running.reason:
            return f"its run was being stopped ({running.reason})"
        if running.policy.keep_processes:
            return "its task keeps its processes"
        if run is None or running.state != "running":
            return "its task did not run"
        if left_behind(run, task_processes):
            return "its task left a process behind"
        return ""

    def keep(self, running: Running, task_processes: set[int], now: float) -> bool:
        """The process of ``running``, its outcome recorded: kept as idle for another task,
        or told to retire (it exits; reaped, its run ends as a forked child's does)."""
        why = self.retire_reason(running, task_processes, now)
        if why or running.channel is None:
            log.log(logging.WARNING if why.startswith(MEMORY_REASON) else logging.DEBUG,
                    "task %s: its process %d retires: %s", running.task_id, running.pid, why)
            if running.channel is not None:
                running.channel.send({"retire": why})
            return False
        self.idle[running.pid] = Idle(running.pid, running.created, running.channel,
                                      running.output, self._runs.get(running.pid, 1))
        return True

    def reaped(self, pid: int) -> None:
        self._runs.pop(pid, None)
        idle = self.idle.pop(pid, None)
        if idle is not None:
            idle.close()

    def retire_spares(self, why: str) -> None:
        """The idle processes that have run no task yet (spares, 6.8) are told to retire and
        forgotten (their exit is reaped as an idle process's)."""
        for pid, idle in list(self.idle.items()):
            if idle.runs == 0:
                idle.channel.send({"retire": why})
                idle.close()
                del self.idle[pid]

    def retire_idle(self, why: str) -> None:
        for idle in self.idle.values():
            idle.channel.send({"retire": why})

    def close(self) -> None:
        """Our ends of the idle processes' sockets: they see end of file and exit."""
        for idle in self.idle.values():
            idle.close()
        self.idle.clear()


def left_behind(run: RunMark, task_processes: set[int]) -> bool:
    """Whether the run of the live task process ``run.leader`` left a process: a child of its
    (a zombie too), or one of our own children that is no task process (an orphan that came
    to us, a child subreaper) and is in its group or carries its mark or title. Reads only
    those processes' entries in /proc."""
    if direct_children(run.leader):
        return True
    for pid in direct_children(os.getpid()) - task_processes:
        if _group(pid) == run.leader or _says(pid, run):
            return True
    return False


def _alive(pid: int) -> bool:
    """Our child ``pid`` runs (not a zombie): one read of /proc/[pid]/stat, psutil elsewhere."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except FileNotFoundError:  # gone, or no /proc here (then psutil tells)
        return not os.path.isdir("/proc/self") and process_alive(pid)
    except OSError:
        return process_alive(pid)
    return data[data.rfind(b")") + 2:data.rfind(b")") + 3] not in (b"Z", b"X", b"")


def _group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _says(pid: int, run: RunMark) -> bool:
    mark, title = signs([pid]).get(pid, (None, ""))
    return mark == run.mark or title == run.title
