"""Whose slots a run left by a dead listener occupies (PROTOCOL.md 6, "Recovery sweep"): a node
keeps its capacity whichever listeners share it.

An adopted run occupies the slots of one live listener of its node that serves its queue: the
one it was counted against while that one lives (its run record's ``adopted_by``), else the
sweeping listener if it serves the queue (it claims the run). A sweeper that serves another
queue, or a scheduler, carries the run's lease but counts it in no slots: until a listener of
its queue is up on the node, the run counts against that queue's capacity there, and the next
listener of the queue counts it from its first sweep. ``place`` is that rule, pure; recovery
applies it and writes the claims."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from blueque.node import NodeListener

__all__ = ["LocalListeners", "Placement", "adoption_line", "claimed", "place", "run_record"]


@dataclass(frozen=True)
class LocalListeners:
    """The listener daemons of a node as one sweep found them: their entries
    (blueque_listeners_on_[node]), and which of them live (by pid and create time)."""

    entries: dict[str, NodeListener]
    live: frozenset[str]

    def serves(self, listener: str, queue: str) -> bool:
        """``listener`` lives and serves ``queue``."""
        return listener in self.live and self.entries[listener].serves(queue)


@dataclass(frozen=True)
class Placement:
    #: the listener whose slots the run occupies; "" for none yet: the queue's capacity on
    #: the node
    counted: str
    #: the sweeper claims it now (its record is written with ``adopted_by``)
    claim: bool = False


def place(queue: str, holder: object, adopter: str | None, serves: bool,
          local: LocalListeners) -> Placement:
    """Where a live run of a dead listener, on ``queue``, is counted. ``holder``: the
    ``adopted_by`` of its record (anything, as read); ``adopter``: the sweeping listener (None:
    a scheduler), which serves ``queue`` when ``serves``. Two listeners that claim at once
    both count it until their next sweep: never neither."""
    if isinstance(holder, str) and holder != adopter and local.serves(holder, queue):
        return Placement(holder)  # the one it was counted against: it stays there
    if adopter is not None and serves:
        return Placement(adopter, claim=holder != adopter)
    return Placement("")


def run_record(raw: str | None) -> dict[str, Any] | None:
    """A run record of blueque_node_[node] (None: none, or unreadable)."""
    try:
        record = json.loads(raw) if raw else None
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def claimed(record: dict[str, Any] | None, adopter: str, task_id: str, queue: str,
            created: float | None, dead: tuple[str, int, float | None]) -> str:
    """The run's record with ``adopted_by`` = ``adopter``; a run of a listener that writes
    none (blueque 1.0.1: ``dead`` is its id, pid and create time) gets one."""
    written = dict(record) if record else {
        "task": task_id, "queue": queue, "attempt": None, "created": created,
        "listener": dead[0], "listener_pid": dead[1], "listener_created": dead[2]}
    written["adopted_by"] = adopter
    return json.dumps(written)


def adoption_line(task_id: str, queue: str, pid: int, dead: str, counted: str,
                  sweeper: str) -> str:
    """How an adoption reads in the sweeper's log: the task, its queue and the listener it
    counts against (or its queue's capacity on the node)."""
    where = (f"on the slots of listener {counted}" if counted else
             f"no listener of queue {queue} runs on this node: it counts against that queue's "
             f"capacity here (carried by {sweeper}), and the next listener of {queue} starts "
             f"with it counted")
    return (f"task {task_id} of queue {queue} (pid {pid}), left running by dead listener "
            f"{dead}, adopted: {where}")
