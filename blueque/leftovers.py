"""What a run leaves behind (PROTOCOL.md 6.4): the processes a task started besides its own,
stopped when the run ends. Which processes those are, and how they are found (its group, its
descendants, its mark or title; the child subreaper), is ``blueque.run_processes``'.

When a run ends, its other processes are stopped as the task process is when a run is stopped
(``blueque.process.Stopping``): SIGTERM, then SIGKILL after the task's ``kill_grace``. A task
whose ``keep_processes`` option is 1 leaves them running (a task that starts a daemon on
purpose); a stop (time limit, cancel, shutdown, preemption) then signals its process group
only, as before. A process that drops both its mark and its title (an exec with a cleared
environment after leaving the group) cannot be told: it is reaped, not stopped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import psutil

from blueque.process import process_alive, signal_group, signal_pid
from blueque.run_processes import (
    RunMark,
    ancestors,
    children_of,
    direct_children,
    find,
    is_subreaper,
    orphans,
    process_table,
    signs,
)

log = logging.getLogger("blueque.daemon")

#: After a run ends, its escaped processes are looked for within this many seconds (one look
#: for every run that ended meanwhile: a look reads /proc, a few ms on a busy node).
SCAN_DELAY = 1.0


def signal_processes(processes: dict[int, float | None], signum: int) -> int:
    """``signum`` to each process still alive (by pid and create time); how many."""
    sent = 0
    for pid, created in processes.items():
        if process_alive(pid, created) and signal_pid(pid, signum):
            sent += 1
    return sent


def _leader_ended(leader: int) -> bool:
    """The task process ``leader`` has exited: gone, or a zombie not yet reaped (its fork
    server keeps it one until the listener settled its exit, PROTOCOL.md 6.8). A live process
    of that pid is a new one (the old group was empty when the pid was given again)."""
    try:
        return psutil.Process(leader).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _group_alive(leader: int) -> bool:
    """Some process is still in the group ``leader`` (ended) led: a zombie too, until reaped.
    A live process that took the pid since is none (while a group has a member, its id is not
    given to a new process: so the group is empty then)."""
    if not _leader_ended(leader):
        return False
    try:
        os.killpg(leader, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _only_its_zombie(leader)


def _only_its_zombie(leader: int) -> bool:
    """The group's one member is its leader's zombie, kept by the fork server until the
    listener settled its exit (6.8). The task process's other processes in its group, when
    it exited, came to us, the child subreaper, with their descendants under them: none of
    our children in the group, none in it. Not a child subreaper, we cannot tell (False:
    the group is taken for alive until the zombie is reaped). Reads our children's list and
    their groups, not the whole process table: it runs at every task's end."""
    try:
        if psutil.Process(leader).status() != psutil.STATUS_ZOMBIE:
            return False
    except psutil.NoSuchProcess:
        return False
    if not is_subreaper():
        return False
    for pid in direct_children(os.getpid()):
        with contextlib.suppress(OSError):
            if pid != leader and os.getpgid(pid) == leader:
                return False
    return True


def _signal_group(leader: int, signum: int) -> None:
    """``signum`` to the group of an ended run (not to a new process's, see _group_alive)."""
    if _leader_ended(leader):
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
        found.update(find(run, table, orphans(table, children)))
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
        said = (signs(pid for pid in table if pid != os.getpid()) if self._everywhere
                else orphans(table, children))
        for leader, ending in self._unscanned.items():
            found = find(ending.run, table, said)
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



def stop_own(run: RunMark, grace: float, poll: float = 0.05) -> int:
    """For a task process that records its own outcome (no listener watches it: blueque
    1.0.1's ``fork_task``, an orphaned run): stop the other processes of its run, SIGTERM then
    SIGKILL after ``grace``, waiting for them (it leads their group: it ignores the SIGTERM it
    sends itself). Returns how many there were."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    table = process_table()
    homes = ancestors(run.leader, table)  # where its escaped orphans went
    found = find(run, table, children_of(homes, table, {run.leader}))
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
    found.update(find(run, table, children_of(homes, table, {run.leader})))
    signal_processes(found, signal.SIGKILL)
    return len(found)
