"""Adopting the live runs of a node's dead listeners (PROTOCOL.md 6, "Recovery sweep"; 5.12b):
the dead listener's lease registered again by the sweeper, its info and node entry kept, each
run placed on the slots it counts against (``blueque.adoption.place``, the rule) and its
adoption logged; a run whose task a lease recovery took back while its adopter was cut off is
taken back for it (reclaim.lua) and adopted again. ``blueque.recovery`` decides which runs."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from blueque.adoption import adoption_line, claimed, place, run_record
from blueque.keys import NODE_RUNS_TTL
from blueque.node import NodeListener
from blueque.orphaned_runs import Orphan
from blueque.store import RedisStore

if TYPE_CHECKING:
    from blueque.recovery import NodeSweep

log = logging.getLogger("blueque.recovery")


class Adopter:
    """What one sweeper writes for the runs it adopts, from one sweep to the next."""

    def __init__(self, store: RedisStore, node: str, lease_ms: int) -> None:
        self.store = store
        self.node = node
        self.lease_ms = lease_ms
        #: task id -> who counts it, as its adoption was last logged ("": its queue's
        #: capacity on the node, no listener of it being up)
        self._told: dict[str, str] = {}

    def adopt(self, queue: str, listener: str, process: tuple[int, float | None],
               live: dict[str, tuple[int, float | None]], sweep: NodeSweep,
               info: dict[str, str] | None = None, rejoin: bool = False) -> None:
        """The dead ``listener``'s ``live`` runs on ``queue`` go on: its lease registered
        again (no other node recovers them), its info kept, each run placed; its node's
        entry written again where it has none (``rejoin``: this sweep may have removed it)."""
        sweep.report.adopted += len(live)
        self.store.lease(queue, listener, self.lease_ms, "register")
        info = self.store.listener_info(listener) if info is None else info
        # outlive the info's TTL: a reused pid stays told apart, and the node identity
        # (written for a 1.0.1 listener too) keeps later sweeps judging it on this node;
        # ``left`` keeps it out of the listeners that status and the dashboard show
        kept = {"node": self.node, "pid": str(process[0]),
                "left": info.get("left") or repr(self.store.now())}
        if process[1] is not None:
            kept["pid_created"] = repr(process[1])
        self.store.write_listener_info(listener, kept, self.lease_ms // 1000 + 1)
        if rejoin or listener not in sweep.node.entries:  # it wrote none (1.0.1), or left
            known = sweep.node.entries.get(listener) or NodeListener(listener, *process, ())
            self.store.join_node(self.node, listener, known.with_queue(queue).entry(),
                                 NODE_RUNS_TTL)
        for task_id, (pid, created) in live.items():
            self.place(queue, (listener, *process), task_id, pid, created, sweep)

    def reclaim(self, orphan: Orphan, sweep: NodeSweep) -> bool:
        """An adopted run whose task a lease recovery took back while the adopter was cut off
        (5.12b): taken back for its dead listener at its attempt unless a newer one started,
        and adopted again. Whether it goes on."""
        known = sweep.node.entries.get(orphan.listener)
        owner = orphan.owner or (known and (known.pid, known.created))
        if not owner:  # its listener's process unknown: it could not be told apart later
            return False
        verdict, detail = self.store.reclaim(orphan.queue, orphan.task_id, orphan.listener,
                                             orphan.attempt, orphan.pid, orphan.created,
                                             self.store.now())
        if verdict != "ok":
            log.info("task %s: not taken back for its adopted run (%s %s)", orphan.task_id,
                     verdict, detail)
            return False
        log.warning("task %s: recovered while its adopted run (attempt %d, pid %d) lived and "
                    "not started again anywhere: taken back, the run goes on", orphan.task_id,
                    orphan.attempt, orphan.pid, extra={"task_id": orphan.task_id,
                                                        "queue": orphan.queue,
                                                        "event": "reclaimed"})
        self.adopt(orphan.queue, orphan.listener, owner,
                    {orphan.task_id: (orphan.pid, orphan.created)}, sweep, rejoin=True)
        return True

    def place(self, queue: str, dead: tuple[str, int, float | None], task_id: str, pid: int,
              created: float | None, sweep: NodeSweep) -> None:
        """Whose slots an adopted run occupies (``blueque.adoption.place``): its claim
        written when the sweeper takes it, the run put in the report as ours (on our slots)
        or carried (its queue's capacity on the node), and its adoption logged when that
        changes."""
        record = run_record(sweep.runs.get(str(pid)))
        adopter = sweep.adopter
        placed = place(queue, record.get("adopted_by") if record else None, adopter,
                       queue in sweep.serves, sweep.node)
        if placed.claim and adopter is not None:
            self.store.claim_run(self.node, pid,
                                 claimed(record, adopter, task_id, queue, created, dead))
        if placed.counted and placed.counted == adopter:
            sweep.report.adopted_runs[task_id] = (pid, created)
        elif not placed.counted:
            sweep.report.carried_runs[task_id] = (pid, created)
        sweep.placed.add(task_id)
        if self._told.get(task_id) != placed.counted:
            self._told[task_id] = placed.counted
            sweeper = f"listener {adopter}" if adopter else f"the sweeper of node {self.node}"
            log.info("%s", adoption_line(task_id, queue, pid, dead[0], placed.counted, sweeper))


    def forget_unplaced(self, placed: set[str]) -> None:
        """After a sweep: forget what was told of runs it no longer placed (ended)."""
        self._told = {task: told for task, told in self._told.items() if task in placed}
