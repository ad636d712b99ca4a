"""Operations on tasks as their producers and operators see them: create, read, count,
cancel, retry, delete, configure their queue, and a running task's checkpoint."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from blueque import ended, protocol
from blueque.protocol import CHECKPOINT_KEEP, QueueCounts
from blueque.statuses import state_of
from blueque.store.core import StoreCore
from blueque.store.errors import translate_errors


class TaskOperations(StoreCore):
    # --- creating tasks -------------------------------------------------------------------
    @translate_errors
    def submit(
        self,
        queue: str,
        task_id: str,
        parameters: str,
        now: float,
        eta: float | None = None,
        fields: dict[str, str] | None = None,
    ) -> bool:
        """Create a pending (or, with an eta, scheduled) task: protocol.submit."""
        return self._execute(protocol.submit(self.keys, queue, task_id, parameters, now, eta,
                                             fields))

    @translate_errors
    def submit_many(
        self, queue: str, tasks: Sequence[tuple[str, str]], now: float,
        fields: dict[str, str] | None = None
    ) -> list[bool]:
        """Create many pending tasks; a created flag per task: protocol.submit_many."""
        return self._execute(protocol.submit_many(self.keys, queue, tasks, now, fields))

    @translate_errors
    def enqueue_due(self, queue: str, now: float, limit: int = 1000) -> list[str]:
        """Move scheduled tasks whose eta has passed to pending: protocol.enqueue_due."""
        return self._execute(protocol.enqueue_due(self.keys, queue, now, limit))

    @translate_errors
    def due_count(self, queue: str, now: float) -> int:
        """ZCOUNT of the scheduled entries whose eta has passed: protocol.due_count."""
        return self._execute(protocol.due_count(self.keys, queue, now))

    # --- reading --------------------------------------------------------------------------
    @translate_errors
    def task_data(self, task_id: str) -> dict[str, str]:
        """HGETALL of one task hash ({} if missing)."""
        return self._execute(protocol.task_data(self.keys, task_id))

    @translate_errors
    def task_data_many(self, task_ids: Sequence[str]) -> list[dict[str, str]]:
        """HGETALL of many task hashes in one pipeline ({} for a missing or foreign key)."""
        return self._execute(protocol.task_data_many(self.keys, task_ids))

    @translate_errors
    def task_fields(self, task_id: str, fields: Sequence[str]) -> dict[str, str]:
        """HMGET of some fields of one task hash (the missing ones left out)."""
        values = self.redis.hmget(self.keys.task(task_id), list(fields))
        return {name: value for name, value in zip(fields, values, strict=True)
                if value is not None}

    @translate_errors
    def task_statuses(self, task_ids: Sequence[str]) -> list[str | None]:
        """The state of many tasks (HMGET status cancelled, one pipeline): the status, or
        cancelled for a failed task stamped so; None where the hash is missing. How
        blueque.spark.wait_for_tasks follows a batch without reading results."""
        pipe = self.redis.pipeline(transaction=False)
        for task_id in task_ids:
            pipe.hmget(self.keys.task(task_id), ["status", "cancelled"])
        return [state_of({"status": status, "cancelled": cancelled or ""})
                if status is not None else None
                for status, cancelled in cast(list[list[str | None]], pipe.execute())]

    @translate_errors
    def counts(self, queue: str) -> QueueCounts:
        """Counts per state from O(1) commands (plus one LLEN per listener)."""
        return self._execute(protocol.counts(self.keys, queue))

    @translate_errors
    def task_ids(self, queue: str, status: str, start: int = 0, stop: int = -1) -> list[str]:
        """Ids of a queue's tasks in one state, from the list, set or zset that holds them."""
        return self._execute(protocol.task_ids(self.keys, queue, status, start, stop))

    @translate_errors
    def known_queues(self) -> list[tuple[str, float]]:
        """blueque_queues: every queue with its listener count."""
        return self._execute(protocol.known_queues(self.keys))

    @translate_errors
    def listener_ids(self, queue: str) -> set[str]:
        return cast(set[str], self.redis.smembers(self.keys.listeners(queue)))

    @translate_errors
    def listener_ids_many(self, queues: Sequence[str]) -> set[str]:
        """The listeners of any of these queues (a pipeline of SMEMBERS)."""
        pipe = self.redis.pipeline(transaction=False)
        for queue in queues:
            pipe.smembers(self.keys.listeners(queue))
        return set().union(*pipe.execute())

    @translate_errors
    def cancel(self, queue: str, task_id: str, now: float, error: str) -> tuple[str, str]:
        """cancel.lua; for a running task also PUBLISH its id on its listener's channel."""
        return self._execute(protocol.cancel(self.keys, queue, task_id, now, error))

    @translate_errors
    def retry_failed(self, queue: str, task_id: str, now: float,
                     skip_cancelled: bool = False) -> bool:
        """Failed -> pending again, attempts kept, checkpoint kept for the re-run
        (retry_failed.lua); False for a cancelled task with ``skip_cancelled``. Raises
        TaskNotFound or InvalidTaskState (not failed)."""
        return self._execute(ended.retry_failed(self.keys, queue, task_id, now,
                                                   skip_cancelled))

    # --- finished tasks -------------------------------------------------------------------
    @translate_errors
    def delete(self, queue: str, task_id: str, state: str) -> bool:
        """DEL the task hash, its output stream and checkpoint, and its entry in the
        complete, failed or cancelled list (``state``) (delete.lua)."""
        return self._execute(ended.delete(self.keys, queue, task_id, state))

    @translate_errors
    def drop_finished_entry(self, queue: str, status: str, task_id: str) -> None:
        """LREM one entry from the old end of a finished list, leaving the hash alone."""
        self._execute(ended.drop_finished_entry(self.keys, queue, status, task_id))

    @translate_errors
    def oldest_finished(self, queue: str, status: str, count: int) -> list[str]:
        """The ``count`` oldest ids of a finished list, oldest first (from its right end)."""
        return self._execute(ended.oldest_finished(self.keys, queue, status, count))

    # --- queue configuration --------------------------------------------------------------
    @translate_errors
    def queue_config(self, queue: str) -> dict[str, str]:
        return self._execute(protocol.queue_config(self.keys, queue))

    @translate_errors
    def set_queue_config(self, queue: str, values: dict[str, str], remove: Sequence[str] = ()
                         ) -> None:
        self._execute(protocol.set_queue_config(self.keys, queue, values, remove))

    @translate_errors
    def forget_queue(self, queue: str) -> bool:
        """Remove an empty queue with no listeners from blueque_queues, with its defaults and
        outcome counts (forget_queue.lua); False if it was not listed. InvalidTaskState if it
        holds tasks or has listeners."""
        queues_key, use_queues = self._queues_key(queue)
        k_ = self.keys
        keys = [k_.pending(queue), k_.scheduled(queue), k_.started(queue), k_.complete(queue),
                k_.failed(queue), k_.listeners(queue), k_.leases(queue), k_.queue_config(queue),
                k_.outcome_counts(queue), queues_key, k_.cancelled(queue)]
        known = bool(self._run("forget_queue", keys, [queue, use_queues]))
        if self.keys.hash_tags:
            known = bool(self.redis.zrem(self.keys.queues(), queue))
        return known

    @translate_errors
    def save_checkpoint(self, task_id: str, attempt: int, listener_id: str, state: str,
                        now: float) -> int:
        """Store a running attempt's checkpoint (checkpoint.lua, fenced by attempt and
        listener); returns its size in bytes. Keys: task hash, blueque_checkpoint_[id].
        Raises StaleAttempt when the run was superseded or has ended: nothing is written."""
        return int(self._run(
            "checkpoint", [self.keys.task(task_id), self.keys.checkpoint(task_id)],
            [task_id, attempt, listener_id, state, repr(now), int(CHECKPOINT_KEEP * 1000)],
        ))

    @translate_errors
    def checkpoint(self, task_id: str) -> dict[str, str]:
        """HGETALL blueque_checkpoint_[id]: state, saved_at, attempt, size ({} if none)."""
        return cast(dict[str, str], self.redis.hgetall(self.keys.checkpoint(task_id)))

    @translate_errors
    def checkpoint_info(self, task_id: str) -> dict[str, str]:
        """HMGET blueque_checkpoint_[id] saved_at attempt size: what a checkpoint is without
        its state, which may be a mebibyte ({} if none)."""
        names = ("saved_at", "attempt", "size")
        values = self.redis.hmget(self.keys.checkpoint(task_id), list(names))
        return {name: value for name, value in zip(names, values, strict=True)
                if value is not None}

