"""One step of the listener daemon's loop, over its parts (PROTOCOL.md 6 "One step"): take in
what the children said and reap them, renew the lease, sweep for dead listeners, enforce time
limits and cancellations, fill free slots, then wait for something to happen (a child's frame
or exit, an enqueue published on a queue's channel, a cancel message, a signal, a timer). The
children are the Supervisor's (supervisor.py), the listener's presence in Redis and its
renewal's round trip the Membership's (membership.py), what wakes the loop the Wakeup's and the
Inbox's (wakeup.py). The life around the steps (signals, stopping, leaving) is loop.py's.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable, Iterator
from typing import Literal

from blueque import eviction
from blueque.client import Client
from blueque.daemon.exclusive import ExclusiveGuard
from blueque.daemon.forks import ForkServerLink, server_setup
from blueque.daemon.keeper import LeaseKeeper
from blueque.daemon.membership import Membership
from blueque.daemon.options import ListenerOptions
from blueque.daemon.owner import NODE_RUNS_TTL, Owner
from blueque.daemon.resources import ResourceBook
from blueque.daemon.running import output_fds
from blueque.daemon.slots import Slots
from blueque.daemon.supervisor import Supervisor
from blueque.daemon.wakeup import Cadence, Inbox, ProgramSignals, Wakeup
from blueque.errors import RedisUnavailable
from blueque.listener import listener_id
from blueque.metrics import ListenerMetrics
from blueque.node import checked_node_name, hostname, node_identity, parse_listener_id
from blueque.preemption import NodePreemption
from blueque.recovery import Recovery
from blueque.spool import Spool
from blueque.spool import default_directory as spool_directory
from blueque.store import RedisStore, Take, apart
from blueque.task_process.calling import TaskFunction, import_function

log = logging.getLogger("blueque.daemon")


def reduced_lottery(weights: dict[str, int], rng: random.Random) -> Iterator[str]:
    """Kale's ReducedLottery: draw queues by weight; a drawn queue leaves the pool, so every
    queue is tried once per round, heavier ones first more often, and none starves."""
    pool = dict(weights)
    while pool:
        names = list(pool)
        choice = rng.choices(names, weights=[pool[name] for name in names])[0]
        del pool[choice]
        yield choice


def reserve(store: RedisStore, weights: dict[str, int], listener: str,
            rng: random.Random, resources: str = "{}") -> tuple[str, str] | None:
    """Move the next pending id the listener may take (its key has a free slot, its
    ``resources`` cover what it requires: take.lua, PROTOCOL.md 5.22) of the first queue,
    drawn by weight, that has one into the listener's reserved list: the queue and the id.
    The stamp comes once a child is forked to run it (6.2)."""
    taken = store.take(listener, Take(list(reduced_lottery(weights, rng)), resources=resources))
    return None if taken is None else (taken.queue, taken.task_id)


class ListenerStep:
    """The listener's parts and one step of its loop (``run_once``: take in, reap, join, renew,
    sweep, enforce limits and cancels, fill free slots, wait), the ListenerDaemon's (and the
    tests'). It composes Membership, Supervisor, Wakeup, Inbox, Slots, Recovery..."""

    def __init__(self, client: Client, options: ListenerOptions,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """Each part is given what it needs of ``options`` when it is made."""
        self.options = options
        interval = options.interval
        # the loop's operations retry for half an interval at most, then its own backoff takes
        # over (limits, signals go on); children get the client's whole retry_deadline
        self.store = client.store.bounded(interval / 2, quiet=True)
        self.weights = options.queues
        self.on_stop = options.on_stop
        self.node_name, self.id = daemon_identity(options.node_name, options.identity)
        self.node = node_identity(self.node_name)
        self.clock = clock
        self.membership = Membership(self.store, self.id, self.node, self.node_name,
                                     self.weights, interval, clock, options.exclusive)
        lease_ms = self.membership.lease_ms
        self.recovery = Recovery(self.store, host=self.node_name, lease_ms=lease_ms,
                                 node=self.node)
        function = options.function
        self.function: TaskFunction | None = None if isinstance(function, str) else function
        self.rng = random.Random()
        #: the loop's Prometheus counters (options.metrics), for a server to serve
        self.spool = Spool.checked(options.spool_dir or spool_directory())  # usable, or refused
        self.metrics = (ListenerMetrics(self.store, self.id, options.concurrency, busy=self.busy,
                                        memory=lambda: self.supervisor.memory(), spool=self.spool)
                        if options.metrics else None)
        #: forks our task processes when it is ready (6.8): started and stopped by the loop
        self.fork_server = fork_server_link(client, options, self.spool)
        self.supervisor = Supervisor(
            self.store, client.store, Owner(self.id, self.node, os.getpid(), None,
                                            lease_ms / 1000), clock, self.rng,
            task_logs=options.task_logs, spool=self.spool,
            count_ending=self.metrics.task_ended if self.metrics else None,
            reuse=options.reuse, max_memory=options.max_memory_per_process,
            fork_server=self.fork_server)
        self.stopper = self.supervisor.stopper  # handed to us: cancels, limits, preemption
        runs = self.supervisor.children  # shared, never copied (the guard's thread reads it)
        self.guard = ExclusiveGuard(runs, lease_ms / 1000, options.exclusive, clock)
        #: renews the leases when the loop is late (a slow link); hears of every renewal
        self.keeper = LeaseKeeper(apart(client.store, interval), self.id, list(self.weights),
                                  interval, self.guard.renewed_at, clock, self.metrics)
        self.wakeup = Wakeup(self.store, interval)
        self.preemption = NodePreemption(self.store, self.node_name, self.id, clock,
                                         options.preempt_grace)
        self.inbox = Inbox(self.store.keys, self.id, self.weights, self.preemption)
        self.slots = Slots(options.concurrency)
        self.resources = ResourceBook(self.store, options.resources, runs, self.slots)
        self.supervisor.take_ahead_from(self._next_queues, self.resources.free)  # 5.22
        self.stop_asked = False
        self.cadence = Cadence(interval, options.poll)
        #: refuses an evicting Redis at start, then says a change at each renewal
        self.memory_watch = eviction.PolicyWatch(f"listener {self.id}", options.allow_eviction, log)
        self.program_signals: ProgramSignals | None = None

    def load_function(self) -> TaskFunction:
        """Import the task function in the parent, before listening: children inherit it, and
        a spec that cannot be imported stops the listener at start (CallbackError) instead of
        failing every task it would take."""
        if self.function is None:
            self.function = import_function(str(self.options.function))
        return self.function

    def register(self) -> None:
        sent = self.clock()
        self.membership.register(self.options.concurrency, self.resources.offered())
        self.keeper.renewed(sent)  # its leases run from here
        self.supervisor.registered(self.membership.created)

    def start_subscriber(self) -> None:
        """Hear enqueues on our queues' channels, cancels on our control channel and this
        node's preemption (PROTOCOL.md 6 step 7)."""
        self.wakeup.subscribe(self.inbox.channels, self.inbox.heard)

    # --- what the loop's life tells its step (daemon/loop.py) ---------------------------
    def keep_on_stop(self, on_stop: str) -> None:  # --on-stop as it can be kept here
        self.on_stop = on_stop

    def ask_stop(self) -> None:  # no new task from now on; leave as --on-stop says
        self.stop_asked = True

    def hear_program(self, program: ProgramSignals | None) -> None:  # ForkingRunner.run()'s
        self.program_signals = program

    def _interrupted(self) -> bool:
        """Asked to stop, or a program's signal waits: a wait for our identity gives way."""
        return self.stop_asked or bool(self.program_signals and self.program_signals.pending)

    def run_once(self) -> None:
        self.keeper.beat()  # a loop that no longer steps lets its lease lapse
        self.supervisor.take_in()
        self.supervisor.reap()
        try:
            if not self.membership.registered:
                self.store.check_server("listener", self.weights)  # before any write (acl)
                self.memory_watch.look(self.store.memory_policy())  # the first refuses evicting
                # endings our node's listeners could not record: before any recovery could
                # take their stopped runs for deaths (PROTOCOL.md 6.5)
                self.spool.replay(self.store)
                if not self.membership.claim(self.recovery, self._interrupted):
                    return
                self.register()
                self.heal()
                if self.wakeup.subscriber is None:  # once the server is known to be usable
                    self.start_subscriber()
            self._step(self.clock())
            timeout = self.options.poll
        except RedisUnavailable as error:
            news, timeout = self.cadence.outage(self.clock())
            if news:
                log.error("listener %s: %s; %s", self.id, error, "children keep running, "
                          "retrying" if self.membership.registered else "not started yet: "
                          "it takes no task until Redis answers, retrying")
            self.supervisor.hold_reports()  # what our children reported outlives us (6.5)
            self._enforce_limits()
        self._wait(timeout)

    def _step(self, current: float) -> None:
        """One step's work with Redis (PROTOCOL.md 6 "One step"); RedisUnavailable ends it."""
        supervisor = self.supervisor
        if self.cadence.down_since is not None:
            # back only once Redis takes a write: under OOM some writes pass and others are
            # refused, and "back" must not be said between two refusals (PROTOCOL.md 6.5)
            self.store.probe_writes(self.id)
        self._renew_when_due(current)
        self._check_preemption()
        supervisor.begin_waiting()
        supervisor.record_reports()  # first: each of those children waits for the word
        supervisor.record_unrecorded()
        if self.cadence.due("sweep", current):
            self._sweep()
            self.cadence.done("sweep", current)
        supervisor.forget_ended()
        if self.cadence.due("due", current):
            # retries are scheduled tasks: move due ones even when no scheduler runs
            for queue in self.weights:
                self.store.enqueue_due(queue, self.store.now())
            self.cadence.done("due", current)
        self.stopper.stop_tasks(self.inbox.cancels(), "cancelled")
        self._enforce_limits()
        if not self.stop_asked and self.preemption.deadline is None:
            self._fill_slots()
        else:
            supervisor.give_back(self.id)  # ids taken ahead: no slot will take them
        supervisor.write_progress()
        if self.cadence.back():
            log.warning("listener %s: Redis is back", self.id)
            self.heal()

    def _renew_when_due(self, current: float) -> None:
        """Every half interval, and first thing after an outage (Cadence)."""
        if self.cadence.due("renew", current):
            self.preemption.hear()  # a request whose message we missed: read it now
            self.renew()
            self.memory_watch.look(self.store.memory_policy())  # a CONFIG SET since (5.18b)
            self.spool.replay(self.store)  # what a listener of ours held when it died
            # a move whose reply was lost (a failover: the retried LMOVE took another
            # task) strands an id in our reserved list that nothing else would put back
            self.heal()
            self.cadence.done("renew", current)

    def renew(self) -> None:
        """Renew our leases and info hash and write our runs (Membership.renew), and look at
        each running child's task as it is now (Stopper.look_at): a superseded run is
        stopped, one recovered while it lived reclaimed, a missed cancel taken."""
        supervisor = self.supervisor
        supervisor.renewing()  # an operator's Queue.configure applies from now
        watched = self.stopper.watched()
        reply = self.membership.renew(self.busy(), supervisor.records(), NODE_RUNS_TTL,
                                      [r.task_id for r in watched], self.metrics,
                                      supervisor.seen)
        self.membership.note(supervisor.health())  # off the lease's path: the next one's
        self.inbox.cancel(self.stopper.look_at(zip(watched, reply.tasks, strict=True)))
        self.keeper.renewed(self.membership.renewed_at)  # the guard and metrics hear of it

    def heal(self) -> None:
        """Put back the ids in our reserved lists that no child of ours runs or has an ending
        to record (Membership.heal; as a renewal just before read them). Raises RedisUnavailable."""
        self.membership.heal(self.supervisor.task_ids(),
                             processes=self.supervisor.task_processes())

    def _sweep(self) -> None:
        """Recovery, as adopter (the runs it adopts take our slots), then old output files."""
        report = self.recovery.sweep(self.weights, exclude=[self.id], adopter=self.id)
        if self.slots.take(report):
            log.info("listener %s: %d adopted task(s) of dead listeners occupy its slots",
                     self.id, len(self.slots.adopted))
        self.supervisor.clean_logs(self.options.interval)
        if self.metrics:
            self.metrics.swept(report)

    def busy(self) -> int:
        """Slots in use: our children (and their leftovers being stopped), adopted, fenced."""
        return self.slots.busy(self.supervisor.occupied())

    def _next_queues(self) -> list[str]:
        """The queues to try, in order, once the run whose ending is recorded frees its slot
        (blueque.daemon.ahead); []: stopping, preempted, or our slots are over-full."""
        if (self.stop_asked or self.preemption.deadline is not None
                or self.slots.free(self.supervisor.occupied() - 1) <= 0):
            return []
        return list(reduced_lottery(self.weights, self.rng))

    def _fill_slots(self) -> None:
        supervisor, free = self.supervisor, self.slots.free  # a task for each free slot
        while free(supervisor.occupied()) > 0 and not self.stop_asked and (
                moved := supervisor.pop_ahead() or reserve(
                    self.store, self.weights, self.id, self.rng, self.resources.free())):
            if not supervisor.fork(*moved, self.load_function()):
                self.heal()
                return
        if not self.stop_asked:  # then the next task's process made ahead (6.8)
            supervisor.make_spare(next(iter(self.weights)), free(supervisor.occupied()))

    def _enforce_limits(self) -> None:
        """Time limits, a preemption's deadline and kill escalation need no Redis: they keep
        working while it is down; so does SIGUSR1 (a node may be told it goes away while
        Redis is away): its tasks are told at once and stopped at the deadline."""
        if self.preemption.signalled:
            self._check_preemption()
        if self.preemption.due():
            # their tasks go back to pending (endings.decide; an adopted run's when a sweep
            # finds it gone)
            self.stop_all("preempted")
        self.stopper.enforce_limits()

    def stop_all(self, reason: Literal["shutdown", "preempted"]) -> None:
        """SIGTERM our children's and adopted runs' groups (SIGKILL after their grace)."""
        self.stopper.stop_all(reason)
        self.recovery.stop_adopted(self.slots.in_care(), reason)

    def _check_preemption(self) -> None:
        """This node goes away: take no more tasks, tell every task process so that it saves
        and stops; its groups are terminated at the deadline (an earlier one wins)."""
        if self.preemption.check(self.stopper.notify, self.slots.adopted_pids()):
            self.membership.note({"preempting_until": repr(self.preemption.deadline)})
            self.cadence.soon("renew")  # blueque status shows it from our next step on

    def _wait(self, timeout: float) -> None:
        if self.stop_asked and self.on_stop == "keep":
            return
        deadlines = [*self.supervisor.deadlines(), *self.cadence.deadlines(),
                     *self.preemption.deadlines()]
        current = self.clock()
        self.wakeup.wait(min([timeout, *(d - current for d in deadlines)]),
                         self.supervisor.channels(), output_fds(self.supervisor.children.values()))


def fork_server_link(client: Client, options: ListenerOptions,
                     spool: Spool) -> ForkServerLink | None:
    """The link to a listener's fork server, if it uses one (ListenerOptions.uses_fork_server)."""
    if not options.uses_fork_server(client.settings) or client.settings is None:
        return None
    setup = server_setup(str(options.function), client.settings,
                         client.store.checkpoint_max_bytes, options.task_logs, spool)
    return ForkServerLink(setup) if setup else None


def daemon_identity(node_name: str | None, identity: str | None) -> tuple[str, str]:
    """A listener daemon's node name and id. An explicit id's host part is its node name:
    "[node name]_[pid]" stays readable."""
    name = checked_node_name(node_name) if node_name else (
        parse_listener_id(identity)[0] if identity else hostname())
    return name, identity or listener_id(node_name=name)
