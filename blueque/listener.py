"""Listener: reserve tasks from one queue (blocking, woken within milliseconds by BLMOVE)."""

from __future__ import annotations

import logging
import os
import time

from blueque.node import hostname, local_process, node_identity, parse_listener_id
from blueque.process import process_alive
from blueque.store import BLOCK_SLICE, RedisStore, Reservation
from blueque.task import Task

log = logging.getLogger("blueque.listener")


__all__ = ["Listener", "hostname", "listener_id", "parse_listener_id"]


def listener_id(pid: int | None = None, node_name: str | None = None) -> str:
    """``[node name]_[pid]``: the node name defaults to the fully qualified host name, as
    in blueque 1.0.1."""
    return f"{node_name or hostname()}_{os.getpid() if pid is None else pid}"


class Listener:
    """Registers in blueque_listeners_[queue] (as blueque 1.0.1 does) and reserves tasks."""

    def __init__(
        self,
        queue: str,
        store: RedisStore,
        identity: str | None = None,
        register: bool = True,
    ) -> None:
        self._queue = queue
        self._store = store
        self.id = identity or listener_id()
        self.host, self.pid = parse_listener_id(self.id)
        self.node = node_identity(self.host)
        if register:
            store.add_listener(queue, self.id)

    @property
    def queue(self) -> str:
        return self._queue

    def close(self) -> None:
        """Leave blueque_listeners_[queue] cleanly (blueque 1.0.1 never did)."""
        self._store.remove_listener(self._queue, self.id)

    def _stamp(self, task_id: str) -> Task | None:
        reservation: Reservation = self._store.stamp(self._queue, self.id, task_id,
                                                     self._store.now())
        if reservation.runnable:
            return Task(task_id, self._store, reservation.fields)
        log.warning(
            "not running task %s from queue %s: %s (%s)",
            task_id, self._queue, reservation.verdict, reservation.detail,
        )
        return None

    def reserve(self) -> Task | None:
        """Reserve the oldest pending task without waiting; None if there is none."""
        while True:
            task_id = self._store.move_pending(self._queue, self.id, block=None)
            if task_id is None:
                return None
            task = self._stamp(task_id)
            if task is not None:
                return task

    def listen(self, timeout: float | None = None) -> Task | None:
        """Block until a task is reserved and return it (None only if ``timeout`` passes).

        BLMOVE pending -> reserved, then stamp.lua; a crash between the two leaves the id in
        this listener's reserved list with status pending, which recovery puts back."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            block = BLOCK_SLICE
            if deadline is not None:
                block = min(block, max(0.0, deadline - time.monotonic()))
            task_id = self._store.move_pending(self._queue, self.id, block=block or 0.001)
            if task_id is not None:
                task = self._stamp(task_id)
                if task is not None:
                    return task
                continue
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def claim_orphan(self) -> Task | None:
        """A task left by a dead listener of this queue on this node, or None (blueque 1.0.1's
        rule: a listener on the same host whose pid is gone; removing it from the listeners
        set is the claim, so only one claimer wins). A listener whose info names another
        node identity is never judged by pid here: only its lease tells (PROTOCOL.md)."""
        for other in sorted(self._store.listener_ids(self._queue)):
            if other == self.id:
                continue
            local = local_process(other, self._store.listener_info(other), self.node, self.host)
            if local is None or process_alive(*local):
                continue
            if not self._store.remove_listener(self._queue, other):
                continue
            task_id = self._store.claim_reserved(self._queue, other, self.id)
            if task_id is not None:
                return Task(task_id, self._store)
        return None
