"""A listener's children (PROTOCOL.md 6.2): fork each run's process, stamp its task for it,
take in what it reports, record its ending by the one rule (blueque.endings), have it stopped
(its Stopper: time limit, cancel, shutdown, supersession, preemption) and reap it. Where the
listener decides what to run and when, the Supervisor runs it."""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import replace

from blueque import failpoints
from blueque.daemon.ahead import Ahead
from blueque.daemon.forks import ForkServerLink, exits
from blueque.daemon.owner import Defaults, Owner
from blueque.daemon.recorder import CountEnding, Recorder, write_progress
from blueque.daemon.running import Running, hand_over_outputs, output_deadlines
from blueque.daemon.starting import Starter
from blueque.daemon.stopper import Stopper
from blueque.daemon.wakeup import Pollable
from blueque.daemon.warm import WarmProcesses
from blueque.leftovers import Leftovers
from blueque.process import resident_bytes
from blueque.reporting import ToChild
from blueque.spool import Spool
from blueque.store import RedisStore
from blueque.task_process.child import TaskFunction
from blueque.tasklog import TaskLogSettings

log = logging.getLogger("blueque.daemon")


class Supervisor:
    def __init__(self, store: RedisStore, task_store: RedisStore, owner: Owner,
                 clock: Callable[[], float], rng: random.Random, *,
                 task_logs: TaskLogSettings | None = None, spool: Spool | None = None,
                 count_ending: CountEnding | None = None, reuse: int = 1,
                 max_memory: int | None = None,
                 fork_server: ForkServerLink | None = None) -> None:
        """``task_logs``, ``spool``, ``count_ending``: the Recorder's (blueque.daemon.recorder);
        ``reuse``: how many tasks one task process may run (PROTOCOL.md 6.7; 1: one), and
        ``max_memory`` the resident memory past which it retires after its task (bytes);
        ``fork_server``: what forks the task processes when it is ready (6.8)."""
        self.store = store  # the loop's, bounded
        self.owner = owner
        self.clock = clock
        #: each queue's defaults (blueque_queue_config_[queue]), read at the first task after
        #: each lease renewal (the listener clears them then) rather than for every task
        self.defaults = Defaults(store)
        self.children: dict[int, Running] = {}
        #: task processes that run several tasks (6.7)
        self.warm = WarmProcesses(reuse, owner.lease_s, max_memory)
        #: what runs start besides their task process (blueque.leftovers)
        self.leftovers = Leftovers(clock)
        #: how its runs are stopped (SIGTERM, then SIGKILL after their grace)
        self.stopper = Stopper(store, self.children, self.leftovers, self.task_processes, clock,
                               owner.id, self.tell)
        self.recorder = Recorder(store, owner.id, owner.node, clock, rng, self.defaults,
                                 task_logs=task_logs, spool=spool, count_ending=count_ending)
        #: the next reservations, taken with the endings (PROTOCOL.md 6.2)
        self.ahead = Ahead(store, self.warm)
        self.fork_server = fork_server
        self.spool = spool
        #: how its runs start: a process made or woken, the stamp, the word
        self.starter = Starter(  # task_store: the children's, the client's whole retry_deadline
            store, task_store, lambda: self.owner, clock, self.warm, self.children,
            self.defaults, fork_server, task_logs=task_logs, spool=spool, tell=self.tell,
            record=self.record, put_back=self.recorder.put_back, close=self.close)
        self._next_clean = 0.0  # the clock's time of the next look for old output files

    # --- the loop's verbs, each its part's (issue 34: no caller reaches through us) --------
    def registered(self, created: float | None) -> None:  # our runs' records carry it now
        self.owner = replace(self.owner, created=created)

    def make_spare(self, queue: str, free: int) -> None:  # Starter.make_spare
        self.starter.make_spare(queue, free)

    def take_ahead_from(self, queues: Callable[[], list[str]],
                        resources: Callable[[str | None], str]) -> None:
        self.ahead.take_from(queues, resources)

    def pop_ahead(self) -> tuple[str, str] | None:  # a task held for a free slot
        return self.ahead.pop()

    def give_back(self, listener: str) -> None:  # the ids taken ahead: no slot takes them
        self.ahead.give_back(listener)

    def record_unrecorded(self) -> None:
        self.recorder.record_unrecorded()

    def forget_ended(self) -> None:
        self.recorder.forget_ended()

    @property
    def seen(self) -> dict[str, float]:  # when each queue's last ending was recorded
        return self.recorder.seen

    def renewing(self) -> None:
        self.defaults.clear()  # an operator's Queue.configure applies from now

    def finish_leftovers(self) -> None:  # what ended runs left, stopped before we go
        self.leftovers.finish(self.children)

    # --- forking and starting (blueque.daemon.starting) -----------------------------------
    def fork(self, queue: str, task_id: str, function: TaskFunction) -> bool:
        """Make or wake the process that runs ``task_id`` and stamp it (Starter.fork)."""
        return self.starter.fork(queue, task_id, function)

    def begin_waiting(self) -> None:  # the stamps an outage interrupted, repeated
        self.starter.begin_waiting()

    def record(self, running: Running) -> str:
        """The run's entry in blueque_node_[node] (PROTOCOL.md 6)."""
        return running.record(self.owner.id, self.owner.pid, self.owner.created)

    def records(self) -> dict[str, str]:
        return {str(r.pid): self.record(r) for r in self.children.values()}

    @staticmethod
    def tell(running: Running, message: ToChild) -> None:
        if running.channel is not None:
            running.channel.send(message)

    # --- what the children say --------------------------------------------------------------
    def take_in(self) -> None:
        """Read every child's frames: progress, and outcomes to record."""
        for running in self.children.values():
            if running.channel is None:
                continue
            for frame in running.channel.receive():
                running.hear(frame)
            if running.report is not None and running.reported_at is None:
                running.reported_at = self.clock()
            running.channel.flush()
            running.read_output(self.clock())  # after its frames: see record_report

    def record_reports(self) -> None:
        """Record the outcomes our children reported, each with the next reservation its slot
        takes in the same round trip (blueque.daemon.ahead)."""
        for running in list(self.children.values()):
            if running.report is not None and running.recorded is None:
                take = self.ahead.request(running, self.owner, self.task_processes(),
                                          self.clock())
                taken = self.recorder.record_report(running, take)
                if taken is not None:
                    failpoints.hit("listener-after-take")  # its round trip took the next
                # a warm process kept idle (6.7): its run ended; it waits for another
                kept = self.warm.reuse > 1 and self.warm.keep(running, self.task_processes(),
                                                               self.clock())
                if kept:
                    del self.children[running.pid]
                    self.recorder.ended(running.pid, running, self.clock() - running.started)
                if taken is not None and taken.reservation is None:
                    self.ahead.held.append((taken.queue, taken.task_id))  # for a free slot
                elif taken is not None and taken.reservation is not None:
                    self.starter.take_up(taken, taken.reservation, running.pid, kept)

    def hold_reports(self) -> None:
        """While Redis cannot take them: spool the outcomes our children reported (6.5)."""
        for running in list(self.children.values()):
            self.recorder.hold_report(running)

    def write_progress(self) -> None:
        """Write each child's latest progress, at most every PROGRESS_SPACING seconds."""
        current = self.clock()
        for running in list(self.children.values()):
            if (running.progress is not None and running.report is None
                    and running.attempt is not None and current >= running.progress_due):
                write_progress(self.store, running, self.clock)

    # --- children that end ------------------------------------------------------------------
    def reap(self) -> None:
        """Reap every child that exited and the orphans of our runs that came to us (a child
        subreaper: blueque.leftovers), and settle the exits our fork server reported alike
        (6.8). A run's ending is recorded, and what it started besides its task process is
        stopped (its group at once; what left it once found), unless its task keeps it."""
        for pid, status in exits(self.fork_server):
            running = self.children.get(pid)
            self.warm.reaped(pid)
            if running is None:
                continue  # an idle warm process, or an orphan of one of our runs, reaped
            if running.channel is not None:
                running.channel.close()
            stopped = self.stopper.stops.forget(pid)  # a group we stopped: SIGKILL what is left
            del self.children[pid]
            run = running.mark()
            if run is not None and running.state == "running" \
                    and not running.policy.keep_processes:
                self.leftovers.ended(run, running.kill_grace, stopped=stopped)
            self.recorder.settle(pid, status, running, self.clock() - running.started)

    # --- for the loop -----------------------------------------------------------------------
    def channels(self) -> dict[int, Pollable]:
        """What the loop's wait watches: the children's sockets, and its fork server's."""
        found: dict[int, Pollable] = {r.channel.fileno(): r.channel for r in
                                      self.children.values() if r.channel and not r.channel.closed}
        if self.fork_server is not None and self.fork_server.fileno() >= 0:
            found[self.fork_server.fileno()] = self.fork_server
        return found

    def deadlines(self) -> list[float]:
        """When something is due for a child: a time limit, a SIGKILL, progress, output."""
        due = [r.started + r.time_limit for r in self.children.values()
               if r.time_limit and not r.reason]
        due += self.stopper.stops.deadlines() + self.leftovers.deadlines()
        due += [r.progress_due for r in self.children.values() if r.progress is not None]
        heard = self.fork_server is not None and self.fork_server.heard()  # read: due now
        return due + output_deadlines(self.children.values()) + ([self.clock()] if heard else [])

    def clean_logs(self, interval: float) -> None:
        """Remove old output files (--log-keep), sparing those of the attempts running now
        (a quiet running attempt's file is not an old one); at start, then once every
        cleaning period (TaskLogSettings.cleaning_period) of a listener sweeping every
        ``interval``."""
        logs = self.recorder.task_logs
        current = self.clock()
        if logs is not None and current >= self._next_clean:
            self._next_clean = current + logs.cleaning_period(interval)
            logs.clean(running=[logs.path(r.queue, r.task_id, r.attempt)
                                for r in self.children.values() if r.attempt is not None])

    def task_ids(self) -> set[str]:
        """Tasks whose ids our reserved lists rightly hold: running, or with an ending still
        to be recorded."""
        return ({r.task_id for r in self.children.values()}
                | {r.task_id for r, _ in self.recorder.unrecorded} | self.ahead.task_ids())

    def task_processes(self) -> set[int]:
        """Our task processes: running a task, or idle (6.7)."""
        return set(self.children) | set(self.warm.idle)

    def health(self) -> dict[str, str]:
        """What the info hash says of our processes and our spool at each renewal (3.3): each
        task process's resident memory, and why the spool cannot be written ("" while it
        can: it is looked at now, Spool.look)."""
        if self.spool is not None:
            self.spool.look()
        return {"task_memory": json.dumps(self.memory()),
                "spool_error": (self.spool and self.spool.failing) or ""}

    def memory(self) -> dict[int, int]:  # our task processes', running or idle
        return resident_memory(self.task_processes())

    def occupied(self) -> int:
        """Slots our runs take: children, and ended runs whose processes are being stopped
        (one that ignores SIGTERM may take its whole kill_grace)."""
        return len(self.children) + len(self.leftovers)

    def done(self) -> bool:
        """No child left, no ending still to record, nothing left behind being stopped."""
        return not self.children and not self.recorder.unrecorded and self.leftovers.idle()

    def close(self) -> None:
        """Close our ends of the children's sockets: they see their listener gone and record
        their outcomes themselves (even when this process lives on: ForkingRunner.run()
        returns to its caller); idle ones exit (6.7)."""
        self.warm.close()
        if self.fork_server is not None:  # it exits (6.8); its children live on
            self.fork_server.close()
            self.starter.drop_spares()
        for running in self.children.values():
            if running.channel is not None:
                running.channel.close()
            if running.output is not None:
                running.output.close()
                running.output = None

    def let_go(self, patience: float = 1.0) -> None:
        """Before the listener leaves its children to the next one: those still waiting for
        their word (a stamp Redis did not answer) are told to stop and given ``patience``
        seconds to go, so that none lingers where the next listener cannot count it; their
        tasks, still in our reserved list, are put back by recovery."""
        waiting = [r for r in self.children.values() if r.state == "starting"]
        for running in waiting:
            self.tell(running, {"stop": "its listener is leaving"})
        hand_over_outputs(self.children.values(), self.clock())  # left running: see 5.19
        self.warm.retire_idle("its listener is leaving")
        deadline = self.clock() + patience
        while (any(r.pid in self.children for r in waiting) or self.warm.idle) \
                and self.clock() < deadline:
            self.reap()
            time.sleep(0.01)



def resident_memory(pids: Iterable[int]) -> dict[int, int]:
    """The resident memory (bytes) of each of ``pids``: what the info hash's ``task_memory``
    and the metrics say of a listener's task processes (--max-memory-per-process)."""
    found = {pid: resident_bytes(pid) for pid in sorted(pids)}
    return {pid: size for pid, size in found.items() if size is not None}
