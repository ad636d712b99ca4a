"""Task: a read-only view of one task hash, with refresh() and wait()."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from blueque import keys as k
from blueque.errors import CorruptTask, TaskNotFound, WaitTimeout
from blueque.store import RedisStore


def _parse(task_id: str, field: str, convert: Callable[[str], Any], raw: str | None) -> Any:
    if raw is None or raw == "":
        return None
    try:
        return convert(raw)
    except ValueError as error:
        raise CorruptTask(
            f"task {task_id!r} has a corrupt {field!r} field ({raw!r}); fix or delete the hash "
            f"{k.Keys().task(task_id)!r}"
        ) from error


def _as_int(raw: str) -> int:
    return int(float(raw))


#: How often a wait re-reads the hash whatever the done channel says (1.0.1 writers do not
#: publish): the longest a wait listens before it reads again.
WAIT_REREAD = 1.0


class TaskView:
    """All fields of ``blueque_task_[id]`` as last read; every attribute of a missing task is
    None. What blueque.Task and blueque.aio.Task share: they differ only in how they read.

    Typed fields: pid and attempts (int), created, updated, eta, started_at, finished_at,
    progress (float). A corrupt typed field raises CorruptTask when read."""

    def __init__(self, task_id: str, data: dict[str, str]) -> None:
        self._id = task_id
        self._data = data

    def __repr__(self) -> str:
        return f"<Task {self._id} {self.status}>"

    @property
    def data(self) -> dict[str, str]:
        """Every raw field of the hash, including fields other tools added."""
        return dict(self._data)

    @property
    def exists(self) -> bool:
        return bool(self._data)

    @property
    def finished(self) -> bool:
        return self.status in k.FINISHED_STATUSES

    def waited_queue(self) -> str:
        """The queue whose done channel a wait listens on, after the first read of an
        unfinished task: TaskNotFound for a missing task, CorruptTask without a queue."""
        if not self.exists:
            raise TaskNotFound(self._id)
        if self.queue is None:
            raise CorruptTask(f"task {self._id!r} has no queue field; cannot wait for it")
        return str(self.queue)

    def listen_for(self, timeout: float | None, deadline: float | None) -> float:
        """After a re-read of an unfinished task: how long a wait may listen on the done
        channel before reading again; TaskNotFound if the task was deleted (or expired)
        meanwhile, WaitTimeout once ``deadline`` (time.monotonic) has passed."""
        if not self.exists:  # deleted (or expired) while we waited
            raise TaskNotFound(self._id)
        remaining = WAIT_REREAD if deadline is None else deadline - time.monotonic()
        if remaining <= 0:
            raise WaitTimeout(f"task {self._id} is still {self.status} after {timeout} s")
        return min(WAIT_REREAD, remaining)

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
        return _parse(self._id, "pid", _as_int, self._get("pid"))  # type: ignore[no-any-return]

    @property
    def attempts(self) -> int | None:
        return _parse(self._id, "attempts", _as_int, self._get("attempts"))  # type: ignore[no-any-return]

    @property
    def created(self) -> float | None:
        return _parse(self._id, "created", float, self._get("created"))  # type: ignore[no-any-return]

    @property
    def updated(self) -> float | None:
        return _parse(self._id, "updated", float, self._get("updated"))  # type: ignore[no-any-return]

    @property
    def eta(self) -> float | None:
        return _parse(self._id, "eta", float, self._get("eta"))  # type: ignore[no-any-return]

    @property
    def started_at(self) -> float | None:
        return _parse(self._id, "started_at", float, self._get("started_at"))  # type: ignore[no-any-return]

    @property
    def finished_at(self) -> float | None:
        return _parse(self._id, "finished_at", float, self._get("finished_at"))  # type: ignore[no-any-return]

    @property
    def progress(self) -> float | None:
        return _parse(self._id, "progress", float, self._get("progress"))  # type: ignore[no-any-return]

    @property
    def cancelled(self) -> bool:
        return bool(self._get("cancelled"))


class Task(TaskView):
    """A task hash read through the sync client: ``refresh()`` re-reads it, ``wait()``
    blocks until it ends. See TaskView for the attributes."""

    def __init__(self, task_id: str, store: RedisStore, data: dict[str, str] | None = None):
        super().__init__(task_id, store.task_data(task_id) if data is None else data)
        self._store = store

    def refresh(self) -> Task:
        """Re-read the task hash (one HGETALL); returns self."""
        self._data = self._store.task_data(self._id)
        return self

    def wait(self, timeout: float | None = None) -> Task:
        """Block until the task is complete or failed; raise WaitTimeout (a TimeoutError)
        after ``timeout``. A Redis restart or failover shorter than the client's
        ``retry_deadline`` goes unnoticed; a longer one raises RedisUnavailable.

        Listens on blueque_done_[queue] (published by every finish), and re-reads the hash at
        least once a second, for finishes by writers that do not publish (blueque 1.0.1)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.refresh().finished:
            return self
        queue = self.waited_queue()
        # a Subscription rides out a lost connection: the refresh, under the store's retry
        # policy, decides whether Redis came back in time (else RedisUnavailable)
        subscription = self._store.subscribe([self._store.keys.done_channel(queue)])
        try:
            subscription.get_message(timeout=0)  # subscribe before the first re-read
            while not self.refresh().finished:
                subscription.get_message(timeout=self.listen_for(timeout, deadline))
        finally:
            subscription.close()
        return self
