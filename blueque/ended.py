"""The protocol operations on ended tasks, written once for both clients as ``blueque.protocol``
writes the others (its steps, Script and Command, run by the sync and the asyncio store): a
failed task retried (PROTOCOL.md 5.11), an ended one deleted (5.7), an ended list purged (5.8).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import cast

from blueque import keys as k
from blueque.errors import InvalidTaskState, TaskNotFound
from blueque.policy import field_float
from blueque.protocol import (
    CHECKPOINT_KEEP,
    Operation,
    Procedure,
    Script,
    bind,
    command,
    task_data_many,
    task_ids,
)
from blueque.statuses import CANCELLED, FAILED, finish_time, status_of_list

#: How far delete.lua looks from each end of a finished list before a full LREM.
DELETE_WINDOW = 512


def retry_failed(keys: k.Keys, queue: str, task_id: str, now: float,
                 skip_cancelled: bool = False) -> Operation[bool]:
    """Failed -> pending again, attempts kept (retry_failed.lua); False when the task was
    cancelled and ``skip_cancelled`` (a bulk retry leaves it). Keys: task hash, failed and
    cancelled lists, pending list, checkpoint (kept: the re-run resumes from it). Raises
    TaskNotFound or InvalidTaskState (not failed)."""
    return bool((yield Script(
        "retry_failed",
        [keys.task(task_id), keys.failed(queue), keys.pending(queue), keys.checkpoint(task_id),
         keys.cancelled(queue)],
        [task_id, repr(now), queue, keys.channel(queue), DELETE_WINDOW,
         int(CHECKPOINT_KEEP * 1000), "1" if skip_cancelled else ""])))


def retry_failed_tasks(keys: k.Keys, queue: str, clock: Callable[[], float],
                       limit: int | None = None, include_cancelled: bool = False
                       ) -> Procedure[list[str]]:
    """Make a queue's failed tasks pending again, oldest first (the ``limit`` oldest only);
    cancelled ones only with ``include_cancelled`` (then the failed ones first). A task
    retried, deleted or expired meanwhile is skipped. Returns the ids retried."""
    retried: list[str] = []
    for state in (FAILED, CANCELLED) if include_cancelled else (FAILED,):
        left = None if limit is None else limit - len(retried)
        if left == 0:
            break
        # the lists have the newest at the left: the oldest are at their end
        ids: list[str] = yield bind(task_ids, keys, queue, state,
                                     -left if left is not None else 0, -1)
        for task_id in ids[::-1]:
            try:
                if (yield bind(retry_failed, keys, queue, task_id, clock(),
                                not include_cancelled)):
                    retried.append(task_id)
            except (InvalidTaskState, TaskNotFound):
                continue
    return retried


# --- finished tasks ---------------------------------------------------------------------------
def delete(keys: k.Keys, queue: str, task_id: str, state: str) -> Operation[bool]:
    """DEL the task hash, its output (stream and tails) and checkpoint, and its entry in the
    complete, failed or cancelled list (``state``) (delete.lua)."""
    return bool((yield Script(
        "delete", [keys.task(task_id), keys.finished(queue, state), keys.task_log(task_id),
                   keys.checkpoint(task_id), keys.task_output(task_id)],
        [task_id, status_of_list(state), DELETE_WINDOW])))


def drop_finished_entry(keys: k.Keys, queue: str, state: str, task_id: str
                        ) -> Operation[None]:
    """LREM one entry from the old (right) end of an ended list, leaving the hash alone:
    for an entry whose task has since moved to another status."""
    yield command("lrem", keys.finished(queue, state), -1, task_id)


def oldest_finished(keys: k.Keys, queue: str, state: str, count: int
                    ) -> Operation[list[str]]:
    """The ``count`` oldest ids of an ended list, oldest first (from its right end)."""
    ids = cast(list[str], (yield command("lrange", keys.finished(queue, state), -count, -1)))
    return ids[::-1]


def finished_time(data: Mapping[str, str]) -> float:
    """When a task finished (statuses.finish_time); a corrupt timestamp counts as long ago, so
    purge gets past it."""
    return field_float(finish_time(data)) or 0.0


def purge(keys: k.Keys, queue: str, state: str, cutoff: float, batch: int = 500
          ) -> Procedure[int]:
    """Delete the tasks of an ended list (``state``: complete, failed or cancelled) that
    finished before ``cutoff`` (Unix s), oldest first; each deletion finds its entry at the
    list's old end, so the cost is O(deleted)."""
    status = status_of_list(state)
    deleted = 0
    while True:
        ids: list[str] = yield bind(oldest_finished, keys, queue, state, batch)
        if not ids:
            return deleted
        datas = yield bind(task_data_many, keys, ids)
        for task_id, data in zip(ids, datas, strict=True):
            if data.get("status") not in (None, status):
                # a stale entry: the task lives in another list now; only the entry goes
                yield bind(drop_finished_entry, keys, queue, state, task_id)
                continue
            if data and finished_time(data) > cutoff:
                return deleted
            yield bind(delete, keys, queue, task_id, state)
            deleted += 1

