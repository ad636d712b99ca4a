"""How a listener's runs start (PROTOCOL.md 6.2, 6.7, 6.8): a process made for the task (forked)
or an idle one woken (a warm one, or the spare made ahead of its task), then the stamp
(pending -> started by that process, and the run's record on the node, in one round trip)
and the word: go, or stop. Also the start of a task taken ahead for a warm process
(blueque.daemon.ahead), whose stamp came with an ending; and the spare itself."""

from __future__ import annotations

import logging
from collections.abc import Callable

from blueque import failpoints
from blueque.daemon.forking import AskedSpare, ask_spare, close_fds, fork_task_process
from blueque.daemon.forks import ForkServerLink
from blueque.daemon.outputs import TaskOutput
from blueque.daemon.owner import NODE_RUNS_TTL, Defaults, Owner
from blueque.daemon.running import Running
from blueque.daemon.warm import WarmProcesses
from blueque.errors import BluequeError, RedisUnavailable
from blueque.policy import Policy
from blueque.reporting import ChildChannel, ToChild
from blueque.spool import Spool
from blueque.store import RedisStore, Reservation, Taken
from blueque.task_process.calling import TaskFunction
from blueque.task_process.child import Assignment
from blueque.tasklog import TaskLogSettings

log = logging.getLogger("blueque.daemon")


class Starter:
    """A Supervisor's runs as they start: it adds each to the Supervisor's ``children``."""

    def __init__(self, store: RedisStore, task_store: RedisStore, owner: Callable[[], Owner],
                 clock: Callable[[], float], warm: WarmProcesses, children: dict[int, Running],
                 defaults: Defaults, fork_server: ForkServerLink | None, *,
                 task_logs: TaskLogSettings | None, spool: Spool | None,
                 tell: Callable[[Running, ToChild], None], record: Callable[[Running], str],
                 put_back: Callable[[Running], None], close: Callable[[], None]) -> None:
        """``store``: the loop's (bounded), ``task_store``: the children's; ``owner``: its
        listener as it is now (its ``created`` comes once it registered); ``task_logs`` and
        ``spool`` each child's; ``tell`` a child a frame, ``record`` a run's entry on the
        node, ``put_back`` a task stamped for a process that is not to run it, ``close`` what
        a forked child inherits of its listener."""
        self.store, self.task_store, self._owner, self.clock = store, task_store, owner, clock
        self.warm, self.children, self.defaults = warm, children, defaults
        self.fork_server, self.task_logs, self.spool = fork_server, task_logs, spool
        self.tell, self.record, self.put_back, self.close = tell, record, put_back, close
        self._spare_refused = False  # its fork server's last answer for a spare: refused

    @property
    def owner(self) -> Owner:
        return self._owner()

    def fork(self, queue: str, task_id: str, function: TaskFunction) -> bool:
        """Fork the child that will run ``task_id`` (moved into our reserved list), then stamp
        the task for it (or give it to an idle warm process). False if none could be forked."""
        self.take_spares()
        server = self.fork_server
        if server is not None and server.spares_stale():
            self.warm.retire_spares("its fork server has loaded the client since it was made")
        if self._assign(queue, task_id):
            return True
        forked = fork_task_process(
            self.store, self.task_store,
            Assignment(task_id, queue, self.owner.id, self.owner.lease_s,
                       self.spool, node=self.owner.node),
            function, self.task_logs, self.warm.reuse,
            inherited=self.close, server=self.fork_server)
        if forked is None:
            return False
        self._start(task_id, queue, forked.pid, forked.created, forked.channel,
                    TaskOutput.of(forked.output, self.task_logs, self.store))
        return True

    def make_spare(self, queue: str, free: int) -> bool:
        """Ask the fork server for a task process before its task (6.8), when no process is
        idle or asked for, and a slot is free (``free``: how many) or one will free with its
        process's exit (a run in its process's last task: every run with --reuse 1). It is
        not waited for: its answer is taken in at a later step (take_spares) and the next
        task moved goes to it (an idle process runs nothing: it takes no slot). False: none
        was asked for (none is wanted, or no ready fork server)."""
        self.take_spares()
        server = self.fork_server
        if server is None or self.warm.idle or server.spares_asked() or (
                free <= 0 and not self.warm.last_tasks(self.children)):
            return False
        return ask_spare(server, self._spare_assignment(queue),
                         self.task_logs, self.warm.reuse) is not None

    def take_spares(self) -> None:
        """The fork server's answers to the spares asked for: each process made is kept as
        idle (runs 0); a refusal is said once, not at every step."""
        server = self.fork_server
        if server is None:
            return
        task_logs = self.task_logs
        for token, answer in server.spares_made():
            assert isinstance(token, AskedSpare)
            made = token.made(answer, self._spare_assignment(""))
            if isinstance(made, str) and not self._spare_refused:
                log.warning("its fork server cannot make a process ahead of its task (%s); "
                            "tasks get their fork when they come", made)
            self._spare_refused = isinstance(made, str)
            if made is None or isinstance(made, str):
                continue
            self.warm.add_spare(made.pid, made.created, made.channel,
                                TaskOutput.of(made.output, task_logs, self.store))
            log.debug("process %d made ahead of its task", made.pid)

    def drop_spares(self) -> None:
        """Our ends of the spares asked for or made and not taken in (the listener closes:
        such a process reads end of file and exits)."""
        server = self.fork_server
        for token, _ in server.spares_made() if server is not None else ():
            assert isinstance(token, AskedSpare)
            token.ours.close()
            close_fds(token.output)

    def _spare_assignment(self, queue: str) -> Assignment:
        return Assignment("", queue, self.owner.id, self.owner.lease_s,
                          self.spool, node=self.owner.node)

    def _start(self, task_id: str, queue: str, pid: int, created: float | None,
               channel: ChildChannel, output: TaskOutput | None) -> None:
        running = Running.starting(task_id, queue, pid, self.clock(), created=created,
                                   channel=channel, output=output)
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
                running.created, self.owner.node, self.record(running),
                NODE_RUNS_TTL)
        except RedisUnavailable:
            raise
        except BluequeError as error:
            reservation = None
            log.error("task %s: not started: %s", running.task_id, error)
        self._begun(running, reservation)

    def _begun(self, running: Running, reservation: Reservation | None) -> None:
        """The stamp answered (None: it failed): tell the child to go, or to stop."""
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

    def take_up(self, taken: Taken, reservation: Reservation, pid: int, kept: bool) -> None:
        """A task a finish took ahead and stamped for the warm process ``pid``: its next run
        if that process was kept idle (``kept``), else put back (it never ran)."""
        idle = self.warm.take(taken.task_id, taken.queue, pid) if kept else None
        running = Running.starting(taken.task_id, taken.queue, pid, self.clock())
        if idle is None:
            if reservation.runnable:  # stamped for a process that is not to run it
                self.put_back(running)
            return
        running.created, running.channel = idle.created, idle.channel
        running.output = idle.output
        self.children[pid] = running
        self._begun(running, reservation)

