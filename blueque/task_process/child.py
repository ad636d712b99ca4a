"""The forked process that runs one task.

The listener daemon's children (``run_reporting_child``) report to their listener over a
socket and let it record start, progress and outcome (PROTOCOL.md 6.2); a child whose listener
is gone records them itself, fenced by attempt. ``run_child`` (blueque 1.0.1's
``ForkingRunner.fork_task``) starts and records its task itself. Either way the child leads
its own session (so a listener's death or restart does not kill it, and a time limit can kill
its whole process group), reseeds random, and always leaves through ``os._exit``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

from blueque import failpoints
from blueque.endings import RunEnd, decide
from blueque.errors import (
    BluequeError,
    Preempted,
    RedisUnavailable,
)
from blueque.fencing import is_current_run
from blueque.leftovers import stop_own
from blueque.policy import Policy, queue_limit
from blueque.preemption import notice, on_preempt, preempt_deadline, preempted
from blueque.process import create_time, set_title
from blueque.processor import Processor, encode_result
from blueque.reporting import (
    EXIT_NOT_STARTED,
    EXIT_REPORT_FAILED,
    EXIT_REPORTED,
    OutcomeFrame,
    ParentLink,
)
from blueque.run_processes import TASK_VARIABLE, RunMark, task_mark, task_title
from blueque.spool import Held, Spool, server_of
from blueque.task import Task
from blueque.task_process import capture as captured_output
from blueque.task_process import progress
from blueque.task_process.calling import CallOutcome, TaskFunction, execute
from blueque.task_process.progress import ParentProgress, ProgressReporter, report_progress
from blueque.tasklog import TaskLogSettings, resumed_shipper

if TYPE_CHECKING:
    from blueque.store import RedisStore

log = logging.getLogger("blueque.child")

#: What task functions imported from here before ``blueque`` had it all (the rest: machinery).
__all__ = ["Preempted", "TaskFunction", "on_preempt", "preempt_deadline", "preempted",
           "report_progress", "run_child", "run_reporting_child"]

#: How long a finished child keeps retrying to record its outcome while Redis is away.
REPORT_PATIENCE = 3600.0


# --- blueque 1.0.1's fork_task: the child starts and records its task itself --------------------
def _run(store: RedisStore, task: Task, function: TaskFunction, policy: Policy,
         task_logs: TaskLogSettings | None = None) -> int:
    processor = Processor(task, store)
    pid = os.getpid()
    try:
        processor.start(pid, create_time(pid))
    except RedisUnavailable as error:
        # the start may have been recorded before the reply was lost: the parent settles it
        log.error("task %s: could not start it: %s", task.id, error)
        return EXIT_REPORT_FAILED
    except BluequeError as error:
        log.warning("task %s not started: %s", task.id, error)
        return EXIT_NOT_STARTED
    return _run_orphan(store, _refreshed(task), task.queue or "", function, policy, task_logs)


def _run_orphan(store: RedisStore, task: Task, queue: str, function: TaskFunction,
                policy: Policy, task_logs: TaskLogSettings | None,
                spool: Spool | None = None) -> int:
    """Run a started task and record its outcome in Redis (no listener records it); then stop
    what it left behind itself (no listener does)."""
    notice.install(None)  # an adopter's notice comes without a deadline
    _mark(task, queue)
    reporter = ProgressReporter(Processor(task, store.bounded(0.0)))
    progress.install(reporter)
    if _own_output(store, task, policy, task_logs):
        captured_output.take_over()  # no listener reads its pipe: it does
    outcome = execute(function, task, _result_limit(store, queue))
    reporter.close()
    _end_output(outcome.traceback, task_logs is not None)
    code = _record_itself(store, Processor(task, store), policy, outcome, spool)
    _leave_nothing(task, queue, policy)
    return code


def _result_limit(store: RedisStore, queue: str) -> int:
    """Its queue's max_result_bytes, for a run no listener told it (the default when Redis
    cannot say)."""
    try:
        return queue_limit(store.bounded(REPORT_PATIENCE / 60).queue_config(queue),
                           "max_result_bytes")
    except BluequeError:
        return queue_limit({}, "max_result_bytes")


def _mark(task: Task, queue: str) -> None:
    """The task process's title, and the mark (BLUEQUE_TASK) everything it starts inherits:
    how the run's processes are told once they leave its group (blueque.leftovers)."""
    set_title(task_title(queue, task.id, task.attempts or 0))
    os.environ[TASK_VARIABLE] = task_mark(task.id, task.attempts or 0)


def _leave_nothing(task: Task, queue: str, policy: Policy) -> None:
    """A run that records its own outcome stops the processes it started (SIGTERM, SIGKILL
    after its kill_grace), unless its task keeps them (keep_processes)."""
    if policy.keep_processes:
        return
    run = RunMark.of(os.getpid(), queue, task.id, task.attempts or 0)
    try:
        left = stop_own(run, policy.kill_grace)
    except OSError as error:
        log.error("task %s: could not stop the processes it left: %s", task.id, error)
        return
    if left:
        log.warning("task %s: %d process(es) it started were still there after its kill_grace "
                    "of %g s: killed", task.id, left, policy.kill_grace)


def _record_itself(store: RedisStore, processor: Processor, policy: Policy,
                   outcome: CallOutcome, spool: Spool | None = None) -> int:
    """Record the outcome, holding on to it while Redis is away or refuses it (the work is
    done): in memory, and in the node's spool (PROTOCOL.md 6.5) should this process end too."""
    task_id = processor.task.id
    from blueque.retry import Backoff  # redis-py's errors: only a child that records itself

    backoff, deadline = Backoff(0.1, 5.0), time.monotonic() + REPORT_PATIENCE
    end = _run_end(processor, policy, outcome, store.now())
    # first of all on the node's disk: its listener is gone, and nothing else holds it should
    # this process end before Redis takes it (each try may wait the whole retry_deadline)
    spooled = spool is not None and spool.hold(Held(end, None, server_of(store)), quiet=True)
    said = False
    while True:
        try:
            processor.record(end)
            if spooled and spool is not None:
                spool.release(end.task_id, end.attempt)
            return EXIT_REPORTED
        except RedisUnavailable as error:
            if time.monotonic() > deadline:
                log.error("task %s: gave up recording its outcome: %s", task_id, error)
                return EXIT_REPORT_FAILED
            delay = backoff.next()
            log.log(logging.DEBUG if said else logging.WARNING,
                    "task %s: %s; retrying until Redis takes it", task_id, error)
            said = True
            time.sleep(delay)
        except BluequeError as error:
            log.error("task %s: outcome (%s) not recorded: %s", task_id, outcome.outcome, error)
            return EXIT_REPORT_FAILED


def _own_output(store: RedisStore, task: Task, policy: Policy,
                task_logs: TaskLogSettings | None) -> bool:
    """How this process ships the attempt's output should it read its own pipe (its listener
    gone: 5.19): from where the stream stops, every ``interval``. False: no pipe of its own."""
    pipe = captured_output.current
    if task_logs is None or pipe is None:
        return False
    pipe.interval = task_logs.interval
    pipe.shipper_factory = lambda: resumed_shipper(
        store.bounded(0.0), task_logs, task.queue or "", task.id, task.attempts,
        policy.result_ttl_ms())
    return True


def _end_output(trace: str | None, ship: bool) -> None:
    """Its function has returned: the traceback to its output (the task's own log shows why
    it failed, where it failed), and its streams flushed into the pipe (a last line printed
    without its newline is output too); with ``ship``, in a process that read its own pipe,
    the rest of the file and the attempt's end mark shipped."""
    if trace:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(trace)
    captured_output.flush()
    if ship and captured_output.current is not None:
        shipper = captured_output.current.end()
        if shipper is not None:
            shipper.ship(end=True)


def _refreshed(task: Task) -> Task:
    """The task as start left it; a Redis that went away right after the start (which the
    retry policy rode out) leaves the task as it was read: its parameters do not change."""
    try:
        return task.refresh()
    except RedisUnavailable as error:
        log.warning("task %s: could not re-read it (%s); running it as reserved", task.id, error)
        return task


def _run_end(processor: Processor, policy: Policy, outcome: CallOutcome, current: float) -> RunEnd:
    """The ending to record, as the one rule (blueque.endings) says, from the task's fields
    (``current``: now, on Redis' clock)."""
    ending = decide(policy, processor.task.data, outcome.outcome, outcome.text, current,
                    retry=outcome.retry)
    if ending.outcome == "complete":
        return processor.run_end("complete", encode_result(ending.text),
                                 result_ttl_ms=policy.result_ttl_ms())
    if ending.outcome == "preempted":
        return processor.run_end("preempted", ending.text)
    if ending.outcome == "retry" and ending.eta is not None:
        return processor.run_end("retry", encode_result(ending.text), retry_eta=ending.eta,
                                 traceback=outcome.traceback)
    return processor.run_end("failed", encode_result(ending.text),
                             result_ttl_ms=policy.result_ttl_ms(), traceback=outcome.traceback)


def prepare_process(title: str, listener: int = -1) -> None:
    """The first steps of every task process: its own session, random and signals
    (``listener``: its socket to its listener, if it has one)."""
    os.setsid()
    random.seed()
    signal.set_wakeup_fd(-1)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    captured_output.watch_listener(listener)  # its output pipe is read by its listener (5.19)
    set_title(title)


def _capture(task_logs: TaskLogSettings | None, task: Task, policy: Policy,
             pipe: tuple[int, int] | None = None) -> TaskLogSettings | None:
    if task_logs is None:
        return None
    path = task_logs.path(task.queue or "", task.id, task.attempts)
    captured = captured_output.capture_attempt(path, task_logs.max_bytes,
                                               bool(policy.keep_processes), pipe)
    return task_logs if captured else None


def leave_process(code: int) -> NoReturn:
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    captured_output.flush()
    os._exit(code)


def run_child(store: RedisStore, task: Task, function: TaskFunction, policy: Policy,
              task_logs: TaskLogSettings | None = None) -> NoReturn:
    """Body of a child that starts and records its task itself (``ForkingRunner.fork_task``);
    never returns. ``policy`` is the one the parent resolved for this task at fork time.
    With ``task_logs``, its stdout and stderr are the attempt's log file (5.19)."""
    code = EXIT_REPORT_FAILED
    try:
        prepare_process(f"blueque: {task.queue} {task.id} attempt {task.attempts}")
        code = _run(store, task, function, policy, _capture(task_logs, task, policy))
    except BaseException:
        traceback.print_exc()
    finally:
        leave_process(code)


# --- the listener daemon's children: the listener records (PROTOCOL.md 6.2) ---------------------
@dataclass(frozen=True)
class Assignment:
    """What a listener daemon's child knows when it is forked: the task id it will run (its
    listener has moved it into its reserved list), that listener, and how long to wait for a
    frame once it runs (``patience``: the listener's lease; a listener silent that long may
    have been taken for dead). For the word to start it waits as long as its listener lives:
    until then nothing runs, so nothing is lost by waiting."""

    task_id: str
    queue: str
    listener: str
    patience: float
    spool: Spool | None = None  # where it holds its ending should it have to record it
    output: tuple[int, int] | None = None  # the pipe its output goes through (capture.py)
    node: str = ""  # its node identity: where a warm process finds a run taken for it (6.7)


def run_reporting_child(store: RedisStore, sock: socket.socket, assignment: Assignment,
                        function: TaskFunction, task_logs: TaskLogSettings | None = None
                        ) -> NoReturn:
    """Body of a listener daemon's child; never returns. It waits for its listener's word,
    runs the task, reports the outcome over ``sock`` and exits once the listener recorded
    it. Without a listener (end of file), it records what it must itself."""
    code = EXIT_REPORT_FAILED
    try:
        prepare_process(f"blueque: {assignment.queue} {assignment.task_id} starting",
                        sock.fileno())
        code = run_reporting(store, ParentLink(sock, assignment.patience), assignment,
                              function, task_logs)
    except BaseException:
        traceback.print_exc()
    finally:
        leave_process(code)


def run_reporting(store: RedisStore, link: ParentLink, assignment: Assignment,
                   function: TaskFunction, task_logs: TaskLogSettings | None) -> int:
    word = link.receive(forever=True)
    if word is None:  # the listener died before telling: did its stamp start us?
        return _run_unannounced(store, assignment, function, task_logs)
    if "go" not in word:
        return EXIT_NOT_STARTED  # refused (cancelled meanwhile, a duplicate...): nothing ran
    notice.install(link)
    task = Task(assignment.task_id, store, dict(word["go"]))
    policy = Policy.resolve(task.data, dict(word.get("defaults") or {}))
    _mark(task, assignment.queue)
    task_logs = _capture(task_logs, task, policy, assignment.output)
    if _own_output(store, task, policy, task_logs) and (
            captured_output.listener_gone() or link.peer_closed()):
        captured_output.take_over()  # its listener died before its pipe was ours to read
    reporter = ParentProgress(link, lambda: ProgressReporter(Processor(task, store.bounded(0.0))))
    progress.install(reporter)
    outcome = execute(function, task, queue_limit(word.get("defaults") or {}, "max_result_bytes"))
    reporter.close()
    # its output into the pipe before its outcome: the listener, hearing it, drains the pipe
    # into this attempt's file, then ships the rest and the end mark (5.19)
    _end_output(outcome.traceback, ship=False)
    sent = link.send(OutcomeFrame(outcome=outcome.outcome, text=outcome.text,
                                  traceback=outcome.traceback, retry=outcome.retry))
    failpoints.hit("child-after-outcome")
    if sent and link.receive() is not None:
        return EXIT_REPORTED  # "recorded": the listener wrote it
    # the listener is gone or frozen (before or after recording: a repeated finish changes
    # nothing, and one of a run that was taken back meanwhile is refused)
    if link.hung_up:
        log.warning("task %s: its listener %s is gone (its end of the link closed); recording "
                    "the outcome itself", task.id, assignment.listener)
    else:  # silent past our patience: frozen (SIGSTOP), or stuck on a Redis that does not answer
        log.warning("task %s: its listener %s did not answer its outcome within %g s (its "
                    "lease); it may be alive but stopped or stuck; recording the outcome "
                    "itself", task.id, assignment.listener, assignment.patience)
    if task_logs is not None:
        captured_output.take_over()  # what is left in its pipe, and its end, are its own
        _end_output(None, ship=True)
    code = _record_itself(store, Processor(task, store), policy, outcome, assignment.spool)
    _leave_nothing(task, assignment.queue, policy)
    return code


def _run_unannounced(store: RedisStore, assignment: Assignment, function: TaskFunction,
                     task_logs: TaskLogSettings | None) -> int:
    """The listener died between the fork and its word. If its stamp made the task started
    by this very process, run it as an orphan (the node's next listener adopts it); else
    nothing was recorded for this process: leave, and recovery puts the task back. The read
    waits for Redis a lease at most: a process no record names must not linger beside the
    runs of the node's next listener, which cannot count it in its slots."""
    try:
        data = store.bounded(assignment.patience).task_data(assignment.task_id)
    except BluequeError as error:
        log.error("task %s: its listener is gone and its state cannot be read (%s); not "
                  "running it", assignment.task_id, error)
        return EXIT_NOT_STARTED
    if not is_current_run(data, assignment.listener, None, os.getpid()):
        return EXIT_NOT_STARTED
    task = Task(assignment.task_id, store, data)
    try:
        policy = Policy.resolve(data, store.queue_config(assignment.queue))
    except BluequeError:
        policy = Policy.resolve(data, {})
    task_logs = _capture(task_logs, task, policy, assignment.output)
    log.warning("task %s: its listener %s died after starting it; running it as an orphan",
                task.id, assignment.listener)
    return _run_orphan(store, task, assignment.queue, function, policy, task_logs,
                       assignment.spool)
