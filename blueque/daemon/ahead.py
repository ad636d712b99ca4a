"""The next reservation, taken in the round trip that records an ending (PROTOCOL.md 6.2, 6.7):
when a child's outcome is recorded and its slot is to take another task, finish.lua and
take.lua go in one pipeline. A warm process kept for another task gets it stamped for its pid
there and then (one round trip per task); otherwise the id is only moved into the listener's
reserved list and held here until the slot frees and a process is made for it (two).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from blueque.daemon.owner import NODE_RUNS_TTL, Owner
from blueque.daemon.running import Running, record_tail
from blueque.daemon.warm import WarmProcesses
from blueque.fencing import unstarted_verdict
from blueque.store import RedisStore, Take

log = logging.getLogger("blueque.daemon")


def no_queues() -> list[str]:
    return []


def no_resources(ending: str | None = None) -> str:
    return "{}"


class Ahead:
    """What a Supervisor takes ahead: the Take to send with an ending, and the ids it moved
    for slots still to free (``held``, in the order taken)."""

    def __init__(self, store: RedisStore, warm: WarmProcesses) -> None:
        self.store = store
        self.warm = warm
        #: the queues to take from, in the order to try them, once the run whose ending is
        #: being recorded frees its slot; [] when the listener takes no task now (stopping, a
        #: preemption, slots held by adopted runs). The listener's step gives it (take_from).
        self.queues: Callable[[], list[str]] = no_queues
        #: the listener's free resources (JSON) once the run of the task id given ends
        self.resources: Callable[[str | None], str] = no_resources
        #: (queue, task id) moved into our reserved list for a process still to be made
        self.held: list[tuple[str, str]] = []

    def take_from(self, queues: Callable[[], list[str]],
                  resources: Callable[[str | None], str]) -> None:
        """Where the next reservations come from: the listener's ``queues`` to try and its free
        ``resources`` (PROTOCOL.md 5.22), asked at each ending."""
        self.queues, self.resources = queues, resources

    def request(self, running: Running, owner: Owner, task_processes: set[int],
                now: float) -> Take | None:
        """The Take to send with ``running``'s ending, or None. Not on a Redis Cluster (the
        node's runs and each queue live in other slots), nor while ids are held: the slots
        they wait for come first."""
        if self.held or self.store.clustered:
            return None
        queues = self.queues()
        if not queues:
            return None
        if self.warm.reuse > 1 and not self.warm.retire_reason(running, task_processes, now):
            # its process will be kept: the next task is stamped for it in the same script
            return Take(queues, running.pid, running.created, owner.node,
                        record_tail(running.created, owner.id, owner.pid, owner.created),
                        NODE_RUNS_TTL, resources=self.resources(running.task_id))
        return Take(queues, resources=self.resources(running.task_id))

    def pop(self) -> tuple[str, str] | None:
        return self.held.pop(0) if self.held else None

    def task_ids(self) -> set[str]:
        return {task_id for _, task_id in self.held}

    def give_back(self, listener: str) -> None:
        """Put the held ids back at the head of their queues (recover, verdict pending): the
        listener takes no more tasks (it stops, or its node is preempted). Raises
        RedisUnavailable: those not given back stay held (the heal leaves them alone)."""
        while self.held:
            queue, task_id = self.held[0]
            data = self.store.task_data(task_id)
            self.store.recover(queue, listener, [unstarted_verdict(task_id, data, listener)],
                               self.store.now(), mode="host", release=False)
            self.held.pop(0)
            log.debug("task %s: taken ahead, given back to queue %s", task_id, queue)
