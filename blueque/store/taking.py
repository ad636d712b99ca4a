"""Taking a task (PROTOCOL.md 5.22, 6.2): the listener daemon's reservation through take.lua,
alone when a slot is free or after an ending in the same round trip (finish_and_take), and the
names lib/keyed.lua builds a key's and a queue's keys from for the scripts that release a key's
slot (finish, recover)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from blueque import keys as k
from blueque.store.core import Reservation, ScriptCall, StoreCore
from blueque.store.errors import translate_errors


@dataclass(frozen=True)
class Take:
    """The next reservation a listener daemon takes in the round trip that records an ending
    (take.lua, PROTOCOL.md 6.2): from the first of ``queues`` with a pending task. With
    ``pid`` (a warm process it keeps, 6.7) the task is stamped for that process and its run
    recorded on ``node`` (``record``: the record's fields after task, queue and attempt, as
    blueque.daemon.running.record_tail writes them); without, it is only moved."""

    queues: Sequence[str]
    pid: int | None = None
    created: float | None = None
    node: str = ""
    record: str = ""
    runs_ttl: int = 0
    #: the listener's free resources (JSON: name -> amount; PROTOCOL.md 5.22)
    resources: str = "{}"


@dataclass(frozen=True)
class Taken:
    """What a Take took: the queue and id moved into the listener's reserved list, and (with a
    pid) the stamp's verdict."""

    queue: str
    task_id: str
    reservation: Reservation | None = None


class TakeOperations(StoreCore):
    @translate_errors
    def move_pending(self, queue: str, listener_id: str, block: float | None) -> str | None:
        """Move the oldest pending id into the listener's reserved list (reserve.lua: none
        while the queue is paused, 5.16c); with ``block``, when the queue has none, BLMOVE
        waits up to ``block`` seconds for one (a paused queue: the wait without a move).
        Follow with stamp(); a crash in between is recovered."""
        source, target = self.keys.pending(queue), self.keys.reserved(queue, listener_id)
        moved = self._run("reserve", [source, target, self.keys.paused(queue)], [])
        if moved == 0:  # paused: nothing comes in this wait
            if block is not None:
                time.sleep(block)
            return None
        if moved is not None or block is None:
            return cast("str | None", moved)
        return cast("str | None", self.redis.blmove(source, target, block, "RIGHT", "LEFT"))

    @staticmethod
    def _reservation(task_id: str, reply: Sequence[Any]) -> Reservation:
        verdict, detail = reply[0], reply[1]
        fields = None
        if verdict == "ok" and len(reply) > 2:
            flat = reply[2]
            fields = dict(zip(flat[::2], flat[1::2], strict=True))
        return Reservation(task_id, verdict, str(detail), fields)

    def _take_call(self, listener: str, now: float, take: Take) -> ScriptCall:
        # KEYS[1] with no pid: unused, a key of the first queue's slot
        keys = [self.keys.node_runs(take.node) if take.pid is not None
                else self.keys.pending(take.queues[0])]
        for queue in take.queues:
            keys += [self.keys.pending(queue), self.keys.reserved(queue, listener),
                     self.keys.failed(queue), *self._outcome_keys(queue, now),
                     self.keys.started(queue), self.keys.queue_config(queue)]
        keys += [self.keys.paused(queue) for queue in take.queues]  # last (lib/pause)
        args = [listener, repr(now), k.FINISHED_MINUTE_TTL,
                "" if take.pid is None else take.pid,
                "" if take.created is None else repr(take.created), take.record, take.runs_ttl,
                self.keys.task(""), take.resources, *self.keys.keyed_names(), *take.queues]
        return ScriptCall("take", keys, args, durable=take.pid is not None)

    def _keyed_names(self) -> list[str]:
        """lib/keyed's names for the scripts that release a key's slot; none where keys are
        refused (a Cluster: the script may touch only the keys it is given)."""
        return [] if self.clustered or self.keys.hash_tags else self.keys.keyed_names()

    @translate_errors
    def take(self, listener_id: str, take: Take) -> Taken | None:
        """The listener daemon's reservation when a slot is free (take.lua, move only: the
        first of ``take.queues`` with a task it may take now, PROTOCOL.md 5.22): what it moved
        into its reserved list, or None. On a Redis Cluster, LMOVE as ever (keys and resources
        are refused there)."""
        if self.clustered or self.keys.hash_tags:
            for queue in take.queues:
                task_id = self.move_pending(queue, listener_id, block=None)
                if task_id is not None:
                    return Taken(queue, task_id)
            return None
        call = self._take_call(listener_id, self.now(), take)
        return self._taken(self._run(call.name, call.keys, call.args))

    def _taken(self, reply: Sequence[Any]) -> Taken | None:
        if not reply:
            return None
        queue, task_id = str(reply[0]), str(reply[1])
        if len(reply) < 3:
            return Taken(queue, task_id)
        return Taken(queue, task_id, self._reservation(task_id, reply[2:]))

