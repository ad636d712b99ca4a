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
import time
from collections.abc import Callable

from blueque.client import Client
from blueque.daemon.options import ListenerOptions
from blueque.daemon.podcost import PodDeletionCost
from blueque.daemon.step import ListenerStep
from blueque.daemon.wakeup import ProgramSignals
from blueque.errors import BluequeError
from blueque.metrics import ListenerMetrics
from blueque.run_processes import child_subreaper
from blueque.task_process.calling import TaskFunction

log = logging.getLogger("blueque.daemon")


class ListenerDaemon:
    """The listener daemon's life around its steps: it has a ListenerStep (``step``: the parts
    and one step over them, which tests also build and drive alone), and adds its signals, its
    stop and its leaving."""

    def __init__(self, client: Client, options: ListenerOptions,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.step = ListenerStep(client, options, clock)

    @property
    def id(self) -> str:
        return self.step.id

    @property
    def metrics(self) -> ListenerMetrics | None:
        """The loop's Prometheus counters (options.metrics), for a server to serve."""
        return self.step.metrics

    def load_function(self) -> TaskFunction:
        return self.step.load_function()

    def run(self) -> int:
        step = self.step
        step.load_function()
        if step.fork_server is not None:
            step.fork_server.start()  # ready soon; until then we fork ourselves
        step.keep_on_stop(on_stop_here(step.on_stop, step.id))
        # what the listener holds by now stays put for good: the children's collections then
        # never touch (and copy) the pages of the objects they inherit
        gc.freeze()
        program = ProgramSignals(self._request_stop) if step.options.in_program else None
        step.hear_program(program)
        stop = self._request_stop if program is None else program.handler
        step.wakeup.install_signals({signal.SIGTERM: stop, signal.SIGINT: stop,
                                     signal.SIGUSR1: step.preemption.on_signal})
        # the orphans of our runs (what they started and left) come to us: we reap them, and
        # stop those of runs that ended (blueque.leftovers)
        subreaper = child_subreaper(True)
        step.guard.start()  # stops exclusive runs in time, even while the loop waits on Redis
        step.keeper.start()  # renews the lease in time, even while the loop is slow
        # in a Kubernetes pod: a scale-in removes idle pods first
        pod_cost = PodDeletionCost(step.id, every=step.options.interval / 2)
        try:
            while True:
                step.run_once()
                pod_cost.update(step.busy(), step.clock())
                if program is not None:
                    program.deliver()  # the program's own handlers, between two steps
                if step.stop_asked and self._may_exit():
                    break
                if self._preempted_and_done():
                    log.warning("listener %s: preempted, and every task it ran is handed back; "
                                "exiting", step.id)
                    break
        finally:
            self._finish()
            if subreaper is False:  # ForkingRunner.run() returns to its caller
                child_subreaper(False)
        if program is not None:
            program.end()
        return 0

    def _request_stop(self, signum: int, frame: object) -> None:
        step = self.step
        if not step.stop_asked:
            log.info("listener %s: signal %d, stopping (on-stop=%s)", step.id, signum,
                     step.on_stop)
        if step.on_stop == "preempt":
            # this node goes away (a container's stop): every run is told, saves and is put
            # back without spending an attempt, and we leave once all are (PROTOCOL.md 6.3)
            step.preemption.on_signal(signum, frame)
            return
        step.ask_stop()

    def _may_exit(self) -> bool:
        step = self.step
        if step.on_stop == "keep":
            return True
        if step.on_stop == "terminate":
            step.stop_all("shutdown")
        # adopted runs occupy our slots too (and the carried ones are in our care): leaving
        # them would end the renewal of their lease, and another node would run their tasks
        # again beside them; a sweep empties them once their processes are gone and records
        # them
        return step.supervisor.done() and not step.slots.in_care()

    def _finish(self) -> None:
        step = self.step
        step.keeper.close()  # the lease is the loop's to leave with (release, or keep)
        step.supervisor.let_go()
        # what ended runs left is not left to anyone (runs still running are: --on-stop=keep)
        step.supervisor.finish_leftovers()
        try:
            if step.supervisor.children:
                log.info("listener %s exiting; %d task(s) keep running and will be adopted by "
                         "the next listener on this host", step.id, len(step.supervisor.children))
                step.membership.leave_runs()
                step.renew()
            elif step.membership.registered:
                if step.supervisor.seen:  # our last runs' record, before we go
                    step.renew()
                step.supervisor.give_back(step.id)
                step.membership.release()  # leave cleanly: nothing of ours to recover
        except BluequeError as error:
            log.error("listener %s: could not leave cleanly: %s", step.id, error)
        step.guard.close()
        step.supervisor.close()
        if step.fork_server is not None:
            step.fork_server.stop()
        step.wakeup.close()

    def _preempted_and_done(self) -> bool:
        # the adopted runs are left once a sweep has recorded them (it empties slots.adopted):
        # their own listener is dead, and leaving them unrecorded would let another node's
        # sweep count their stop against an attempt
        step = self.step
        return (step.preemption.deadline is not None and step.supervisor.done()
                and step.busy() == 0 and not step.slots.carried)


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

