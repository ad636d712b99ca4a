"""Reads for watching (PROTOCOL.md 5.18): the dashboard's and the metrics' windows, never
whole lists; and a task's output stream (5.19)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import cast

from blueque import protocol
from blueque.protocol import QueueCounts
from blueque.store.core import StoreCore, _tolerating_wrong_types
from blueque.store.errors import translate_errors


@dataclass(frozen=True)
class ListenersAtWork:
    """One queue's listeners as the nodes page reads them (store.listeners_at_work)."""

    registered: set[str]
    leases: dict[str, float]
    started: list[tuple[str, str, str]]


def _started_entries(members: Iterable[str]) -> list[tuple[str, str, str]]:
    """Started-set members ("[listener id] [pid] [task id]") as tuples, sorted."""
    entries = []
    for member in sorted(members):
        parts = member.rsplit(" ", 2)
        if len(parts) == 3:
            entries.append((parts[0], parts[1], parts[2]))
    return entries


def _counts(reply: object) -> dict[str, int]:
    """An outcome-counter hash as numbers; a value that is no integer, or a key that is no
    hash (a WRONGTYPE reply), counts as nothing rather than failing the page or scrape."""
    if not isinstance(reply, dict):
        return {}
    counts = {}
    for name, count in reply.items():
        try:
            counts[str(name)] = int(count)
        except ValueError:
            continue
    return counts



class WatchOperations(StoreCore):
    # --- watching: reads for the dashboard and the metrics (windows, never whole lists) --
    # Each read of many queues is a fixed number of pipelines, whatever the number of queues.
    @translate_errors
    def counts_many(self, queues: Sequence[str]) -> list[QueueCounts]:
        """counts() of many queues in two pipelines."""
        return self._execute(protocol.counts_many(self.keys, queues))

    @translate_errors
    def outcomes_per_minute_many(self, queues: Sequence[str], minutes: Sequence[int]
                                 ) -> list[list[dict[str, int]]]:
        """blueque_finished_per_minute_[queue]_[minute] for each queue and minute (its first
        second), in one pipeline: per queue, per minute, outcome -> count ({} for a minute in
        which nothing ended)."""
        pipe = self.redis.pipeline(transaction=False)
        for queue in queues:
            for minute in minutes:
                pipe.hgetall(self.keys.finished_per_minute(queue, str(minute)))
        counts = [_counts(reply) for reply in _tolerating_wrong_types(pipe)]
        return [counts[n * len(minutes):(n + 1) * len(minutes)] for n in range(len(queues))]

    @translate_errors
    def outcomes_per_hour_many(self, queues: Sequence[str], hours: Sequence[int]
                               ) -> list[list[dict[str, int]]]:
        """blueque_finished_per_hour_[queue]_[hour] for each queue and hour (its first
        second), in one pipeline, as outcomes_per_minute_many."""
        pipe = self.redis.pipeline(transaction=False)
        for queue in queues:
            for hour in hours:
                pipe.hgetall(self.keys.finished_per_hour(queue, str(hour)))
        counts = [_counts(reply) for reply in _tolerating_wrong_types(pipe)]
        return [counts[n * len(hours):(n + 1) * len(hours)] for n in range(len(queues))]

    def outcomes_per_minute(self, queue: str, minutes: Sequence[int]
                            ) -> list[dict[str, int]]:
        return self.outcomes_per_minute_many([queue], minutes)[0]

    @translate_errors
    def outcome_counts_many(self, queues: Sequence[str]) -> list[dict[str, int]]:
        """blueque_outcome_counts_[queue] of each queue, in one pipeline: outcome -> tasks
        that ever ended so."""
        pipe = self.redis.pipeline(transaction=False)
        for queue in queues:
            pipe.hgetall(self.keys.outcome_counts(queue))
        return [_counts(reply) for reply in _tolerating_wrong_types(pipe)]

    def outcome_counts(self, queue: str) -> dict[str, int]:
        return self.outcome_counts_many([queue])[0]

    @translate_errors
    def oldest_pending_many(self, queues: Sequence[str]
                            ) -> list[tuple[str, dict[str, str]] | None]:
        """Per queue, the task next in line (the right end of the pending list) with its
        ``created`` and ``updated`` (none for a key that is no hash), or None when nothing is
        pending: a pipeline of LINDEX -1, then one of HMGET."""
        pipe = self.redis.pipeline(transaction=False)
        for queue in queues:
            pipe.lindex(self.keys.pending(queue), -1)
        heads = cast(list["str | None"], pipe.execute())
        pipe = self.redis.pipeline(transaction=False)
        for task_id in heads:
            if task_id is not None:
                pipe.hmget(self.keys.task(task_id), "created", "updated")
        replies = iter(_tolerating_wrong_types(pipe))
        found: list[tuple[str, dict[str, str]] | None] = []
        for task_id in heads:
            if task_id is None:
                found.append(None)
                continue
            reply = next(replies)
            values = reply if isinstance(reply, list) else [None, None]
            found.append((task_id, {name: value for name, value in zip(
                ("created", "updated"), values, strict=True) if value is not None}))
        return found

    def oldest_pending(self, queue: str) -> tuple[str, dict[str, str]] | None:
        """The task next in line with its ``created`` and ``updated`` (LINDEX -1, HMGET)."""
        return self.oldest_pending_many([queue])[0]

    @translate_errors
    def started_entries(self, queue: str) -> list[tuple[str, str, str]]:
        """blueque_started_tasks_[queue] as (listener id, pid, task id), sorted."""
        return _started_entries(self.redis.smembers(self.keys.started(queue)))

    @translate_errors
    def listeners_at_work(self, queues: Sequence[str], started: bool = True
                          ) -> list[ListenersAtWork]:
        """Per queue, its registered listeners, its leases (listener id -> deadline, server
        ms) and (unless not ``started``: none) its started entries (as started_entries), in
        one pipeline."""
        pipe = self.redis.pipeline(transaction=False)
        for queue in queues:
            pipe.smembers(self.keys.listeners(queue))
            pipe.zrange(self.keys.leases(queue), 0, -1, withscores=True)
            if started:
                pipe.smembers(self.keys.started(queue))
        replies = pipe.execute()
        step = 3 if started else 2
        return [ListenersAtWork(set(replies[n]), dict(replies[n + 1]),
                                _started_entries(replies[n + 2]) if started else [])
                for n in range(0, len(replies), step)]

    @translate_errors
    def task_fields_many(self, task_ids: Sequence[str], fields: Sequence[str]
                         ) -> list[dict[str, str]]:
        """HMGET of some fields of many task hashes in one pipeline (the dashboard's
        filters): per task, the fields it has ({} for a missing key or one that is no hash)."""
        pipe = self.redis.pipeline(transaction=False)
        for task_id in task_ids:
            pipe.hmget(self.keys.task(task_id), list(fields))
        return [{name: value for name, value in zip(fields, reply, strict=True)
                 if value is not None} if isinstance(reply, list) else {}
                for reply in _tolerating_wrong_types(pipe)]

    @translate_errors
    def listener_infos(self, listener_ids: Sequence[str]) -> list[dict[str, str]]:
        """HGETALL blueque_listener_[id] for many listeners in one pipeline."""
        pipe = self.redis.pipeline(transaction=False)
        for listener in listener_ids:
            pipe.hgetall(self.keys.listener_info(listener))
        return cast(list[dict[str, str]], pipe.execute())

    @translate_errors
    def listeners_seen_many(self, queues: Sequence[str], count: int
                            ) -> list[list[tuple[str, float]]]:
        """Per queue, the ``count`` listeners whose runs ended latest, with when (Unix s,
        newest first), from blueque_listeners_seen_[queue], in one pipeline."""
        pipe = self.redis.pipeline(transaction=False)
        for queue in queues:
            pipe.zrevrange(self.keys.listeners_seen(queue), 0, count - 1, withscores=True)
        return [[(str(member), float(score)) for member, score in reply]
                if isinstance(reply, list) else [] for reply in _tolerating_wrong_types(pipe)]

    @translate_errors
    def listener_counts_many(self, pairs: Sequence[tuple[str, str]]) -> list[dict[str, int]]:
        """blueque_listener_counts_[queue]_[listener id] of each (queue, listener) pair, in
        one pipeline: outcome -> runs it ended so."""
        pipe = self.redis.pipeline(transaction=False)
        for queue, listener in pairs:
            pipe.hgetall(self.keys.listener_counts(queue, listener))
        return [_counts(reply) for reply in _tolerating_wrong_types(pipe)]

    @translate_errors
    def scheduled_counts(self, queues: Sequence[str]) -> list[int]:
        """ZCARD blueque_scheduled_tasks_[queue] of each queue, in one pipeline."""
        pipe = self.redis.pipeline(transaction=False)
        for queue in queues:
            pipe.zcard(self.keys.scheduled(queue))
        return cast(list[int], pipe.execute())

    @translate_errors
    def scheduled_windows(self, queues: Sequence[str], count: int
                          ) -> list[list[tuple[str, float]]]:
        """The ``count`` soonest scheduled tasks (id, eta) of each queue, in one pipeline."""
        pipe = self.redis.pipeline(transaction=False)
        for queue in queues:
            pipe.zrange(self.keys.scheduled(queue), 0, count - 1, withscores=True)
        return cast(list[list[tuple[str, float]]], pipe.execute())

    # --- task output (blueque_task_log_[id], a stream; blueque_output_[id], the tails) -------
    @translate_errors
    def append_output(self, task_id: str, attempt: str, text: str, offset: int,
                      ttl_ms: int | None = None) -> str:
        """XADD one chunk of a running attempt's output and PEXPIRE the stream, in one
        transaction; returns the entry id."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.xadd(self.keys.task_log(task_id),
                  {"attempt": attempt, "data": text, "offset": str(offset)})
        if ttl_ms:
            pipe.pexpire(self.keys.task_log(task_id), ttl_ms)
        return str(pipe.execute()[0])

    @translate_errors
    def end_output(self, task_id: str, attempt: str, rest: str, offset: int, ttl_ms: int,
                   keep: int) -> int:
        """The attempt is over: its entries in the stream, then ``rest`` (what it wrote
        beyond them, ending at ``offset`` in its file), move to the task's output tails, its
        last ``keep`` bytes kept for ``ttl_ms`` (end_output.lua); returns the bytes kept, 0
        when it had nothing."""
        return int(self._run("end_output",
                             [self.keys.task_log(task_id), self.keys.task_output(task_id)],
                             [attempt, rest, offset, ttl_ms, keep]))

    @translate_errors
    def outputs(self, task_id: str) -> tuple[str | None, list[tuple[str, dict[str, str]]]]:
        """The task's output tails (blueque_output_[id] as stored, None without) and its
        stream's entries, oldest first, in one pipeline."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.get(self.keys.task_output(task_id))
        pipe.xrange(self.keys.task_log(task_id), "-", "+")
        tails, entries = pipe.execute()
        return tails, [(str(entry), dict(fields)) for entry, fields in entries]

    @translate_errors
    def outputs_since(self, task_id: str, after: str) -> tuple[list[tuple[str, dict[str, str]]],
                                                                int]:
        """The stream's entries after ``after`` (an entry id, exclusive; "-" for all) and the
        length of the task's output tails (0 without), in one pipeline: what a follower of a
        running attempt reads at each look."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.xrange(self.keys.task_log(task_id), "-" if after == "-" else "(" + after, "+")
        pipe.strlen(self.keys.task_output(task_id))
        entries, size = pipe.execute()
        return [(str(entry), dict(fields)) for entry, fields in entries], int(size)

    @translate_errors
    def output_tails(self, task_id: str) -> str | None:
        """GET blueque_output_[id]: the task's ended attempts' tails as stored (None without)."""
        return cast("str | None", self.redis.get(self.keys.task_output(task_id)))

    @translate_errors
    def drop_output(self, task_id: str, entry_ids: Sequence[str]) -> None:
        """XDEL older chunks of an attempt: each keeps only its last TAIL_BYTES."""
        self.redis.xdel(self.keys.task_log(task_id), *entry_ids)

    @translate_errors
    def last_output(self, task_id: str) -> dict[str, str]:
        """The stream's newest entry's fields ({} if none)."""
        entries = self.redis.xrevrange(self.keys.task_log(task_id), count=1)
        return dict(entries[0][1]) if entries else {}
