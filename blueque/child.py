"""The forked process that runs one task: start, call the function, record the outcome.

It leads its own session (so a listener's death or restart does not kill it, and a time limit
can kill its whole process group), reseeds random, and always leaves through ``os._exit``.
"""

from __future__ import annotations

import importlib
import logging
import os
import random
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from blueque.errors import BluequeError, CallbackError, RedisUnavailable
from blueque.policy import Policy
from blueque.process import create_time
from blueque.processor import Processor, encode_result
from blueque.store import RedisStore, now
from blueque.task import Task

log = logging.getLogger("blueque.child")

TaskFunction = Callable[[Task], Any]

#: Exit codes of the child; anything else (or a signal) means it died without reporting.
EXIT_REPORTED = 0
EXIT_NOT_STARTED = 3  # the task could not be started (cancelled, superseded): nothing ran
EXIT_REPORT_FAILED = 4  # ran, but its outcome could not be recorded (see the log)
#: How long a finished child keeps retrying to record its outcome while Redis is away.
REPORT_PATIENCE = 3600.0

_current: Processor | None = None


def report_progress(fraction: float, message: str = "") -> None:
    """Called from inside a task function: record how far the task has got (0.0 to 1.0)."""
    if _current is None:
        raise BluequeError("report_progress() is only available inside a running task")
    _current.progress(fraction, message)


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


def _run(store: RedisStore, task: Task, function: TaskFunction, policy: Policy) -> int:
    global _current
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
    _current = processor
    retry, trace = True, None
    try:
        result = function(task.refresh())
    except (Exception, SystemExit, KeyboardInterrupt) as error:
        # sys.exit() and KeyboardInterrupt end the task, not the child: recorded as what they are
        outcome, text, trace = "failed", describe_error(error), traceback.format_exc()
    else:
        try:
            outcome, text = "complete", encode_result(result)
        except Exception as error:
            # the work is done; running it again would only return the same value
            outcome, retry = "failed", False
            text = (f"the task function returned a {type(result).__name__}, which is not a "
                    f"string and cannot be encoded as JSON ({type(error).__name__}: {error}); "
                    "not retried: return a str or a JSON-serialisable value")
    delay, deadline = 0.1, time.monotonic() + REPORT_PATIENCE
    while True:
        try:
            _report(processor, policy, outcome, text, retry, trace)
            return EXIT_REPORTED
        except RedisUnavailable as error:
            # The work is done: hold on to its outcome until Redis is back, not lose it.
            if time.monotonic() > deadline:
                log.error("task %s: gave up recording its outcome: %s", task.id, error)
                return EXIT_REPORT_FAILED
            log.warning("task %s: %s; retrying in %.1f s", task.id, error, delay)
            time.sleep(delay)
            delay = min(5.0, delay * 2)
        except BluequeError as error:
            log.error("task %s: outcome (%s) not recorded: %s", task.id, outcome, error)
            return EXIT_REPORT_FAILED


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


def _report(processor: Processor, policy: Policy, outcome: str, text: str,
            retry: bool = True, trace: str | None = None) -> None:
    if outcome == "complete":
        processor.complete(text, _ttl_ms(policy))
        return
    eta = policy.retry_eta(processor.attempt or 1, now()) if retry else None
    if eta is None:
        processor.fail(text, _ttl_ms(policy), traceback=trace)
    else:
        processor.retry(text, eta, traceback=trace)


def _ttl_ms(policy: Policy) -> int | None:
    return int(policy.result_ttl * 1000) if policy.result_ttl > 0 else None


def run_child(store: RedisStore, task: Task, function: TaskFunction, policy: Policy) -> None:
    """Body of the forked child; never returns. ``policy`` is the one the parent resolved
    for this task at fork time, so the child does not read the queue's config again."""
    code = EXIT_REPORT_FAILED
    try:
        os.setsid()
        random.seed()
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        code = _run(store, task, function, policy)
    except BaseException:
        traceback.print_exc()
    finally:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
