"""How a listener records its children's endings (PROTOCOL.md 6.2): the outcome a child
reported, or what its exit says; by the one rule of blueque.endings, fenced by attempt."""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Callable, Mapping
from typing import Any

from blueque import failpoints
from blueque.daemon.running import (
    ENDING_FIELDS,
    WARNING_OUTCOMES,
    LogOutcome,
    Running,
    describe_ending,
)
from blueque.display import format_seconds
from blueque.endings import Ending, RunEnd, decide, describe_exit
from blueque.errors import BluequeError, InvalidTaskState, RedisUnavailable
from blueque.fencing import is_current_run, unstarted_verdict
from blueque.policy import Policy
from blueque.reporting import EXIT_NOT_STARTED, EXIT_REPORTED
from blueque.spool import Held, Spool, server_of
from blueque.statuses import (
    FINISHED_STATUSES,
    PENDING,
    RESERVED,
    SCHEDULED,
    STARTED,
    state_of,
)
from blueque.store import RedisStore, Take, Taken
from blueque.tasklog import TaskLogSettings, drop_if_empty, ship_rest

log = logging.getLogger("blueque.daemon")

#: Shortest time between two progress writes for one child: a task that reports in a tight
#: loop costs Redis ten writes a second, not one per report (PROTOCOL.md 6.2).
PROGRESS_SPACING = 0.1


#: Told of each run that ended (not a refused one): its task, queue, attempt and how long
#: it took (the loop's ListenerMetrics.task_ended).
CountEnding = Callable[[str, str, int | None, float], None]


class Recorder:
    def __init__(self, store: RedisStore, listener: str, node: str,
                 clock: Callable[[], float], rng: random.Random,
                 defaults: Callable[[str], dict[str, str]], *,
                 task_logs: TaskLogSettings | None = None, spool: Spool | None = None,
                 count_ending: CountEnding | None = None) -> None:
        self.store, self.listener, self.node = store, listener, node
        self.clock, self.rng, self.defaults = clock, rng, defaults
        #: where task output goes on the node (None: the listener's stderr)
        self.task_logs = task_logs
        self.count_ending = count_ending
        #: where endings Redis cannot take are written to outlive us (PROTOCOL.md 6.5)
        self.spool = spool
        self.spooled: set[tuple[str, int]] = set()  # (task, attempt) of the files we wrote
        self.unrecorded: list[tuple[Running, str]] = []  # endings of children gone
        self.ended_pids: list[str] = []  # to drop from blueque_node_[node]
        self.taken: Taken | None = None  # what the last finish took ahead (record_report)
        #: queue -> when the last run of ours recorded since our last renewal ended: the
        #: renewal writes it to blueque_listeners_seen_[queue] (PROTOCOL.md 6, step 2)
        self.seen: dict[str, float] = {}

    def settle(self, pid: int, status: int, running: Running, duration: float) -> None:
        """A reaped child: record its ending unless already done, count it, log it."""
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
        running.exit_code = code
        if running.output is not None:
            # the read end of its output pipe, ours since the fork: what it wrote last (before
            # a crash) is output too; then it is closed, whatever the ending (one descriptor
            # per run otherwise: select() refused the 1024th)
            running.read_output(self.clock(), limit=None)
            running.output.close()
        if running.recorded is None and running.state != "refused":
            if running.report is None:
                self.ended_pids.append(str(pid))
                if self.task_logs is not None and running.state == "running":
                    # it died without reporting: the listener ships the end of its output
                    # (a run told to go ran its task, whatever its exit code says: a task
                    # may leave with os._exit(3), the code a refused child leaves with)
                    ship_rest(self.store.bounded(0.0), self.task_logs, running.queue,
                              running.task_id, running.attempt, running.policy.result_ttl_ms())
            # an outcome it reported is recorded as reported; any other ending is checked
            # against the task, exit codes 0 and 3 included (a task function may call
            # os._exit itself): _record reads first
            self.unrecorded.append((running, describe_exit(status, running.reason,
                                                           running.time_limit)))
            self.record_unrecorded()
        elif running.state == "refused":
            self.ended_pids.append(str(pid))
        self.ended(pid, running, duration)

    def ended(self, pid: int, running: Running, duration: float) -> None:
        """A run has ended, its ending recorded or kept: its empty output file goes, it is
        counted and logged (its process exited, or waits warm for its next task: 6.7)."""
        if self.task_logs is not None and running.attempt is not None:
            # its writer is gone: an attempt that wrote nothing leaves no file (5.19)
            drop_if_empty(running.output_path(self.task_logs))
        if self.count_ending is not None and running.state != "refused":
            self.count_ending(running.task_id, running.queue, running.attempt, duration)
        log_end(self.node, pid, running, duration, self.store.now())

    def record_unrecorded(self) -> None:
        """Record endings of children that are gone: the outcome a child reported, or what
        its exit status says; kept until Redis accepts them."""
        while self.unrecorded:
            running, error = self.unrecorded[0]
            try:
                if running.report is not None:
                    self.record_report(running)
                elif running.state == "starting":
                    self.put_back(running)
                else:
                    self.record_exit(running, error)
            except RedisUnavailable:
                return
            except InvalidTaskState as refused:
                # recovered or cancelled between our read and our finish: its new state stands
                log.warning("task %s: ending not recorded: %s", running.task_id, refused)
            self.unrecorded.pop(0)

    def record_report(self, running: Running, take: Take | None = None) -> Taken | None:
        """Record the outcome a child reported (finish, fenced by its attempt), after the
        rest of its output and its last progress; then tell the child, which exits or waits
        for its next task. With ``take``, the next reservation goes in the same round trip
        (blueque.daemon.ahead): what it took is returned. Raises RedisUnavailable: the
        outcome is kept (and the child waits) until Redis takes it."""
        if running.output is not None and not running.output_shipped:
            # the process flushed its output into the pipe before it sent its outcome: all of
            # it goes to this attempt's file (not a warm process's next), then the end (5.19)
            running.read_output(self.clock())
            running.output.end()
            running.output_shipped = True
        ending, trace = self._reported(running)
        if running.progress is not None and running.state == "running":
            try:
                # its last report shows beside its outcome
                write_progress(self.store, running, self.clock)
            except RedisUnavailable:
                # refused or away: the outcome would be too; it is held (spooled) meanwhile
                self._hold(running.run_end(ending, self.listener, self.store.now(), trace),
                           forget=True)
                raise
        failpoints.hit("listener-before-finish")
        self.taken = None
        try:
            running.recorded = self._finish_run(running, ending, trace, forget=True, take=take)
        except InvalidTaskState as refused:  # StaleAttempt: it was taken back meanwhile
            running.recorded = ""
            running.ending = self.store.task_fields(running.task_id, ENDING_FIELDS)
            if not running.ending:
                say_gone(running)
            else:
                log.warning("task %s: outcome (%s) of attempt %s not recorded: %s",
                            running.task_id, ending.outcome, running.attempt, refused)
        failpoints.hit("listener-before-recorded")
        if running.channel is not None:  # a reaped child's is closed
            running.channel.send({"recorded": running.recorded})
        return self.taken

    def _reported(self, running: Running) -> tuple[Ending, str | None]:
        """The ending of the outcome a child reported (endings.decide), and its traceback."""
        report: Mapping[str, Any] = running.report or {}  # a child may send anything
        ran = report.get("outcome")
        ending = decide(running.policy, running.fields,
                        ran if ran in ("complete", "preempted") else "failed",
                        str(report.get("text") or ""), self.store.now(),
                        retry=bool(report.get("retry", True)), stopped=running.reason,
                        rng=self.rng)
        return ending, str(report.get("traceback") or "") or None

    def hold_report(self, running: Running) -> None:
        """Redis is away or refuses writes, and the step that records reported outcomes did
        not run: spool this child's (PROTOCOL.md 6.5), so that it outlives us."""
        if (running.report is None or running.recorded is not None or running.attempt is None
                or (running.task_id, running.attempt) in self.spooled):
            return
        ending, trace = self._reported(running)
        self._hold(running.run_end(ending, self.listener, self.store.now(), trace),
                           forget=True)

    def _finish_run(self, running: Running, ending: Ending, trace: str | None = None,
                    forget: bool = False, listener: str | None = None,
                    attempt: int | None = None, take: Take | None = None) -> str:
        """Record ``ending`` for the child's run (finish, fenced by its attempt); with
        ``forget``, drop its run record in the same round trip, and with ``take``, take the
        next reservation there too (kept in ``taken``, even when the finish is refused).
        Keeps what was recorded for the listener's log line."""
        end = running.run_end(ending, listener or self.listener, self.store.now(), trace,
                              attempt)
        forget_run = (self.node, running.pid) if forget else None
        renews = end.listener == self.listener  # not a dead listener's run we adopted
        try:
            if take is None:
                status = self.store.finish(end, forget_run=forget_run, renews=renews)
            else:
                outcome, self.taken = self.store.finish_and_take(end, forget_run, take, renews)
                if isinstance(outcome, BluequeError):
                    raise outcome
                status = outcome
        except RedisUnavailable:
            self._hold(end, forget)
            raise
        if renews:
            self.seen[end.queue] = max(end.now, self.seen.get(end.queue, end.now))
        if self.spool is not None and (end.task_id, end.attempt) in self.spooled:
            self.spooled.discard((end.task_id, end.attempt or 0))
            self.spool.release(end.task_id, end.attempt)  # recorded: the file is moot
        current = end.now
        # the fields finish.lua wrote that describe_ending reads
        running.ending = {"status": status, "attempts": str(running.attempt),
                          "updated": repr(current)}
        if ending.outcome == "preempted":
            running.ending["preempted_at"] = repr(current)
        elif ending.outcome != "complete":
            running.ending.update(error=ending.text, traceback=trace or "",
                                  eta="" if ending.eta is None else repr(ending.eta),
                                  cancelled=repr(current) if ending.cancelled else "")
        return status

    def _hold(self, end: RunEnd, forget: bool) -> None:
        """Redis did not take ``end``: besides memory, the spool keeps it (once per run), so
        that the node's next listener records it if we die before Redis takes it (6.5)."""
        if self.spool is None or end.attempt is None or (end.task_id, end.attempt) in self.spooled:
            return
        if self.spool.hold(Held(end, self.node if forget else None, server_of(self.store))):
            self.spooled.add((end.task_id, end.attempt))

    def record_exit(self, running: Running, error: str) -> None:
        """The ending of a child that reported no outcome, from its exit status."""
        said = running.exit_code in (EXIT_REPORTED, EXIT_NOT_STARTED) and not running.reason
        if said:
            fields = self.store.task_fields(running.task_id, (*ENDING_FIELDS, "pid", "node"))
            if fields.get("status") != STARTED or not self._its_run(running, fields):
                # it recorded an outcome itself, or never started the task
                running.ending = fields
                return
        data = self.store.task_data(running.task_id)
        if data.get("status") not in (RESERVED, STARTED) or not self._its_run(running, data):
            # the task moved on (recovered, cancelled), or the stamp never started it
            running.ending = data
            return
        attempt = running.attempt
        if attempt is None and data.get("attempts", "").isdigit():
            attempt = int(data["attempts"])  # a stamp whose reply was lost, by its pid
        policy = running.policy
        if running.state != "running":  # never told its policy: read it now
            policy = running.policy = Policy.resolve(data, self.defaults(running.queue))
        ending = decide(policy, data, "failed", error, self.store.now(), stopped=running.reason,
                        rng=self.rng)
        status = self._finish_run(running, ending, listener=data.get("node") or self.listener,
                                  attempt=attempt)
        running.ending = self.store.task_fields(running.task_id, ENDING_FIELDS)
        outcome, _ = describe_ending(running.ending, running.attempt, "", self.store.now())
        # the task's state: a run stopped by a cancel reads cancelled, not failed
        shown = state_of(running.ending) or status
        log.warning("task %s queue %s: %s -> %s", running.task_id, running.queue, error, shown,
                    extra={"task_id": running.task_id, "queue": running.queue,
                           "event": "recorded", "outcome": outcome})

    def put_back(self, running: Running) -> None:
        """A child that ended before it was told to go never ran its task: whether or not
        the stamp (whose reply never came) started it for that child, the task goes back to
        the head of the line, its attempt not held against it (recover, verdict pending)."""
        data = self.store.task_data(running.task_id)
        verdict = unstarted_verdict(running.task_id, data, self.listener, running.pid)
        running.ending = data
        if data and verdict.kind == "pending":  # a hash that is gone is left to the heal
            self.store.recover(running.queue, self.listener, [verdict], self.store.now(),
                               mode="host", release=False)
            running.ending = {"status": PENDING}

    def _its_run(self, running: Running, data: dict[str, str]) -> bool:
        """Is the task's current run this child's (blueque.fencing)? By attempt, once the
        stamp told it; for a stamp whose reply never came, by the pid it would have written."""
        return is_current_run(data, self.listener, running.attempt, running.pid)

    def forget_ended(self) -> None:
        """Drop the runs that ended from blueque_node_[node]. Raises RedisUnavailable (they
        are dropped at a later step)."""
        if self.ended_pids:
            self.store.forget_runs(self.node, self.ended_pids)
            self.ended_pids = []


def write_progress(store: RedisStore, running: Running, clock: Callable[[], float]) -> None:
    """Write a child's latest progress (progress.lua, fenced by its attempt); the next one
    no sooner than PROGRESS_SPACING from now."""
    if running.progress is None or running.attempt is None:
        return
    fraction, message = running.progress
    try:
        if not running.gone:
            store.progress(running.task_id, running.attempt, fraction, message,
                                store.now())
    except InvalidTaskState as error:  # StaleAttempt: superseded; dropped
        fields = store.task_fields(running.task_id, ("status", "attempts"))
        if not fields:  # Redis lost it (flushed, or back empty): said once per run
            say_gone(running)
        elif (fields.get("status") in (*FINISHED_STATUSES, SCHEDULED)
                and fields.get("attempts") == str(running.attempt)):
            # this attempt has ended (its run recorded that itself when its listener was
            # silent a lease, as in an outage): its last progress is moot, nothing lost
            log.debug("progress of task %s not recorded: %s", running.task_id, error)
        else:
            log.warning("progress of task %s not recorded: %s", running.task_id, error)
    running.progress = None
    running.progress_due = clock() + PROGRESS_SPACING


def log_end(node: str, pid: int, running: Running, duration: float, now: float) -> None:
    """One line per run: its outcome (the log's "outcome" field, at warning for a failure)
    and how its process ended ("process_end": reported its outcome, died, or not started)."""
    process = ("not started" if running.state in ("refused", "starting")
               else "reported" if running.report is not None else "died")
    took = format_seconds(duration)
    outcome: LogOutcome
    if running.state == "refused":
        outcome, what = "refused", "not started: the stamp refused it"
    elif running.ending is None:
        outcome, what = "unrecorded", f"ended in {took}, to be recorded when Redis is back"
    else:
        outcome, what = describe_ending(running.ending, running.attempt, took, now)
    log.log(logging.WARNING if outcome in WARNING_OUTCOMES else logging.INFO,
            "task %s queue %s attempt %s %s (pid %d %s, node %s)", running.task_id,
            running.queue, running.attempt, what, pid, process, node, extra={
                "task_id": running.task_id, "queue": running.queue, "pid": pid,
                "attempt": running.attempt, "node": node,
                "duration": round(duration, 6), "event": "ended", "outcome": outcome,
                "process_end": process, "ending": what})


def say_gone(running: Running) -> None:
    """Its task's hash is gone from Redis: said once per run, in one clear line."""
    if not running.gone:
        running.gone = True
        log.warning("task %s is gone from Redis (its hash was lost): its run goes on, its "
                    "ending cannot be recorded", running.task_id, extra={
                        "task_id": running.task_id, "queue": running.queue,
                        "event": "gone"})
