"""Which processes are a run's (PROTOCOL.md 6.4): how they are told, and the look for them.

A task process leads its own process group, and everything it starts inherits
``BLUEQUE_TASK=[task id]:[attempt]`` (its **mark**) in the environment; a process it forked
without exec also still shows its **title** (``blueque: [queue] [task id] attempt [n]``). A
run's other processes are then: the members of its group, its task process's descendants,
and the processes carrying its mark or title, with their own descendants. That finds what
left the group (``setsid``, ``start_new_session=True``, a daemon's double fork) while the task
process lives, and after it died too: on Linux the listener is a child subreaper
(``PR_SET_CHILD_SUBREAPER``), so the orphans of its runs become its children, which it reaps
and looks through for marks; elsewhere every process is looked through.

Finding only: what is done with what is found (SIGTERM, SIGKILL after the grace) is
``blueque.leftovers``'.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

import psutil

from blueque.process import created_from_stat

#: The environment variable every task process sets for what it starts: its run's mark.
TASK_VARIABLE = "BLUEQUE_TASK"

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37


def task_mark(task_id: str, attempt: int | str) -> str:
    """The value of BLUEQUE_TASK for one run: ``[task id]:[attempt]``."""
    return f"{task_id}:{attempt}"


def task_title(queue: str, task_id: str, attempt: int | str) -> str:
    """The title (``ps``) of a task process running ``attempt`` of ``task_id``."""
    return f"blueque: {queue} {task_id} attempt {attempt}"


@functools.cache
def libc_prctl() -> Callable[..., int] | None:
    """libc's prctl, looked up once, among the symbols the process already has (dlopen of
    NULL): never by ctypes.util.find_library, which runs ``ldconfig -p`` in a subprocess (the
    chaos test counted it among a node's task processes; at every task, it cost a task
    process about 3 ms of CPU)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # a libc without prctl
        return None
    return function


def child_subreaper(on: bool) -> bool | None:
    """Make this process a child subreaper (Linux): the orphans of its descendants become its
    children instead of init's. Returns whether it was one before; None where the kernel has
    no such thing (then nothing changed)."""
    prctl = libc_prctl()
    if prctl is None:
        return None
    was = ctypes.c_int(0)
    if prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(was), 0, 0, 0) != 0:
        return None
    if prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        return None
    return bool(was.value)


def is_subreaper() -> bool:
    prctl = libc_prctl()
    state = ctypes.c_int(0)
    return (prctl is not None
            and prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(state), 0, 0, 0) == 0
            and bool(state.value))


@dataclass(frozen=True)
class RunMark:
    """How one run's processes are told: its task process (the leader of its process group),
    the mark its descendants inherit and its title."""

    leader: int
    mark: str
    title: str

    @classmethod
    def of(cls, leader: int, queue: str, task_id: str, attempt: int | str) -> RunMark:
        return cls(leader, task_mark(task_id, attempt), task_title(queue, task_id, attempt))


@dataclass(frozen=True)
class Entry:
    """One process as the process table shows it."""

    ppid: int
    pgid: int
    created: float | None


def process_table() -> dict[int, Entry]:
    """Every process: pid -> parent, process group and create time (one read of /proc; psutil
    where there is none)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return _psutil_table()
    table: dict[int, Entry] = {}
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                data = handle.read()
            fields = data[data.rfind(b")") + 2:].split()  # the name may hold spaces
            table[int(name)] = Entry(int(fields[1]), int(fields[2]), created_from_stat(data))
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    return table


def _psutil_table() -> dict[int, Entry]:
    table: dict[int, Entry] = {}
    for process in psutil.process_iter(["ppid", "create_time"]):
        with contextlib.suppress(psutil.Error, OSError):
            table[process.pid] = Entry(process.info["ppid"] or 0, os.getpgid(process.pid),
                                       process.info["create_time"])
    return table


Signs = dict[int, tuple[str | None, str]]


def signs(pids: Iterable[int]) -> Signs:
    """What each process says of its run: the BLUEQUE_TASK it inherited (None), and its
    title (the first word of its command line: a title set by setproctitle is one)."""
    said: Signs = {}
    for pid in pids:
        with contextlib.suppress(psutil.Error, OSError):
            said[pid] = (psutil.Process(pid).environ().get(TASK_VARIABLE), _title(pid))
    return said


def _title(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().split(b"\0")[0].decode(errors="replace").strip()
    except FileNotFoundError:  # no /proc: psutil splits a title at its spaces, join them
        if os.path.isdir("/proc/self"):
            raise
        return " ".join(psutil.Process(pid).cmdline()).strip()


def find(run: RunMark, table: dict[int, Entry], said: Signs) -> dict[int, float | None]:
    """The run's processes besides its task process, as ``table`` shows them: pid -> create
    time. Its group's members, its task process's descendants, and the processes of ``said``
    that carry its mark or title, with their descendants."""
    children: dict[int, list[int]] = {}
    for pid, entry in table.items():
        children.setdefault(entry.ppid, []).append(pid)
    roots = [run.leader] + [pid for pid, (mark, title) in said.items() if pid in table and (
        (run.mark and mark == run.mark) or (run.title and title == run.title))]
    found = {pid for pid, entry in table.items() if entry.pgid == run.leader}
    while roots:
        pid = roots.pop()
        found.add(pid)
        roots += [child for child in children.get(pid, ()) if child not in found]
    found -= {run.leader, os.getpid()}
    return {pid: table[pid].created for pid in found}


def orphans(table: dict[int, Entry], children: Collection[int]) -> Signs:
    """What the processes that may be escaped orphans of our runs say: an orphan goes to the
    nearest child subreaper among its ancestors, else to init. So: our own children but our
    task processes when we are a child subreaper, else also those of our ancestors."""
    me = os.getpid()
    homes = {me} if is_subreaper() else {me, *ancestors(me, table)}
    return children_of(homes, table, {me, *children})


def ancestors(pid: int, table: dict[int, Entry]) -> set[int]:
    found: set[int] = set()
    while pid in table and table[pid].ppid not in found and table[pid].ppid > 0:
        pid = table[pid].ppid
        found.add(pid)
    return found


def direct_children(pid: int) -> set[int]:
    """The children of ``pid``: the children files of its threads in /proc (one read
    each), psutil where there is none."""
    found: set[int] = set()
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return _children_psutil(pid)
    for thread in threads:
        try:
            with open(f"/proc/{pid}/task/{thread}/children", encoding="ascii") as handle:
                found.update(int(word) for word in handle.read().split())
        except FileNotFoundError:
            continue  # the thread ended meanwhile
        except OSError:
            return _children_psutil(pid)
    return found


def _children_psutil(pid: int) -> set[int]:
    with contextlib.suppress(psutil.Error):
        return {child.pid for child in psutil.Process(pid).children()}
    return set()


def children_of(homes: set[int], table: dict[int, Entry], skip: set[int]) -> Signs:
    """What the children of ``homes`` say, but those in ``skip``."""
    return signs(pid for pid, entry in table.items() if entry.ppid in homes and pid not in skip)
