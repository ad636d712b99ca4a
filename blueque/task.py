"""Task: a view of one task hash, with refresh() and wait(), and its running attempt's
checkpoint (save_checkpoint, checkpoint)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from blueque import dependencies
from blueque import keys as k
from blueque.errors import (
    CheckpointTooLarge,
    CorruptTask,
    InvalidTaskState,
    MissingTaskWarning,
    TaskNotFound,
    WaitTimeout,
    WrongType,
)
from blueque.history import task_history
from blueque.statuses import FINISHED_STATUSES, RESERVED, STARTED, finish_time, state_of
from blueque.waiting import WaitResult, drive

if TYPE_CHECKING:
    from blueque.store import RedisStore

T = TypeVar("T")


def _parse(task_id: str, field: str, convert: Callable[[str], T], raw: str | None
           ) -> T | None:
    if raw is None or raw == "":
        return None
    try:
        return convert(raw)
    except ValueError as error:
        raise CorruptTask(
            f"task {task_id!r} has a corrupt {field!r} field ({raw!r}); fix or delete the hash "
            f"{k.Keys().task(task_id)!r}"
        ) from error


def utf8_size(text: str, what: str) -> int:
    """The size of ``text`` in UTF-8, as Redis stores it; WrongType for text UTF-8 cannot
    encode (a lone surrogate, as a decode with errors="surrogateescape" leaves), which would
    otherwise reach the caller as redis-py's UnicodeEncodeError, outside the BluequeError
    tree."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError as error:
        raise WrongType(
            f"{what} cannot be stored: it is not valid UTF-8 text ({error.reason} at "
            f"position {error.start}); encode it with json.dumps, which escapes it"
        ) from error


def _as_int(raw: str) -> int:
    return int(float(raw))


@dataclass(frozen=True)
class CheckpointInfo:
    """What a task's last checkpoint is, without its state: its size in bytes (UTF-8), when
    it was saved (Unix s, the saver's clock) and by which attempt."""

    size: int
    saved_at: float
    attempt: int

    @classmethod
    def parse(cls, task_id: str, fields: dict[str, str]) -> CheckpointInfo | None:
        if not fields:
            return None
        try:
            return cls(int(fields["size"]), float(fields["saved_at"]), int(fields["attempt"]))
        except (KeyError, ValueError) as error:
            raise CorruptTask(
                f"the checkpoint of task {task_id!r} is corrupt ({fields!r} without its "
                f"state); delete {k.Keys().checkpoint(task_id)!r}"
            ) from error


_UNREAD: Any = object()


def warn_missing(task_id: str) -> None:
    """What ``get_task`` says of an id with no task hash (MissingTaskWarning, at its
    caller's line)."""
    warnings.warn(
        f"task {task_id!r} does not exist (never enqueued, or deleted, or its result "
        "expired): every attribute of this Task is None. get_task(id, missing_ok=True) asks "
        "without this warning; task.exists tells", MissingTaskWarning, stacklevel=3)


class TaskView:
    """All fields of ``blueque_task_[id]`` as last read; every attribute of a missing task is
    None. What blueque.Task and blueque.aio.Task share: they differ only in how they read.

    Typed fields: pid and attempts (int), created, updated, eta, started_at, finished_at,
    progress (float). A corrupt typed field raises CorruptTask when read."""

    def __init__(self, task_id: str, data: dict[str, str]) -> None:
        self._id = task_id
        self._data = data

    def __repr__(self) -> str:
        return f"<Task {self._id} {self.status if self._data else '(no such task)'}>"

    @property
    def data(self) -> dict[str, str]:
        """Every raw field of the hash, including fields other tools added."""
        return dict(self._data)

    @property
    def exists(self) -> bool:
        return bool(self._data)

    @property
    def finished(self) -> bool:
        return self.status in FINISHED_STATUSES

    def _waited(self, result: WaitResult, timeout: float | None) -> None:
        """After a wait for this task: TaskNotFound if it does not exist (or was deleted, or
        expired, meanwhile), WaitTimeout if ``timeout`` passed before it ended."""
        if not self.exists:
            raise TaskNotFound(self._id)
        if not result.done:
            raise WaitTimeout(f"task {self._id} is still {self.status} after {timeout} s")

    def _get(self, field: str) -> str | None:
        return self._data.get(field)

    id = property(lambda self: self._id)
    status = property(lambda self: self._get("status"))
    queue = property(lambda self: self._get("queue"))
    parameters = property(lambda self: self._get("parameters"))
    result = property(lambda self: self._get("result"))
    error = property(lambda self: self._get("error"))
    node = property(lambda self: self._get("node"))
    progress_message = property(lambda self: self._get("progress_message"))

    @property
    def pid(self) -> int | None:
        return _parse(self._id, "pid", _as_int, self._get("pid"))

    @property
    def attempts(self) -> int | None:
        return _parse(self._id, "attempts", _as_int, self._get("attempts"))

    @property
    def created(self) -> float | None:
        return _parse(self._id, "created", float, self._get("created"))

    @property
    def updated(self) -> float | None:
        return _parse(self._id, "updated", float, self._get("updated"))

    @property
    def eta(self) -> float | None:
        return _parse(self._id, "eta", float, self._get("eta"))

    @property
    def started_at(self) -> float | None:
        return _parse(self._id, "started_at", float, self._get("started_at"))

    @property
    def finished_at(self) -> float | None:
        """When a finished task ended (its ``finished_at``, written before issue 29, else its
        ``updated``); None while it has not."""
        field = "finished_at" if self._get("finished_at") else "updated"
        return _parse(self._id, field, float, finish_time(self._data))

    @property
    def progress(self) -> float | None:
        return _parse(self._id, "progress", float, self._get("progress"))

    @property
    def cancelled(self) -> bool:
        return bool(self._get("cancelled"))

    @property
    def state(self) -> str | None:
        """The status, or ``cancelled`` for a failed task that was cancelled (how it is
        counted and listed); None for a missing task."""
        return state_of(self._data)

    @property
    def history(self) -> list[dict[str, Any]]:
        """How each earlier run (and an operator's retry) ended, oldest first, the last 20
        (PROTOCOL.md 3.2): dicts with ``attempt``, ``outcome`` (complete, failed, retry,
        cancelled, preempted, requeued, retried), ``at`` (Unix s), ``node`` (the listener),
        ``pid``, ``started``, ``error``, ``eta`` (of a retry), ``was`` (the status a cancel
        or a retry found). The current fields describe the current attempt only."""
        return task_history(self._data)

    @property
    def after(self) -> list[str]:
        """The ids of the tasks this one was enqueued after (its parents), [] for none."""
        return dependencies.after_of(self._data)


class Task(TaskView):
    """A task hash read through the sync client: ``refresh()`` re-reads it, ``wait()``
    blocks until it ends. See TaskView for the attributes. The task function gets one:
    ``checkpoint`` (read at first use) and ``save_checkpoint(state)`` let a long job resume
    where a dead attempt left off (PROTOCOL.md 5.20)."""

    def __init__(self, task_id: str, store: RedisStore, data: dict[str, str] | None = None):
        super().__init__(task_id, store.task_data(task_id) if data is None else data)
        self._store = store
        #: (attempt, listener id) of the run this object belongs to: the first reserved or
        #: started attempt it read. A refresh that finds a newer attempt leaves it as it is,
        #: so a superseded run stays fenced out even if it re-reads its task.
        self._run: tuple[int, str] | None = None
        self._note_run()
        self._checkpoint: dict[str, str] | None = _UNREAD
        self._checkpoint_info: CheckpointInfo | None = _UNREAD
        self._queue_limit: str | None = _UNREAD

    def refresh(self) -> Task:
        """Re-read the task hash (one HGETALL); returns self. The checkpoint is read again at
        its next use."""
        self._take(self._store.task_data(self._id))
        return self

    def _take(self, data: dict[str, str]) -> None:
        self._data = data
        self._note_run()
        self._checkpoint = self._checkpoint_info = _UNREAD

    def _note_run(self) -> None:
        if self._run is not None or self._get("status") not in (RESERVED, STARTED):
            return
        attempts, node = self.attempts, self.node
        if attempts is not None and node:
            self._run = (attempts, node)

    def parents(self) -> list[Task]:
        """The tasks this one was enqueued after, read now (one pipeline): their ids,
        statuses and results, for a task that assembles what they made. A parent deleted
        or expired since reads as missing."""
        after = self.after
        return [Task(parent, self._store, data)
                for parent, data in zip(after, self._store.task_data_many(after), strict=True)]

    def awaiting(self) -> list[str]:
        """The parents a waiting task has not yet been told the ending of (PROTOCOL.md
        5.21): what it waits for. [] once it was released or ended."""
        return self._store.perform(dependencies.awaited, self._id)

    def wait(self, timeout: float | None = None) -> Task:
        """Block until the task is complete or failed; raise WaitTimeout (a TimeoutError)
        after ``timeout``, TaskNotFound if it does not exist or is deleted meanwhile. A Redis
        restart or failover shorter than the client's ``retry_deadline`` goes unnoticed; a
        longer one raises RedisUnavailable.

        Listens on blueque_done_[queue] (published by every finish), and re-reads the hash at
        least once a second, for finishes by writers that do not publish (blueque 1.0.1): the
        one wait of blueque.waiting."""
        result = WaitResult([self._id])
        drive(self._store, result, lambda ids: [self._store.task_data(i) for i in ids], timeout,
              on_read=lambda: self._take(result.tasks[self._id]))
        self._waited(result, timeout)
        return self

    # --- the running attempt's checkpoint (blueque_checkpoint_[id], PROTOCOL.md 5.20) -------
    @property
    def checkpoint(self) -> str | None:
        """The last checkpoint saved for this task (by this attempt or an earlier one), or
        None: where a re-run resumes from. Read at first use (one HGETALL of its own key), so
        a task that never uses checkpoints pays nothing for them."""
        if self._checkpoint is _UNREAD:
            self._checkpoint = self._store.checkpoint(self._id)
            self._checkpoint_info = CheckpointInfo.parse(self._id, self._checkpoint)
        return self._checkpoint.get("state") if self._checkpoint else None

    @property
    def checkpoint_info(self) -> CheckpointInfo | None:
        """Size, save time and attempt of the last checkpoint, or None; read without the
        state itself (HMGET) unless ``checkpoint`` was read already."""
        if self._checkpoint_info is _UNREAD:
            self._checkpoint_info = CheckpointInfo.parse(
                self._id, self._store.checkpoint_info(self._id))
        return self._checkpoint_info

    def save_checkpoint(self, state: str) -> CheckpointInfo:
        """Store ``state`` (text, JSON by convention; never a pickle) as this task's
        checkpoint, replacing the previous one: if this attempt dies, the next one reads it
        as ``task.checkpoint`` and resumes from there. One round trip (checkpoint.lua).

        Fenced like an outcome: raises StaleAttempt, writing nothing, once this run has been
        superseded (its task recovered and reserved again) or has ended, so a stale run never
        overwrites a newer attempt's checkpoint; stop working then. Rides through a Redis
        restart or failover for the client's ``retry_deadline`` (30 s by default), then
        raises RedisUnavailable (a BluequeError the task may catch and save later). Raises
        WrongType for a state that is not a str, and CheckpointTooLarge, writing nothing, for
        one larger than ``checkpoint_max_bytes`` (the task's option, else its queue's
        default, else the client's; 1 MiB by default). Keys: blueque_task_[id] (read),
        blueque_checkpoint_[id]."""
        if not isinstance(state, str):
            raise WrongType(
                f"a checkpoint must be a string (JSON by convention), not "
                f"{type(state).__name__}: encode it with json.dumps first"
            )
        if self._run is None:
            if self.status in (RESERVED, STARTED):  # reserved by blueque 1.0.1
                raise InvalidTaskState(
                    f"task {self._id} has no attempt number (blueque 1.0.1 reserved it): "
                    "a checkpoint that cannot be fenced by attempt is not saved"
                )
            raise InvalidTaskState(
                f"task {self._id} is {self.status or 'missing'}: only a reserved or started "
                "attempt can save a checkpoint (call save_checkpoint from the task function)"
            )
        size = utf8_size(state, "the checkpoint")
        limit = self._checkpoint_limit()
        if size > limit:
            raise CheckpointTooLarge(
                f"the checkpoint of task {self._id} is {size} bytes, more than its limit of "
                f"{limit} (checkpoint_max_bytes); nothing was saved. Store large state "
                "elsewhere (a file, an object store) and checkpoint a reference to it"
            )
        attempt, listener = self._run
        saved_at = self._store.now()
        size = self._store.unbounded.save_checkpoint(self._id, attempt, listener, state,
                                                     saved_at)
        info = CheckpointInfo(size, saved_at, attempt)
        self._checkpoint = {"state": state, "saved_at": repr(saved_at),
                            "attempt": str(attempt), "size": str(size)}
        self._checkpoint_info = info
        return info

    def _checkpoint_limit(self) -> int:
        """checkpoint_max_bytes: the task's own option, else its queue's default (read once
        per Task), else the client's."""
        raw = self._get("checkpoint_max_bytes")
        if not raw and self.queue is not None:
            if self._queue_limit is _UNREAD:
                config = self._store.unbounded.queue_config(self.queue)
                self._queue_limit = config.get("checkpoint_max_bytes")
            raw = self._queue_limit
        try:
            return int(float(raw)) if raw else self._store.checkpoint_max_bytes
        except (ValueError, OverflowError):  # a corrupt option falls back, as policy.py does
            return self._store.checkpoint_max_bytes
