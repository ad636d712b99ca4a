"""Recovery: give back the tasks of listeners that died, on any host, within a bounded time.

Two ways a listener is known dead (PROTOCOL.md, "Liveness and recovery"):
- its lease expired by the Redis server's clock (host died, process SIGKILLed, network cut):
  any live listener or scheduler, on any host, recovers its tasks;
- on its own host, its pid is gone (pid plus create time, so a reused pid is not mistaken):
  detected at once, without waiting for the lease. Started tasks whose process is still
  alive are adopted instead: their lease is renewed and they record their own outcome.

Verdicts per task: not started yet -> pending again (front of the queue); started -> retried
later or failed, by the task's retry policy; cancel requested -> failed as cancelled.

This module decides and records; the processes of the runs it finds (adopted runs told of
their cancel or time limit, fenced runs stopped) are signalled by ``blueque.orphaned_runs``.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from blueque import dependencies, keyed
from blueque.adopting import Adopter
from blueque.adoption import LocalListeners
from blueque.endings import decide, describe_exit
from blueque.fencing import unstarted_verdict
from blueque.keys import NODE_RUNS_TTL
from blueque.leases import EXCLUSIVE_MARGIN, LeaseWatch
from blueque.node import NodeListener, hostname, node_identity
from blueque.orphaned_runs import OrphanedRuns
from blueque.policy import Policy, field_float
from blueque.process import process_alive, signal_group
from blueque.statuses import STARTED, Verdict, VerdictKind
from blueque.store import RedisStore
from blueque.unlisted import Unlisted

log = logging.getLogger("blueque.recovery")

@dataclass
class RecoveryReport:
    requeued: int = 0
    retried: int = 0
    failed: int = 0  # the cancelled ones too (their status is failed)
    cancelled: int = 0
    adopted: int = 0
    listeners: list[str] = field(default_factory=list)
    #: live runs of dead listeners that the sweep's ``adopter`` holds: task id -> (pid,
    #: create time); they occupy the adopter's slots until they end
    adopted_runs: dict[str, tuple[int, float | None]] = field(default_factory=dict)
    #: live runs of dead listeners the sweep adopted that no live listener of the node
    #: serving their queue counts yet: they count against that queue's capacity on the node
    #: (the next listener of the queue counts them from its first sweep), not against the
    #: sweeper's slots; in its care meanwhile (its sweeps carry their lease, its drain waits
    #: for them, its terminate and its node's preemption stop them)
    carried_runs: dict[str, tuple[int, float | None]] = field(default_factory=dict)
    #: fenced runs of dead listeners whose process group was signalled
    stopped_runs: int = 0
    #: those of them still alive: pid -> create time; until they are gone they occupy a slot
    #: of the sweeping listener (a job may take its whole kill_grace to stop)
    fenced_runs: dict[int, float | None] = field(default_factory=dict)

    def add(self, counts: list[int]) -> None:
        self.requeued += counts[0]
        self.retried += counts[1]
        self.failed += counts[2]
        self.cancelled += counts[4] if len(counts) > 4 else 0


def ended_text(counts: list[int]) -> str:
    """How a recovery's endings read in its log line: ``2 failed, 1 cancelled`` (recover.lua
    counts a cancelled task among the failed: its status is failed, but it was cancelled)."""
    cancelled = counts[4] if len(counts) > 4 else 0
    return f"{counts[2] - cancelled} failed, {cancelled} cancelled"



class Recovery:
    """One sweep per call; the daemons call ``sweep`` every lease interval."""

    def __init__(
        self,
        store: RedisStore,
        host: str | None = None,
        lease_ms: int = 20_000,
        alive: Callable[[int, float | None], bool] = process_alive,
        rng: random.Random | None = None,
        kill: Callable[[int, int], None] = signal_group,
        node: str | None = None,
        watch_ms: int | None = None,
    ) -> None:
        self.store = store
        self.lease_ms = lease_ms
        self.host = host or hostname()
        #: pids are judged only for listeners whose info names exactly this node identity
        self.node = node or node_identity(self.host)
        self._alive = alive
        self._rng = rng or random.Random()
        #: the live runs of dead listeners of this node that it signals (adopted, fenced)
        self.runs = OrphanedRuns(store, self.host, self.node, alive, kill)
        #: judges leases; its own stalls by ``watch_ms`` (two of its sweeps), else its lease
        self.watch = LeaseWatch(store, lease_ms if watch_ms is None else watch_ms)
        #: the dead listeners of this node that wrote no entry (blueque 1.0.1's)
        self.unlisted = Unlisted(store, self.host, self.node, alive)
        #: adopts the live runs of dead listeners of this node
        self.adopter = Adopter(store, self.node, lease_ms)

    def _verdicts(
        self, queue: str, listener: str, why: str, adopt: bool, exclusive: bool = False
    ) -> tuple[list[Verdict], dict[str, tuple[int, float | None]]]:
        """Verdicts for a dead listener's reserved tasks, and the still-running ones
        (adopt=True: checked by pid on this node) left alone: task id -> (pid, created).
        adopt=False (its lease lapsed): its exclusive runs (``exclusive``: all of them, a
        listener --exclusive) were stopped by their own listener before the lapse, and are
        put back as preempted runs are, without spending an attempt (PROTOCOL.md 6.6)."""
        ids = self.store.reserved_ids(queue, listener)
        datas = self.store.task_data_many(ids) if ids else []
        config = self.store.queue_config(queue) if ids else {}
        current = self.store.now()
        verdicts: list[Verdict] = []
        live: dict[str, tuple[int, float | None]] = {}
        for task_id, data in zip(ids, datas, strict=True):
            pid = data.get("pid")
            if data.get("status") == STARTED:
                created = field_float(data.get("pid_created"))
                if adopt and pid and pid.isdigit() and self._alive(int(pid), created):
                    live[task_id] = (int(pid), created)
                    self.runs.enforce(task_id, int(pid), data, Policy.resolve(data, config),
                                      current)
                    continue
                stopped = self.runs.gone(task_id)
                if adopt and pid and pid.isdigit():
                    self.runs.ended(task_id, int(pid), data, Policy.resolve(data, config), stopped)
                elif not adopt and (exclusive or Policy.resolve(data, config).exclusive == 1):
                    stopped = "fenced"
                verdicts.append(self._started_verdict(
                    task_id, data, config, self._why(why, stopped, data, config), current,
                    preempted=stopped in ("preempted", "fenced")))
            else:  # never started by a run of it: put back, or dropped if it moved on
                verdicts.append(unstarted_verdict(task_id, data, listener))
                if verdicts[-1].kind == "drop" and pid and pid.isdigit():
                    self.runs.forget_mark(int(pid))
        return verdicts, live

    def stop_adopted(self, runs: dict[str, tuple[int, float | None]],
                     reason: Literal["shutdown", "preempted"] = "shutdown") -> None:
        """A listener stopping with --on-stop=terminate, or preempted at its deadline, stops
        the runs it adopted as it stops its own children (``OrphanedRuns.stop_adopted``);
        a sweep records each once its process is gone."""
        self.runs.stop_adopted(runs, reason)

    @staticmethod
    def _why(why: str, stopped: str, data: dict[str, str], config: dict[str, str]) -> str:
        if stopped == "shutdown":
            return ("terminated because the listener that adopted it shut down "
                    f"(--on-stop=terminate; {why})")
        if stopped == "preempted":
            return f"{describe_exit(0, stopped, 0)} (adopted; {why})"
        if stopped == "fenced":
            return f"exclusive, so stopped by its own listener before its lease lapsed ({why})"
        if stopped != "time limit":
            return why
        limit = Policy.resolve(data, config).time_limit
        return f"time limit of {limit:g} s exceeded (its group killed by the adopter; {why})"

    def _started_verdict(
        self, task_id: str, data: dict[str, str], config: dict[str, str], why: str,
        current: float, preempted: bool = False,
    ) -> Verdict:
        """A started run that is gone: by endings.decide, as its listener would have recorded
        it (``preempted``: stopped at its node's preemption deadline)."""
        return started_verdict(task_id, data, config, why, current, self._rng, preempted)

    def recover_expired(self, queue: str, report: RecoveryReport,
                        listeners: Iterable[str] | None = None) -> None:
        """Listeners whose lease expired (``listeners``: those of them the caller judged
        dead): recover everything they held (mode "lease")."""
        for listener in self.store.expired_listeners(queue) if listeners is None else listeners:
            verdicts, _ = self._verdicts(
                queue, listener, f"listener {listener} stopped renewing its lease", adopt=False,
                exclusive=self.store.listener_info(listener).get("exclusive") == "1")
            if listeners is not None and not self.watch.still_dead(listener):
                continue  # Redis stalled while we read its tasks: judge it again next sweep
            if (listeners is not None and self._holds_exclusive(queue, listener)
                    and not self.watch.lapsed_past(listener, EXCLUSIVE_MARGIN)):
                continue  # an exclusive run: its listener stops it; wait past the margin
            counts = self.store.recover(queue, listener, verdicts, self.store.now(), mode="lease")
            if counts != [-1]:
                report.add(counts)
                report.listeners.append(listener)
                log.warning(
                    "recovered listener %s on queue %s (lease expired): %d requeued, "
                    "%d retried, %s", listener, queue, *counts[:2], ended_text(counts),
                )

    def _holds_exclusive(self, queue: str, listener: str) -> bool:
        """Whether a dead listener's reserved tasks include an exclusive one (PROTOCOL.md
        6.6: by the task's option or its queue's, or the listener's --exclusive)."""
        if self.store.listener_info(listener).get("exclusive") == "1":
            return True
        ids = self.store.reserved_ids(queue, listener)
        if not ids:
            return False
        config = self.store.queue_config(queue)
        return any(Policy.resolve(data, config).exclusive == 1
                   for data in self.store.task_data_many(ids))

    def recover_dead(self, listener: NodeListener, sweep: NodeSweep) -> None:
        """A dead listener of this node, known by its entry (pid and create time, queues):
        recovered on each of its queues (``recover_local``); its entry goes once nothing of
        it runs any more."""
        info = self.store.listener_info(listener.id)
        held = [self.recover_local(queue, listener.id, (listener.pid, listener.created), sweep,
                                   info) for queue in listener.queues]
        if not any(held):
            self.store.leave_node(self.node, listener.id)

    def recover_local(self, queue: str, listener: str, process: tuple[int, float | None],
                      sweep: NodeSweep, info: dict[str, str] | None = None) -> bool:
        """A dead listener on this node (mode "host"; ``process``: its pid and create time,
        gone). Its processes that still run are adopted: its lease is renewed for them (so no
        other node recovers them) and they record their own outcome; if one dies unreported,
        a later sweep sees its pid gone and applies the retry policy. Each adopted run
        occupies the slots of one live listener of the node that serves its queue
        (``place``). Returns whether runs of it still run on ``queue``."""
        report = sweep.report
        verdicts, live = self._verdicts(queue, listener, f"listener {listener} died", adopt=True)
        if verdicts or not live:
            counts = self.store.recover(
                queue, listener, verdicts, self.store.now(), mode="host", release=not live
            )
            if counts == [-1]:
                return False
            report.add(counts)
            report.listeners.append(listener)
            log.warning(
                "recovered dead listener %s on queue %s: %d requeued, %d retried, "
                "%s, %d still running", listener, queue, *counts[:2], ended_text(counts),
                len(live),
            )
        if not live:
            return False
        self.adopter.adopt(queue, listener, process, live, sweep, info)
        return True

    def stop_fenced_runs(self, report: RecoveryReport, runs: dict[str, str] | None = None,
                         sweep: NodeSweep | None = None) -> None:
        """Stop the fenced runs of this node's dead listeners (``OrphanedRuns.stop_fenced``;
        ``runs``: the node's run records, read anew if None), counted in ``report``; in a
        ``sweep``, those that may be taken back are adopted again instead (``_reclaim``)."""
        signalled = self.runs.stop_fenced(
            runs, None if sweep is None else lambda orphan: self.adopter.reclaim(orphan, sweep))
        report.stopped_runs += len(signalled)
        report.fenced_runs.update(signalled)

    def sweep(self, queues: Iterable[str], exclude: Iterable[str] = (),
              adopter: str | None = None) -> RecoveryReport:
        """Recover dead listeners of this node first (so their live processes are adopted
        before their lease can expire), then expired leases on ``queues`` (and waiting tasks
        whose parents' endings nobody told, 5.21; the keys' holds no ending released, 5.22);
        then stop the fenced runs of dead listeners of this node. ``adopter``: the sweeping
        listener, which serves ``queues``. Its round trips do not grow with the fleet."""
        report = RecoveryReport()
        excluded, swept = set(exclude), list(queues)
        self.watch.begin()
        view = self.store.node_view(self.node, swept)
        entries = NodeListener.all_of(view.listeners)
        live = frozenset(listener for listener, entry in entries.items()
                         if self._alive(entry.pid, entry.created))
        sweep = NodeSweep(report, view.runs, LocalListeners(entries, live), adopter,
                          frozenset(swept) if adopter is not None else frozenset())
        for listener, entry in sorted(entries.items()):
            if listener not in live and listener not in excluded:
                self.recover_dead(entry, sweep)
        for queue, listener, process, lives in self.unlisted.found(swept, view,
                                                                  set(entries) | excluded):
            if lives:  # its node's sweeps know it from now on (1.0.1, an earlier Blueque)
                known = NodeListener(listener, *process, (queue,))
                self.store.join_node(self.node, listener, known.entry(), NODE_RUNS_TTL)
            else:
                self.recover_local(queue, listener, process, sweep)
        for queue in swept:
            self.recover_expired(queue, report, self.watch.expired(queue, excluded))
            self.store.perform(dependencies.settle_waiting, queue, self.store.now())
        self.store.perform(keyed.heal)
        self.stop_fenced_runs(report, view.runs, sweep)
        self.runs.step()
        self.watch.end()
        self.adopter.forget_unplaced(sweep.placed)
        return report


@dataclass
class NodeSweep:
    """What one sweep knows of its node and fills in as it goes."""

    report: RecoveryReport
    runs: dict[str, str]  # the node's run records (blueque_node_[node]), as read at its start
    node: LocalListeners
    adopter: str | None  # the sweeping listener (None: a scheduler)
    serves: frozenset[str]  # the queues the adopter serves
    #: the adopted runs it placed (task ids)
    placed: set[str] = field(default_factory=set)


def started_verdict(task_id: str, data: dict[str, str], config: dict[str, str], why: str,
                    current: float, rng: random.Random | None = None, preempted: bool = False
                    ) -> Verdict:
    """recover.lua's verdict for a started task whose run is gone: retried by its policy,
    put back as preempted (``preempted``: stopped at its node's preemption deadline), or
    failed (``cancelled``: failed and stamped so, when a cancel was asked for), the error
    saying ``why``."""
    attempts = data.get("attempts", "")
    error = f"{why} while it ran attempt {attempts or '?'} (pid {data.get('pid', '?')})"
    ending = decide(Policy.resolve(data, config), data, "failed", error, current,
                    stopped="preempted" if preempted else "", rng=rng)
    verdict: VerdictKind = ("retry" if ending.outcome == "retry" else
                              "preempted" if ending.outcome == "preempted" else
                              "cancelled" if ending.cancelled else "failed")
    return Verdict(task_id, attempts, verdict, ending.eta, ending.text)
