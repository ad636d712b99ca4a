"""How a listener's runs are stopped (PROTOCOL.md 6.2): time limit, cancel, shutdown,
supersession, preemption: SIGTERM to the run's process group (and to what left the group) now,
SIGKILL after its kill_grace; and what a lease renewal finds of them (a run superseded, a
cancel whose message was missed)."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Iterable

from blueque.daemon.running import Running
from blueque.endings import Stopped, late_ending_allowed
from blueque.fencing import is_current_run, may_reclaim
from blueque.leftovers import Leftovers
from blueque.process import Stopping, signal_group, signal_pid
from blueque.reporting import ToChild
from blueque.statuses import FAILED
from blueque.store import RedisStore

log = logging.getLogger("blueque.daemon")


class Stopper:
    """A Supervisor's stops, and the loop's: cancels, time limits, shutdown, preemption's
    notice, what a renewal finds (superseded runs stopped, recovered ones reclaimed)."""

    def __init__(self, store: RedisStore, children: dict[int, Running], leftovers: Leftovers,
                 task_processes: Callable[[], set[int]], clock: Callable[[], float],
                 listener: str, tell: Callable[[Running, ToChild], None]) -> None:
        """``children``: the Supervisor's runs by pid (shared, never copied);
        ``task_processes``: its task processes, running or idle (6.7)."""
        self.store = store  # the loop's, bounded
        self.children, self.leftovers = children, leftovers
        self.task_processes, self.clock = task_processes, clock
        self.listener, self.tell = listener, tell
        self.stops = Stopping(kill=self._signal_run)  # the groups being stopped

    def _signal_run(self, pid: int, signum: int) -> None:
        """How Stopping signals a run: its process group, and what left the group (setsid,
        a daemon's double fork), unless its task keeps its processes (then its group only)."""
        running = self.children.get(pid)
        run = None if running is None or running.policy.keep_processes else running.mark()
        if run is None:
            signal_group(pid, signum)
            return
        escaped = self.leftovers.signal(run, signum, self.task_processes())
        if escaped:
            log.info("task %s: sent %s to %d process(es) it started outside its process group",
                     running.task_id if running else pid, signal.Signals(signum).name, escaped)

    def stop(self, running: Running, reason: Stopped) -> None:
        """SIGTERM its process group now, SIGKILL after its kill_grace (enforce_limits)."""
        if not running.reason:
            running.reason = reason
            log.info("task %s: %s, sending SIGTERM to its process group", running.task_id,
                     reason)
            self.stops.begin(running.pid, running.pid, running.kill_grace, reason)

    def stop_tasks(self, task_ids: Iterable[str], reason: Stopped) -> None:
        wanted = set(task_ids)
        for running in self.children.values():
            if running.task_id in wanted:
                self.stop(running, reason)

    def stop_all(self, reason: Stopped) -> None:
        for running in self.children.values():
            if running.report is None:
                self.stop(running, reason)

    def enforce_limits(self) -> None:
        """Time limits and kill escalation need no Redis: they keep working while it is down."""
        current = self.clock()
        for running in list(self.children.values()):
            if running.time_limit and current - running.started > running.time_limit:
                self.stop(running, "time limit")
        self.stops.escalate()
        self.leftovers.step(self.task_processes())

    def notify(self, message: ToChild, signum: int) -> int:
        """Tell every running child ``message``, then send it ``signum`` (a preemption's
        notice); returns how many were told."""
        runs = [r for r in self.children.values() if r.state == "running"]
        for running in runs:
            self.tell(running, message)
            signal_pid(running.pid, signum)
        return len(runs)

    # --- what a renewal finds ------------------------------------------------------------------
    def watched(self) -> list[Running]:
        """The children whose task a renewal looks at: running, and not yet reported (one
        whose outcome we took in is only exiting, not superseded by its own end)."""
        return [r for r in self.children.values() if r.report is None and r.state == "running"]

    def look_at(self, fields: Iterable[tuple[Running, dict[str, str]]]) -> list[str]:
        """With each watched child's task as a renewal read it: stop the runs that were taken
        back or reserved again (superseded: they could record nothing), and reclaim those
        whose task recover took back while they lived (PROTOCOL.md 5.12b); returns the tasks
        whose cancel was asked for (their message may have been missed). Raises
        RedisUnavailable (a run not reclaimed yet is looked at again next time)."""
        cancels, recovered = self._read(fields)
        for running in recovered:
            self._reclaim(running)
        return cancels

    def _read(self, fields: Iterable[tuple[Running, dict[str, str]]]
              ) -> tuple[list[str], list[Running]]:
        """The tasks whose cancel was asked for, and the runs to reclaim (no newer attempt
        superseded them); the superseded ones are stopped."""
        cancels, reclaim = [], []
        for running, data in fields:
            if data.get("cancel_requested"):
                cancels.append(running.task_id)
            elif running.attempt is not None and may_reclaim(data, self.listener,
                                                             running.attempt):
                reclaim.append(running)
            elif self._superseded(running, data):
                self.stop(running, "superseded")
        return cancels, reclaim

    def _reclaim(self, running: Running) -> None:
        """Take its task back for a run that lived through a cut longer than our lease, unless
        a newer attempt started meanwhile: then it is superseded, and stopped."""
        assert running.attempt is not None  # _read reclaims only such runs
        verdict, detail = self.store.reclaim(running.queue, running.task_id, self.listener,
                                             running.attempt, running.pid, running.created,
                                             self.store.now())
        if verdict == "ok":
            log.warning("task %s: recovered while its run lived (its listener was cut off from "
                        "Redis longer than its lease) and not started again anywhere: taken "
                        "back, its run (attempt %s, pid %d) goes on", running.task_id,
                        running.attempt, running.pid, extra={
                            "task_id": running.task_id, "queue": running.queue,
                            "event": "reclaimed"})
            return
        log.info("task %s: not taken back (%s: %s): its run is stopped as superseded",
                 running.task_id, verdict, detail)
        self.stop(running, "superseded")

    def _superseded(self, running: Running, data: dict[str, str]) -> bool:
        if not data or running.attempt is None:
            return False
        if (data.get("status") == FAILED
                and late_ending_allowed(data, self.listener, running.attempt)):
            return False  # recovered while it lived, and no attempt will follow: it may end
        return not is_current_run(data, self.listener, running.attempt)
