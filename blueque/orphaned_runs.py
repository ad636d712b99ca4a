"""The live runs of this node's dead listeners, as a sweeper signals them (blueque.recovery
decides and records their tasks' verdicts; this module only stops processes).

- **adopted** runs (their task's current run): their dead listener no longer hears their
  cancel nor watches their time limit, and the listener that adopted them stops them with its
  own (``--on-stop=terminate``, preemption): SIGTERM to their group, SIGKILL after kill_grace;
- an adopted run whose process died unrecorded: what it left behind is stopped
  (``blueque.leftovers``);
- **fenced** runs (their task was taken back: requeued, retried, cancelled, finished or stamped
  again): they can record nothing and only duplicate the task's next attempt, so they are
  stopped as a listener stops a superseded run of its own.

A sweeper's runs are not its children: it says SIGTERM again at each sweep until the grace has
passed, and tells their processes outside their group too (by mark or title), unless their
task keeps its processes.
"""

from __future__ import annotations

import json
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from blueque.fencing import is_current_run, may_reclaim
from blueque.leftovers import Leftovers, signal_escaped
from blueque.node import local_process
from blueque.policy import Policy, field_float
from blueque.process import Stopping
from blueque.run_processes import RunMark
from blueque.store import RedisStore

log = logging.getLogger("blueque.recovery")


@dataclass(frozen=True)
class Orphan:
    """A live run of a dead listener of this node, as its run record names it: the queue, the
    task, the listener that forked it, its attempt, its process (pid and create time) and
    that listener's process (None: unknown)."""

    queue: str
    task_id: str
    listener: str
    attempt: int
    pid: int
    created: float | None
    owner: tuple[int, float | None] | None


class OrphanedRuns:
    """What one sweeper signals of the runs of dead listeners on its node (``node``, whose
    pids it may judge), from one sweep to the next."""

    def __init__(self, store: RedisStore, host: str, node: str,
                 alive: Callable[[int, float | None], bool],
                 kill: Callable[[int, int], None]) -> None:
        self.store = store
        self.host = host
        self.node = node
        self._alive = alive
        self._kill = kill
        # Adopted runs stopped by task id (why: cancelled, time limit, shutdown), fenced runs
        # by pid.
        self._stopping = Stopping(self._signal_run, repeat=True)
        self._fenced = Stopping(self._signal_run, repeat=True)
        #: how the runs being stopped are told (by pid): their processes outside their
        #: group are signalled too, unless their task keeps its processes (blueque.leftovers)
        self._marks: dict[int, RunMark] = {}
        #: what adopted runs that died left behind, being stopped
        self.leftovers = Leftovers(everywhere=True)

    def _signal_run(self, pid: int, signum: int) -> None:
        self._kill(pid, signum)
        run = self._marks.get(pid)
        if run is not None:
            signal_escaped(run, signum)

    def _mark(self, pid: int, data: dict[str, str], policy: Policy,
              attempt: str | None = None) -> RunMark | None:
        """Note how run ``pid`` of the task ``data`` is told; None if its task keeps its
        processes."""
        if policy.keep_processes:
            self._marks.pop(pid, None)
            return None
        run = RunMark.of(pid, data.get("queue", ""), data.get("id", ""),
                         data.get("attempts", "") if attempt is None else attempt)
        self._marks[pid] = run
        return run

    def forget_mark(self, pid: int) -> None:
        """Run ``pid`` is none of ours to tell any more (its task moved on)."""
        self._marks.pop(pid, None)

    # --- adopted runs -----------------------------------------------------------------------
    def enforce(self, task_id: str, pid: int, data: dict[str, str], policy: Policy,
                current: float) -> None:
        """An adopted task's dead listener no longer hears its cancel message nor watches its
        time limit: do both here. SIGTERM to its group, SIGKILL after kill_grace; once it is
        gone a later sweep records it (failed and cancelled, or by the retry policy)."""
        started_at = field_float(data.get("started_at"))
        if data.get("cancel_requested"):
            reason = "cancelled"
        elif policy.time_limit and started_at and current - started_at > policy.time_limit:
            reason = "time limit"
        elif task_id in self._stopping:
            reason = self._stopping.reason(task_id) or "shutdown"  # stop_adopted began it
        else:
            return
        self._mark(pid, {**data, "id": task_id}, policy)
        signum = self._stopping.step(task_id, pid, policy.kill_grace, reason)
        log.warning("task %s: %s while adopted, sending %s to pid %d's group", task_id, reason,
                    signal.Signals(signum).name, pid)

    def ended(self, task_id: str, pid: int, data: dict[str, str], policy: Policy,
              stopped: str) -> None:
        """An adopted run's process died unrecorded (a run that returns records itself and
        stops what it left): what it left is stopped, SIGTERM now and SIGKILL after its
        kill_grace (at later sweeps; at the next one if we were stopping it already)."""
        run = self._mark(pid, {**data, "id": task_id}, policy)
        self._marks.pop(pid, None)
        if run is not None:  # SIGTERM now, SIGKILL at a later sweep
            self.leftovers.ended(run, 0.0 if stopped else policy.kill_grace)

    def gone(self, task_id: str) -> str:
        """The adopted run of ``task_id`` is gone (its verdict is being recorded): it is
        stopped no more. Returns why it was being stopped ("" if it was not)."""
        stopped = self._stopping.reason(task_id) or ""
        self._stopping.forget(task_id, kill=False)
        return stopped

    def stop_adopted(self, runs: dict[str, tuple[int, float | None]],
                     reason: Literal["shutdown", "preempted"] = "shutdown") -> None:
        """A listener stopping with --on-stop=terminate, or preempted at its deadline, stops
        the runs it adopted as it stops its own children: SIGTERM to their groups now, SIGKILL
        once kill_grace has passed (later sweeps), and a sweep records each once its process
        is gone (a preempted one as preempted: back to pending, no attempt spent)."""
        for task_id, (pid, created) in runs.items():
            if task_id not in self._stopping and self._alive(pid, created):
                log.warning("task %s: adopted run (pid %d) stopped (%s), sending SIGTERM to "
                            "its group", task_id, pid, reason)
                self._stopping.begin(task_id, pid, Policy().kill_grace, reason)

    # --- fenced runs ------------------------------------------------------------------------
    def stop_fenced(self, runs: dict[str, str] | None = None,
                    reclaim: Callable[[Orphan], bool] | None = None
                    ) -> dict[int, float | None]:
        """Runs forked on this node (blueque_node_[node]) whose listener is dead and whose
        task was taken back meanwhile (requeued, retried, cancelled, finished, or stamped
        again): fenced, they can record nothing and only duplicate the task's next attempt.
        Their group gets SIGTERM, then SIGKILL once kill_grace has passed, as a listener
        stops a superseded run of its own. Entries of ended processes are dropped. A run's
        listener is judged by the process the entry names (pid and create time), so a later
        listener with the same id (a pid reused) does not pass for it. Returns the runs
        signalled now: pid -> create time (until they are gone, each holds a slot of the
        sweeping listener: a job may take its whole kill_grace to stop). A run whose task was
        taken back while it lived and waits for its retry, with no newer attempt started (its
        adopter was cut off from Redis longer than the lease: 5.12b), is offered to
        ``reclaim`` first, and left to go on when it takes it back."""
        ended: list[str] = []
        signalled: dict[int, float | None] = {}
        for field_, raw in (self.store.node_runs(self.node) if runs is None else runs).items():
            try:
                run = json.loads(raw)
                pid, task_id, listener = int(field_), str(run["task"]), str(run["listener"])
                attempt = None if run.get("attempt") is None else str(run["attempt"])
                created = field_float(str(run.get("created") or ""))
            except (ValueError, KeyError, TypeError):
                ended.append(field_)  # unreadable: nothing to act on
                continue
            if not self._alive(pid, created):
                ended.append(field_)
                self._fenced.forget(pid)  # SIGKILL: grandchildren left in its group
                self._marks.pop(pid, None)
                continue
            owner = self._run_owner(run, listener)
            if owner is not None and self._alive(*owner):
                continue  # its own listener watches it
            data = self.store.task_data(task_id)
            # the task's current run (adopted by recover_local): by attempt, or for a record
            # written at fork, before the stamp fixed the attempt, by the pid it stamped
            if not data or is_current_run(data, listener, attempt, pid):
                continue
            if (reclaim is not None and attempt is not None and attempt.isdigit()
                    and may_reclaim(data, listener, int(attempt))
                    and reclaim(Orphan(str(run.get("queue", "")), task_id, listener,
                                       int(attempt), pid, created, owner))):
                continue
            policy = Policy.resolve(data, self.store.queue_config(str(run.get("queue", ""))))
            self._mark(pid, {"queue": str(run.get("queue", "")), "id": task_id}, policy,
                       attempt=attempt or "")
            signum = self._fenced.step(pid, pid, policy.kill_grace)
            log.warning("task %s: attempt %s (pid %d) of dead listener %s was taken back "
                        "(now %s, attempt %s); sending %s to its group", task_id, attempt, pid,
                        listener, data.get("status"), data.get("attempts"),
                        signal.Signals(signum).name)
            signalled[pid] = created
        self.store.forget_runs(self.node, ended)
        return signalled

    def _run_owner(self, run: dict[str, object], listener: str
                   ) -> tuple[int, float | None] | None:
        owner_pid = run.get("listener_pid")
        if isinstance(owner_pid, int):
            return owner_pid, field_float(str(run.get("listener_created") or ""))
        return local_process(listener, self.store.listener_info(listener), self.node,
                             self.host)

    def step(self) -> None:
        """At each sweep: what died adopted runs left, SIGKILL after their grace."""
        self.leftovers.step()
