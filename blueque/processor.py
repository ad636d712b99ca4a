"""Processor: what the process running one task calls to record its progress and outcome."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from blueque.endings import Outcome, RunEnd
from blueque.errors import ConfigurationError, InvalidTaskState, WrongType
from blueque.task import Task

if TYPE_CHECKING:
    from blueque.store import RedisStore


def encode_result(value: object) -> str:
    """Results are strings on the wire: a str is kept, anything else becomes JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return json.dumps(value)


def check_result(value: object) -> str:
    """The text a task function's return value would be stored as (a str as is, anything
    else as JSON), or WrongType saying why it cannot be stored. A long task calls it early on
    a value shaped like the one it will return, to learn in its first minute, not after hours
    of work, that the result would fail its task (a run whose value cannot be stored fails,
    not retried: running it again would return the same value)."""
    try:
        return encode_result(value)
    except Exception as error:  # TypeError, ValueError (a cycle), RecursionError (too deep)
        raise WrongType(
            f"a task's result must be a str or a JSON-serialisable value; this "
            f"{type(value).__name__} cannot be encoded as JSON ({type(error).__name__}: "
            f"{error})") from error


def check_fraction(fraction: float) -> None:
    """The one rule for a progress value, whoever reports it (a Processor, a task through
    blueque.report_progress): a fraction from 0 to 1, else ConfigurationError."""
    if not 0.0 <= fraction <= 1.0:
        raise ConfigurationError(f"progress must be between 0 and 1, not {fraction}")


class Processor:
    """Runs one attempt of a task: start(pid), then complete(result) or fail(error).

    Every write is fenced by the task's attempt number (when the task has one): once the
    task has been recovered and reserved again, this run can no longer record anything."""

    def __init__(self, task: Task, store: RedisStore) -> None:
        if task.queue is None or task.node is None:
            raise InvalidTaskState(
                f"task {task.id} has no queue or node: only a reserved task can be processed"
            )
        self._task = task
        self._store = store
        self._queue: str = task.queue
        self._listener: str = task.node
        self._pid = task.pid
        self._attempt = task.attempts

    @property
    def task(self) -> Task:
        return self._task

    @property
    def attempt(self) -> int | None:
        return self._attempt

    def start(self, pid: int, pid_created: float | None = None) -> str | None:
        """Mark the task started by ``pid``; returns its parameters."""
        self._pid = pid
        self._store.start(
            self._queue, self._task.id, self._listener, pid, self._store.now(), self._attempt,
            pid_created
        )
        parameters: str | None = self._task.parameters
        return parameters

    def complete(self, result: object, result_ttl_ms: int | None = None) -> None:
        self._finish("complete", encode_result(result), result_ttl_ms=result_ttl_ms)

    def fail(self, error: object, result_ttl_ms: int | None = None,
             traceback: str | None = None) -> None:
        """Record the failure: ``error`` in the task's ``error`` field (as 1.0.1 does),
        ``traceback`` (if any) in its ``traceback`` field."""
        self._finish("failed", encode_result(error), result_ttl_ms=result_ttl_ms,
                     traceback=traceback)

    def retry(self, error: object, eta: float, traceback: str | None = None) -> None:
        """Record this attempt's failure and schedule the next attempt at ``eta``."""
        self._finish("retry", encode_result(error), retry_eta=eta, traceback=traceback)

    def preempt(self, reason: str) -> None:
        """Record that this run stopped because its node goes away: the task is pending
        again, at the head of the line, and the run does not count as an attempt."""
        self._finish("preempted", reason)

    def _finish(self, outcome: Outcome, text: str, **options: Any) -> None:
        self.record(self.run_end(outcome, text, **options))

    def run_end(self, outcome: Outcome, text: str, **options: Any) -> RunEnd:
        """This run's ending as finish records it (now, on Redis' clock), not yet sent: what
        a task process that records itself holds (and spools) while Redis cannot take it."""
        return RunEnd(self._queue, self._task.id, self._listener, self._pid, self._attempt,
                      outcome, text, self._store.now(), **options)

    def record(self, end: RunEnd) -> None:
        """Record an ending made by ``run_end`` (finish.lua, fenced by its attempt)."""
        self._store.finish(end)

    def progress(self, fraction: float, message: str = "") -> None:
        """Report how far the task has got (0.0 to 1.0) and what it is doing."""
        if self._attempt is None:
            raise InvalidTaskState(f"task {self._task.id} has no attempt number to report on")
        check_fraction(fraction)
        self._store.progress(self._task.id, self._attempt, fraction, message, self._store.now())
