"""The scheduler: moves due tasks, fires periodic (cron) tasks, recovers dead listeners' tasks
and purges old results. Several schedulers may run at once, for availability.

One step (``run_once``) does, for every queue in blueque_queues:
- due tasks: Queue.enqueue_due_tasks (enqueue_due.lua: ZREM decides which scheduler moves
  each task, so none is enqueued twice);
- cron: for each entry, the ticks after the last one recorded in blueque_cron up to now
  (at most ``catch_up`` of them) are enqueued as ``cron-<name>-<tick>`` through idempotent
  enqueue, then the recorded tick is advanced by compare-and-set (cron_advance.lua). A
  scheduler that loses the compare-and-set re-reads and skips what the winner fired; one
  that dies between the two steps leaves the tick to the next, whose enqueue of the same id
  creates nothing. So no tick fires twice and none is skipped;
- recovery: ``recovery.sweep(queues)`` every ``recovery_interval`` seconds;
- purge: finished tasks older than their queue's ``result_ttl`` are deleted every
  ``purge_interval`` seconds.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from blueque import eviction
from blueque.client import Client
from blueque.cron import CronEntry, check_unique
from blueque.display import format_time
from blueque.errors import BluequeError, ConfigurationError, RedisUnavailable
from blueque.policy import Policy
from blueque.retry import Backoff
from blueque.statuses import ENDED_LISTS

log = logging.getLogger("blueque.scheduler")

#: Longest pause between steps while Redis is unreachable (the pause doubles from twice the
#: interval; a scheduler whose interval is longer keeps its interval).
MAX_BACKOFF = 30.0


class Sweeper(Protocol):
    """What the scheduler needs of blueque.recovery.Recovery."""

    def sweep(self, queues: Iterable[str]) -> object: ...


@dataclass
class StepReport:
    """What one step did (for logs and tests)."""

    due: dict[str, int] = field(default_factory=dict)
    fired: dict[str, list[str]] = field(default_factory=dict)
    skipped_ticks: dict[str, int] = field(default_factory=dict)
    recovered: object = None
    purged: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def _tick(entry: CronEntry, recorded: str) -> int:
    try:
        return int(float(recorded))
    except ValueError:
        raise BluequeError(
            f"blueque_cron holds {recorded!r} for {entry.name}, not a tick (Unix seconds): "
            f"HDEL it to register the entry afresh"
        ) from None


class Scheduler:
    """``run()`` repeats ``run_once()`` every ``interval`` seconds until ``stop()``.

    ``clock`` (Unix seconds; by default Redis' clock) times cron ticks and the recovery and
    purge cadences; ``sleep`` waits between steps (default: an Event wait that ``stop()``
    interrupts)."""

    def __init__(
        self,
        client: Client,
        cron_entries: Sequence[CronEntry] = (),
        interval: float = 1.0,
        recovery: Sweeper | None = None,
        recovery_interval: float = 2.0,
        purge_interval: float = 60.0,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], object] | None = None,
        allow_eviction: bool | None = None,
    ) -> None:
        if not min(interval, recovery_interval, purge_interval) > 0:
            raise ConfigurationError(
                "the scheduler's intervals must be more than 0 seconds, not "
                f"{interval!r}, {recovery_interval!r}, {purge_interval!r}"
            )
        self.client = client
        self.cron_entries = check_unique(cron_entries)
        self.interval = interval
        self.recovery = recovery
        self.recovery_interval = recovery_interval
        self.purge_interval = purge_interval
        self.clock = clock or client.store.now  # Redis' clock (blueque.clock)
        self._stop_asked = threading.Event()
        self.sleep = sleep or self._stop_asked.wait
        self._next_recovery = 0.0
        self._next_purge = 0.0
        #: run on a Redis that may evict keys (None: $BLUEQUE_ALLOW_EVICTION decides)
        self.allow_eviction = allow_eviction
        self._memory_checked = False

    def stop(self) -> None:
        """Ask run() to return after the current step (safe from a signal handler)."""
        self._stop_asked.set()

    @property
    def stop_asked(self) -> bool:
        return self._stop_asked.is_set()

    def run(self, max_steps: int | None = None) -> None:
        log.info(
            "scheduler started: a step every %g s, %d cron entr%s, recovery sweep %s",
            self.interval, len(self.cron_entries), "y" if len(self.cron_entries) == 1 else "ies",
            "off" if self.recovery is None else f"every {self.recovery_interval:g} s",
        )
        backoff = Backoff(self.interval * 2, max(MAX_BACKOFF, self.interval))
        steps = 0
        while not self.stop_asked and (max_steps is None or steps < max_steps):
            steps += 1
            try:
                self.run_once()
                backoff.reset()
                pause = self.interval
            except RedisUnavailable as error:
                log.warning("scheduler step failed: %s", error)
                pause = backoff.next()
            if not self.stop_asked:
                self.sleep(pause)

    def run_once(self) -> StepReport:
        """One step. A queue or entry whose data is bad is logged and skipped; an unreachable
        Redis raises RedisUnavailable (run() retries with backoff). The first step refuses a
        Redis that may evict keys (EvictingServer) unless ``allow_eviction``."""
        report = StepReport()
        self.client.store.check_server("scheduler")  # once: its Redis user's too (acl)
        if not self._memory_checked:  # refuses a Redis that may evict our keys
            eviction.check(self.client.store.memory_policy(), "scheduler", self.allow_eviction,
                           log)
            self._memory_checked = True
        queues = self.client.queue_names()
        for queue in queues:
            self._guard(report, f"due tasks of {queue}", self._move_due, queue, report)
        for entry in self.cron_entries:
            self._guard(report, f"cron entry {entry.name}", self._fire, entry, report)
        current = self.clock()
        if self.recovery is not None and current >= self._next_recovery:
            self._next_recovery = current + self.recovery_interval
            self._guard(report, "recovery sweep", self._recover, queues, report)
        if current >= self._next_purge:
            self._next_purge = current + self.purge_interval
            for queue in queues:
                self._guard(report, f"purge of {queue}", self._purge, queue, report)
        return report

    def _guard(self, report: StepReport, what: str, step: Callable[..., None],
               *args: object) -> None:
        try:
            step(*args)
        except RedisUnavailable:
            raise
        except BluequeError as error:
            report.errors.append(f"{what}: {error}")
            log.error("scheduler: %s failed: %s", what, error)

    def _recover(self, queues: list[str], report: StepReport) -> None:
        assert self.recovery is not None
        report.recovered = self.recovery.sweep(queues)

    def _move_due(self, queue: str, report: StepReport) -> None:
        moved = self.client.get_queue(queue).enqueue_due_tasks()
        if moved:
            report.due[queue] = len(moved)
            log.info("enqueued %d due task(s) on %s", len(moved), queue)

    def _fire(self, entry: CronEntry, report: StepReport) -> None:
        """Fire the entry's due ticks, oldest first, each enqueue followed by its
        compare-and-set; on a lost compare-and-set, re-read and go on from there."""
        store = self.client.store
        now = self.clock()
        recorded = store.cron_ticks().get(entry.name)
        if recorded is None:
            # first sight of this entry: it fires the ticks after now, none before
            if store.advance_cron(entry.name, None, int(now)):
                log.info("cron entry %s registered; next tick at %s", entry.name,
                         format_time(entry.next_tick(now)))
            return
        while True:
            ticks, capped = entry.due_ticks(_tick(entry, recorded), now)
            if capped:
                report.skipped_ticks[entry.name] = 1
                log.warning(
                    "cron entry %s missed more than %d ticks since %s: firing only the last "
                    "%d", entry.name, entry.catch_up, format_time(_tick(entry, recorded)),
                    entry.catch_up,
                )
            for tick in ticks:
                task_id = self.client.get_queue(entry.queue).enqueue(
                    entry.parameters, task_id=entry.task_id(tick), **entry.options
                )
                if not store.advance_cron(entry.name, recorded, tick):
                    recorded = store.cron_ticks().get(entry.name)
                    break
                report.fired.setdefault(entry.name, []).append(task_id)
                log.info("cron entry %s fired tick %d as task %s on %s",
                         entry.name, tick, task_id, entry.queue)
                recorded = str(tick)
            else:
                return
            if recorded is None:
                return

    def _purge(self, queue: str, report: StepReport) -> None:
        q = self.client.get_queue(queue)
        ttl = Policy.resolve({}, q.config()).result_ttl
        if ttl <= 0:
            return
        deleted = sum(q.purge(state, ttl) for state in ENDED_LISTS)  # cancelled too
        if deleted:
            report.purged[queue] = deleted
            log.info("purged %d finished task(s) older than %g s from %s", deleted, ttl, queue)
