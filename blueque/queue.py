"""Queue: submit tasks, move due ones, inspect counts, delete and purge finished ones."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from blueque import keys as k
from blueque import protocol
from blueque.errors import ConfigurationError, InvalidTaskState, TaskNotFound, WrongType
from blueque.policy import encode_options
from blueque.protocol import QueueCounts
from blueque.store import RedisStore, now
from blueque.task import Task, utf8_size


def _text(value: object, what: str) -> str:
    """Parameters are strings on the wire (JSON by convention); numbers pass as blueque 1.0.1
    let them (redis-py wrote them as text). Never pickles."""
    if isinstance(value, str):
        utf8_size(value, what)
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return repr(value)
    raise WrongType(
        f"{what} must be a string (JSON by convention), not {type(value).__name__}: "
        "encode it with json.dumps first"
    )


def check_queue_name(name: object) -> str:
    """The one queue-name rule (keys.QUEUE_NAME_RULE), checked wherever a queue is made:
    enqueue, configure, listen. ConfigurationError says what is wrong."""
    problem = k.queue_name_problem(name)
    if problem:
        raise ConfigurationError(problem)
    return str(name)


def given_queue_name(name: object) -> str:
    """The name of a queue to read or act on: a non-empty string (keys.names_a_queue), else
    ConfigurationError. Queues made before the rule keep their names."""
    if not k.names_a_queue(name):
        raise ConfigurationError(k.queue_name_problem(name))
    return name


def task_id_for(keys: k.Keys, queue: str, task_id: str | None) -> str:
    """A new id for the queue, or the caller's id (checked; hash-tagged in the cluster
    layout)."""
    if task_id is None:
        return keys.new_task_id(queue)
    if not isinstance(task_id, str) or not task_id or " " in task_id:
        raise ConfigurationError(
            f"a task id must be a non-empty string without spaces, not {task_id!r}"
        )
    return keys.task_id_for(queue, task_id)


def bulk_ids(keys: k.Keys, queue: str, count: int, task_ids: Sequence[str] | None
             ) -> list[str]:
    """The ids of an enqueue_many of ``count`` tasks: new ones, or the caller's (one per
    task, no duplicates)."""
    if task_ids is None:
        return [keys.new_task_id(queue) for _ in range(count)]
    if len(task_ids) != count:
        raise ConfigurationError(
            f"{count} parameters but {len(task_ids)} task ids: give one id per task"
        )
    ids = [task_id_for(keys, queue, i) for i in task_ids]
    if len(set(ids)) != len(ids):
        raise ConfigurationError("task_ids contains duplicates; each task needs its own id")
    return ids


def submission(keys: k.Keys, queue: str, parameters: object, task_id: str | None,
               options: dict[str, object]) -> tuple[str, str, dict[str, str]]:
    """What enqueue and schedule pass to protocol.submit, checked: (id, parameters as
    text, option fields). ConfigurationError or WrongType say what is wrong."""
    check_queue_name(queue)
    return task_id_for(keys, queue, task_id), _text(parameters, "parameters"), \
        encode_options(options)


def bulk_submission(keys: k.Keys, queue: str, parameters: Sequence[object],
                    task_ids: Sequence[str] | None) -> list[tuple[str, str]]:
    """What enqueue_many passes to protocol.submit_many, checked: (id, parameters as text)
    per task."""
    check_queue_name(queue)
    texts = [_text(p, "parameters") for p in parameters]
    return list(zip(bulk_ids(keys, queue, len(texts), task_ids), texts, strict=True))


def check_deletable(queue: str, task_id: str, task_queue: str | None, status: str | None
                    ) -> str:
    """The status of a task delete_task may delete (complete or failed, in this queue)."""
    if task_queue != queue:
        raise InvalidTaskState(f"Task {task_id} is not in queue {queue}")
    if status not in k.FINISHED_STATUSES:
        raise InvalidTaskState(
            f"Cannot delete task with status {status}: only complete or failed tasks "
            "can be deleted (cancel it first)"
        )
    return status


def purge_cutoff(status: str, older_than: float) -> float:
    """The finish time (Unix s) before which purge deletes tasks of ``status``."""
    if status not in k.FINISHED_STATUSES:
        raise InvalidTaskState(f"only complete or failed tasks can be purged, not {status!r}")
    # NaN compares False with everything: unchecked, its cutoff deleted every finished task
    if not older_than >= 0:
        raise ConfigurationError(
            f"older_than must be a number of seconds >= 0, not {older_than!r}")
    return time.time() - older_than


class TaskId(str):
    """The id ``enqueue`` and ``schedule`` return (a str, as in blueque 1.0.1), which also
    says whether this call created the task: ``created`` is False when a task with that id
    already existed (an idempotent re-enqueue that changed nothing).

    It goes wherever a str goes: pickle (a multiprocessing pool's arguments and results),
    copy and deepcopy keep it a TaskId with its flag; ``json.dumps`` writes the id."""

    created: bool

    def __new__(cls, task_id: str, created: bool = True) -> TaskId:
        self = super().__new__(cls, task_id)
        self.created = created
        return self

    def __reduce__(self) -> tuple[type[TaskId], tuple[str, bool]]:
        # str's own reduction rebuilds the object with the text alone: __new__ then lacked
        # ``created``, and every pickle, copy and deepcopy raised TypeError
        return type(self), (str(self), self.created)


@dataclass(frozen=True)
class BulkEnqueue:
    """What enqueue_many did: the id of every task, and how many were new."""

    task_ids: list[str]
    created_flags: list[bool]

    @property
    def created(self) -> int:
        return sum(self.created_flags)

    @property
    def existing(self) -> int:
        return len(self.created_flags) - self.created

    def __iter__(self) -> Iterator[str]:
        return iter(self.task_ids)

    def __len__(self) -> int:
        return len(self.task_ids)


@dataclass(frozen=True)
class QueueStats(QueueCounts):
    name: str = ""


class Queue:
    def __init__(self, name: str, store: RedisStore) -> None:
        self._name = given_queue_name(name)
        self._store = store

    @property
    def name(self) -> str:
        return self._name

    def __repr__(self) -> str:
        return f"<Queue {self._name}>"

    def enqueue(self, parameters: object, task_id: str | None = None, **options: object
                ) -> TaskId:
        """Create a pending task and return its id (a ``TaskId``: a str whose ``created`` is
        False if the task already existed). With ``task_id``, enqueueing the same id again
        creates nothing (idempotent while the task exists); an id that exists in another queue
        raises InvalidTaskState. ``options``: max_attempts, retry_backoff, retry_backoff_max,
        time_limit, kill_grace, result_ttl."""
        task_id, text, fields = submission(self._store.keys, self._name, parameters, task_id,
                                           options)
        created = self._store.submit(self._name, task_id, text, now(), fields=fields)
        return TaskId(task_id, created)

    def enqueue_many(
        self, parameters: Sequence[object], task_ids: Sequence[str] | None = None
    ) -> BulkEnqueue:
        """Create many pending tasks in a few round trips (1,000 per server-side script call).
        With ``task_ids``, ids that already exist are left alone and counted as existing."""
        tasks = bulk_submission(self._store.keys, self._name, parameters, task_ids)
        flags = self._store.submit_many(self._name, tasks, now())
        return BulkEnqueue([task_id for task_id, _ in tasks], flags)

    def schedule(
        self, parameters: object, eta: float, task_id: str | None = None, **options: object
    ) -> TaskId:
        """Create a task to run at ``eta`` (Unix time); an eta in the past enqueues at once.
        Returns a ``TaskId``, as enqueue does."""
        current = now()
        if eta < current:
            return self.enqueue(parameters, task_id, **options)
        task_id, text, fields = submission(self._store.keys, self._name, parameters, task_id,
                                           options)
        created = self._store.submit(self._name, task_id, text, current, eta=float(eta),
                                     fields=fields)
        return TaskId(task_id, created)

    def enqueue_due_tasks(self) -> list[str]:
        """Move every scheduled task whose eta has passed to pending; returns their ids."""
        return self._store.run(protocol.enqueue_due_tasks(self._store.keys, self._name, now()))

    def delete_task(self, task: Task) -> None:
        """Delete a complete or failed task (its hash and its finished-list entry)."""
        status = check_deletable(self._name, task.id, task.queue, task.status)
        self._store.delete(self._name, task.id, status)

    def stats(self) -> QueueStats:
        """Counts per state and listeners, from O(1) commands: fine every second."""
        counts = self._store.counts(self._name)
        return QueueStats(**vars(counts), name=self._name)

    def task_ids(self, status: str, start: int = 0, stop: int = -1) -> list[str]:
        return self._store.task_ids(self._name, status, start, stop)

    def retry_failed(self, limit: int | None = None) -> list[str]:
        """Make this queue's failed tasks pending again, oldest first (the ``limit`` oldest
        only), their attempts kept: retry_failed.lua per task, as ``Client.retry_task``.
        Returns the ids retried; a task retried, deleted or expired meanwhile is skipped."""
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                                  or limit < 1):
            raise ConfigurationError(f"limit must be a whole number >= 1, not {limit!r}")
        # blueque_failed_tasks_[queue] has the newest at the left: the oldest are at its end
        oldest = self.task_ids(k.FAILED, -limit if limit is not None else 0, -1)[::-1]
        retried = []
        for task_id in oldest:
            try:
                self._store.retry_failed(self._name, task_id, now())
            except (InvalidTaskState, TaskNotFound):
                continue
            retried.append(task_id)
        return retried

    def configure(self, **options: object) -> None:
        """Set queue defaults (max_attempts, retry_backoff, time_limit, result_ttl...); a value
        of None removes that default."""
        check_queue_name(self._name)
        removed = [name for name, value in options.items() if value is None]
        self._store.set_queue_config(self._name, encode_options(options), removed)

    def config(self) -> dict[str, str]:
        return self._store.queue_config(self._name)

    def purge(self, status: str, older_than: float, batch: int = 500) -> int:
        """Delete finished tasks of ``status`` that finished more than ``older_than`` seconds
        ago, oldest first; each deletion finds its entry at the list's old end, so the cost
        is O(deleted), not O(list length)."""
        cutoff = purge_cutoff(status, older_than)
        return self._store.run(protocol.purge(self._store.keys, self._name, status, cutoff,
                                              batch))
