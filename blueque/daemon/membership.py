"""A listener's presence in Redis (PROTOCOL.md 6 "Registration", 6.1 "Identity check"): its
id, which no other live listener may hold; its info hash; its lease on each queue, renewed
every half interval in one round trip (timed, and warned of on a slow link: the lease keeper,
blueque.daemon.keeper, renews it between two when the loop is late); and its reserved lists,
healed of ids no child of its runs."""

from __future__ import annotations

import logging
import math
import os
import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass

from blueque import failpoints
from blueque.errors import ConfigurationError
from blueque.fencing import unstarted_verdict
from blueque.keys import NODE_RUNS_TTL
from blueque.metrics import ListenerMetrics
from blueque.node import NodeListener
from blueque.policy import field_float
from blueque.process import create_time, process_alive
from blueque.recovery import Recovery, RecoveryReport, started_verdict
from blueque.statuses import STARTED, Verdict
from blueque.store import NodeRenewal, RedisStore, RenewalReply

log = logging.getLogger("blueque.daemon")

#: A renewal whose round trip takes more than this share of the interval is on a slow link:
#: the lease is promised to hold only under it (PROTOCOL.md 6, step 2, "Slow links").
SLOW_SHARE = 0.1
#: How often a slow link is warned of, at most (s).
SLOW_WARN_EVERY = 60.0
#: How many of the latest round trips a renewal's time is the least of.
TRIPS_KEPT = 3

#: The error of a started task whose listener has no run of it (Membership.heal).
LOST_RUN = ("listener {listener} has no run of it any more: its ending was lost (Redis came "
            "back older than it went away: restored from an earlier copy, or a failover lost "
            "the last writes)")



@dataclass
class Membership:
    store: RedisStore
    id: str
    node: str  # node identity (6.1)
    node_name: str
    weights: dict[str, int]
    interval: float
    clock: Callable[[], float] = time.monotonic
    exclusive: bool = False  # every run exclusive (PROTOCOL.md 6.6): said in the info hash

    def __post_init__(self) -> None:
        self.lease_ms = int(self.interval * 2000)
        self.info: dict[str, str] = {}  # what register wrote, written whole at each renewal
        self.registered = False
        #: how long a renewal's round trip takes (s): the least of the latest TRIPS_KEPT (one
        #: that had to connect first is no slow link), written to the info hash by the next
        self.took: float | None = None
        self._trips: deque[float] = deque(maxlen=TRIPS_KEPT)
        #: when the latest renewal that held every lease (renewed, or registered again) was
        #: sent (this clock), or None
        self.renewed_at: float | None = None
        self._warned_at: float | None = None
        #: the reserved lists as the latest renewal read them, for the heal that follows it
        self._reserved: dict[str, list[str]] | None = None

    @property
    def created(self) -> float | None:
        """This listener process's create time, as registered."""
        return field_float(self.info.get("pid_created"))

    def claim(self, recovery: Recovery, stopping: Callable[[], bool]) -> bool:
        """Make sure no live listener holds our id (two processes sharing one would share a
        reserved list, a lease and a control channel). Raises ConfigurationError if one does;
        returns False if we were asked to stop while waiting.

        Same node identity: the holder's pid and create time tell at once. Otherwise (another
        node, e.g. two containers with one host name and one pid; or a dead holder on this
        node, after a pid reuse) its lease tells: we wait for one renewal interval and until
        its leases on our queues have lapsed; a renewal meanwhile means it lives. A dead
        holder's tasks are then recovered (mode lease) before we take the id."""
        info = self.store.listener_info(self.id)
        held = self._held_leases()
        if not info and not held:
            return True
        pid = int(info["pid"]) if info.get("pid", "").isdigit() else None
        if info.get("node") == self.node and pid is not None:
            created = field_float(info.get("pid_created"))
            if pid == os.getpid():
                if created is not None and process_alive(pid, created):
                    return True  # an earlier run() of this very process (ForkingRunner)
            elif process_alive(pid, created):
                raise ConfigurationError(
                    f"listener id {self.id} is in use by the live listener pid {pid} on this "
                    f"node: two listeners cannot share an id; give each its own --identity, "
                    f"or stop the other one first")
        where = info.get("node", "an unknown node")
        log.warning("listener id %s was held by a listener on %s that cannot be checked by pid "
                    "from here; waiting for its lease to lapse", self.id, where)
        if not self._outwait(info, held, where, stopping):
            return False
        report = RecoveryReport()
        for queue in held:
            recovery.recover_expired(queue, report)
        self.store.delete_listener_info(self.id)
        return True

    def _outwait(self, info: dict[str, str], held: dict[str, float], where: str,
                 stopping: Callable[[], bool]) -> bool:
        """Wait one interval of the holder and until its leases lapsed; raise if it renews."""
        patience = self.clock() + (field_float(info.get("interval")) or self.interval) + 1.0
        renewed = info.get("renewed")
        while not stopping():
            time.sleep(0.2)  # a signal ends it early enough: its handler sets stopping
            now_info, now_held = self.store.listener_info(self.id), self._held_leases()
            if (now_info.get("renewed", renewed) != renewed
                    or any(now_held.get(q, 0.0) > d for q, d in held.items())):
                raise ConfigurationError(
                    f"listener id {self.id} is in use by a live listener on {where} (it renewed "
                    f"its lease): listener ids must be unique; give each node its own "
                    f"--node-name (and each listener on it its own pid)")
            server_ms = self.store.server_time() * 1000
            if self.clock() > patience and all(d <= server_ms for d in now_held.values()):
                return True
        return False

    def _held_leases(self) -> dict[str, float]:
        found = {q: self.store.lease_deadline(q, self.id) for q in self.weights}
        return {q: deadline for q, deadline in found.items() if deadline is not None}

    def register(self, concurrency: int, resources: str = "") -> None:
        """Claim our place: info hash (``resources``: our --resources as JSON, PROTOCOL.md
        3.3), node entry, leases and listener sets."""
        pid = os.getpid()
        self.info = {
            "host": self.node_name, "node": self.node, "pid": str(pid),
            "pid_created": repr(create_time(pid) or 0.0),
            "queues": ",".join(f"{q}:{w}" for q, w in self.weights.items()),
            "concurrency": str(concurrency), "interval": repr(self.interval),
            "started": repr(self.store.now()),
        }
        self.info |= {"exclusive": "1"} if self.exclusive else {}
        self.info |= {"resources": resources} if resources else {}
        self.store.check_server()
        sent = self.clock()
        self.store.write_listener_info(self.id, self.info, self._info_ttl())
        self._took(self.clock() - sent, None)  # one round trip: a slow link is said at start
        # known to our node's sweeps before we hold anything: dead from here on, we are found
        self.store.join_node(self.node, self.id, self.entry(), NODE_RUNS_TTL)
        for queue in self.weights:
            self._join(queue)
        self.registered = True
        log.info("listener %s listening on %s with concurrency %d", self.id,
                 self.info["queues"], concurrency)

    def note(self, fields: dict[str, str]) -> None:  # info fields the next renewal writes
        self.info.update(fields)

    def release(self) -> None:
        """Leave cleanly: nothing of ours is left to recover."""
        for queue in self.weights:
            self.store.lease(queue, self.id, self.lease_ms, "release")
            self.store.remove_listener(queue, self.id)
        self.store.delete_listener_info(self.id)
        self.store.leave_node(self.node, self.id)
        self.registered = False

    def leave_runs(self) -> None:
        """We exit, leaving our runs to the node (--on-stop=keep): our next renewal (the last)
        says when (``left``), which takes us out of what status and the dashboard show at
        once; our lease, set membership and entry stay for the listener that adopts them."""
        self.info["left"] = repr(self.store.now())

    def entry(self) -> str:
        """Our entry among our node's listeners (blueque_listeners_on_[node])."""
        return NodeListener(self.id, os.getpid(), self.created, tuple(self.weights)).entry()

    def renew(self, busy: int, runs: dict[str, str], runs_ttl: int, tasks: list[str],
              metrics: ListenerMetrics | None = None,
              seen: dict[str, float] | None = None) -> RenewalReply:
        """One renewal in one round trip (RedisStore.renew_node, PROTOCOL.md 6 step 2): what
        ``renewal`` writes, and the fields of ``tasks`` (our running children's) as they are
        now. ``seen``: when our last run of each queue ended since the last renewal (the
        Recorder's), written and then emptied. Raises RedisUnavailable."""
        started = self.clock()
        reply = self.store.renew_node(self.renewal(busy, runs, runs_ttl, tasks, self.took,
                                                   dict(seen or {})))
        self._took(self.clock() - started, metrics)
        if seen:  # written
            seen.clear()
        self.renewed(reply.leases, metrics)
        # each lease, renewed or (lost) registered again just now, lapses no earlier than a
        # lease from ``started``: the exclusive guard counts from here (PROTOCOL.md 6.6)
        self.renewed_at = started
        self._reserved = reply.reserved
        return reply

    def renewal(self, busy: int, runs: dict[str, str], runs_ttl: int,
                tasks: list[str], took: float | None, seen: dict[str, float]) -> NodeRenewal:
        """What one renewal writes (PROTOCOL.md 6, step 2): the leases, the info hash whole
        (after a pause longer than its TTL it is gone), the node's runs, our entry among the
        node's listeners (pid_created tells us from a reused pid); and which tasks it reads.
        ``took``: how long the previous renewal took (renewal_seconds)."""
        info = {**self.info, "renewed": repr(self.store.now()), "busy": str(busy)}
        if took is not None:
            info["renewal_seconds"] = f"{took:.3f}"
        return NodeRenewal(self.id, self.node, list(self.weights), self.lease_ms, info,
                           self._info_ttl(), runs, runs_ttl, tasks, seen, self.entry())

    def renewed(self, leases: dict[str, int], metrics: ListenerMetrics | None = None) -> None:
        """After a renewal: a lease that was lost (we were declared dead and recovered) is
        registered again; our old runs are fenced out, or reclaimed (PROTOCOL.md 5.12b)."""
        for queue, deadline in leases.items():
            if deadline == -1:
                if metrics:
                    metrics.lease_lost(queue)
                log.error("listener %s lost its lease on %s (declared dead and recovered); "
                          "registering again", self.id, queue)
                self._join(queue)

    def _join(self, queue: str) -> None:
        """The lease first: dead between the two, we leave a lease that lapses and is swept,
        not a member no sweep would ever find dead (PROTOCOL.md 6, registration)."""
        self.store.lease(queue, self.id, self.lease_ms, "register")
        failpoints.hit("listener-after-lease")
        self.store.add_listener(queue, self.id)

    def _took(self, seconds: float, metrics: ListenerMetrics | None) -> None:
        """Measure a round trip (a renewal's, the registration's); warn (at most every
        SLOW_WARN_EVERY) when the link is slow for the interval, naming an --interval that
        would hold."""
        self._trips.append(seconds)
        seconds = self.took = min(self._trips)
        if metrics:
            metrics.renewal_took(seconds)
        if seconds <= SLOW_SHARE * self.interval:
            return
        now = self.clock()
        if self._warned_at is not None and now - self._warned_at < SLOW_WARN_EVERY:
            return
        self._warned_at = now
        holds = math.ceil(seconds / SLOW_SHARE * 2) / 2
        log.warning("listener %s: a round trip to Redis took %.2f s, more than a tenth of "
                    "its --interval %g: a slow or distant Redis, on which its lease is not "
                    "promised to hold (renewals may land late, and live tasks be run again "
                    "elsewhere). --interval %g or more would hold", self.id, seconds,
                    self.interval, holds)

    def _info_ttl(self) -> int:
        return int(self.interval * 3) + 1

    def heal(self, ours: Collection[str], reserved: dict[str, list[str]] | None = None,
             processes: Collection[int] = ()) -> None:
        """Settle tasks left in our reserved lists that no child of ours runs (``ours``).
        Put back: a reserve cut off between LMOVE and stamp.lua (Redis went away), an LMOVE
        whose reply a failover lost (the retried one took another task), a refused stamp.
        Retried or failed by their policy: tasks Redis has as started by us, whose run we
        no longer have (Redis came back older than it went away: restored from an earlier
        copy, or a failover lost the writes that recorded their ending). ``reserved``: the
        lists as read just before (by default, as the latest renewal read them, if the heal
        follows one). ``processes``: our task processes; a task started by us for one of them
        that runs another task (or none) never ran: put back, its attempt not held against it
        (a take whose reply was lost, 6.2). Raises RedisUnavailable."""
        reserved, self._reserved = reserved or self._reserved, None
        for queue in self.weights:
            listed = (reserved or {}).get(queue)  # as the renewal just read it
            if listed is None:
                listed = self.store.reserved_ids(queue, self.id)
            ids = [i for i in listed if i not in ours]
            if not ids:
                continue
            verdicts: list[Verdict] = []
            config: dict[str, str] | None = None
            for task_id, data in zip(ids, self.store.task_data_many(ids), strict=True):
                pid = data.get("pid", "")
                if pid.isdigit() and int(pid) in processes:
                    verdicts.append(unstarted_verdict(task_id, data, self.id, int(pid)))
                    continue
                if data.get("status") == STARTED and data.get("node") == self.id:
                    config = self.store.queue_config(queue) if config is None else config
                    verdicts.append(started_verdict(task_id, data, config, LOST_RUN.format(
                        listener=self.id), self.store.now()))
                    continue
                verdicts.append(unstarted_verdict(task_id, data, self.id))
            counts = self.store.recover(queue, self.id, verdicts, self.store.now(), mode="host",
                                        release=False)
            log.warning("listener %s: put back %s task(s) left in its reserved list on %s"
                        "%s", self.id, counts[0], queue,
                        f"; {counts[1] + counts[2]} started task(s) of which it has no run "
                        "any more retried or failed by their policy (Redis lost their "
                        "endings)" if counts[1] + counts[2] else "")
