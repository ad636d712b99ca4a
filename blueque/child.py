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
import importlib
import logging
import os
import random
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from blueque import failpoints
from blueque import keys as k
from blueque.endings import Ran, decide
from blueque.errors import (
    BluequeError,
    CallbackError,
    ConfigurationError,
    Preempted,
    RedisUnavailable,
)
from blueque.policy import Policy
from blueque.process import create_time, set_title
from blueque.processor import Processor, encode_result
from blueque.reporting import ParentLink
from blueque.store import RedisStore, now
from blueque.task import Task
from blueque.tasklog import Shipper, TaskLogSettings, capture

log = logging.getLogger("blueque.child")

TaskFunction = Callable[[Task], Any]

#: Exit codes of the child; anything else (or a signal) means it died without reporting.
EXIT_REPORTED = 0
EXIT_NOT_STARTED = 3  # the task could not be started (cancelled, superseded): nothing ran
EXIT_REPORT_FAILED = 4  # ran, but its outcome could not be recorded (see the log)
#: How long a finished child keeps retrying to record its outcome while Redis is away.
REPORT_PATIENCE = 3600.0

#: Longest pause between two tries to send a progress report Redis did not take.
PROGRESS_RETRY_MAX = 5.0


class ProgressReporter:
    """Sends a running task's progress; never raises into the task function.

    Progress is best effort: while Redis is away the latest value is kept (older ones are
    superseded) and a background thread sends it once Redis is back, with a backoff; a
    report made meanwhile replaces it and returns at once. A report Redis refuses (the run
    was superseded: StaleAttempt) is dropped and logged. Reports go through a store without
    retries, so that a task never waits for Redis in ``report_progress``."""

    def __init__(self, processor: Processor) -> None:
        self._processor = processor
        self._lock = threading.Lock()  # guards _pending, _retry_at, _closed
        self._sending = threading.Lock()  # one sender at a time
        self._pending: tuple[float, str] | None = None
        self._retry_at = 0.0
        self._delay = 0.1
        self._kept = False  # a send failed: the value waits for Redis
        self._closed = False
        self._wakeup = threading.Event()
        self._thread: threading.Thread | None = None

    def report(self, fraction: float, message: str) -> None:
        if not 0.0 <= fraction <= 1.0:
            raise ConfigurationError(f"progress must be between 0 and 1, not {fraction}")
        with self._lock:
            if self._closed:
                return
            self._pending = (fraction, message)
        self._send()

    def _send(self) -> None:
        """Send the latest value unless another send is under way (it picks the latest up)
        or a failed send's backoff has not passed (the background thread sends it then)."""
        if not self._sending.acquire(blocking=False):
            return
        try:
            while True:
                with self._lock:
                    value = self._pending
                    if value is None or time.monotonic() < self._retry_at:
                        return
                try:
                    self._processor.progress(*value)
                except RedisUnavailable as error:
                    self._postpone(error)
                    return
                except BluequeError as error:  # superseded (StaleAttempt), or not started
                    log.warning("progress of task %s not recorded: %s",
                                self._processor.task.id, error)
                with self._lock:
                    if self._kept:
                        log.info("task %s: kept progress recorded", self._processor.task.id)
                    self._delay, self._kept = 0.1, False
                    if self._pending is value:
                        self._pending = None
                        return
        finally:
            self._sending.release()

    def _postpone(self, error: BluequeError) -> None:
        with self._lock:
            if not self._kept:
                log.warning("task %s: progress kept until Redis is back: %s",
                            self._processor.task.id, error)
            self._kept = True
            self._retry_at = time.monotonic() + self._delay
            self._delay = min(PROGRESS_RETRY_MAX, self._delay * 2)
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._retry, name="blueque-progress",
                                                daemon=True)
                self._thread.start()
        self._wakeup.set()

    def _retry(self) -> None:
        """Background: send the kept value each time its backoff has passed, until sent."""
        while True:
            with self._lock:
                if self._closed or self._pending is None:
                    self._thread = None
                    return
                wait = self._retry_at - time.monotonic()
                if wait <= 0:
                    self._retry_at = 0.0
            if wait > 0:
                self._wakeup.wait(wait)
                self._wakeup.clear()
            else:
                self._send()
                self._wakeup.wait(0.01)  # a concurrent report may be sending: let it finish
                self._wakeup.clear()

    def close(self) -> None:
        """The task function returned: one last try for a kept value, then drop it (the
        outcome, recorded next, is what counts)."""
        with self._lock:
            self._retry_at = 0.0
        self._send()
        with self._lock:
            self._closed = True
            if self._pending is not None:
                log.info("task %s: last progress report dropped (Redis unavailable)",
                         self._processor.task.id)
            self._pending = None
        self._wakeup.set()


class ParentProgress:
    """Progress of a listener daemon's child, sent to its listener (PROTOCOL.md 6.2).

    A thread sends the latest value, so ``report`` never waits for the listener; values that
    come faster than they can be sent are superseded. Once the listener is gone, a
    ProgressReporter writes to Redis instead (best effort, as ever)."""

    def __init__(self, link: ParentLink, direct: Callable[[], ProgressReporter]) -> None:
        self._link = link
        self._make_direct = direct
        self._direct: ProgressReporter | None = None
        self._lock = threading.Lock()  # guards _pending, _direct, _closed, _thread
        self._pending: tuple[float, str] | None = None
        self._closed = False
        self._wakeup = threading.Event()
        self._thread: threading.Thread | None = None

    def report(self, fraction: float, message: str) -> None:
        if not 0.0 <= fraction <= 1.0:
            raise ConfigurationError(f"progress must be between 0 and 1, not {fraction}")
        with self._lock:
            if self._closed:
                return
            direct = self._direct
            if direct is None:
                self._pending = (fraction, message)
                if self._thread is None:
                    self._thread = threading.Thread(target=self._send, name="blueque-progress",
                                                    daemon=True)
                    self._thread.start()
        if direct is not None:
            direct.report(fraction, message)
        else:
            self._wakeup.set()

    def _send(self) -> None:
        while True:
            self._wakeup.wait()
            self._wakeup.clear()
            with self._lock:
                value, self._pending, closed = self._pending, None, self._closed
            if value is not None and not self._link.send(
                    {"progress": value[0], "message": value[1]}):
                self._orphaned(value)
                return
            if closed:
                return

    def _orphaned(self, value: tuple[float, str]) -> None:
        """The listener is gone: from now on progress goes to Redis directly."""
        direct = self._make_direct()
        with self._lock:
            self._direct = direct
            latest, self._pending = self._pending or value, None
        direct.report(*latest)

    def close(self) -> None:
        """The task function returned: what is under way is sent before its outcome."""
        with self._lock:
            self._closed = True
            thread, direct = self._thread, self._direct
        self._wakeup.set()
        if thread is not None:
            thread.join()
        if direct is not None:
            direct.close()


_current: ProgressReporter | ParentProgress | None = None


class Preemption:
    """The notice that this task's node goes away (PROTOCOL.md 6.3), as a task process gets
    it: SIGUSR1 from its listener, whose frame before it gives the deadline. The handler runs
    in the task's main thread, between two bytecodes: it notes the notice and runs the
    callbacks registered with ``on_preempt`` (an exception in one is logged, never raised
    into the task)."""

    def __init__(self) -> None:
        self.deadline: float | None = None
        self.noticed = False
        self.callbacks: list[Callable[[], object]] = []
        self.link: ParentLink | None = None

    def install(self, link: ParentLink | None) -> None:
        self.link = link
        signal.signal(signal.SIGUSR1, self._notice)

    def _notice(self, signum: int, frame: object) -> None:
        if self.link is not None:
            for message in self.link.pending():
                if "preempt" in message:
                    with contextlib.suppress(TypeError, ValueError):
                        self.deadline = float(message["preempt"])
        if self.noticed:
            return
        self.noticed = True
        log.warning("this task's node goes away%s: it should save what it has and stop "
                    "(raise blueque.Preempted)", "" if self.deadline is None else
                    f" in {max(0.0, self.deadline - time.time()):.0f} s")
        for callback in list(self.callbacks):
            self.call(callback)

    @staticmethod
    def call(callback: Callable[[], object]) -> None:
        try:
            callback()
        except Exception:
            log.exception("an on_preempt callback raised; the task goes on")


_preemption = Preemption()


def preempted() -> bool:
    """True once this task's node has announced that it goes away (``blueque preempt`` or
    SIGUSR1 to the listener): save a checkpoint and stop by raising ``blueque.Preempted``;
    the task then runs again elsewhere without spending an attempt."""
    return _preemption.noticed


def preempt_deadline() -> float | None:
    """When the node goes away (Unix s) once preempted, if its listener said; None else.
    After it, the task's process group is terminated."""
    return _preemption.deadline


def on_preempt(callback: Callable[[], object]) -> None:
    """Call ``callback()`` (in the task's main thread) when the node announces that it goes
    away; at once if it already has. Typically it saves a checkpoint and sets a flag the task
    loop checks, or raises blueque.Preempted to stop the task where it is."""
    _preemption.callbacks.append(callback)
    if _preemption.noticed:
        _preemption.call(callback)


def report_progress(fraction: float, message: str = "") -> None:
    """Called from inside a task function: record how far the task has got (0.0 to 1.0).

    Best effort, and it never fails the task: while Redis is unavailable the latest value is
    kept and sent when Redis is back (or dropped when the task ends first); a report of a
    run that was superseded is dropped. Raises only for a fraction outside 0..1
    (ConfigurationError) and outside a running task (BluequeError)."""
    if _current is None:
        raise BluequeError("report_progress() is only available inside a running task")
    _current.report(fraction, message)


def import_function(spec: str) -> TaskFunction:
    """``package.module:function`` -> the function; CallbackError says what is wrong."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise CallbackError(f"task function {spec!r} must look like package.module:function")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:
        raise CallbackError(
            f"cannot import module {module_name!r} for task function {spec!r}: {error}"
        ) from error
    target: Any = module
    for part in attribute.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise CallbackError(
                f"module {module_name!r} has no attribute {attribute!r} for task function "
                f"{spec!r}"
            )
    if not callable(target):
        raise CallbackError(f"{spec!r} is not callable")
    return target  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Outcome:
    """What one call of the task function came to."""

    outcome: Ran  # complete, failed, or preempted (it raised Preempted)
    text: str  # the result, or the error (1.0.1's str(exception))
    traceback: str | None = None
    retry: bool = True  # False: the work finished (its value could not be encoded)


def execute(function: TaskFunction, task: Task) -> Outcome:
    """Call the task function; never raises. sys.exit() and KeyboardInterrupt end the task,
    not the child: they are recorded as what they are. Preempted stops it to run again
    elsewhere (PROTOCOL.md 6.3)."""
    try:
        result = function(task)
    except Preempted as error:
        return Outcome("preempted", str(error) or "the task stopped: its node goes away")
    except (Exception, SystemExit, KeyboardInterrupt) as error:
        return Outcome("failed", describe_error(error), traceback.format_exc())
    try:
        return Outcome("complete", encode_result(result))
    except Exception as error:
        # the work is done; running it again would only return the same value
        return Outcome("failed", retry=False, text=(
            f"the task function returned a {type(result).__name__}, which is not a string and "
            f"cannot be encoded as JSON ({type(error).__name__}: {error}); not retried: return "
            "a str or a JSON-serialisable value"))


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
    return _run_orphan(store, _refreshed(task), function, policy, task_logs)


def _run_orphan(store: RedisStore, task: Task, function: TaskFunction, policy: Policy,
                task_logs: TaskLogSettings | None) -> int:
    """Run a started task and record its outcome in Redis (no listener records it)."""
    global _current
    _preemption.install(None)  # an adopter's notice comes without a deadline
    _current = ProgressReporter(Processor(task, store.bounded(0.0)))
    shipper = _ship_output(store, task, policy, task_logs)
    outcome = execute(function, task)
    _current.close()
    if shipper is not None:
        _end_output(shipper, outcome.traceback)
    return _record_itself(Processor(task, store), policy, outcome)


def _record_itself(processor: Processor, policy: Policy, outcome: Outcome) -> int:
    """Record the outcome, holding on to it while Redis is away (the work is done)."""
    task_id = processor.task.id
    delay, deadline = 0.1, time.monotonic() + REPORT_PATIENCE
    while True:
        try:
            _report(processor, policy, outcome)
            return EXIT_REPORTED
        except RedisUnavailable as error:
            if time.monotonic() > deadline:
                log.error("task %s: gave up recording its outcome: %s", task_id, error)
                return EXIT_REPORT_FAILED
            log.warning("task %s: %s; retrying in %.1f s", task_id, error, delay)
            time.sleep(delay)
            delay = min(5.0, delay * 2)
        except BluequeError as error:
            log.error("task %s: outcome (%s) not recorded: %s", task_id, outcome.outcome, error)
            return EXIT_REPORT_FAILED


def _ship_output(store: RedisStore, task: Task, policy: Policy,
                 task_logs: TaskLogSettings | None) -> Shipper | None:
    """Ship the attempt's output file to the task's log stream as it grows (5.19)."""
    if task_logs is None:
        return None
    shipper = Shipper(store.bounded(0.0), task_logs, task.id, task.attempts,
                      task_logs.path(task.queue or "", task.id, task.attempts),
                      policy.result_ttl_ms())
    shipper.start()
    return shipper


def _end_output(shipper: Shipper, trace: str | None, ship: bool = True) -> None:
    if trace:
        sys.stderr.write(trace)  # the task's own log shows why it failed, where it failed
        sys.stderr.flush()
    shipper.close(ship=ship)  # with ship: the rest of its output and the attempt's end


def _refreshed(task: Task) -> Task:
    """The task as start left it; a Redis that went away right after the start (which the
    retry policy rode out) leaves the task as it was read: its parameters do not change."""
    try:
        return task.refresh()
    except RedisUnavailable as error:
        log.warning("task %s: could not re-read it (%s); running it as reserved", task.id, error)
        return task


def describe_error(error: BaseException) -> str:
    """The ``error`` field of a run that raised: the message, as blueque 1.0.1 recorded it
    (``str(error)``), the exception's name when it has none, and for ``sys.exit(n)`` the exit
    code. The traceback goes to its own field."""
    if isinstance(error, SystemExit):
        if isinstance(error.code, str):
            return error.code
        code = 0 if error.code is None else error.code
        return f"exit code {code}: the task function called sys.exit({code!r})"
    if isinstance(error, KeyboardInterrupt):
        return "KeyboardInterrupt: the task function was interrupted"
    return str(error) or type(error).__name__


def _report(processor: Processor, policy: Policy, outcome: Outcome) -> None:
    """Record the outcome as the one rule (blueque.endings) says, from the task's fields."""
    ending = decide(policy, processor.task.data, outcome.outcome, outcome.text, now(),
                    retry=outcome.retry)
    if ending.outcome == "complete":
        processor.complete(ending.text, policy.result_ttl_ms())
    elif ending.outcome == "preempted":
        processor.preempt(ending.text)
    elif ending.outcome == "retry" and ending.eta is not None:
        processor.retry(ending.text, ending.eta, traceback=outcome.traceback)
    else:
        processor.fail(ending.text, policy.result_ttl_ms(), traceback=outcome.traceback)


def _prepare(title: str) -> None:
    """The first steps of every task process: its own session, random and signals."""
    os.setsid()
    random.seed()
    signal.set_wakeup_fd(-1)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    set_title(title)


def _capture(task_logs: TaskLogSettings | None, task: Task) -> TaskLogSettings | None:
    if task_logs is None:
        return None
    try:
        capture(task_logs.path(task.queue or "", task.id, task.attempts))
    except OSError as error:  # a full or read-only disk must not stop the task
        log.error("task %s: output not captured: %s", task.id, error)
        return None
    return task_logs


def _leave(code: int) -> NoReturn:
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_child(store: RedisStore, task: Task, function: TaskFunction, policy: Policy,
              task_logs: TaskLogSettings | None = None) -> NoReturn:
    """Body of a child that starts and records its task itself (``ForkingRunner.fork_task``);
    never returns. ``policy`` is the one the parent resolved for this task at fork time.
    With ``task_logs``, its stdout and stderr are the attempt's log file (5.19)."""
    code = EXIT_REPORT_FAILED
    try:
        _prepare(f"blueque: {task.queue} {task.id} attempt {task.attempts}")
        code = _run(store, task, function, policy, _capture(task_logs, task))
    except BaseException:
        traceback.print_exc()
    finally:
        _leave(code)


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


def run_reporting_child(store: RedisStore, sock: socket.socket, assignment: Assignment,
                        function: TaskFunction, task_logs: TaskLogSettings | None = None
                        ) -> NoReturn:
    """Body of a listener daemon's child; never returns. It waits for its listener's word,
    runs the task, reports the outcome over ``sock`` and exits once the listener recorded
    it. Without a listener (end of file), it records what it must itself."""
    code = EXIT_REPORT_FAILED
    try:
        _prepare(f"blueque: {assignment.queue} {assignment.task_id} starting")
        code = _run_reporting(store, ParentLink(sock, assignment.patience), assignment,
                              function, task_logs)
    except BaseException:
        traceback.print_exc()
    finally:
        _leave(code)


def _run_reporting(store: RedisStore, link: ParentLink, assignment: Assignment,
                   function: TaskFunction, task_logs: TaskLogSettings | None) -> int:
    global _current
    word = link.receive(forever=True)
    if word is None:  # the listener died before telling: did its stamp start us?
        return _run_unannounced(store, assignment, function, task_logs)
    if "go" not in word:
        return EXIT_NOT_STARTED  # refused (cancelled meanwhile, a duplicate...): nothing ran
    _preemption.install(link)
    task = Task(assignment.task_id, store, dict(word["go"]))
    policy = Policy.resolve(task.data, dict(word.get("defaults") or {}))
    set_title(f"blueque: {assignment.queue} {task.id} attempt {task.attempts}")
    task_logs = _capture(task_logs, task)
    _current = ParentProgress(link, lambda: ProgressReporter(Processor(task, store.bounded(0.0))))
    shipper = _ship_output(store, task, policy, task_logs)
    outcome = execute(function, task)
    _current.close()
    output: dict[str, Any] = {}
    if shipper is not None:
        _end_output(shipper, outcome.traceback, ship=False)
        output = shipper.state()
    sent = link.send({"outcome": outcome.outcome, "text": outcome.text,
                      "traceback": outcome.traceback, "retry": outcome.retry,
                      "output": output})
    failpoints.hit("child-after-outcome")
    if sent and link.receive() is not None:
        return EXIT_REPORTED  # "recorded": the listener wrote it
    # the listener is gone or frozen (before or after recording: a repeated finish changes
    # nothing, and one of a run that was taken back meanwhile is refused)
    log.warning("task %s: its listener %s is gone or not answering; recording the outcome "
                "itself", task.id, assignment.listener)
    if shipper is not None:
        shipper.ship(end=True)
    return _record_itself(Processor(task, store), policy, outcome)


def _run_unannounced(store: RedisStore, assignment: Assignment, function: TaskFunction,
                     task_logs: TaskLogSettings | None) -> int:
    """The listener died between the fork and its word. If its stamp made the task started
    by this very process, run it as an orphan (the node's next listener adopts it); else
    nothing was recorded for this process: leave, and recovery puts the task back."""
    try:
        data = store.task_data(assignment.task_id)
    except BluequeError as error:
        log.error("task %s: its listener is gone and its state cannot be read (%s); not "
                  "running it", assignment.task_id, error)
        return EXIT_NOT_STARTED
    mine = (data.get("status") == k.STARTED and data.get("node") == assignment.listener
            and data.get("pid") == str(os.getpid()))
    if not mine:
        return EXIT_NOT_STARTED
    task = Task(assignment.task_id, store, data)
    try:
        policy = Policy.resolve(data, store.queue_config(assignment.queue))
    except BluequeError:
        policy = Policy.resolve(data, {})
    set_title(f"blueque: {assignment.queue} {task.id} attempt {task.attempts}")
    task_logs = _capture(task_logs, task)
    log.warning("task %s: its listener %s died after starting it; running it as an orphan",
                task.id, assignment.listener)
    return _run_orphan(store, task, function, policy, task_logs)
