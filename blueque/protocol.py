"""The protocol operations a client offers, each written once for every kind of I/O.

An operation is a generator that yields *steps* — one Lua script call (``Script``), one
command (``Command``) or a pipeline of commands (``Pipeline``) — receives each step's reply,
and returns the operation's result. It sends nothing itself: ``blueque.store.RedisStore``
runs the steps with redis-py, ``blueque.aio.store.AsyncRedisStore`` awaits them with
redis.asyncio. The keys come from ``blueque.keys``, the scripts from ``blueque/lua``; the
argument encoding and the decoding of the replies live here and nowhere else, so the two
clients cannot drift apart (PROTOCOL.md 5 names this module for each operation). The
operations on ended tasks (retry a failed one, delete, purge) are written the same way in
``blueque.ended``.

A *procedure* strings several operations together (cancel_waiting, enqueue_due_tasks): it yields
operation factories, which the store runs each under its own retry, as the sync Queue
always did.

Daemon-side operations (stamp, start, finish, progress, lease, recover...) are still methods
of RedisStore only: the asyncio client does not run tasks.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from blueque import keys as k
from blueque.errors import InvalidTaskState
from blueque.policy import QUEUE_LIMITS
from blueque.statuses import ENDED_LISTS, PENDING, RESERVED, SCHEDULED, STARTED, STATES, WAITING

T = TypeVar("T")

#: Tasks per submit_many call: keeps each script call short so Redis stays responsive.
BULK_CHUNK = 1000
#: Scheduled tasks moved per enqueue_due call.
DUE_BATCH = 1000
#: Tasks looked at per cancel_pending / cancel_scheduled call: a call cancelling that many
#: runs for a few milliseconds, so a bulk cancel of a million tasks never holds Redis long.
CANCEL_BATCH = 200
#: Entries a task's ``history`` keeps (the newest), and bytes of an error kept in an entry:
#: the Lua scripts that end runs write both as constants (tests/test_history.py holds them
#: to these).
HISTORY_KEEP = 20
HISTORY_ERROR_BYTES = 500


#: How long a checkpoint is kept after its last save when nothing else ends it first (delete,
#: purge, result TTL): it bounds the life of one whose task blueque 1.0.1 deleted (its delete
#: knows no checkpoint key), and is far longer than a task waits between two attempts.
CHECKPOINT_KEEP = 30 * 86400.0


@dataclass(frozen=True)
class Script:
    """EVALSHA of ``blueque/lua/<name>.lua``; ``durable``: WAIT for replicas after it when the
    store has a Durability (enqueues and outcomes)."""

    name: str
    keys: Sequence[str]
    args: Sequence[Any]
    durable: bool = False


@dataclass(frozen=True)
class Command:
    """One redis-py command method (``hgetall``, ``zrangebyscore``...) with its arguments:
    the sync and the asyncio client share the method names and their reply parsing."""

    name: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Pipeline:
    """Commands sent in one round trip (MULTI/EXEC when ``transaction``); the reply is the
    list of their replies, errors in place when ``raise_on_error`` is False."""

    commands: tuple[Command, ...]
    transaction: bool = False
    raise_on_error: bool = True


Step = Script | Command | Pipeline
Operation = Generator[Step, Any, T]
Procedure = Generator[Callable[[], Operation[Any]], Any, T]


def command(name: str, *args: Any, **kwargs: Any) -> Command:
    return Command(name, args, kwargs)


def bind(operation: Callable[..., Operation[T]], *args: Any) -> Callable[[], Operation[T]]:
    """A factory of ``operation(*args)`` that keeps this loop iteration's values."""
    return lambda: operation(*args)


# --- layout helpers (also used by the daemon-side operations of RedisStore) ----------------
def queues_key(keys: k.Keys, queue: str) -> tuple[str, str]:
    """The key a script may update blueque_queues through, and whether it should.

    In the hash-tagged layout blueque_queues lives in another slot, so scripts get a same-slot
    placeholder and the caller updates blueque_queues itself, outside the script."""
    if keys.hash_tags:
        return keys.pending(queue), "0"
    return keys.queues(), "1"


def outcome_keys(keys: k.Keys, queue: str, now: float) -> list[str]:
    """The per-minute, all-time and per-hour outcome counters an ending increments
    (PROTOCOL.md 5.6), in the order the scripts take them."""
    minute, hour = str(int(now // 60 * 60)), str(int(now // 3600 * 3600))
    return [keys.finished_per_minute(queue, minute), keys.outcome_counts(queue),
            keys.finished_per_hour(queue, hour)]


def touch_queue(keys: k.Keys, queue: str) -> Operation[None]:
    """ZADD NX blueque_queues 0 (1.0.1's ZINCRBY 0, without a write when the queue is
    listed), outside the scripts, in the hash-tagged layout only."""
    if keys.hash_tags:
        yield command("zadd", keys.queues(), {queue: 0}, nx=True)


# --- creating tasks ---------------------------------------------------------------------------
def submit(keys: k.Keys, queue: str, task_id: str, parameters: str, now: float,
           eta: float | None = None, fields: Mapping[str, str] | None = None
           ) -> Operation[bool]:
    """Create a pending (or, with an eta, scheduled) task; False if the id already exists.
    Keys: task hash, pending list or scheduled zset, the queue's config (its
    max_parameters_bytes), blueque_queues. Script: submit.lua."""
    target = keys.pending(queue) if eta is None else keys.scheduled(queue)
    script_keys = [keys.task(task_id), target, keys.queue_config(queue)]
    queues, use_queues = queues_key(keys, queue)
    if use_queues == "1":
        script_keys.append(queues)
    extra = [item for pair in (fields or {}).items() for item in pair]
    args = [task_id, queue, parameters, repr(now), "" if eta is None else repr(eta),
            keys.channel(queue), str(QUEUE_LIMITS["max_parameters_bytes"]), *extra]
    created = bool((yield Script("submit", script_keys, args, durable=True)))
    yield from touch_queue(keys, queue)
    return created


def submit_many(keys: k.Keys, queue: str, tasks: Sequence[tuple[str, str]], now: float,
                fields: Mapping[str, str] | None = None) -> Operation[list[bool]]:
    """Create many pending tasks, each with ``fields``, BULK_CHUNK per script call; a created
    flag per task. Keys: pending list, blueque_queues, the queue's config (its
    max_parameters_bytes), every task hash. Script: submit_many.lua."""
    queues, use_queues = queues_key(keys, queue)
    pending, channel, stamp = keys.pending(queue), keys.channel(queue), repr(now)
    flags: list[bool] = []
    for start in range(0, len(tasks), BULK_CHUNK):
        chunk = tasks[start : start + BULK_CHUNK]
        script_keys = [pending, queues, keys.queue_config(queue),
                       *(keys.task(task_id) for task_id, _ in chunk)]
        args: list[str] = [queue, stamp, use_queues, channel,
                           str(QUEUE_LIMITS["max_parameters_bytes"])]
        args += [*(part for task in chunk for part in task),
                 *(part for pair in (fields or {}).items() for part in pair)]  # every task's
        result = yield Script("submit_many", script_keys, args, durable=True)
        flags.extend(flag == "1" for flag in result)
    yield from touch_queue(keys, queue)
    return flags


def enqueue_due(keys: k.Keys, queue: str, now: float, limit: int = DUE_BATCH
                ) -> Operation[list[str]]:
    """Move scheduled tasks whose eta has passed to pending (at most ``limit`` per call).
    Keys: scheduled zset, pending list, each due task hash. Script: enqueue_due.lua."""
    scheduled = keys.scheduled(queue)
    due: list[str] = yield command("zrangebyscore", scheduled, 0, now, start=0, num=limit)
    if not due:
        return []
    script_keys = [scheduled, keys.pending(queue), *(keys.task(i) for i in due)]
    moved: list[str] = yield Script("enqueue_due", script_keys,
                                    [repr(now), keys.channel(queue), queue, *due])
    return moved


def due_count(keys: k.Keys, queue: str, now: float) -> Operation[int]:
    """ZCOUNT of the scheduled entries whose eta has passed (enqueue_due loops on it)."""
    return int((yield command("zcount", keys.scheduled(queue), 0, now)))


def enqueue_due_tasks(keys: k.Keys, queue: str, now: float) -> Procedure[list[str]]:
    """enqueue_due until nothing due is left: a batch of stale entries (only removed, not
    moved) may hide due tasks behind it, so a short batch is followed by a due_count."""
    moved: list[str] = []
    while True:
        batch = yield lambda: enqueue_due(keys, queue, now)
        moved += batch
        if len(batch) < DUE_BATCH and not (yield lambda: due_count(keys, queue, now)):
            return moved


# --- reading ----------------------------------------------------------------------------------
def task_data(keys: k.Keys, task_id: str) -> Operation[dict[str, str]]:
    """HGETALL of one task hash ({} if missing)."""
    data: dict[str, str] = yield command("hgetall", keys.task(task_id))
    return data


def task_data_many(keys: k.Keys, task_ids: Sequence[str]) -> Operation[list[dict[str, str]]]:
    """HGETALL of many task hashes in one pipeline; a key that is not a hash reads as {}
    (no task), so one foreign key cannot block a purge or a recovery sweep."""
    replies = yield Pipeline(tuple(command("hgetall", keys.task(i)) for i in task_ids),
                             raise_on_error=False)
    for reply in replies:
        if isinstance(reply, Exception) and not str(reply).startswith("WRONGTYPE"):
            raise reply
    return [{} if isinstance(reply, Exception) else reply for reply in replies]


@dataclass(frozen=True)
class QueueCounts:
    pending: int
    scheduled: int
    reserved: int
    started: int
    complete: int
    failed: int
    #: failed tasks that were cancelled: counted apart, not in ``failed`` (PROTOCOL.md 5.15)
    cancelled: int
    listeners: int
    #: tasks enqueued ``after=`` others that wait for them (PROTOCOL.md 5.21)
    waiting: int = 0
    paused: bool = False  #: no listener starts its tasks (PROTOCOL.md 5.16c)


def counts(keys: k.Keys, queue: str) -> Operation[QueueCounts]:
    """Counts per state from O(1) commands (plus one LLEN per listener)."""
    return (yield from counts_many(keys, [queue]))[0]


def counts_many(keys: k.Keys, queues: Sequence[str]) -> Operation[list[QueueCounts]]:
    """counts() of many queues in two round trips, whatever their number (the dashboard's
    and the metrics' pages): the listener sets, then every queue's LLENs, ZCARD and SCARD."""
    if not queues:
        return []
    listener_sets = [sorted(members) for members in (yield Pipeline(tuple(
        command("smembers", keys.listeners(queue)) for queue in queues)))]
    replies = iter((yield Pipeline(tuple(
        step for queue, listeners in zip(queues, listener_sets, strict=True) for step in (
            command("llen", keys.pending(queue)),
            command("zcard", keys.scheduled(queue)),
            command("scard", keys.started(queue)),
            command("llen", keys.complete(queue)),
            command("llen", keys.failed(queue)),
            command("llen", keys.cancelled(queue)),
            command("zcard", keys.waiting(queue)),
            command("exists", keys.paused(queue)),
            *(command("llen", keys.reserved(queue, listener)) for listener in listeners),
        )))))
    found = []
    for listeners in listener_sets:
        pending, scheduled, started, complete, failed, cancelled, waiting, paused = (
            next(replies) for _ in range(8))
        reserved = sum(next(replies) for _ in listeners)
        found.append(QueueCounts(pending=pending, scheduled=scheduled,
                                 reserved=max(0, reserved - started), started=started,
                                 complete=complete, failed=failed, listeners=len(listeners),
                                 cancelled=cancelled, waiting=waiting, paused=bool(paused)))
    return found


def task_ids(keys: k.Keys, queue: str, status: str, start: int = 0, stop: int = -1
             ) -> Operation[list[str]]:
    """Ids of a queue's tasks in one state (a status, or cancelled: statuses.STATES), from the
    list, set or zset that holds them."""
    if status == PENDING:
        return cast(list[str], (yield command("lrange", keys.pending(queue), start, stop)))
    if status == SCHEDULED:
        return cast(list[str], (yield command("zrange", keys.scheduled(queue), start, stop)))
    if status == WAITING:
        return cast(list[str], (yield command("zrange", keys.waiting(queue), start, stop)))
    if status in ENDED_LISTS:
        finished = keys.finished(queue, status)
        return cast(list[str], (yield command("lrange", finished, start, stop)))
    if status == STARTED:
        members = sorted((yield command("smembers", keys.started(queue))))
        ids = [member.rsplit(" ", 1)[-1] for member in members]
        return ids[start : None if stop == -1 else stop + 1]  # LRANGE's inclusive stop
    if status == RESERVED:
        started = set((yield from task_ids(keys, queue, STARTED)))
        listeners = sorted((yield command("smembers", keys.listeners(queue))))
        reserved: list[str] = []
        for listener in listeners:
            reserved += yield command("lrange", keys.reserved(queue, listener), 0, -1)
        return [i for i in reserved if i not in started]
    raise InvalidTaskState(f"unknown status {status!r}; expected one of {STATES}")


def known_queues(keys: k.Keys) -> Operation[list[tuple[str, float]]]:
    """blueque_queues: every queue with its listener count."""
    return cast(list[tuple[str, float]],
                (yield command("zrange", keys.queues(), 0, -1, withscores=True)))


# --- cancel and retry -------------------------------------------------------------------------
def cancel(keys: k.Keys, queue: str, task_id: str, now: float, error: str
           ) -> Operation[tuple[str, str]]:
    """cancel.lua; for a running task also PUBLISH its id on its listener's channel."""
    verdict, detail = yield Script(
        "cancel",
        [keys.task(task_id), keys.pending(queue), keys.scheduled(queue), keys.cancelled(queue),
         *outcome_keys(keys, queue, now)],
        [task_id, repr(now), error, k.FINISHED_MINUTE_TTL, keys.done_channel(queue)],
    )
    if verdict == "requested" and detail:
        yield command("publish", keys.control(detail), task_id)
    return str(verdict), str(detail)


@dataclass(frozen=True)
class CancelledWaiting:
    """What a bulk cancel (``Queue.cancel_waiting``) did: tasks cancelled from the pending
    list and from the scheduled zset, and the script calls it took."""

    pending: int = 0
    scheduled: int = 0
    calls: int = 0

    @property
    def cancelled(self) -> int:
        return self.pending + self.scheduled


def id_matches(keys: k.Keys, queue: str, task_id: str, pattern: str | None) -> bool:
    """Whether a task id matches a shell-style pattern (``fnmatchcase``: ``*``, ``?``,
    ``[...]``), written with or without the queue's hash tag in the hash-tagged layout."""
    if pattern is None:
        return True
    tag = keys.task_id_for(queue, "")
    bare = task_id[len(tag):] if tag and task_id.startswith(tag) else task_id
    return fnmatch.fnmatchcase(task_id, pattern) or fnmatch.fnmatchcase(bare, pattern)


def cancel_batch(keys: k.Keys, queue: str, source: str, now: float, error: str,
                 cutoff: float | None, anchor: tuple[str, str], batch: Sequence[str],
                 pattern: str | None, size: int = CANCEL_BATCH
                 ) -> Operation[tuple[int, tuple[str, str], list[str]]]:
    """One call of cancel_pending.lua (``source`` pending) or cancel_scheduled.lua
    (scheduled): cancel what of ``batch`` still waits (and matches), read the next batch.
    ``anchor``: where the looked-at part ends (pending: anchor id and how many were kept;
    scheduled: anchor id and its eta). Returns (cancelled, the new anchor, the next batch)."""
    waiting = keys.pending(queue) if source == PENDING else keys.scheduled(queue)
    args: list[Any] = [repr(now), error, k.FINISHED_MINUTE_TTL, keys.done_channel(queue),
                       "" if cutoff is None else repr(cutoff), *anchor, size]
    for task_id in batch:
        args += (task_id, "1" if id_matches(keys, queue, task_id, pattern) else "0")
    reply = yield Script(
        f"cancel_{source}",
        [waiting, keys.cancelled(queue), *outcome_keys(keys, queue, now),
         *(keys.task(task_id) for task_id in batch)],
        args)
    return int(reply[0]), (str(reply[1]), str(reply[2])), [str(i) for i in reply[3:]]


def cancel_waiting(keys: k.Keys, queue: str, clock: Callable[[], float], error: str,
                   cutoff: float | None = None, pattern: str | None = None,
                   sources: Sequence[str] = (PENDING, SCHEDULED),
                   size: int = CANCEL_BATCH) -> Procedure[CancelledWaiting]:
    """Cancel every pending and scheduled task of a queue (``sources``), or those created at
    or before ``cutoff`` and/or whose id matches ``pattern``: cancel_pending.lua and
    cancel_scheduled.lua, ``size`` tasks per call, until each has looked at its whole list
    (PROTOCOL.md 5.9b). Each call is an operation of its own (retried alone)."""
    found = {PENDING: 0, SCHEDULED: 0}
    calls = 0
    for source in sources:
        anchor = ("", "0") if source == PENDING else ("", "")
        batch: list[str] = []
        while True:
            cancelled, anchor, batch = yield bind(
                cancel_batch, keys, queue, source, clock(), error, cutoff, anchor, batch,
                pattern, size)
            found[source] += cancelled
            calls += 1
            if not batch:
                break
    return CancelledWaiting(found[PENDING], found[SCHEDULED], calls)


# --- queue configuration ----------------------------------------------------------------------
def queue_config(keys: k.Keys, queue: str) -> Operation[dict[str, str]]:
    return cast(dict[str, str], (yield command("hgetall", keys.queue_config(queue))))


def set_queue_config(keys: k.Keys, queue: str, values: Mapping[str, str],
                     remove: Sequence[str] = ()) -> Operation[None]:
    """HSET/HDEL blueque_queue_config_[queue] and ZINCRBY blueque_queues 0 (MULTI/EXEC
    outside the hash-tagged layout, where the keys live in different slots)."""
    commands = []
    if values:
        commands.append(command("hset", keys.queue_config(queue), mapping=dict(values)))
    if remove:
        commands.append(command("hdel", keys.queue_config(queue), *remove))
    commands.append(command("zincrby", keys.queues(), 0, queue))
    yield Pipeline(tuple(commands), transaction=not keys.hash_tags)
