"""Pausing a queue (PROTOCOL.md 5.16c), written once for both clients: while
``blueque_paused_[queue]`` exists no listener daemon takes a task of the queue (reserve.lua and
take.lua ask in the step that takes one); running tasks go on, enqueues go on. Resuming deletes
the hash and publishes on the queue's channel, as an enqueue does, so idle listeners look at
once. Blueque 1.0.1's listeners know nothing of it and go on taking the queue's tasks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from blueque import keys as k
from blueque.errors import ConfigurationError, WrongType
from blueque.policy import field_float
from blueque.protocol import Operation, Pipeline, command


@dataclass(frozen=True)
class Pause:
    """A paused queue's pause: why (``reason``, "" if none was given) and since when
    (``paused_at``, Unix s on Redis' clock; None if unreadable)."""

    queue: str
    reason: str
    paused_at: float | None


def pause(keys: k.Keys, queue: str, reason: str | None, now: float) -> Operation[None]:
    """HSET blueque_paused_[queue] reason paused_at, and ZINCRBY blueque_queues 0 so that a
    queue paused before its first task is listed (MULTI/EXEC outside the hash-tagged layout).
    Pausing a paused queue replaces its reason and time. WrongType for a reason that is
    not text, ConfigurationError for a name no listener could serve (keys.QUEUE_NAME_RULE)."""
    if reason is not None and not isinstance(reason, str):
        raise WrongType(f"a pause's reason must be text, not {type(reason).__name__}")
    problem = k.queue_name_problem(queue)  # it may list the queue: a name listen can serve
    if problem:
        raise ConfigurationError(problem)
    yield Pipeline((command("hset", keys.paused(queue),
                            mapping={"reason": reason or "", "paused_at": repr(now)}),
                    command("zincrby", keys.queues(), 0, queue)),
                   transaction=not keys.hash_tags)


def resume(keys: k.Keys, queue: str) -> Operation[bool]:
    """DEL blueque_paused_[queue], then PUBLISH blueque_channel_[queue] [queue] (the
    listeners of the queue look for its tasks at once); False if it was not paused."""
    deleted, _ = yield Pipeline((command("delete", keys.paused(queue)),
                                 command("publish", keys.channel(queue), queue)),
                                transaction=not keys.hash_tags)
    return bool(deleted)


def pauses(keys: k.Keys, queues: Sequence[str]) -> Operation[dict[str, Pause]]:
    """The pauses of those of ``queues`` that are paused (HGETALL each, one round trip)."""
    if not queues:
        return {}
    replies = yield Pipeline(tuple(command("hgetall", keys.paused(q)) for q in queues))
    return {queue: Pause(queue, reply.get("reason", ""), field_float(reply.get("paused_at")))
            for queue, reply in zip(queues, replies, strict=True) if reply}
