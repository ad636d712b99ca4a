"""The listener daemon: reserve a task only when a slot is free, fork one child per task, keep a
lease, record every ending, recover dead listeners, and stop without losing work.

``run()`` repeats one step (``run_once``, step.py) until the listener is asked to stop and may
leave, or its node is preempted and every run is handed back; it installs the signals, makes
the listener its runs' child subreaper, and leaves cleanly (or leaves its runs to the next
listener of its node, --on-stop=keep).
"""

from __future__ import annotations

import gc
import logging
import os
import signal

from blueque.daemon.podcost import PodDeletionCost
from blueque.daemon.step import ListenerStep
from blueque.daemon.wakeup import ProgramSignals
from blueque.errors import BluequeError
from blueque.run_processes import child_subreaper

log = logging.getLogger("blueque.daemon")


class ListenerDaemon(ListenerStep):
    """The listener daemon's life: its steps (ListenerStep), its signals, its stop and its
    leaving."""

    def run(self) -> int:
        self.load_function()
        if self.fork_server is not None:
            self.fork_server.start()  # ready soon; until then we fork ourselves
        self.on_stop = on_stop_here(self.on_stop, self.id)
        # what the listener holds by now stays put for good: the children's collections then
        # never touch (and copy) the pages of the objects they inherit
        gc.freeze()
        program = self.program_signals = (ProgramSignals(self._request_stop)
                                          if self.options.in_program else None)
        stop = self._request_stop if program is None else program.handler
        self.wakeup.install_signals({signal.SIGTERM: stop, signal.SIGINT: stop,
                                     signal.SIGUSR1: self.preemption.on_signal})
        # the orphans of our runs (what they started and left) come to us: we reap them, and
        # stop those of runs that ended (blueque.leftovers)
        subreaper = child_subreaper(True)
        self.guard.start()  # stops exclusive runs in time, even while the loop waits on Redis
        self.keeper.start()  # renews the lease in time, even while the loop is slow
        # in a Kubernetes pod: a scale-in removes idle pods first
        pod_cost = PodDeletionCost(self.id, every=self.options.interval / 2)
        try:
            while True:
                self.run_once()
                pod_cost.update(self.busy(), self.clock())
                if program is not None:
                    program.deliver()  # the program's own handlers, between two steps
                if self.stop_asked and self._may_exit():
                    break
                if self._preempted_and_done():
                    log.warning("listener %s: preempted, and every task it ran is handed back; "
                                "exiting", self.id)
                    break
        finally:
            self._finish()
            if subreaper is False:  # ForkingRunner.run() returns to its caller
                child_subreaper(False)
        if program is not None:
            program.end()
        return 0

    def _request_stop(self, signum: int, frame: object) -> None:
        if not self.stop_asked:
            log.info("listener %s: signal %d, stopping (on-stop=%s)", self.id, signum,
                     self.on_stop)
        if self.on_stop == "preempt":
            # this node goes away (a container's stop): every run is told, saves and is put
            # back without spending an attempt, and we leave once all are (PROTOCOL.md 6.3)
            self.preemption.on_signal(signum, frame)
            return
        self.stop_asked = True

    def _may_exit(self) -> bool:
        if self.on_stop == "keep":
            return True
        if self.on_stop == "terminate":
            self._stop_all("shutdown")
        # adopted runs occupy our slots too (and the carried ones are in our care): leaving
        # them would end the renewal of their lease, and another node would run their tasks
        # again beside them; a sweep empties them once their processes are gone and records
        # them
        return self.supervisor.done() and not self.slots.in_care()

    def _finish(self) -> None:
        self.keeper.close()  # the lease is the loop's to leave with (release, or keep)
        self.supervisor.let_go()
        # what ended runs left is not left to anyone (runs still running are: --on-stop=keep)
        self.supervisor.finish_leftovers()
        try:
            if self.supervisor.children:
                log.info("listener %s exiting; %d task(s) keep running and will be adopted by "
                         "the next listener on this host", self.id, len(self.supervisor.children))
                self.membership.leave_runs()
                self._renew()
            elif self.membership.registered:
                if self.supervisor.seen:  # our last runs' record, before we go
                    self._renew()
                self.supervisor.give_back(self.id)
                self.membership.release()  # leave cleanly: nothing of ours to recover
        except BluequeError as error:
            log.error("listener %s: could not leave cleanly: %s", self.id, error)
        self.guard.close()
        self.supervisor.close()
        if self.fork_server is not None:
            self.fork_server.stop()
        self.wakeup.close()

    def _preempted_and_done(self) -> bool:
        # the adopted runs are left once a sweep has recorded them (it empties slots.adopted):
        # their own listener is dead, and leaving them unrecorded would let another node's
        # sweep count their stop against an attempt
        return (self.preemption.deadline is not None and self.supervisor.done()
                and self.busy() == 0 and not self.slots.carried)


def on_stop_here(on_stop: str, listener: str, pid: int | None = None) -> str:
    """--on-stop as it can be kept: the init of a PID namespace (a container's main process)
    takes every process of the namespace with it when it exits, so no run can wait for
    adoption there, and "keep" (the default) becomes "preempt" (said in the log): a SIGTERM
    there means everything dies at the end of the runtime's grace period."""
    if on_stop != "keep" or (os.getpid() if pid is None else pid) != 1:
        return on_stop
    log.info("listener %s runs as pid 1 of its PID namespace (a container): its task "
             "processes end when it exits, so it cannot leave them to the next listener "
             "(--on-stop=keep); on SIGTERM it preempts them instead (--on-stop=preempt: "
             "each is told, saves and is put back without spending an attempt, within "
             "--preempt-grace)", listener)
    return "preempt"

