"""Queue: submit tasks, move due ones, inspect counts, delete and purge finished ones."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from blueque import dependencies, ended, keyed, pausing, protocol
from blueque import keys as k
from blueque.display import parse_duration
from blueque.errors import ConfigurationError, InvalidTaskState, WrongType
from blueque.protocol import CancelledWaiting, QueueCounts
from blueque.statuses import CANCELLED, ENDED_LISTS, FAILED, FINISHED_STATUSES, PENDING, SCHEDULED
from blueque.store import RedisStore
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


@functools.lru_cache(maxsize=1024)
def _name_problem(name: str) -> str | None:
    """keys.queue_name_problem of a str, remembered: a queue's name is checked at every
    enqueue, and looking at each character costed 2 us of an enqueue's 30 (issue 20)."""
    return k.queue_name_problem(name)


def check_queue_name(name: object) -> str:
    """The one queue-name rule (keys.QUEUE_NAME_RULE), checked wherever a queue is made:
    enqueue, configure, listen. ConfigurationError says what is wrong."""
    problem = _name_problem(name) if type(name) is str else k.queue_name_problem(name)
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
        keyed.task_options(keys, options)



def bulk_submission(keys: k.Keys, queue: str, parameters: Sequence[object],
                    task_ids: Sequence[str] | None) -> list[tuple[str, str]]:
    """What enqueue_many passes to protocol.submit_many, checked: (id, parameters as text)
    per task."""
    check_queue_name(queue)
    texts = [_text(p, "parameters") for p in parameters]
    return list(zip(bulk_ids(keys, queue, len(texts), task_ids), texts, strict=True))


def check_deletable(queue: str, task_id: str, task_queue: str | None, status: str | None,
                    cancelled: bool = False) -> str:
    """The list of a task delete_task may delete (complete or failed, in this queue): its
    status, or cancelled for a failed task stamped cancelled."""
    if task_queue != queue:
        raise InvalidTaskState(f"Task {task_id} is not in queue {queue}")
    if status not in FINISHED_STATUSES:
        raise InvalidTaskState(
            f"Cannot delete task with status {status}: only complete or failed tasks "
            "can be deleted (cancel it first)"
        )
    return CANCELLED if status == FAILED and cancelled else status


def purge_cutoff(state: str, older_than: float, current: float) -> float:
    """The finish time (Unix s on Redis' clock, as ``current``) before which purge deletes
    tasks of ``state``."""
    if state not in ENDED_LISTS:
        raise InvalidTaskState(
            f"only complete, failed or cancelled tasks can be purged, not {state!r}")
    return current - seconds_ago(older_than, "older_than")


def seconds_ago(value: float, name: str) -> float:
    """An age in seconds, checked: a number >= 0 (NaN compares False with everything:
    unchecked, its cutoff would take every task)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ConfigurationError(f"{name} must be a number of seconds >= 0, not {value!r}")
    return float(value)


def bulk_cancel(older_than: float | None, match: str | None, reason: str, scheduled: bool,
                current: float) -> tuple[float | None, str | None, str, tuple[str, ...]]:
    """What cancel_waiting passes to protocol.cancel_waiting, checked: (created cutoff on
    Redis' clock, as ``current``; id pattern, error text, lists)."""
    cutoff = None if older_than is None else current - seconds_ago(older_than, "older_than")
    if match is not None and (not isinstance(match, str) or not match):
        raise ConfigurationError(f"match must be a non-empty pattern such as 'batch-7-*', "
                                 f"not {match!r}")
    if not isinstance(reason, str):
        raise ConfigurationError(f"reason must be a string, not {reason!r}")
    sources = (PENDING, SCHEDULED) if scheduled else (PENDING,)
    return cutoff, match, f"cancelled: {reason}", sources


def check_limit(limit: int | None) -> int | None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                              or limit < 1):
        raise ConfigurationError(f"limit must be a whole number >= 1, not {limit!r}")
    return limit


def due_time(eta: float | None, delay: float | str | None, current: float) -> float:
    """When a scheduled task is due (Unix s, Redis' clock): ``eta`` as given, or ``delay``
    seconds after ``current`` (a number, or text as the CLI's ``--delay`` takes it: ``"1h"``);
    exactly one of the two."""
    if (eta is None) == (delay is None):
        raise ConfigurationError("schedule needs an eta (Unix time) or a delay (seconds), "
                                 "one of the two")
    if isinstance(delay, str):
        delay = parse_duration(delay)
    when = eta if delay is None else delay
    if isinstance(when, bool) or not isinstance(when, (int, float)) or not math.isfinite(when):
        raise ConfigurationError(f"{'eta' if delay is None else 'delay'} must be a finite "
                                 f"number, not {when!r}")
    if delay is not None and delay < 0:
        raise ConfigurationError(f"delay must be 0 seconds or more, not {delay!r}")
    return float(when) if delay is None else current + float(delay)


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

    def enqueue(self, parameters: object, task_id: str | None = None, *,
                after: object = None, after_any: object = False,
                **options: object) -> TaskId:
        """Create a pending task and return its id (a ``TaskId``: a str whose ``created`` is
        False if the task already existed). With ``task_id``, enqueueing the same id again
        creates nothing (idempotent while the task exists); an id that exists in another queue
        raises InvalidTaskState. ``options``: max_attempts, retry_backoff, retry_backoff_max,
        time_limit, kill_grace, result_ttl, max_preemptions, keep_processes, exclusive,
        checkpoint_max_bytes (blueque.policy); concurrency_key, requires (PROTOCOL.md 5.22:
        a task no live listener of the queue could run is said in a warning).

        ``after``: a task id or ids (of any queue): the task is created ``waiting`` and
        becomes pending once every one of them has completed; one that fails or is cancelled
        ends it as failed instead, unless ``after_any`` (then any ending releases it).
        DependencyError for an unknown id, nothing written (PROTOCOL.md 5.21)."""
        task_id, text, fields = submission(self._store.keys, self._name, parameters, task_id,
                                           options)
        self._check_placement(fields, task_id)
        if after is not None:
            return self._submit_after(task_id, text, fields, after, after_any)
        created = self._store.submit(self._name, task_id, text, self._store.now(), fields=fields)
        return TaskId(task_id, created)

    def _check_placement(self, fields: dict[str, str], what: str) -> None:
        """Warn of a task whose ``requires`` no live listener of the queue offers (5.22)."""
        if "requires" in fields:
            keyed.warn_unplaceable(self._name, what, fields["requires"],
                                   self._store.perform(keyed.live_offers, self._name))

    def _submit_after(self, task_id: str, text: str, fields: dict[str, str],
                      after: object, after_any: object,
                      eta: float | None = None) -> TaskId:
        created = self._store.perform(
            dependencies.submit_after, self._name, task_id, text, self._store.now(),
            dependencies.wanted(task_id, after, after_any), eta, fields)
        return TaskId(task_id, created)

    def enqueue_many(
        self, parameters: Sequence[object], task_ids: Sequence[str] | None = None, *,
        after: object = None, after_any: object = False, **options: object
    ) -> BulkEnqueue:
        """Create many pending tasks in a few round trips (1,000 per server-side script call).
        With ``task_ids``, ids that already exist are left alone and counted as existing.
        With ``after``, every task waits for those tasks, as ``enqueue(after=...)`` (one
        call per task). ``options`` (enqueue's) apply to every task."""
        tasks = bulk_submission(self._store.keys, self._name, parameters, task_ids)
        fields = keyed.task_options(self._store.keys, options)
        self._check_placement(fields, f"{len(tasks)} tasks")
        if after is not None:
            ids = [self._submit_after(i, text, fields, after, after_any) for i, text in tasks]
            return BulkEnqueue([str(i) for i in ids], [i.created for i in ids])
        flags = self._store.submit_many(self._name, tasks, self._store.now(), fields)
        return BulkEnqueue([task_id for task_id, _ in tasks], flags)

    def schedule(
        self, parameters: object, eta: float | None = None, task_id: str | None = None, *,
        delay: float | str | None = None, after: object = None,
        after_any: object = False, **options: object
    ) -> TaskId:
        """Create a task to run at ``eta`` (Unix time: an instant, on Redis' clock like every
        Blueque time) or ``delay`` seconds from now (by Redis' clock: "in an hour" whatever
        this host's clock says; give one of the two); an eta in the past enqueues at once.
        Returns a ``TaskId``, as enqueue does. With ``after`` (see enqueue), it waits for
        those tasks, and is released to run at the eta (at once if it has passed)."""
        current = self._store.now()
        eta = due_time(eta, delay, current)
        if eta < current:
            return self.enqueue(parameters, task_id, after=after, after_any=after_any,
                                **options)
        task_id, text, fields = submission(self._store.keys, self._name, parameters, task_id,
                                           options)
        self._check_placement(fields, task_id)
        if after is not None:
            return self._submit_after(task_id, text, fields, after, after_any, float(eta))
        created = self._store.submit(self._name, task_id, text, current, eta=float(eta),
                                     fields=fields)
        return TaskId(task_id, created)

    def enqueue_due_tasks(self) -> list[str]:
        """Move every scheduled task whose eta has passed to pending; returns their ids."""
        return self._store.run(protocol.enqueue_due_tasks(self._store.keys, self._name,
                                                         self._store.now()))

    def delete_task(self, task: Task) -> None:
        """Delete a complete or failed task (its hash and its entry in the complete, failed
        or cancelled list)."""
        state = check_deletable(self._name, task.id, task.queue, task.status, task.cancelled)
        self._store.delete(self._name, task.id, state)

    def stats(self) -> QueueStats:
        """Counts per state and listeners, from O(1) commands: fine every second.
        ``cancelled`` tasks (failed, stamped cancelled) are counted apart from ``failed``."""
        counts = self._store.counts(self._name)
        return QueueStats(**vars(counts), name=self._name)

    def pause(self, reason: str | None = None) -> None:
        """Stop every listener daemon starting this queue's tasks until ``resume()``
        (blueque_paused_[queue], PROTOCOL.md 5.16c): running tasks go on, enqueues are
        kept; it lasts through listener and Redis restarts. Blueque 1.0.1 listeners ignore it."""
        self._store.perform(pausing.pause, self._name, reason, self._store.now())

    def resume(self) -> bool:
        """Let listeners start this queue's tasks again, at once; False if it was not paused."""
        return self._store.perform(pausing.resume, self._name)

    def task_ids(self, status: str, start: int = 0, stop: int = -1) -> list[str]:
        """Ids of the tasks in one state: a status, or ``cancelled`` (statuses.STATES)."""
        return self._store.task_ids(self._name, status, start, stop)

    def retry_failed(self, limit: int | None = None, include_cancelled: bool = False
                     ) -> list[str]:
        """Make this queue's failed tasks pending again, oldest first (the ``limit`` oldest
        only), their attempts kept: retry_failed.lua per task, as ``Client.retry_task``.
        Cancelled tasks are left alone (cancelled means never) unless ``include_cancelled``
        (then after the failed ones). Returns the ids retried; a task retried, deleted or
        expired meanwhile is skipped."""
        return self._store.run(ended.retry_failed_tasks(
            self._store.keys, self._name, self._store.now, check_limit(limit),
            include_cancelled))

    def cancel_waiting(self, older_than: float | None = None, match: str | None = None,
                       reason: str = "cancelled", scheduled: bool = True) -> CancelledWaiting:
        """Cancel every pending and (unless ``scheduled`` is False) scheduled task of this
        queue, or only those created more than ``older_than`` seconds ago and/or whose id
        matches the shell-style pattern ``match`` (``batch-7-*``). Each is recorded as
        ``Client.cancel_task`` records one (failed, stamped cancelled, counted cancelled, its
        waiters woken) with the error ``cancelled: <reason>``. Running tasks are not touched
        (cancel them by id). Works through the lists CANCEL_BATCH tasks per script call
        (cancel_pending.lua, cancel_scheduled.lua), so Redis is never held for long; a task a
        listener takes meanwhile runs. Tasks that become pending while it works (recovered,
        retried) may be left. Returns how many were cancelled from each list."""
        cutoff, match, error, sources = bulk_cancel(older_than, match, reason, scheduled,
                                                    self._store.now())
        return self._store.run(protocol.cancel_waiting(
            self._store.keys, self._name, self._store.now, error, cutoff, match, sources))

    def configure(self, **options: object) -> None:
        """Set queue defaults (max_attempts, retry_backoff, time_limit, result_ttl...); a value
        of None removes that default."""
        check_queue_name(self._name)
        removed = [name for name, value in options.items() if value is None]
        self._store.set_queue_config(self._name, keyed.task_options(self._store.keys, options,
                                                                    True), removed)

    def config(self) -> dict[str, str]:
        return self._store.queue_config(self._name)

    def purge(self, status: str, older_than: float, batch: int = 500) -> int:
        """Delete the tasks of ``status`` (complete, failed, or cancelled: the failed tasks
        that were cancelled) that finished more than ``older_than`` seconds ago, oldest
        first; each deletion finds its entry at the list's old end, so the cost is
        O(deleted), not O(list length)."""
        cutoff = purge_cutoff(status, older_than, self._store.now())
        return self._store.run(ended.purge(self._store.keys, self._name, status, cutoff,
                                              batch))
