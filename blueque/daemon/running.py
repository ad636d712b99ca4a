"""One run of a task in a listener's child process, and how its ending reads in the logs."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from blueque.daemon.outputs import READ_LIMIT, TaskOutput
from blueque.display import format_seconds, last_line, shorten
from blueque.endings import Ending, RunEnd, Stopped
from blueque.policy import Policy
from blueque.process import signal_pid
from blueque.reporting import ChildChannel, OutcomeFrame, ToListener
from blueque.run_processes import RunMark
from blueque.statuses import CANCELLED, COMPLETE, FAILED, PENDING, SCHEDULED, state_of
from blueque.task_process.capture import LEAVING
from blueque.tasklog import TaskLogSettings

log = logging.getLogger("blueque.daemon")

#: A run's state: the stamp not yet confirmed, its task started for it, or refused.
RunState = Literal["starting", "running", "refused"]


@dataclass
class Running:
    """A child process running one attempt of one task (PROTOCOL.md 6.2).

    ``state``: "starting" until the stamp has started the task for it (repeated while Redis
    is away), then "running"; "refused" when the stamp refused the task (nothing ran). A run
    that starts is made by ``Running.starting`` (its attempt, policy and limits come with the
    stamp: blueque.daemon.starting).

    Who writes what: the listener's loop thread writes every field (its Starter, Supervisor,
    Recorder and Stopper, one at a time). One other thread touches a run, the exclusive
    guard's (blueque.daemon.exclusive): it reads ``pid``, ``task_id``, ``policy`` and
    ``exit_code``, and writes ``reason`` alone, only from "" to "lease" (one assignment of a
    str, whole under the GIL); the loop's Stopper sets ``reason`` only while it is "" as
    well, so a run's first reason stays, whichever thread gave it. Nothing else is written
    from the guard's thread."""

    task_id: str
    queue: str
    attempt: int | None
    started: float  # monotonic
    time_limit: float
    kill_grace: float
    policy: Policy
    pid: int = 0
    reason: Stopped = ""  # why we stop it (its group: Supervisor.stops)
    exit_code: int | None = None  # None while it runs, or when a signal ended it
    created: float | None = None  # the process's create time
    #: the task's fields once its ending is recorded (for the listener's log line)
    ending: dict[str, str] | None = None
    channel: ChildChannel | None = None  # the listener's end of the child's socket
    state: RunState = "running"
    #: the outcome frame the child sent, and the status recorded for it (None: not yet)
    report: OutcomeFrame | None = None
    recorded: str | None = None
    fields: dict[str, str] = field(default_factory=dict)  # the task as the stamp left it
    progress: tuple[float, str] | None = None  # the latest report, not written yet
    progress_due: float = 0.0  # monotonic: no progress write for this child before
    reported_at: float | None = None  # monotonic: when its outcome frame was taken in
    output_shipped: bool = False  # the rest of its reported attempt's output is in Redis
    gone: bool = False  # its task's hash is gone from Redis (said once: see Recorder)
    #: our read end of its output pipe (blueque.daemon.outputs): read in the loop into its file
    output: TaskOutput | None = None

    @classmethod
    def starting(cls, task_id: str, queue: str, pid: int, now: float, *,
                 created: float | None = None, channel: ChildChannel | None = None,
                 output: TaskOutput | None = None) -> Running:
        """A run whose process has its task and waits for the stamp (``state`` "starting"):
        no attempt yet, and no time limit or policy of its own until the stamp reads its
        task's (``now``: the loop's clock)."""
        return cls(task_id, queue, None, now, 0.0, Policy().kill_grace, Policy(), pid,
                   created=created, channel=channel, output=output, state="starting")

    def hear(self, frame: ToListener) -> None:
        """A frame its child sent: its outcome (nothing counts after it), or progress."""
        if self.report is not None:
            return
        if "outcome" in frame:
            self.report = frame
        elif "progress" in frame and self.state == "running":
            try:
                self.progress = (float(frame["progress"]), str(frame.get("message") or ""))
            except (TypeError, ValueError):
                log.warning("task %s: unreadable progress report %r", self.task_id, frame)

    def read_output(self, current: float, limit: int | None = READ_LIMIT) -> None:
        """What its output pipe holds into its attempt's file; the tail shipped when due
        (5.19); ``current``: the loop's clock."""
        output = self.output
        if output is None or self.state != "running" or self.attempt is None:
            return
        output.follow(self.queue, self.task_id, self.attempt, self.policy.result_ttl_ms(),
                      current)
        output.read(limit)
        if self.report is None:
            output.ship_due(current, always=bool(self.policy.keep_processes))

    def output_path(self, settings: TaskLogSettings) -> Path:
        """Its attempt's output file (as its pipe's reader named it, if it did)."""
        output = self.output
        if output is not None and output.path is not None \
                and output.attempt == (self.task_id, self.attempt):
            return output.path
        return settings.path(self.queue, self.task_id, self.attempt)

    def run_end(self, ending: Ending, listener: str, now: float, trace: str | None = None,
                attempt: int | None = None) -> RunEnd:
        """What finish.lua records of ``ending`` for this run (by default its own attempt)."""
        final = ending.outcome in ("complete", "failed")
        return RunEnd(
            self.queue, self.task_id, listener, self.pid,
            self.attempt if attempt is None else attempt, ending.outcome, ending.text, now,
            retry_eta=ending.eta, result_ttl_ms=self.policy.result_ttl_ms() if final else None,
            cancelled=ending.cancelled, traceback=trace)

    def mark(self) -> RunMark | None:
        """How its other processes are told (blueque.run_processes); None before the stamp
        told it its attempt (nothing of the task ran yet)."""
        if self.attempt is None:
            return None
        return RunMark.of(self.pid, self.queue, self.task_id, self.attempt)

    def record(self, listener: str, listener_pid: int, listener_created: float | None) -> str:
        """This run's entry in blueque_node_[node] (PROTOCOL.md): with its listener process,
        so that whoever reads it on this node can tell whether that very process lives."""
        head = json.dumps({"task": self.task_id, "queue": self.queue, "attempt": self.attempt})
        return head[:-1] + record_tail(self.created, listener, listener_pid, listener_created)


def record_tail(created: float | None, listener: str, listener_pid: int,
                listener_created: float | None) -> str:
    """A run record's fields after its task, queue and attempt (Running.record), from ", " to
    the closing brace: what take.lua appends to the record it writes for a warm process's
    next run (PROTOCOL.md 6.7)."""
    tail = json.dumps({"created": created, "listener": listener, "listener_pid": listener_pid,
                       "listener_created": listener_created})
    return ", " + tail[1:]


def output_fds(runs: Iterable[Running]) -> list[int]:
    """The read ends of the running runs' output pipes, for the loop's wait (5.19); not once
    a run reported its outcome (its output is in the pipe then, read when it is recorded: its
    pipe's hang-up at its exit would only wake the loop once more)."""
    return [r.output.fileno() for r in runs if r.output is not None and r.output.readable
            and r.state == "running" and r.report is None]


def output_deadlines(runs: Iterable[Running]) -> list[float]:
    """When the runs' output is to be shipped next."""
    return [r.output.due for r in runs
            if r.output is not None and r.output.shipper is not None and r.report is None]


def hand_over_outputs(runs: Iterable[Running], current: float) -> None:
    """A listener leaving its runs running (they outlive it, to be adopted): what their
    pipes hold to their files, then each is told to read its own pipe from now on."""
    for running in runs:
        if running.output is not None and running.state == "running":
            running.read_output(current)
            signal_pid(running.pid, LEAVING)  # not reaped yet: its pid is its own


#: The task fields describe_ending reads.
ENDING_FIELDS = ("status", "attempts", "error", "traceback", "eta", "cancelled", "updated",
                 "preempted_at")

#: How a run ended, in the "outcome" field of the listener's log: complete; failed (for good);
#: cancelled; retrying (failed, its next attempt scheduled); preempted (back to pending without
#: spending an attempt, its node going away); requeued (back to pending, never started);
#: superseded (the task had moved on to a later attempt); missing (its hash is not in Redis:
#: deleted, expired, or lost with Redis' data: a server restarted empty, a failover);
#: refused (the stamp refused it: nothing ran); unrecorded (Redis is away: recorded when it
#: is back); unsettled (its task is still reserved or started, though its run has ended).
LogOutcome = Literal["complete", "failed", "cancelled", "retrying", "preempted", "requeued",
                  "superseded", "missing", "refused", "unrecorded", "unsettled"]
#: The outcomes logged at warning: the run failed, or its ending is not what was meant.
WARNING_OUTCOMES: frozenset[LogOutcome] = frozenset({"failed", "retrying", "superseded",
                                                   "missing", "unrecorded", "unsettled"})


def describe_ending(fields: dict[str, str], attempt: int | None, took: str,
                    current: float) -> tuple[LogOutcome, str]:
    """How an attempt ended, for the listener's log: its outcome and a text such as
    ``complete in 3h12m``, ``failed in 2s: ValueError: bad``, ``failed in 2s, retry in 30s:
    ...``, ``cancelled in 5m: ...``, or where the task has moved on meanwhile."""
    status = state_of(fields)  # a cancelled task reads cancelled (its status is failed)
    # the exception with its type, from the traceback's last line; 1.0.1's error is its text
    error = shorten(last_line(fields.get("traceback")) or fields.get("error"), 200)
    if not fields:
        return "missing", (f"ended in {took}; its task's hash is not in Redis (deleted, "
                           "expired, or lost with Redis' data: a server restarted empty, a "
                           "failover to a replica without it)")
    if attempt is not None and fields.get("attempts") not in (None, str(attempt)):
        return "superseded", (f"ended in {took}, superseded: the task is {status} at attempt "
                              f"{fields.get('attempts')}")
    if status == COMPLETE:
        return "complete", f"complete in {took}"
    if status == CANCELLED:
        return "cancelled", f"cancelled in {took}: {error}"
    if status == FAILED:
        return "failed", f"failed in {took}: {error}"
    if status == SCHEDULED and fields.get("eta"):
        wait = format_seconds(max(0.0, float(fields["eta"]) - current))
        return "retrying", f"failed in {took}, retry in {wait}: {error}"
    if status == PENDING and fields.get("preempted_at") and (
            fields.get("preempted_at") == fields.get("updated")):  # its last change
        return "preempted", (f"preempted in {took}: the task is pending again, its attempt "
                             "not spent")
    if status == PENDING:
        return "requeued", f"ended in {took}, put back: the task is pending again"
    return "unsettled", f"ended in {took}; the task is {status}"
