"""What a run leaves behind (PROTOCOL.md 6.4): the processes a task started besides its own.

A task process leads its own process group, and everything it starts inherits
``BLUEQUE_TASK=[task id]:[attempt]`` (its **mark**) in the environment; a process it forked
without exec also still shows its **title** (``blueque: [queue] [task id] attempt [n]``). A
run's other processes are then: the members of its group, its task process's descendants,
and the processes carrying its mark or title, with their own descendants. That finds what
left the group (``setsid``, ``start_new_session=True``, a daemon's double fork) while the task
process lives, and after it died too: on Linux the listener is a child subreaper
(``PR_SET_CHILD_SUBREAPER``), so the orphans of its runs become its children, which it reaps
and looks through for marks; elsewhere every process is looked through.

When a run ends, its other processes are stopped as the task process is when a run is stopped
(``blueque.process.Stopping``): SIGTERM, then SIGKILL after the task's ``kill_grace``. A task
whose ``keep_processes`` option is 1 leaves them running (a task that starts a daemon on
purpose); a stop (time limit, cancel, shutdown, preemption) then signals its process group
only, as before. A process that drops both its mark and its title (an exec with a cleared
environment after leaving the group) cannot be told: it is reaped, not stopped.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

import psutil

from blueque.process import created_from_stat, process_alive, signal_group

log = logging.getLogger("blueque.daemon")

#: The environment variable every task process sets for what it starts: its run's mark.
TASK_VARIABLE = "BLUEQUE_TASK"
#: After a run ends, its escaped processes are looked for within this many seconds (one look
#: for every run that ended meanwhile: a look reads /proc, a few ms on a busy node).
SCAN_DELAY = 1.0

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37


def task_mark(task_id: str, attempt: int | str) -> str:
    """The value of BLUEQUE_TASK for one run: ``[task id]:[attempt]``."""
    return f"{task_id}:{attempt}"


def task_title(queue: str, task_id: str, attempt: int | str) -> str:
    """The title (``ps``) of a task process running ``attempt`` of ``task_id``."""
    return f"blueque: {queue} {task_id} attempt {attempt}"


@functools.cache
def _prctl() -> Callable[..., int] | None:
    """libc's prctl, looked up once: ctypes.util.find_library runs ``ldconfig -p`` in a
    subprocess, which a running listener must not start at every ended run (the chaos test
    counted it among a node's task processes)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    except OSError:
        return None
    function: Callable[..., int] = libc.prctl
    return function


def child_subreaper(on: bool) -> bool | None:
    """Make this process a child subreaper (Linux): the orphans of its descendants become its
    children instead of init's. Returns whether it was one before; None where the kernel has
    no such thing (then nothing changed)."""
    prctl = _prctl()
    if prctl is None:
        return None
    was = ctypes.c_int(0)
    if prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(was), 0, 0, 0) != 0:
        return None
    if prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        return None
    return bool(was.value)


def is_subreaper() -> bool:
    prctl = _prctl()
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


def signal_processes(processes: dict[int, float | None], signum: int) -> int:
    """``signum`` to each process still alive (by pid and create time); how many."""
    sent = 0
    for pid, created in processes.items():
        if process_alive(pid, created):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)
                sent += 1
    return sent


def _group_alive(leader: int) -> bool:
    """Some process is still in the group ``leader`` (gone) led: a zombie too, until reaped.
    A process that took the pid since is none (while a group has a member, its id is not
    given to a new process: so the group is empty then)."""
    if psutil.pid_exists(leader):
        return False
    try:
        os.killpg(leader, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(leader: int, signum: int) -> None:
    """``signum`` to the group of an ended run (not to a new process's, see _group_alive)."""
    if not psutil.pid_exists(leader):
        signal_group(leader, signum)


def signal_escaped(run: RunMark, signum: int) -> int:
    """``signum`` to the run's processes outside its process group (found by descent while
    its task process lives, else by mark or title among every process): for a sweeper's
    adopted and fenced runs, whose group it signals itself. Returns how many."""
    table = process_table()
    found = find(run, table, signs(pid for pid in table if pid not in (run.leader,
                                                                        os.getpid())))
    return signal_processes({pid: created for pid, created in found.items()
                             if table[pid].pgid != run.leader}, signum)


@dataclass
class _Ended:
    """An ended run whose other processes are being stopped."""

    run: RunMark
    grace: float
    since: float
    processes: dict[int, float | None] = field(default_factory=dict)
    killed: bool = False


class Leftovers:
    """A listener's view of its runs' other processes: ``signal`` a run being stopped (its
    group and what escaped it), ``ended`` for each reaped task process, ``step`` at each
    loop step (the look for escaped orphans, SIGKILL after the grace), ``finish`` when the
    listener leaves. Runs whose processes are still being stopped hold a slot (``len``)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 everywhere: bool = False) -> None:
        self._clock = clock
        #: look for escaped processes among every process (a sweeper's adopted runs: their
        #: orphans never came to it), not only among our children and our ancestors'
        self._everywhere = everywhere
        self._ending: dict[int, _Ended] = {}  # by leader: SIGTERM sent, SIGKILL after grace
        self._unscanned: dict[int, _Ended] = {}  # ended since the last look for orphans
        self._scan_due: float | None = None
        #: processes of runs being stopped, found while their task process lived (an escaped
        #: one may carry no mark: once orphaned it could not be told any more)
        self._known: dict[int, dict[int, float | None]] = {}

    # --- a run being stopped (its task process still runs) ----------------------------------
    def signal(self, run: RunMark, signum: int, children: Collection[int] = ()) -> int:
        """``signum`` to the run's process group and to every other process of it found now
        (those in another session: setsid, a daemon); returns how many of those.
        ``children``: the listener's task processes (no orphans of a run)."""
        signal_group(run.leader, signum)
        table = process_table()
        found = self._known.setdefault(run.leader, {})
        found.update(find(run, table, _orphans(table, children)))
        return signal_processes({pid: created for pid, created in found.items()
                                 if pid not in table or table[pid].pgid != run.leader}, signum)

    # --- a run whose task process was reaped ------------------------------------------------
    def ended(self, run: RunMark, grace: float, stopped: bool = False) -> None:
        """The run's task process was reaped. One that was being stopped has had its SIGKILL
        (``signal``); its processes are forgotten. Any other: SIGTERM to its group now, and
        its escaped processes are looked for within SCAN_DELAY; SIGKILL after ``grace``."""
        known = self._known.pop(run.leader, {})
        if stopped:
            return
        ending = _Ended(run, grace, self._clock(), dict(known))
        _signal_group(run.leader, signal.SIGTERM)
        signal_processes(known, signal.SIGTERM)
        if _group_alive(run.leader) or known:
            log.warning("task %s: processes it started outlived it in its process group; "
                        "sending SIGTERM, SIGKILL after %g s", run.mark, grace)
            self._ending[run.leader] = ending
        self._unscanned[run.leader] = ending
        if self._scan_due is None:
            self._scan_due = self._clock() + SCAN_DELAY

    def step(self, children: Collection[int] = ()) -> None:
        """Look for the escaped processes of the runs that ended (when due); SIGKILL what is
        left of a run once its grace has passed; forget runs with nothing left.
        ``children``: the listener's task processes (no orphans of a run)."""
        current = self._clock()
        if self._scan_due is not None and current >= self._scan_due:
            self._scan(children)
        for leader, ending in list(self._ending.items()):
            ending.processes = {pid: created for pid, created in ending.processes.items()
                                if process_alive(pid, created)}
            if not ending.processes and not _group_alive(leader):
                del self._ending[leader]
            elif not ending.killed and current - ending.since > ending.grace:
                ending.killed = True
                self._kill(ending)

    def _scan(self, children: Collection[int]) -> None:
        table = process_table()
        orphans = (signs(pid for pid in table if pid != os.getpid()) if self._everywhere
                   else _orphans(table, children))
        for leader, ending in self._unscanned.items():
            found = find(ending.run, table, orphans)
            new = {pid: created for pid, created in found.items()  # its group had SIGTERM
                   if pid not in ending.processes and table[pid].pgid != leader}
            if not new:
                continue
            ending.processes.update(new)
            self._ending[leader] = ending
            log.warning("task %s: %d process(es) it started outlived it outside its process "
                        "group (pids %s); sending SIGTERM, SIGKILL after %g s", ending.run.mark,
                        len(new),
                        " ".join(map(str, sorted(new))), ending.grace)
            signal_processes(new, signal.SIGKILL if ending.killed else signal.SIGTERM)
        self._unscanned.clear()
        self._scan_due = None

    def _kill(self, ending: _Ended) -> None:
        _signal_group(ending.run.leader, signal.SIGKILL)
        table = process_table()
        for pid in list(ending.processes):  # and what they started meanwhile
            ending.processes.update(find(RunMark(pid, "", ""), table, {}))
        signal_processes(ending.processes, signal.SIGKILL)

    def finish(self, children: Collection[int] = ()) -> None:
        """The listener leaves: look for what is still to be looked for, and SIGKILL what the
        ended runs left (their grace cut short: nobody would stop them after). Runs still
        running are not touched (--on-stop=keep leaves them to the next listener)."""
        if self._unscanned:
            self._scan(children)
        for ending in self._ending.values():
            self._kill(ending)
        if self._ending:
            log.warning("killed what %d ended run(s) left behind, the listener leaving before "
                        "their kill_grace had passed", len(self._ending))
        self._ending.clear()

    def deadlines(self) -> list[float]:
        """When the next look or SIGKILL is due (for the loop's wait)."""
        due = [e.since + e.grace for e in self._ending.values() if not e.killed]
        return due + ([] if self._scan_due is None else [self._scan_due])

    def idle(self) -> bool:
        """Nothing being stopped, nothing still to look for."""
        return not self._ending and not self._unscanned

    def __len__(self) -> int:
        return len(self._ending)


def _orphans(table: dict[int, Entry], children: Collection[int]) -> Signs:
    """What the processes that may be escaped orphans of our runs say: an orphan goes to the
    nearest child subreaper among its ancestors, else to init. So: our own children but our
    task processes when we are a child subreaper, else also those of our ancestors."""
    me = os.getpid()
    homes = {me} if is_subreaper() else {me, *_ancestors(me, table)}
    return _children_of(homes, table, {me, *children})


def _ancestors(pid: int, table: dict[int, Entry]) -> set[int]:
    found: set[int] = set()
    while pid in table and table[pid].ppid not in found and table[pid].ppid > 0:
        pid = table[pid].ppid
        found.add(pid)
    return found


def _children_of(homes: set[int], table: dict[int, Entry], skip: set[int]) -> Signs:
    return signs(pid for pid, entry in table.items() if entry.ppid in homes and pid not in skip)


def stop_own(run: RunMark, grace: float, poll: float = 0.05) -> int:
    """For a task process that records its own outcome (no listener watches it: blueque
    1.0.1's ``fork_task``, an orphaned run): stop the other processes of its run, SIGTERM then
    SIGKILL after ``grace``, waiting for them (it leads their group: it ignores the SIGTERM it
    sends itself). Returns how many there were."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    table = process_table()
    homes = _ancestors(run.leader, table)  # where its escaped orphans went
    found = find(run, table, _children_of(homes, table, {run.leader}))
    if not found:
        return 0
    signal_group(run.leader, signal.SIGTERM)
    signal_processes(found, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        found = {pid: c for pid, c in found.items() if process_alive(pid, c)}
        if not found:
            return 0
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:  # its own children, now zombies
                pass
        time.sleep(poll)
    table = process_table()
    found.update(find(run, table, _children_of(homes, table, {run.leader})))
    signal_processes(found, signal.SIGKILL)
    return len(found)
