"""The listener daemon: reserve a task only when a slot is free, fork one child per task, keep a
lease, record every ending, recover dead listeners, and stop without losing work.

``run()`` repeats ``run_once()``: reap children, renew the lease, sweep for dead listeners,
enforce time limits and cancellations, fill free slots, then wait for something to happen
(a child exiting, an enqueue published on a queue's channel, a cancel message, a timer).
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import random
import select
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from blueque import failpoints
from blueque import keys as k
from blueque.child import (
    EXIT_NOT_STARTED,
    EXIT_REPORTED,
    Assignment,
    TaskFunction,
    import_function,
    run_reporting_child,
)
from blueque.client import Client
from blueque.display import (
    format_seconds,
    last_line,
    shorten,
)
from blueque.endings import Ending, Stopped, decide
from blueque.errors import (
    BluequeError,
    ConfigurationError,
    InvalidTaskState,
    RedisUnavailable,
)
from blueque.listener import Listener, listener_id
from blueque.metrics import ListenerMetrics
from blueque.node import checked_node_name, hostname, node_identity, parse_listener_id
from blueque.policy import Policy
from blueque.process import create_time, process_alive
from blueque.recovery import Recovery, RecoveryReport
from blueque.reporting import ChildChannel
from blueque.store import now
from blueque.tasklog import TaskLogSettings, ship_reported, ship_rest

log = logging.getLogger("blueque.daemon")

ON_STOP = ("keep", "drain", "terminate")
#: How long blueque_node_[node] outlives its last write: a run orphaned on a node where no
#: listener or scheduler runs for longer is no longer found (PROTOCOL.md, "Node identity").
NODE_RUNS_TTL = 7 * 24 * 3600
#: Shortest time between two progress writes for one child: a task that reports in a tight
#: loop costs Redis ten writes a second, not one per report (PROTOCOL.md 6.2).
PROGRESS_SPACING = 0.1


def _float(raw: str | None) -> float | None:
    try:
        return float(raw) if raw else None
    except ValueError:
        return None


def reduced_lottery(weights: dict[str, int], rng: random.Random) -> Iterator[str]:
    """Kale's ReducedLottery: draw queues by weight; a drawn queue leaves the pool, so every
    queue is tried once per round, heavier ones first more often, and none starves."""
    pool = dict(weights)
    while pool:
        names = list(pool)
        choice = rng.choices(names, weights=[pool[name] for name in names])[0]
        del pool[choice]
        yield choice


@dataclass
class Running:
    """A child process running one attempt of one task (PROTOCOL.md 6.2).

    ``state``: "starting" until the stamp has started the task for it (repeated while Redis
    is away), then "running"; "refused" when the stamp refused the task (nothing ran)."""

    task_id: str
    queue: str
    attempt: int | None
    started: float  # monotonic
    time_limit: float
    kill_grace: float
    policy: Policy
    pid: int = 0
    reason: Stopped = ""  # why we stop it
    term_sent: float = 0.0
    kill_sent: bool = False
    exit_code: int | None = None  # None while it runs, or when a signal ended it
    created: float | None = None  # the process's create time
    #: the task's fields once its ending is recorded (for the listener's log line)
    ending: dict[str, str] | None = None
    channel: ChildChannel | None = None  # the listener's end of the child's socket
    state: str = "running"
    #: the outcome frame the child sent, and the status recorded for it (None: not yet)
    report: dict[str, Any] | None = None
    recorded: str | None = None
    fields: dict[str, str] = field(default_factory=dict)  # the task as the stamp left it
    progress: tuple[float, str] | None = None  # the latest report, not written yet
    progress_due: float = 0.0  # monotonic: no progress write for this child before
    output_shipped: bool = False  # the rest of its reported attempt's output is in Redis

    def record(self, listener: str, listener_pid: int, listener_created: float | None) -> str:
        """This run's entry in blueque_node_[node] (PROTOCOL.md): with its listener process,
        so that whoever reads it on this node can tell whether that very process lives."""
        return json.dumps({"task": self.task_id, "queue": self.queue, "attempt": self.attempt,
                           "created": self.created, "listener": listener,
                           "listener_pid": listener_pid, "listener_created": listener_created})


def describe_exit(status: int, reason: str, time_limit: float) -> str:
    """What an unreported ending means, for the task's error field."""
    if reason == "time limit":
        return f"time limit of {time_limit:g} s exceeded: the task's process group was killed"
    if reason == "cancelled":
        return "cancelled while it ran: its process group was terminated"
    if reason == "shutdown":
        return "terminated because its listener shut down (--on-stop=terminate)"
    if reason == "preempted":
        return ("preempted: its node goes away, and it still ran at the deadline; its process "
                "group was terminated")
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        name = signal.Signals(signum).name if signum in signal.valid_signals() else str(signum)
        text = f"process killed by signal {name} ({signum}) without reporting an outcome"
        if signum == signal.SIGKILL:
            text += "; if nobody sent it, the kernel's out-of-memory killer may have"
        return text
    return f"process exited with code {os.WEXITSTATUS(status)} without reporting an outcome"


#: The task fields describe_ending reads.
ENDING_FIELDS = ("status", "attempts", "error", "traceback", "eta", "cancelled")


def describe_ending(fields: dict[str, str], attempt: int | None, took: str) -> str:
    """How an attempt ended, for the listener's log: ``complete in 3h12m``, ``failed in 2s:
    ValueError: bad``, ``failed in 2s, retry in 30s: ...``, ``cancelled in 5m: ...``, or
    where the task has moved on meanwhile."""
    status = fields.get("status")
    # the exception with its type, from the traceback's last line; 1.0.1's error is its text
    error = shorten(last_line(fields.get("traceback")) or fields.get("error"), 200)
    if not fields:
        return f"ended in {took}; its task is gone (deleted)"
    if attempt is not None and fields.get("attempts") not in (None, str(attempt)):
        return (f"ended in {took}, superseded: the task is {status} at attempt "
                f"{fields.get('attempts')}")
    if status == k.COMPLETE:
        return f"complete in {took}"
    if status == k.FAILED:
        return f"{'cancelled' if fields.get('cancelled') else 'failed'} in {took}: {error}"
    if status == k.SCHEDULED and fields.get("eta"):
        wait = format_seconds(max(0.0, float(fields["eta"]) - now()))
        return f"failed in {took}, retry in {wait}: {error}"
    if status == k.PENDING:
        return f"ended in {took}, put back: the task is pending again"
    return f"ended in {took}; the task is {status}"


class ListenerDaemon:
    def __init__(
        self,
        client: Client,
        queues: dict[str, int],
        function: TaskFunction | str,
        concurrency: int = 1,
        on_stop: str = "keep",
        interval: float = 10.0,
        poll: float = 1.0,
        identity: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        node_name: str | None = None,
    ) -> None:
        if not queues:
            raise ConfigurationError("a listener needs at least one queue")
        if concurrency < 1:
            raise ConfigurationError(f"concurrency must be at least 1, not {concurrency}")
        if on_stop not in ON_STOP:
            raise ConfigurationError(f"--on-stop must be one of {ON_STOP}, not {on_stop!r}")
        if not interval > 0 or not poll > 0:
            raise ConfigurationError(
                f"interval and poll must be more than 0 seconds, not {interval!r} and {poll!r}"
            )
        self.client = client
        # the loop's operations retry for half an interval at most, then the loop's own
        # backoff takes over (it keeps enforcing time limits and hearing signals meanwhile);
        # children get the client's whole retry_deadline for their start and outcome
        self.store = client.store.bounded(interval / 2)
        self.task_store = client.store
        self.weights = dict(queues)
        self.concurrency = concurrency
        self.on_stop = on_stop
        self.interval = interval
        self.poll = poll
        # an explicit id's host part is its node name: "[node name]_[pid]" stays readable
        self.node_name = checked_node_name(node_name) if node_name else (
            parse_listener_id(identity)[0] if identity else hostname())
        self.id = identity or listener_id(node_name=self.node_name)
        self.node = node_identity(self.node_name)
        self.clock = clock
        self.lease_ms = int(interval * 2000)
        self.recovery = Recovery(self.store, host=self.node_name, lease_ms=self.lease_ms,
                                 node=self.node)
        self.listeners = {q: Listener(q, self.store, self.id, register=False) for q in queues}
        self.function_spec = function if isinstance(function, str) else None
        self.function: TaskFunction | None = None if isinstance(function, str) else function
        self.children: dict[int, Running] = {}
        # live runs of dead listeners of this node that we adopted: they occupy our slots
        self.adopted: dict[str, tuple[int, float | None]] = {}
        # fenced runs of dead listeners of this node that our sweep is stopping: pid ->
        # create time; they occupy our slots too until their processes are gone
        self.fenced: dict[int, float | None] = {}
        self._ended_pids: list[str] = []  # to drop from blueque_node_[node]
        self.unrecorded: list[tuple[Running, str]] = []
        self.stopping = False
        self.rng = random.Random()
        self._next_renew = 0.0
        self._next_sweep = 0.0
        self._next_due = 0.0
        self._redis_down_since: float | None = None
        self._cancels: deque[str] = deque()
        self._wake_r, self._wake_w = os.pipe()
        self._sig_r, self._sig_w = os.pipe()
        for fd in (self._wake_r, self._wake_w, self._sig_r, self._sig_w):
            os.set_blocking(fd, False)
        self._wake_lock = threading.Lock()
        self._previous_handlers: dict[int, Any] = {}  # what signal.signal() returned
        self._previous_wakeup_fd: int | None = None
        self._subscriber: threading.Thread | None = None
        self._registered = False
        self._info: dict[str, str] = {}
        #: each queue's defaults (blueque_queue_config_[queue]), read again at every renewal
        self._queue_defaults: dict[str, dict[str, str]] = {}
        #: preemption (PROTOCOL.md 6.3): SIGUSR1 gives this much notice
        self.preempt_grace = 90.0
        self.preempt_deadline: float | None = None  # Unix s: this node goes away then
        self._preempt_at = 0.0  # the same deadline, on self.clock
        self._preempt_signalled = False  # SIGUSR1 arrived
        self._preempt_heard = True  # read blueque_preempt_[node name] at the next step
        self._preempt_seen = ""  # requested_at of the request acted on (or found stale)
        self._adopted_stops: dict[int, float] = {}  # adopted pid -> SIGTERM sent (clock)
        self.metrics: ListenerMetrics | None = None  # blueque listen --metrics-port
        #: where task output goes (blueque listen: on by default; PROTOCOL.md 5.19)
        self.task_logs: TaskLogSettings | None = None

    # --- lifecycle --------------------------------------------------------------------------
    def load_function(self) -> TaskFunction:
        """Import the task function in the parent, before listening: children inherit it, and
        a spec that cannot be imported stops the listener at start (CallbackError) instead of
        failing every task it would take."""
        if self.function is None:
            self.function = import_function(self.function_spec or "")
        return self.function

    def install_signals(self) -> None:
        """Taken for the life of run(); _finish gives them back (ForkingRunner runs in-process)."""
        self._previous_wakeup_fd = signal.set_wakeup_fd(self._sig_w)
        self._previous_handlers[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, lambda *_: None)
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous_handlers[signum] = signal.signal(signum, self._request_stop)
        self._previous_handlers[signal.SIGUSR1] = signal.signal(signal.SIGUSR1,
                                                                self._request_preempt)

    def _restore_signals(self) -> None:
        while self._previous_handlers:
            signum, handler = self._previous_handlers.popitem()
            signal.signal(signum, handler)
        if self._previous_wakeup_fd is not None:
            signal.set_wakeup_fd(self._previous_wakeup_fd)
            self._previous_wakeup_fd = None

    def _request_preempt(self, signum: int, frame: object) -> None:
        self._preempt_signalled = True  # acted on in run_once (the wakeup fd wakes it)

    def _request_stop(self, signum: int, frame: object) -> None:
        if not self.stopping:
            log.info("listener %s: signal %d, stopping (on-stop=%s)", self.id, signum,
                     self.on_stop)
        self.stopping = True

    def claim_identity(self) -> bool:
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
            created = _float(info.get("pid_created"))
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
        patience = self.clock() + (_float(info.get("interval")) or self.interval) + 1.0
        renewed = info.get("renewed")
        while not self.stopping:
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
                break
        else:
            return False
        report = RecoveryReport()
        for queue in held:
            self.recovery.recover_expired(queue, report)
        self.store.delete_listener_info(self.id)
        return True

    def _held_leases(self) -> dict[str, float]:
        found = {q: self.store.leases(q).get(self.id) for q in self.weights}
        return {q: deadline for q, deadline in found.items() if deadline is not None}

    def register(self) -> None:
        pid = os.getpid()
        info = {
            "host": self.node_name, "node": self.node, "pid": str(pid),
            "pid_created": repr(create_time(pid) or 0.0),
            "queues": ",".join(f"{q}:{w}" for q, w in self.weights.items()),
            "concurrency": str(self.concurrency), "interval": repr(self.interval),
            "started": repr(now()),
        }
        self._info = info
        self.store.check_server()
        self.store.write_listener_info(self.id, info, int(self.interval * 3) + 1)
        for queue in self.weights:
            self.store.add_listener(queue, self.id)
            self.store.lease(queue, self.id, self.lease_ms, "register")
        self._registered = True
        log.info("listener %s listening on %s with concurrency %d", self.id,
                 info["queues"], self.concurrency)

    def release(self) -> None:
        """Leave cleanly: nothing of ours is left to recover."""
        for queue in self.weights:
            self.store.lease(queue, self.id, self.lease_ms, "release")
            self.store.remove_listener(queue, self.id)
        self.store.delete_listener_info(self.id)
        self._registered = False

    def run(self) -> int:
        self.load_function()
        if self.on_stop == "keep" and os.getpid() == 1:
            # the init of a PID namespace (a container's main process): when it exits, the
            # kernel kills every process in the namespace, so no run can wait for adoption
            log.warning("listener %s runs as pid 1 of its PID namespace: its task processes "
                        "end when it exits, so --on-stop=keep cannot leave them to the next "
                        "listener; it will stop them as --on-stop=terminate does (recorded, "
                        "retried by their policy). Run it under an init that outlives it "
                        "to keep them", self.id)
            self.on_stop = "terminate"
        # what the listener holds by now stays put for good: the children's collections then
        # never touch (and copy) the pages of the objects they inherit
        gc.freeze()
        self.install_signals()
        self._start_subscriber()
        try:
            while True:
                self.run_once()
                if self.stopping and self._may_exit():
                    break
                if self._preempted_and_done():
                    log.warning("listener %s: preempted, and every task it ran is handed back; "
                                "exiting", self.id)
                    break
        finally:
            self._finish()
        return 0

    def _may_exit(self) -> bool:
        if self.on_stop == "keep":
            return True
        if self.on_stop == "terminate":
            for running in self.children.values():
                running.reason = running.reason or "shutdown"
                if not running.term_sent:
                    running.term_sent = self.clock()
                    self._signal_group(running, signal.SIGTERM)
            self.recovery.stop_adopted(self.adopted)
        # adopted runs occupy our slots too: leaving them would end the renewal of their
        # lease, and another node would run their tasks again beside them; a sweep empties
        # self.adopted once their processes are gone and records them
        return not self.children and not self.unrecorded and not self.adopted

    def _finish(self) -> None:
        self._subscriber = None
        try:
            if self.children:
                log.info("listener %s exiting; %d task(s) keep running and will be adopted by "
                         "the next listener on this host", self.id, len(self.children))
                self._renew()
            elif self._registered:
                self.release()
        except BluequeError as error:
            log.error("listener %s: could not leave cleanly: %s", self.id, error)
        for running in self.children.values():
            if running.channel is not None:
                # the children see their listener gone and record their outcomes themselves,
                # even when this process lives on (ForkingRunner.run() returns to its caller)
                running.channel.close()
        self._restore_signals()
        with self._wake_lock:  # the subscriber thread may still hold a message for a second
            for fd in (self._wake_r, self._wake_w, self._sig_r, self._sig_w):
                os.close(fd)
            self._wake_w = -1

    # --- one step ---------------------------------------------------------------------------
    def run_once(self) -> None:
        self._read_children()
        self._reap()
        try:
            if not self._registered:
                self.store.check_server()  # once: before the identity check's first command
                if not self.claim_identity():
                    return
                self.register()
                self._heal()
            current = self.clock()
            self._renew_when_due(current)
            self._check_preemption()
            self._begin_waiting()
            self._record_reports()  # first: each of those children waits for the word
            self._record_unrecorded()
            if current >= self._next_sweep:
                self._sweep()
                self._next_sweep = current + self.interval
            if self._ended_pids:
                self.store.forget_runs(self.node, self._ended_pids)
                self._ended_pids = []
            if current >= self._next_due:
                # retries are scheduled tasks: move due ones even when no scheduler runs
                for listener in self.listeners.values():
                    self.store.enqueue_due(listener.queue, now())
                self._next_due = current + self.poll
            self._handle_cancels()
            self._enforce_limits()
            if not self.stopping and self.preempt_deadline is None:
                self._fill_slots()
            self._write_progress()
            if self._redis_down_since is not None:
                log.warning("listener %s: Redis is back", self.id)
                self._redis_down_since = None
                self._heal()
            timeout = self.poll
        except RedisUnavailable as error:
            if self._redis_down_since is None:
                self._redis_down_since = self.clock()
                log.error("listener %s: %s; children keep running, retrying", self.id, error)
            down = self.clock() - self._redis_down_since
            # at most half an interval: back within a lease's slack once Redis is
            timeout = min(5.0, self.interval / 2, 0.1 * 2 ** min(6, int(down)))
            self._enforce_limits_offline()
        self._wait(timeout)

    def _renew_when_due(self, current: float) -> None:
        """Every half interval, and first thing after an outage (so that no sweeper takes
        our lease for lapsed while Redis was away: PROTOCOL.md 6, "Outages")."""
        if current >= self._next_renew or self._redis_down_since is not None:
            self._preempt_heard = True  # a request whose message we missed: read it now
            self._renew()
            # a move whose reply was lost (a failover: the retried LMOVE took another
            # task) strands an id in our reserved list that nothing else would put back
            self._heal()
            self._next_renew = current + self.interval / 2

    def _sweep(self) -> None:
        """Recovery, as adopter: the live runs of dead listeners we adopt take our slots."""
        report = self.recovery.sweep(self.weights, exclude=[self.id], adopter=self.id)
        if self.task_logs is not None:  # a quiet running attempt's file is not an old one
            settings = self.task_logs
            settings.clean(running=[settings.path(r.queue, r.task_id, r.attempt)
                                    for r in self.children.values() if r.attempt is not None])
        if set(report.adopted_runs) != set(self.adopted):
            log.info("listener %s: %d adopted task(s) of dead listeners occupy its slots",
                     self.id, len(report.adopted_runs))
        self.adopted = dict(report.adopted_runs)
        self.fenced = dict(report.fenced_runs)
        if self.metrics:
            self.metrics.swept(report)

    def busy(self) -> int:
        """Slots in use: our children, the runs we adopted, the fenced runs we are stopping."""
        return len(self.children) + len(self.adopted) + len(self.fenced)

    def _free_slots(self) -> int:
        # an adopted or fenced run frees its slot when its process ends (no need to wait
        # for a sweep)
        self.adopted = {t: run for t, run in self.adopted.items() if process_alive(*run)}
        self.fenced = {pid: created for pid, created in self.fenced.items()
                       if process_alive(pid, created)}
        return self.concurrency - self.busy()

    def _fill_slots(self) -> None:
        while self._free_slots() > 0 and not self.stopping:
            moved = self._reserve()
            if moved is None or not self._fork(*moved):
                return

    def _reserve(self) -> tuple[str, str] | None:
        """LMOVE the next pending id of a queue drawn by weight into our reserved list: the
        queue and the id. The stamp comes once a child is forked to run it (6.2)."""
        for queue in reduced_lottery(self.weights, self.rng):
            task_id = self.store.move_pending(queue, self.id, block=None)
            if task_id is not None:
                return queue, task_id
        return None

    def _fork(self, queue: str, task_id: str) -> bool:
        """Fork the child that will run ``task_id``, then stamp the task for it (6.2)."""
        function = self.load_function()
        ours, theirs = socket.socketpair()
        try:
            with self._pool_lock():
                pid = os.fork()
        except OSError as error:  # EAGAIN at a pids limit (systemd TasksMax), ENOMEM
            ours.close()
            theirs.close()
            log.error("task %s: cannot fork a process to run it (%s); putting it back",
                      task_id, error)
            self._heal()
            return False
        if pid == 0:
            ours.close()
            for running in self.children.values():  # its siblings' sockets are not its own
                if running.channel is not None:
                    running.channel.close()
            run_reporting_child(self.task_store, theirs,
                                Assignment(task_id, queue, self.id, self.lease_ms / 1000),
                                function, self.task_logs)
        theirs.close()
        running = Running(task_id, queue, None, self.clock(), 0.0, Policy().kill_grace,
                          Policy(), pid, created=create_time(pid), channel=ChildChannel(ours),
                          state="starting")
        self.children[pid] = running
        failpoints.hit("listener-before-stamp")
        self._begin(running)
        return True

    def _begin(self, running: Running) -> None:
        """Stamp the moved task with the child's pid (pending -> started) and record the run
        on our node, in one round trip; then tell the child to go, or to stop (6.2)."""
        try:
            reservation = self.store.begin_run(
                running.queue, self.id, running.task_id, now(), running.pid, running.created,
                self.node, running.record(self.id, os.getpid(), self._created()),
                NODE_RUNS_TTL)
        except RedisUnavailable:
            # the stamp may or may not have happened: the child waits (nothing runs yet)
            # while we repeat it, idempotent, at every step until Redis answers
            raise
        except BluequeError as error:
            reservation = None
            log.error("task %s: not started: %s", running.task_id, error)
        if reservation is None or not reservation.runnable:
            if reservation is not None:
                log.warning("not running task %s from queue %s: %s (%s)", running.task_id,
                            running.queue, reservation.verdict, reservation.detail)
            running.state = "refused"
            self._tell(running, {"stop": reservation.detail if reservation else "refused"})
            return
        fields = reservation.fields or {}
        defaults = self._defaults(running.queue)
        policy = Policy.resolve(fields, defaults)
        running.attempt, running.policy, running.fields = reservation.attempt, policy, fields
        running.time_limit, running.kill_grace = policy.time_limit, policy.kill_grace
        failpoints.hit("listener-before-go")
        self._tell(running, {"go": fields, "defaults": defaults})
        if running.channel is not None and running.channel.closed:
            return  # the child died before it could be told: it never ran (see _put_back)
        running.started, running.state = self.clock(), "running"
        log.info("task %s queue %s: attempt %s started in pid %d", running.task_id,
                 running.queue, running.attempt, running.pid,
                 extra={"task_id": running.task_id, "queue": running.queue,
                        "pid": running.pid, "event": "started", "attempt": running.attempt})

    def _begin_waiting(self) -> None:
        """Repeat the stamps an outage interrupted (their children are waiting)."""
        for running in list(self.children.values()):
            if running.state == "starting":
                self._begin(running)

    def _created(self) -> float | None:
        return _float(self._info.get("pid_created"))

    @staticmethod
    def _tell(running: Running, message: dict[str, Any]) -> None:
        if running.channel is not None:
            running.channel.send(message)

    def _defaults(self, queue: str) -> dict[str, str]:
        """The queue's defaults (blueque_queue_config_[queue]), read again at every lease
        renewal rather than for every task."""
        defaults = self._queue_defaults.get(queue)
        if defaults is None:
            defaults = self._queue_defaults[queue] = self.store.queue_config(queue)
        return defaults

    def _pool_lock(self) -> contextlib.AbstractContextManager[object]:
        """The connection pool's lock, held across fork(): the child reuses the store, and
        redis-py resets an inherited pool under that lock; forked while the subscriber thread
        held it, the child's first command would wait forever."""
        lock = getattr(getattr(self.store.redis, "connection_pool", None), "_lock", None)
        return lock if lock is not None else contextlib.nullcontext()

    # --- children ---------------------------------------------------------------------------
    def _read_children(self) -> None:
        """Take in what the children said (6.2): progress, and outcomes to record."""
        for running in self.children.values():
            if running.channel is None:
                continue
            for frame in running.channel.receive():
                if running.report is not None:
                    continue  # nothing counts after the outcome
                if "outcome" in frame:
                    running.report = frame
                elif "progress" in frame and running.state == "running":
                    try:
                        running.progress = (float(frame["progress"]),
                                            str(frame.get("message") or ""))
                    except (TypeError, ValueError):
                        log.warning("task %s: unreadable progress report %r", running.task_id,
                                    frame)
            running.channel.flush()

    def _record_reports(self) -> None:
        for running in list(self.children.values()):
            if running.report is not None and running.recorded is None:
                self._record_report(running)

    def _record_report(self, running: Running) -> None:
        """Record the outcome a child reported (finish, fenced by its attempt), after the
        rest of its output; then tell the child, which exits. Raises RedisUnavailable: the
        outcome is kept (and the child waits) until Redis takes it."""
        report = running.report or {}
        policy, attempt = running.policy, running.attempt
        if self.task_logs is not None and not running.output_shipped:
            output = report.get("output")
            ship_reported(self.store.bounded(0.0), self.task_logs, running.queue,
                          running.task_id, attempt, policy.result_ttl_ms(),
                          output if isinstance(output, dict) else {})
            running.output_shipped = True
        if running.progress is not None and running.state == "running":
            self._write_progress_of(running)  # its last report shows beside its outcome
        ran = report.get("outcome")
        trace = str(report.get("traceback") or "") or None
        ending = decide(policy, running.fields, ran if ran in ("complete", "preempted") else
                        "failed", str(report.get("text") or ""), now(),
                        retry=bool(report.get("retry", True)), stopped=running.reason,
                        rng=self.rng)
        failpoints.hit("listener-before-finish")
        try:
            running.recorded = self._finish_run(running, ending, trace, forget=True)
        except InvalidTaskState as refused:  # StaleAttempt: it was taken back meanwhile
            log.warning("task %s: outcome (%s) of attempt %s not recorded: %s",
                        running.task_id, ending.outcome, attempt, refused)
            running.recorded = ""
            running.ending = self.store.task_fields(running.task_id, ENDING_FIELDS)
        failpoints.hit("listener-before-recorded")
        self._tell(running, {"recorded": running.recorded})  # a reaped child's is closed

    def _finish_run(self, running: Running, ending: Ending, trace: str | None = None,
                    forget: bool = False, listener: str | None = None,
                    attempt: int | None = None) -> str:
        """Record ``ending`` for the child's run (finish, fenced by its attempt); with
        ``forget``, drop its run record in the same round trip. Keeps what was recorded for
        the listener's log line."""
        current = now()
        final = ending.outcome in ("complete", "failed")
        status = self.store.finish(
            running.queue, running.task_id, listener or self.id, running.pid, ending.outcome,
            ending.text, current, running.attempt if attempt is None else attempt,
            retry_eta=ending.eta, result_ttl_ms=running.policy.result_ttl_ms() if final else None,
            extra=("cancelled", repr(current)) if ending.cancelled else None,
            traceback=trace, forget_run=(self.node, running.pid) if forget else None)
        running.ending = {"status": status, "attempts": str(running.attempt)}
        if ending.outcome != "complete":
            running.ending.update(error=ending.text, traceback=trace or "",
                                  eta="" if ending.eta is None else repr(ending.eta),
                                  cancelled="1" if ending.cancelled else "")
        return status

    def _write_progress(self) -> None:
        """Write each child's latest progress, at most every PROGRESS_SPACING seconds."""
        current = self.clock()
        for running in list(self.children.values()):
            if (running.progress is not None and running.report is None
                    and running.attempt is not None and current >= running.progress_due):
                self._write_progress_of(running)

    def _write_progress_of(self, running: Running) -> None:
        if running.progress is None or running.attempt is None:
            return
        fraction, message = running.progress
        try:
            self.store.progress(running.task_id, running.attempt, fraction, message, now())
        except InvalidTaskState as error:  # StaleAttempt: superseded; dropped
            log.warning("progress of task %s not recorded: %s", running.task_id, error)
        running.progress = None
        running.progress_due = self.clock() + PROGRESS_SPACING

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            running = self.children.pop(pid, None)
            if running is None:
                continue
            if running.channel is not None:
                running.channel.close()
            if running.reason:  # we stopped it: time limit, cancelled, shutdown, superseded
                self._signal_group(running, signal.SIGKILL, pid)  # grandchildren too
            self._settle(pid, status, running)

    def _settle(self, pid: int, status: int, running: Running) -> None:
        duration = self.clock() - running.started
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
        running.exit_code = code
        if running.recorded is None and running.state != "refused":
            if running.report is None:
                self._ended_pids.append(str(pid))
                if self.task_logs is not None and code != EXIT_NOT_STARTED:
                    # it died without reporting: the listener ships the end of its output
                    ship_rest(self.store.bounded(0.0), self.task_logs, running.queue,
                              running.task_id, running.attempt, running.policy.result_ttl_ms())
            # an outcome it reported is recorded as reported; any other ending is checked
            # against the task, exit codes 0 and 3 included (a task function may call
            # os._exit itself): _record reads first
            self.unrecorded.append((running, describe_exit(status, running.reason,
                                                           running.time_limit)))
            self._record_unrecorded()
        elif running.state == "refused":
            self._ended_pids.append(str(pid))
        if self.metrics and running.state != "refused":
            self.metrics.task_ended(running.task_id, running.queue, running.attempt, duration)
        never_ran = running.state in ("refused", "starting")
        process = ("not started" if never_ran or code == EXIT_NOT_STARTED
                   else "reported" if running.report is not None else "died")
        took = format_seconds(duration)
        what = (f"ended in {took}, to be recorded when Redis is back" if running.ending is None
                else describe_ending(running.ending, running.attempt, took))
        if running.state == "refused":
            what = "not started: the stamp refused it"
        log.info("task %s queue %s attempt %s %s (pid %d %s, node %s)", running.task_id,
                 running.queue, running.attempt, what, pid, process, self.node, extra={
                     "task_id": running.task_id, "queue": running.queue, "pid": pid,
                     "attempt": running.attempt, "node": self.node,
                     "duration": round(duration, 6), "event": "ended", "outcome": process,
                     "ending": what})

    def _record_unrecorded(self) -> None:
        """Record endings of children that are gone: the outcome a child reported, or what
        its exit status says; kept until Redis accepts them."""
        while self.unrecorded:
            running, error = self.unrecorded[0]
            try:
                if running.report is not None:
                    self._record_report(running)
                elif running.state == "starting":
                    self._put_back(running)
                else:
                    self._record(running, error)
            except RedisUnavailable:
                return
            except InvalidTaskState as refused:
                # recovered or cancelled between our read and our finish: its new state stands
                log.warning("task %s: ending not recorded: %s", running.task_id, refused)
            self.unrecorded.pop(0)

    def _record(self, running: Running, error: str) -> None:
        """The ending of a child that reported no outcome, from its exit status."""
        said = running.exit_code in (EXIT_REPORTED, EXIT_NOT_STARTED) and not running.reason
        if said:
            fields = self.store.task_fields(running.task_id, (*ENDING_FIELDS, "pid", "node"))
            if fields.get("status") != k.STARTED or not self._its_run(running, fields):
                # it recorded an outcome itself, or never started the task
                running.ending = fields
                return
        data = self.store.task_data(running.task_id)
        if data.get("status") not in (k.RESERVED, k.STARTED) or not self._its_run(running, data):
            # the task moved on (recovered, cancelled), or the stamp never started it
            running.ending = data
            return
        attempt = running.attempt
        if attempt is None and data.get("attempts", "").isdigit():
            attempt = int(data["attempts"])  # a stamp whose reply was lost, by its pid
        policy = running.policy
        if running.state != "running":  # never told its policy: read it now
            policy = running.policy = Policy.resolve(data, self._defaults(running.queue))
        ending = decide(policy, data, "failed", error, now(), stopped=running.reason,
                        rng=self.rng)
        status = self._finish_run(running, ending, listener=data.get("node") or self.id,
                                  attempt=attempt)
        running.ending = self.store.task_fields(running.task_id, ENDING_FIELDS)
        log.warning("task %s queue %s: %s -> %s", running.task_id, running.queue, error, status,
                    extra={"task_id": running.task_id, "queue": running.queue,
                           "event": "recorded", "outcome": status})

    def _put_back(self, running: Running) -> None:
        """A child that ended before it was told to go never ran its task: whether or not
        the stamp (whose reply never came) started it for that child, the task goes back to
        the head of the line, its attempt not held against it (recover, verdict pending)."""
        data = self.store.task_data(running.task_id)
        ours = data.get("node") == self.id and (
            data.get("status") == k.RESERVED
            or (data.get("status") == k.STARTED and data.get("pid") == str(running.pid)))
        running.ending = data
        if data.get("status") == k.PENDING or ours:
            self.store.recover(running.queue, self.id,
                               [(running.task_id, data.get("attempts", ""), "pending", None, "")],
                               now(), mode="host", release=False)
            running.ending = {"status": k.PENDING}

    def _its_run(self, running: Running, data: dict[str, str]) -> bool:
        """Is the task's current run this child's? By attempt, once the stamp told it; for a
        stamp whose reply never came, by the pid and listener the stamp would have written."""
        if running.attempt is not None:
            return data.get("attempts") == str(running.attempt)
        return data.get("pid") == str(running.pid) and data.get("node") == self.id

    # --- preemption (PROTOCOL.md 6.3) ------------------------------------------------------
    def _check_preemption(self) -> None:
        """SIGUSR1 (our own grace), or a request for this node in Redis (read when its
        message came, and at every renewal in case it was missed)."""
        if self._preempt_signalled:
            self._preempt_signalled = False
            self.preempt(now() + self.preempt_grace, "SIGUSR1")
        if not self._preempt_heard:
            return
        self._preempt_heard = False
        request = self.store.preemption(self.node_name)
        requested = request.get("requested_at", "")
        if not request or requested == self._preempt_seen:
            return
        self._preempt_seen = requested
        deadline = _float(request.get("deadline"))
        if deadline is None:
            log.error("listener %s: unreadable preemption request %r ignored", self.id, request)
        elif deadline <= now() and self.preempt_deadline is None:
            log.info("listener %s: a preemption of node %s that ended %s ago is ignored "
                     "(the node is still here)", self.id, self.node_name,
                     format_seconds(now() - deadline))
        else:
            self.preempt(deadline, request.get("reason") or "blueque preempt")

    def preempt(self, deadline: float, why: str) -> None:
        """This node goes away at ``deadline`` (Unix s): take no more tasks, tell every task
        process (a frame with the deadline, then SIGUSR1) so that it saves and stops; its
        groups are terminated at the deadline. An earlier deadline replaces a later one."""
        if self.preempt_deadline is not None and deadline >= self.preempt_deadline:
            return
        self.preempt_deadline = deadline
        self._preempt_at = self.clock() + max(0.0, deadline - now())
        self._info["preempting_until"] = repr(deadline)
        self._next_renew = 0.0  # blueque status shows it from our next step on
        runs = [r for r in self.children.values() if r.state == "running"]
        log.warning("listener %s: node %s goes away in %s (%s): taking no more tasks; telling "
                    "%d task(s)", self.id, self.node_name,
                    format_seconds(max(0.0, deadline - now())), why,
                    len(runs) + len(self.adopted), extra={"event": "preempted",
                                                          "deadline": deadline})
        for running in runs:
            self._tell(running, {"preempt": deadline})
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(running.pid, signal.SIGUSR1)
        for pid, _ in self.adopted.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGUSR1)

    def _stop_preempted(self, current: float) -> None:
        """The deadline has come: SIGTERM the groups still running (then SIGKILL after their
        kill_grace, as for any stop); their tasks go back to pending (endings.decide)."""
        for running in list(self.children.values()):
            if running.report is None:
                self._stop_child(running, "preempted")
        for pid, _ in list(self.adopted.values()):
            first = self._adopted_stops.setdefault(pid, current)
            signum = (signal.SIGKILL if current - first > Policy().kill_grace
                      else signal.SIGTERM)
            if first == current or signum == signal.SIGKILL:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signum)

    def _preempted_and_done(self) -> bool:
        return (self.preempt_deadline is not None and not self.children
                and not self.unrecorded and self._free_slots() == self.concurrency)

    def _signal_group(self, running: Running, signum: int, pid: int | None = None) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid or running.pid, signum)

    def _stop_child(self, running: Running, reason: Stopped) -> None:
        if not running.reason:
            running.reason = reason
            running.term_sent = self.clock()
            log.info("task %s: %s, sending SIGTERM to its process group", running.task_id,
                     reason)
            self._signal_group(running, signal.SIGTERM)

    def _enforce_limits(self) -> None:
        self._enforce_limits_offline()

    def _enforce_limits_offline(self) -> None:
        """Time limits, a preemption's deadline and kill escalation need no Redis: they keep
        working while it is down."""
        current = self.clock()
        if self.preempt_deadline is not None and current >= self._preempt_at:
            self._stop_preempted(current)
        for running in list(self.children.values()):
            if running.time_limit and current - running.started > running.time_limit:
                self._stop_child(running, "time limit")
            if running.term_sent and not running.kill_sent and (
                current - running.term_sent > running.kill_grace
            ):
                running.kill_sent = True
                self._signal_group(running, signal.SIGKILL)

    def _handle_cancels(self) -> None:
        wanted = set()
        while self._cancels:
            wanted.add(self._cancels.popleft())
        for running in self.children.values():
            if running.task_id in wanted:
                self._stop_child(running, "cancelled")

    def _heal(self) -> None:
        """Put back tasks left in our own reserved lists that no child of ours runs: a reserve
        cut off between LMOVE and stamp.lua (Redis went away), or a stamp that was refused."""
        ours = {r.task_id for r in self.children.values()}
        ours.update(r.task_id for r, _ in self.unrecorded)  # endings still to be recorded
        for queue in self.weights:
            ids = [i for i in self.store.reserved_ids(queue, self.id) if i not in ours]
            if not ids:
                continue
            verdicts = []
            for task_id, data in zip(ids, self.store.task_data_many(ids), strict=True):
                waiting = data.get("status") in (k.PENDING, k.RESERVED) or not data
                verdicts.append((task_id, data.get("attempts", ""),
                                 "pending" if waiting else "drop", None, ""))
            counts = self.store.recover(queue, self.id, verdicts, now(), mode="host",
                                        release=False)
            log.warning("listener %s: put back %s task(s) left in its reserved list on %s",
                        self.id, counts[0], queue)

    # --- lease ------------------------------------------------------------------------------
    def _renew(self) -> None:
        if self.metrics:
            self.metrics.renewal(self.clock(), self.interval)
        self._queue_defaults.clear()  # an operator's Queue.configure applies from now on
        for queue in self.weights:
            if self.store.lease(queue, self.id, self.lease_ms, "renew") == -1:
                if self.metrics:
                    self.metrics.lease_lost(queue)
                log.error("listener %s lost its lease on %s (declared dead and recovered); "
                          "registering again", self.id, queue)
                self.store.add_listener(queue, self.id)
                self.store.lease(queue, self.id, self.lease_ms, "register")
        # all of it: after a pause longer than its TTL (SIGSTOP, an outage) the hash is gone,
        # and recover_local needs pid_created to tell this process from a reused pid
        self.store.write_listener_info(
            self.id, {**self._info, "renewed": repr(now()),
                      "busy": str(self.busy())},
            int(self.interval * 3) + 1)
        running = list(self.children.values())
        self._record_runs(running)  # refreshes the record's expiry too
        # a child whose outcome we took in is only exiting: it is not superseded by its own end
        running = [r for r in running if r.report is None and r.state == "running"]
        if running:
            datas = self.store.task_data_many([r.task_id for r in running])
            for child, data in zip(running, datas, strict=True):
                if data.get("cancel_requested"):
                    self._cancels.append(child.task_id)
                elif self._superseded(child, data):
                    self._stop_child(child, "superseded")

    def _record_runs(self, runs: Sequence[Running]) -> None:
        pid, created = os.getpid(), _float(self._info.get("pid_created"))
        self.store.record_runs(self.node, {str(r.pid): r.record(self.id, pid, created)
                                           for r in runs},
                               NODE_RUNS_TTL)

    def _superseded(self, running: Running, data: dict[str, str]) -> bool:
        """Its task was taken back (recovered while we were frozen or cut off) or reserved
        again: the run can record nothing (fenced), so going on only duplicates work. A child
        that has just recorded its own outcome looks the same, and stopping it is harmless."""
        if not data or running.attempt is None:
            return False
        return (data.get("attempts") != str(running.attempt) or data.get("node") != self.id
                or data.get("status") not in (k.RESERVED, k.STARTED))

    # --- waiting ----------------------------------------------------------------------------
    def _start_subscriber(self) -> None:
        channels = [self.store.keys.channel(q) for q in self.weights]
        channels.append(self.store.keys.preemption_channel(self.node_name))
        control = self.store.keys.control(self.id)
        thread = threading.Thread(
            target=self._subscribe, args=(channels, control), name="blueque-subscriber",
            daemon=True,
        )
        self._subscriber = thread
        thread.start()

    def _subscribe(self, channels: Sequence[str], control: str) -> None:
        """Background thread: wake the main loop on every enqueue and cancel message."""
        backoff = 0.1
        while self._subscriber is not None:
            pubsub = self.store.pubsub()
            try:
                pubsub.subscribe(*channels, control)
                backoff = 0.1
                heard, pinged = time.monotonic(), 0.0
                while self._subscriber is not None:
                    message = pubsub.get_message(timeout=min(1.0, self.interval))
                    current = time.monotonic()
                    if message is not None:
                        heard, pinged = current, 0.0
                        if message["type"] == "pong":
                            continue
                        if message["channel"] == control:
                            self._cancels.append(message["data"])
                        elif message["channel"] == channels[-1]:
                            self._preempt_heard = True  # this node's preemption
                        self._wake()
                    elif pinged and current - pinged > self.interval:
                        raise ConnectionError(f"no reply to PING within {self.interval:g} s")
                    elif not pinged and current - heard > self.interval:
                        # silent for an interval: prove the connection is alive (a NAT or load
                        # balancer may have dropped it without a word) and keep it from idling
                        pubsub.ping()
                        pinged = current
            except Exception as error:  # the connection dropped: resubscribe with backoff
                log.debug("subscriber: %s; resubscribing in %.1f s", error, backoff)
                time.sleep(backoff)
                backoff = min(5.0, backoff * 2)
                self._wake()  # missed messages: let the main loop look for itself
            finally:
                pubsub.close()

    def _wake(self) -> None:
        # under the lock: once _finish has closed the pipe, its number may name another file
        with self._wake_lock, contextlib.suppress(OSError):  # a full pipe: it wakes anyway
            if self._wake_w >= 0:
                os.write(self._wake_w, b"\0")

    def _wait(self, timeout: float) -> None:
        if self.stopping and self.on_stop == "keep":
            return
        # a child already being stopped waits for its kill_grace, not its passed time limit
        deadlines = [r.started + r.time_limit for r in self.children.values()
                     if r.time_limit and not r.term_sent]
        deadlines += [r.term_sent + r.kill_grace for r in self.children.values()
                      if r.term_sent and not r.kill_sent]
        if self._redis_down_since is None:  # overdue while Redis is away: the backoff rules
            deadlines += [self._next_renew, self._next_sweep, self._next_due]
        if self.preempt_deadline is not None and self._preempt_at > self.clock():
            deadlines.append(self._preempt_at)
        deadlines += [r.progress_due for r in self.children.values() if r.progress is not None]
        channels = {r.channel.fileno(): r.channel for r in self.children.values()
                    if r.channel is not None and not r.channel.closed}
        current = self.clock()
        timeout = max(0.0, min([timeout, *(d - current for d in deadlines)]))
        try:
            ready, writable, _ = select.select(
                [self._wake_r, self._sig_r, *channels],
                [fd for fd, channel in channels.items() if channel.wants_write], [], timeout)
        except InterruptedError:
            return
        for fd in writable:
            channels[fd].flush()
        for fd in ready:
            if fd in channels:
                continue  # a child's socket: run_once reads it
            try:
                while os.read(fd, 512):
                    pass
            except BlockingIOError:
                pass
