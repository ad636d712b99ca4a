"""A listener's children (PROTOCOL.md 6.2): fork each run's process, stamp its task for it,
take in what it reports, record its ending by the one rule (blueque.endings), have it stopped
(its Stopper: time limit, cancel, shutdown, supersession, preemption) and reap it. Where the
listener decides what to run and when, the Supervisor runs it."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

from blueque import failpoints
from blueque.child import Assignment, TaskFunction
from blueque.daemon.forking import close_fds, fork_task_process
from blueque.daemon.forks import ForkServerLink, exits
from blueque.daemon.owner import NODE_RUNS_TTL, Defaults, Owner
from blueque.daemon.recorder import CountEnding, Recorder
from blueque.daemon.stopper import Stopper
from blueque.daemon.wakeup import Pollable
from blueque.errors import BluequeError, RedisUnavailable
from blueque.leftovers import Leftovers
from blueque.policy import Policy
from blueque.reporting import ChildChannel, ToChild
from blueque.running import Running
from blueque.spool import Spool
from blueque.store import RedisStore
from blueque.tasklog import TaskLogSettings
from blueque.warm import WarmProcesses

log = logging.getLogger("blueque.daemon")


class Supervisor:
    def __init__(self, store: RedisStore, task_store: RedisStore, owner: Owner,
                 clock: Callable[[], float], rng: random.Random, *,
                 task_logs: TaskLogSettings | None = None, spool: Spool | None = None,
                 count_ending: CountEnding | None = None, reuse: int = 1,
                 fork_server: ForkServerLink | None = None) -> None:
        """``task_logs``, ``spool``, ``count_ending``: the Recorder's (blueque.daemon.recorder);
        ``reuse``: how many tasks one task process may run (PROTOCOL.md 6.7; 1: one);
        ``fork_server``: what forks the task processes when it is ready (6.8)."""
        self.store = store  # the loop's, bounded
        self.task_store = task_store  # the children's: the client's whole retry_deadline
        self.owner = owner
        self.clock = clock
        self.rng = rng
        #: each queue's defaults (blueque_queue_config_[queue]), read at the first task after
        #: each lease renewal (the listener clears them then) rather than for every task
        self.defaults = Defaults(store)
        self.children: dict[int, Running] = {}
        #: task processes that run several tasks (6.7)
        self.warm = WarmProcesses(reuse, owner.lease_s)
        #: what runs start besides their task process (blueque.leftovers)
        self.leftovers = Leftovers(clock)
        #: how its runs are stopped (SIGTERM, then SIGKILL after their grace)
        self.stopper = Stopper(self.children, self.leftovers, self.task_processes, clock,
                               owner.id, self.tell)
        self.recorder = Recorder(store, owner.id, owner.node, clock, rng, self.defaults,
                                 task_logs=task_logs, spool=spool, count_ending=count_ending)
        self._next_clean = 0.0  # the clock's time of the next look for old output files
        self.fork_server = fork_server

    # --- forking and starting ---------------------------------------------------------------
    def fork(self, queue: str, task_id: str, function: TaskFunction) -> bool:
        """Fork the child that will run ``task_id`` (moved into our reserved list), then stamp
        the task for it (or give it to an idle warm process). False if none could be forked."""
        if self._assign(queue, task_id):
            return True
        forked = fork_task_process(
            self.store, self.task_store,
            Assignment(task_id, queue, self.owner.id, self.owner.lease_s, self.recorder.spool),
            function, self.recorder.task_logs, self.warm.reuse, inherited=self.close,
            server=self.fork_server)
        if forked is None:
            return False
        self._start(task_id, queue, forked.pid, forked.created, forked.channel, forked.output)
        return True

    def _start(self, task_id: str, queue: str, pid: int, created: float | None,
               channel: ChildChannel, output: int | None) -> None:
        running = Running(task_id, queue, None, self.clock(), 0.0, Policy().kill_grace,
                          Policy(), pid, created=created, channel=channel, output=output,
                          state="starting")
        self.children[pid] = running
        failpoints.hit("listener-before-stamp")
        self._begin(running)

    def _assign(self, queue: str, task_id: str) -> bool:
        """Give the task to an idle warm process, then stamp it for that process as for a
        forked one (6.7). False: none is idle."""
        idle = self.warm.take(task_id, queue)
        if idle is not None:
            failpoints.hit("listener-before-warm-stamp")  # told its task, not stamped
            self._start(task_id, queue, idle.pid, idle.created, idle.channel, idle.output)
        return idle is not None

    def _begin(self, running: Running) -> None:
        """Stamp the moved task with the child's pid (pending -> started) and record the run
        on our node, in one round trip; then tell the child to go, or to stop. Raises
        RedisUnavailable: the stamp may or may not have happened, and the child waits (nothing
        runs yet) while ``begin_waiting`` repeats it, idempotent, at every step."""
        try:
            reservation = self.store.begin_run(
                running.queue, self.owner.id, running.task_id, self.store.now(), running.pid,
                running.created, self.owner.node, self.record(running), NODE_RUNS_TTL)
        except RedisUnavailable:
            raise
        except BluequeError as error:
            reservation = None
            log.error("task %s: not started: %s", running.task_id, error)
        if reservation is None or not reservation.runnable:
            if reservation is not None:
                log.warning("not running task %s from queue %s: %s (%s)", running.task_id,
                            running.queue, reservation.verdict, reservation.detail)
            running.state = "refused"
            self.tell(running, {"stop": reservation.detail if reservation else "refused"})
            return
        fields = reservation.fields or {}
        defaults = self.defaults(running.queue)
        policy = Policy.resolve(fields, defaults)
        running.attempt, running.policy, running.fields = reservation.attempt, policy, fields
        running.time_limit, running.kill_grace = policy.time_limit, policy.kill_grace
        failpoints.hit("listener-before-go")
        self.tell(running, {"go": fields, "defaults": defaults})
        if running.channel is not None and running.channel.closed:
            return  # the child died before it could be told: it never ran (see _put_back)
        running.started, running.state = self.clock(), "running"
        log.info("task %s queue %s: attempt %s started in pid %d", running.task_id,
                 running.queue, running.attempt, running.pid,
                 extra={"task_id": running.task_id, "queue": running.queue,
                        "pid": running.pid, "event": "started", "attempt": running.attempt})

    def begin_waiting(self) -> None:
        """Repeat the stamps an outage interrupted (their children are waiting)."""
        for running in list(self.children.values()):
            if running.state == "starting":
                self._begin(running)

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

    def record_reports(self) -> None:
        for running in list(self.children.values()):
            if running.report is not None and running.recorded is None:
                self.recorder.record_report(running)
                # a warm process kept idle (6.7): its run ended; it waits for another
                if self.warm.reuse > 1 and self.warm.keep(running, self.task_processes(),
                                                           self.clock()):
                    del self.children[running.pid]
                    self.recorder.ended(running.pid, running, self.clock() - running.started)

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
                self.recorder.write_progress(running)

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
        """When something is due for a child: a time limit, a SIGKILL, a progress write."""
        due = [r.started + r.time_limit for r in self.children.values()
               if r.time_limit and not r.reason]
        due += self.stopper.stops.deadlines() + self.leftovers.deadlines()
        due += [r.progress_due for r in self.children.values() if r.progress is not None]
        return due

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
                | {r.task_id for r, _ in self.recorder.unrecorded})

    def task_processes(self) -> set[int]:
        """Our task processes: running a task, or idle (6.7)."""
        return set(self.children) | set(self.warm.idle)

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
        for running in self.children.values():
            if running.channel is not None:
                running.channel.close()
            if running.output is not None:
                close_fds((running.output,))
                running.output = None

    def let_go(self, patience: float = 1.0) -> None:
        """Before the listener leaves its children to the next one: those still waiting for
        their word (a stamp Redis did not answer) are told to stop and given ``patience``
        seconds to go, so that none lingers where the next listener cannot count it; their
        tasks, still in our reserved list, are put back by recovery."""
        waiting = [r for r in self.children.values() if r.state == "starting"]
        for running in waiting:
            self.tell(running, {"stop": "its listener is leaving"})
        self.warm.retire_idle("its listener is leaving")
        deadline = self.clock() + patience
        while (any(r.pid in self.children for r in waiting) or self.warm.idle) \
                and self.clock() < deadline:
            self.reap()
            time.sleep(0.01)

