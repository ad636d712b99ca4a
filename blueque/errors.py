"""Everything Blueque raises derives from BluequeError; each message says what to do next."""

from __future__ import annotations


class BluequeError(Exception):
    """The root of every error Blueque raises on purpose."""


class ConfigurationError(BluequeError, ValueError):
    """A URL, option or argument that cannot work (bad scheme, bad port, unknown option)."""


class PermissionRefused(ConfigurationError):
    """The Redis user may not run a command, or touch a key or channel, that Blueque needs
    (an ACL without it: NOPERM, or found up front by ACL DRYRUN, blueque.acl)."""


class WrongType(ConfigurationError, TypeError):
    """An argument of the wrong type (a TypeError too), e.g. parameters that are not text."""


class RedisUnavailable(BluequeError, ConnectionError):
    """Redis could not be reached, or went away and did not come back in time."""


class WritesRefused(RedisUnavailable):
    """Redis answers but refuses every write: it is out of memory (``maxmemory`` reached under
    ``noeviction``: OOM), cannot persist (a full disk, an AOF or RDB error: MISCONF) or lacks
    the replicas its ``min-replicas-to-write`` asks for (NOREPLICAS). An outage, not a fault
    of the command: nothing was written, and the same write succeeds once the cause is fixed
    (free memory or disk space). ``cause`` says which, in words."""

    def __init__(self, message: str, cause: str = "") -> None:
        super().__init__(message)
        self.cause = cause


class WaitTimeout(BluequeError, TimeoutError):
    """A wait for tasks ran out of time (a TimeoutError, as before)."""


class TaskNotFound(BluequeError, KeyError):
    """No task hash exists under that id (never enqueued, or already deleted or expired)."""

    def __init__(self, task_id: str) -> None:
        super().__init__(task_id)
        self.task_id = task_id

    def __str__(self) -> str:
        return (
            f"task {self.task_id!r} does not exist: it was never enqueued, or it was deleted "
            "or its result expired"
        )


class InvalidTaskState(BluequeError, ValueError):
    """The task's status forbids the operation (a ValueError, as in blueque 1.0.1)."""


class StaleAttempt(InvalidTaskState):
    """A superseded run tried to record an outcome over a newer attempt (fencing)."""


class DependencyError(ConfigurationError):
    """``after=`` names a task that does not exist, the task itself, or a later task of the
    same enqueue (a cycle): refused before anything is written."""


class CorruptTask(BluequeError):
    """A task hash is missing fields or holds values that cannot be parsed."""


class CallbackError(BluequeError):
    """A task function named as ``package.module:function`` cannot be imported or called."""


class InvalidJob(CallbackError):
    """A task a ``blueque.Jobs`` listener cannot run: its parameters name no job, or a job its
    registry does not have, or arguments the job's function does not take. The task fails at
    once and is not retried (no later attempt could run it); nothing of the job ran."""


class AuthenticationFailed(ConfigurationError):
    """Redis refused the URL's user name or password (never retried: waiting cannot fix it)."""


class EvictingServer(ConfigurationError):
    """A Redis whose maxmemory-policy lets it delete Blueque's keys when it is full (anything
    but noeviction): a daemon refuses to start on it unless told to accept it."""


class UnsupportedServer(ConfigurationError):
    """The server is not a Redis Blueque can use: not Redis at all, or older than 6.2."""


class CheckpointTooLarge(BluequeError, ValueError):
    """A checkpoint larger than its task's limit (``checkpoint_max_bytes``): nothing was
    written. Store large state elsewhere (a file, an object store) and checkpoint a reference
    to it."""


class TooLarge(BluequeError):
    """A task's parameters over its queue's ``max_parameters_bytes`` (16 MiB unless
    ``Queue.configure`` says): nothing was enqueued."""


class Preempted(BluequeError):
    """Raised by a task function to stop because its node goes away (``blueque preempt``,
    SIGUSR1 to its listener): the task goes back to pending without spending an attempt,
    to resume (from its checkpoint) elsewhere. Its preemptions are counted, and a task
    preempted more than ``max_preemptions`` times fails instead of looping."""


class MissingTaskWarning(UserWarning):
    """``Client.get_task`` was asked for an id with no task hash (never enqueued, deleted, or
    expired): it returns a Task whose attributes are all None, as blueque 1.0.1 did, and says
    so with this warning. ``get_task(id, missing_ok=True)`` asks quietly (then check
    ``task.exists``)."""
