"""Several jobs behind one listener: ``blueque.Jobs``, a registry of task functions by name.

A producer enqueues a job by its name with keyword arguments; a listener started with the
registry (``blueque listen images mypackage.jobs:jobs``) runs whichever job each task names::

    jobs = blueque.Jobs()

    @jobs.job
    def resize(task, width: int):
        ...

    jobs.enqueue(queue, "resize", width=10, max_attempts=3)

The task's parameters stay a JSON string, as every Blueque task's (and blueque 1.0.1's):
``{"job": "resize", "arguments": {"width": 10}}`` (PROTOCOL.md 3.3), so any client, 1.0.1's
included, can read and write them. A task that names a job the listener's registry does not
have, or arguments its function does not take, fails at once and is not retried: no later
attempt could run it (``InvalidJob``).

This module imports no redis-py: a task module that makes a registry stays light in the fork
server (PROTOCOL.md 6.8); the queue it enqueues on is the caller's.
"""

from __future__ import annotations

import difflib
import inspect
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, overload

from blueque.errors import ConfigurationError, InvalidJob, WrongType
from blueque.policy import OPTION_TYPES

if TYPE_CHECKING:
    from blueque.queue import TaskId
    from blueque.task import Task

#: The two keys of a job's parameters (PROTOCOL.md 3.3).
JOB_KEY = "job"
ARGUMENTS_KEY = "arguments"

#: What ``Jobs.enqueue`` passes to the queue rather than to the job: the task's id, its
#: dependencies, when it runs, and its options (blueque.policy). A job cannot have a
#: parameter of one of these names.
ENQUEUE_OPTIONS = frozenset({"task_id", "after", "after_any", "eta", "delay", *OPTION_TYPES})

F = TypeVar("F", bound=Callable[..., Any])


class _SyncQueue(Protocol):
    """A ``blueque.Queue``, as jobs.enqueue uses it."""

    def enqueue(self, parameters: str, **options: Any) -> TaskId: ...

    def schedule(self, parameters: str, **options: Any) -> TaskId: ...


class _AsyncQueue(Protocol):
    """A ``blueque.aio`` Queue, as jobs.enqueue_async uses it."""

    async def enqueue(self, parameters: str, **options: Any) -> TaskId: ...

    async def schedule(self, parameters: str, **options: Any) -> TaskId: ...


def job_parameters(name: str, **arguments: Any) -> str:
    """The parameters of a task that runs job ``name`` with ``arguments``: the JSON text
    ``{"job": name, "arguments": {...}}``. For a producer that does not import the jobs'
    code (``queue.enqueue(job_parameters("resize", width=10))``); ``Jobs.enqueue`` checks the
    arguments against the function first. WrongType for arguments that are not JSON."""
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"a job's name must be a non-empty string, not {name!r}")
    try:
        return json.dumps({JOB_KEY: name, ARGUMENTS_KEY: arguments}, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise WrongType(
            f"the arguments of job {name!r} must be JSON values (str, int, float, bool, None, "
            f"lists and dicts of them): {error}") from error


@dataclass(frozen=True)
class JobCall:
    """What a job's parameters say: the job's name and its arguments."""

    name: str
    arguments: dict[str, Any]


def read_job_call(parameters: str | None) -> JobCall | None:
    """The job named by a task's parameters, or None when they are not a job's (any other
    text: a task enqueued by ``queue.enqueue`` for a single-function listener). For what
    people see (``blueque show``, the dashboard)."""
    try:
        return _job_call(parameters)
    except InvalidJob:
        return None


def _job_call(parameters: str | None) -> JobCall:
    """A job's parameters, read; InvalidJob says what is wrong with them."""
    try:
        value = json.loads(parameters or "")
    except ValueError:
        value = None
    if not isinstance(value, dict) or not isinstance(value.get(JOB_KEY), str):
        raise InvalidJob(
            f"the task's parameters name no job: a listener of a blueque.Jobs runs tasks whose "
            f'parameters are {{"{JOB_KEY}": NAME, "{ARGUMENTS_KEY}": {{...}}}} '
            f"(jobs.enqueue writes them), not {_excerpt(parameters)}")
    arguments = value.get(ARGUMENTS_KEY, {})
    if not isinstance(arguments, dict):
        raise InvalidJob(f"the arguments of job {value[JOB_KEY]!r} must be a JSON object of "
                         f"names and values, not {_excerpt(json.dumps(arguments))}")
    return JobCall(value[JOB_KEY], arguments)


def _excerpt(text: str | None, width: int = 80) -> str:
    shown = repr(text)
    return shown if len(shown) <= width else shown[: width - 4] + "...'"


@dataclass(frozen=True)
class Job:
    """One registered job: its name, its function and the function's signature."""

    name: str
    function: Callable[..., Any]
    signature: inspect.Signature

    def bind(self, arguments: Mapping[str, Any]) -> None:
        """TypeError when the function cannot take ``arguments`` (after the task)."""
        self.signature.bind(None, **arguments)


class Jobs:
    """A registry of jobs: task functions by name, for one listener to run them all.

    ``@jobs.job`` registers a function under its name (``@jobs.job(name="images.resize")``
    under another); its first parameter is the task, the others are the job's arguments,
    given by keyword. ``jobs.enqueue(queue, "resize", width=10, max_attempts=3)`` enqueues
    it (``await jobs.enqueue_async(...)`` on a ``blueque.aio`` queue); the registry itself is
    the task function of ``blueque listen QUEUE mypackage.jobs:jobs``."""

    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}

    def __repr__(self) -> str:
        return f"<Jobs {', '.join(self._jobs) or '(none)'}>"

    def __iter__(self) -> Iterator[str]:
        return iter(self._jobs)

    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, name: object) -> bool:
        return name in self._jobs

    def __getitem__(self, name: str) -> Callable[..., Any]:
        return self._known(name, ConfigurationError).function

    # --- registering --------------------------------------------------------------------
    @overload
    def job(self, function: F, /) -> F: ...

    @overload
    def job(self, function: None = None, /, *, name: str | None = None
            ) -> Callable[[F], F]: ...

    def job(self, function: Callable[..., Any] | None = None, /, *, name: str | None = None
            ) -> Any:
        """Register a job: ``@jobs.job``, or ``@jobs.job(name="...")`` for a name other than
        the function's. The function is returned unchanged (call it directly in tests).
        ConfigurationError for a name taken, a function without a task parameter, or a
        parameter that has the name of an enqueue option (``ENQUEUE_OPTIONS``)."""
        def register(target: Callable[..., Any]) -> Callable[..., Any]:
            self._add(target, name)
            return target

        return register if function is None else register(function)

    def _add(self, function: Callable[..., Any], name: str | None) -> None:
        if not callable(function):
            raise ConfigurationError(f"a job must be a function, not {function!r}")
        name = getattr(function, "__name__", None) if name is None else name
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"a job's name must be a non-empty string, not {name!r}; "
                                     "give one: @jobs.job(name=...)")
        if name in self._jobs:
            raise ConfigurationError(
                f"two jobs are named {name!r} ({_where(self._jobs[name].function)} and "
                f"{_where(function)}): give one another name, @jobs.job(name=...)")
        signature = inspect.signature(function)
        _check_parameters(name, list(signature.parameters.values()))
        self._jobs[name] = Job(name, function, signature)

    # --- enqueueing ---------------------------------------------------------------------
    def parameters(self, name: str, /, **arguments: Any) -> str:
        """The parameters of a task that runs job ``name`` with ``arguments``, checked
        against its function: ConfigurationError for an unknown job, WrongType for arguments
        it does not take or that are not JSON values."""
        job = self._known(name, ConfigurationError)
        try:
            job.bind(arguments)
        except TypeError as error:
            raise WrongType(f"job {name!r} cannot take these arguments: {error}; its "
                            f"parameters are {_arguments_of(job)}") from error
        return job_parameters(name, **arguments)

    def enqueue(self, queue: _SyncQueue, name: str, /, **arguments: Any) -> TaskId:
        """Enqueue job ``name`` on ``queue`` (a ``blueque.Queue``): the keyword arguments
        that are enqueue options (``ENQUEUE_OPTIONS``: ``task_id``, ``after``, ``after_any``,
        ``eta`` or ``delay`` to schedule it, and the task options ``max_attempts``,
        ``time_limit``...) go to the queue, the others to the job. Returns the task's id, as
        ``Queue.enqueue`` does."""
        text, options = self._submission(name, arguments)
        if "eta" in options or "delay" in options:
            return queue.schedule(text, **options)
        return queue.enqueue(text, **options)

    async def enqueue_async(self, queue: _AsyncQueue, name: str, /, **arguments: Any
                            ) -> TaskId:
        """``enqueue``'s twin for a ``blueque.aio`` queue: ``await jobs.enqueue_async(queue,
        "resize", width=10)``."""
        text, options = self._submission(name, arguments)
        if "eta" in options or "delay" in options:
            return await queue.schedule(text, **options)
        return await queue.enqueue(text, **options)

    def _submission(self, name: str, given: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        options = {key: value for key, value in given.items() if key in ENQUEUE_OPTIONS}
        arguments = {key: value for key, value in given.items() if key not in ENQUEUE_OPTIONS}
        return self.parameters(name, **arguments), options

    # --- running ------------------------------------------------------------------------
    def __call__(self, task: Task) -> Any:
        """Run the job the task names: the registry is the listener's task function.
        InvalidJob, before the job's code runs, for parameters that name no job, a job this
        registry does not have, or arguments its function does not take: the task fails at
        once, not retried (blueque.task_process.calling)."""
        call = _job_call(task.parameters)
        job = self._known(call.name, InvalidJob)
        try:
            job.bind(call.arguments)
        except TypeError as error:
            raise InvalidJob(f"job {call.name!r} cannot take the task's arguments: {error}; "
                             f"its parameters are {_arguments_of(job)}") from error
        return job.function(task, **call.arguments)

    def _known(self, name: str, error: type[Exception]) -> Job:
        job = self._jobs.get(name)
        if job is not None:
            return job
        known = ", ".join(sorted(self._jobs)) or "none"
        close = difflib.get_close_matches(str(name), list(self._jobs), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise error(f"unknown job {name!r}{hint} (the jobs registered here: {known})")


def _check_parameters(name: str, parameters: list[inspect.Parameter]) -> None:
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if not parameters or parameters[0].kind not in positional:
        raise ConfigurationError(
            f"job {name!r} must take the task as its first parameter: def {name}(task, ...)")
    for parameter in parameters[1:]:
        if parameter.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise ConfigurationError(
                f"job {name!r}: its parameter {parameter.name!r} is positional-only, but a "
                "job's arguments are given by name")
        if parameter.name in ENQUEUE_OPTIONS:
            raise ConfigurationError(
                f"job {name!r}: its parameter {parameter.name!r} has the name of an enqueue "
                f"option, which jobs.enqueue would take for the queue: rename it")


def _arguments_of(job: Job) -> str:
    shown = [str(p.replace(annotation=inspect.Parameter.empty))
             for p in list(job.signature.parameters.values())[1:]]
    return "(" + ", ".join(shown) + ")" if shown else "none"


def _where(function: Callable[..., Any]) -> str:
    return f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', '?')}"
