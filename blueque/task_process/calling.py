"""The task function: how a listener finds it (``package.module:function``) and what one call
of it comes to (``execute``: complete, failed or preempted, never raising), the same for a
listener daemon's child and for 1.0.1's ``ForkingRunner.fork_task``."""

from __future__ import annotations

import importlib
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from blueque.endings import Ran
from blueque.errors import CallbackError, InvalidJob, Preempted, WrongType
from blueque.jobs import Jobs
from blueque.preemption import notice
from blueque.processor import check_result
from blueque.task import Task

TaskFunction = Callable[[Task], Any]


def import_function(spec: str) -> TaskFunction:
    """``package.module:function`` -> the function; CallbackError says what is wrong."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise CallbackError(f"task function {spec!r} must look like package.module:function")
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as error:  # sys.exit() at import: the module cannot serve
        said = (f"its import called sys.exit({error.code!r})" if isinstance(error, SystemExit)
                else str(error))
        raise CallbackError(
            f"cannot import module {module_name!r} for task function {spec!r}: {said}"
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
    if isinstance(target, Jobs) and not len(target):
        raise CallbackError(
            f"{spec!r} is a blueque.Jobs with no job registered: register them with @jobs.job "
            f"in that module, or import the modules that do from it")
    return target  # type: ignore[no-any-return]


@dataclass(frozen=True)
class CallOutcome:
    """What one call of the task function came to."""

    outcome: Ran  # complete, failed, or preempted (it raised Preempted)
    text: str  # the result, or the error (1.0.1's str(exception))
    traceback: str | None = None
    retry: bool = True  # False: the work finished (its value could not be encoded)


def execute(function: TaskFunction, task: Task, max_result_bytes: int = 0) -> CallOutcome:
    """Call the task function; never raises. sys.exit() and KeyboardInterrupt end the task,
    not the child: they are recorded as what they are. Preempted stops it to run again
    elsewhere (PROTOCOL.md 6.3). A result over ``max_result_bytes`` (its queue's limit; 0:
    none) fails the run, not retried: the same work would return the same value."""
    notice.running = True  # from now on an on_preempt callback's Preempted stops it
    try:
        result = function(task)
    except Preempted as error:
        return CallOutcome("preempted", str(error) or f"the task stopped: {notice.why()}")
    except InvalidJob as error:  # a registry's refusal, before any job ran: never runnable
        return CallOutcome("failed", f"not run: {error}; not retried", retry=False)
    except (Exception, SystemExit, KeyboardInterrupt) as error:
        return CallOutcome("failed", describe_error(error), traceback.format_exc())
    finally:
        notice.running = False
    try:
        return _bounded(check_result(result), max_result_bytes)
    except WrongType as error:
        # the work is done; running it again would only return the same value
        return CallOutcome("failed", retry=False, text=(
            f"the task function returned a {type(result).__name__}, which is not a string and "
            f"cannot be stored: {error}; not retried (blueque.check_result tells early)"))


def _bounded(result: str, limit: int) -> CallOutcome:
    size = len(result.encode("utf-8", "surrogatepass"))
    if limit <= 0 or size <= limit:
        return CallOutcome("complete", result)
    return CallOutcome("failed", retry=False, text=(
        f"the task function returned a result of {size} bytes, more than the "
        f"max_result_bytes of {limit} of its queue: not stored, and not retried (the same work "
        "returns the same value). Store a large result elsewhere (a file, an object store) and "
        "return a reference, or raise the queue's limit (blueque configure QUEUE "
        "--max-result-bytes N; 0: none)"))


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
