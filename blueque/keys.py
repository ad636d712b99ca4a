"""Every Redis key and channel name Blueque uses, and nothing else.

This module is the twin of the key table in PROTOCOL.md (``tests/test_protocol_doc.py``
checks that the two agree). No other module formats a key.

The default layout is exactly blueque 1.0.1's, so both implementations share one Redis.
The opt-in hash-tagged layout (``Keys(hash_tags=True)``, what a Redis Cluster needs) wraps the
queue name in a hash tag (``{queue}``) so that every key one queue's operations touch together
lives in one hash slot; task ids then carry the same tag.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TypeGuard

from blueque.statuses import CANCELLED, COMPLETE, FAILED

PREFIX = "blueque"

#: Seconds a per-minute outcome hash is kept: the dashboard shows the last hour.
FINISHED_MINUTE_TTL = 7200
#: Seconds a per-hour outcome hash is kept: the dashboard shows the last 7 days (8: margin).
FINISHED_HOUR_TTL = 691200
#: Seconds a listener's run counters (and its place in listeners_seen) outlive its last run.
LISTENER_COUNTS_TTL = 604800
#: Seconds a node's records (blueque_node_[node], blueque_listeners_on_[node]) outlive their
#: last write: a run orphaned on a node where no listener or scheduler runs for longer is no
#: longer found (PROTOCOL.md, "Node identity").
NODE_RUNS_TTL = 7 * 24 * 3600


#: What a queue name that `blueque listen` can serve may not contain (PROTOCOL.md §2): `:`
#: separates a weight and `,` queues on its command line, whitespace and control characters
#: cannot be typed or shown back reliably. Checked at enqueue, configure and listen.
QUEUE_NAME_RULE = (
    "a queue name may not be blank nor contain ':', ',', whitespace or control characters"
)


def names_a_queue(name: object) -> TypeGuard[str]:
    """A non-empty string: enough to read or act on a queue that exists, whatever its name
    (1.0.1 made queues before QUEUE_NAME_RULE); a new queue must follow the rule too."""
    return isinstance(name, str) and name != ""


def queue_name_problem(name: object) -> str | None:
    """Why ``name`` breaks QUEUE_NAME_RULE, or None if it is a good queue name."""
    if not names_a_queue(name):
        return f"a queue name must be a non-empty string, not {name!r}"
    bad = sorted({c for c in name if c in ":," or c.isspace() or not c.isprintable()})
    if bad:
        return f"queue name {name!r} contains {', '.join(map(repr, bad))}: {QUEUE_NAME_RULE}"
    return None


def _key(*parts: str) -> str:
    return "_".join((PREFIX, *parts))


@dataclass(frozen=True)
class Keys:
    """Builds key names. ``hash_tags=True`` selects the hash-tagged layout that a Redis
    Cluster needs (PROTOCOL.md 8); it does not connect anywhere."""

    hash_tags: bool = False

    def _q(self, queue: str) -> str:
        if not self.hash_tags:
            return queue
        if "{" in queue or "}" in queue:
            raise ValueError(
                f"queue name {queue!r} may not contain braces in the hash-tagged layout")
        return "{" + queue + "}"

    # --- the keys of blueque 1.0.1 -------------------------------------------------------
    def queues(self) -> str:
        """Sorted set: queue name -> number of listeners."""
        return _key("queues")

    def pending(self, queue: str) -> str:
        """List of pending task ids; LPUSH in, taken from the right."""
        return _key("pending_tasks", self._q(queue))

    def reserved(self, queue: str, listener_id: str) -> str:
        """List of the task ids a listener has reserved and not yet finished."""
        return _key("reserved_tasks", self._q(queue), listener_id)

    def task(self, task_id: str) -> str:
        """Hash of one task's fields."""
        return _key("task", task_id)

    def started(self, queue: str) -> str:
        """Set of "[listener id] [pid] [task id]" for every running task."""
        return _key("started_tasks", self._q(queue))

    def complete(self, queue: str) -> str:
        """List of complete task ids, newest at the left."""
        return _key("complete_tasks", self._q(queue))

    def failed(self, queue: str) -> str:
        """List of failed task ids, newest at the left."""
        return _key("failed_tasks", self._q(queue))

    def cancelled(self, queue: str) -> str:
        """List of cancelled task ids (status failed, stamped cancelled), newest at the left:
        kept apart from the failed list so that cancelled tasks are counted on their own and
        never re-run by a bulk retry."""
        return _key("cancelled_tasks", self._q(queue))

    def scheduled(self, queue: str) -> str:
        """Sorted set: task id -> eta (Unix time, seconds)."""
        return _key("scheduled_tasks", self._q(queue))

    def listeners(self, queue: str) -> str:
        """Set of the listener ids listening on a queue."""
        return _key("listeners", self._q(queue))

    def waiting(self, queue: str) -> str:
        """Sorted set: id of a task waiting for its parents -> when a sweep next checks
        their statuses (Unix s)."""
        return _key("waiting_tasks", self._q(queue))

    def awaits(self, task_id: str) -> str:
        """Set of the parent ids a waiting task has not yet been told the ending of."""
        return _key("awaits", task_id)

    def dependents(self, task_id: str) -> str:
        """Set of the ids of tasks enqueued after this one, not yet told of its ending."""
        return _key("dependents", task_id)

    # --- keys Blueque adds ---------------------------------------------------------------
    def leases(self, queue: str) -> str:
        """Sorted set: listener id -> lease deadline (Redis server time, milliseconds)."""
        return _key("leases", self._q(queue))

    def listener_info(self, listener_id: str) -> str:
        """Hash describing one listener process (host, pid, create time, queues...)."""
        return _key("listener", listener_id)

    def write_probe(self, listener_id: str) -> str:
        """String a listener writes (1 s TTL) to learn whether Redis takes writes again after
        an outage, refused writes included (PROTOCOL.md 6.5)."""
        return _key("write_probe", listener_id)

    def node_runs(self, node: str) -> str:
        """Hash: pid -> the task run a listener of node identity ``node`` forked (JSON)."""
        return _key("node", node)

    def node_listeners(self, node: str) -> str:
        """Hash: listener id -> its pid, create time and queues (JSON), for every listener
        daemon of node identity ``node``: how a sweep finds its node's listeners without
        reading every listener's info (PROTOCOL.md 6, "Recovery sweep")."""
        return _key("listeners_on", node)

    def queue_config(self, queue: str) -> str:
        """Hash of a queue's defaults (max_attempts, backoff, time_limit, result_ttl)."""
        return _key("queue_config", self._q(queue))

    def paused(self, queue: str) -> str:
        """Hash {reason, paused_at}: the queue is paused, no listener starts its tasks
        (PROTOCOL.md 5.16c); absent when it runs."""
        return _key("paused", self._q(queue))

    def cron(self) -> str:
        """Hash: periodic task name -> last tick fired (Unix time, seconds)."""
        return _key("cron")

    def finished_per_minute(self, queue: str, minute: str) -> str:
        """Hash: outcome -> tasks of the queue that ended so in one minute (its start, Unix
        seconds); expires after FINISHED_MINUTE_TTL seconds."""
        return _key("finished_per_minute", self._q(queue), minute)

    def finished_per_hour(self, queue: str, hour: str) -> str:
        """Hash: outcome -> tasks of the queue that ended so in one hour (its start, Unix
        seconds); expires after FINISHED_HOUR_TTL seconds."""
        return _key("finished_per_hour", self._q(queue), hour)

    def listener_counts(self, queue: str, listener_id: str) -> str:
        """Hash: outcome -> runs of the queue's tasks a listener ended so; expires
        LISTENER_COUNTS_TTL after its last write (when is in listeners_seen)."""
        return _key("listener_counts", self._q(queue), listener_id)

    def listeners_seen(self, queue: str) -> str:
        """Sorted set: listener id -> when a run of it last ended, for LISTENER_COUNTS_TTL."""
        return _key("listeners_seen", self._q(queue))

    def task_log(self, task_id: str) -> str:
        """Stream of a running attempt's output: entries {attempt, data, offset}, its last
        TAIL_BYTES; they move to task_output when the attempt ends (streams written before
        issue 29 also hold ended attempts, closed by an entry with ``end``); expires ``keep``
        after its last write."""
        return _key("task_log", task_id)

    def task_output(self, task_id: str) -> str:
        """String: the output tails of a task's ended attempts, a JSON object attempt ->
        [offset, text] (the last TAIL_BYTES of each); expires ``keep`` after the last attempt
        ended, or with the task's result TTL."""
        return _key("output", task_id)

    def outcome_counts(self, queue: str) -> str:
        """Hash: outcome -> tasks of the queue that ended so, ever (a Prometheus counter)."""
        return _key("outcome_counts", self._q(queue))

    def checkpoint(self, task_id: str) -> str:
        """Hash of a task's last checkpoint {state, saved_at, attempt, size}: a key of its own
        so that the HGETALLs of task hashes (recovery, dashboard, refresh) never carry it; in
        the hash-tagged layout the task id's hash tag puts it in the task's slot."""
        return _key("checkpoint", task_id)

    def preemption(self, node_name: str) -> str:
        """Hash {deadline, grace, requested_at, reason}: the node named ``node_name`` goes
        away at ``deadline`` (Unix s); its listeners stop taking work and tell their tasks."""
        return _key("preempt", node_name)

    def limits(self) -> str:
        """Hash: concurrency key -> how many runs of its tasks may run at once across the
        fleet (``Client.set_limit``, PROTOCOL.md 5.22)."""
        return _key("limits")

    def concurrency_keys(self) -> str:
        """Set of the concurrency keys some run holds a slot of or some task waits for: what
        ``blueque limit``, the dashboard and the metrics list (5.22)."""
        return _key("concurrency_keys")

    def key_holders(self, concurrency_key: str) -> str:
        """Hash: task id -> the run holding one of the key's slots (JSON: listener, queue,
        attempt): taken with the task, released when the run's ending is recorded (5.22)."""
        return _key("key_holders", concurrency_key)

    def key_waiting(self, concurrency_key: str) -> str:
        """List of the ids of pending tasks that found their key full, oldest at the right:
        moved back to their queue when a slot of the key frees (5.22)."""
        return _key("key_waiting", concurrency_key)

    def keyed_names(self) -> list[str]:
        """What lua/lib/keyed.lua builds the keys of a concurrency key and of a task's queue
        from (a key and a queue are only known once the task is read): the limits hash, the
        keys set, then the prefixes of the holders hash, waiting list, task hash, pending list,
        reserved list and channel. Keys and resources are refused in the hash-tagged layout
        (a key's slots are shared by every queue: no one hash slot holds them)."""
        return [self.limits(), self.concurrency_keys(), self.key_holders(""),
                self.key_waiting(""), self.task(""), self.pending(""),
                _key("reserved_tasks", ""), self.channel("")]

    # --- pub/sub channels (not keys; listed in PROTOCOL.md all the same) -----------------
    def channel(self, queue: str) -> str:
        """Channel published on every enqueue, so idle multi-queue listeners wake at once."""
        return _key("channel", self._q(queue))

    def done_channel(self, queue: str) -> str:
        """Channel published with the task id whenever a task of the queue finishes."""
        return _key("done", self._q(queue))

    def control(self, listener_id: str) -> str:
        """Channel on which a listener is told to cancel one of its running tasks."""
        return _key("control", listener_id)

    def preemption_channel(self, node_name: str) -> str:
        """Channel on which the listeners of node ``node_name`` hear of its preemption."""
        return _key("preempt_channel", node_name)

    def finished(self, queue: str, state: str) -> str:
        """The complete, failed or cancelled list (ENDED_LISTS), by state."""
        if state == COMPLETE:
            return self.complete(queue)
        if state == FAILED:
            return self.failed(queue)
        if state == CANCELLED:
            return self.cancelled(queue)
        raise ValueError(f"{state!r} is not a finished state")

    # --- task ids -------------------------------------------------------------------------
    def new_task_id(self, queue: str) -> str:
        """A fresh task id; in the hash-tagged layout it carries the queue's hash tag."""
        return self.task_id_for(queue, str(uuid.uuid4()))

    def task_id_for(self, queue: str, task_id: str) -> str:
        """The stored id for a caller-supplied id (unchanged in the default layout)."""
        if not self.hash_tags:
            return task_id
        tag = self._q(queue)
        return task_id if task_id.startswith(tag) else tag + task_id


#: Methods that build keys or channels, in the order PROTOCOL.md lists them.
KEY_BUILDERS = (
    "queues",
    "pending",
    "reserved",
    "task",
    "started",
    "complete",
    "failed",
    "cancelled",
    "scheduled",
    "listeners",
    "waiting",
    "awaits",
    "dependents",
    "leases",
    "listener_info",
    "write_probe",
    "node_runs",
    "node_listeners",
    "queue_config",
    "paused",
    "limits",
    "concurrency_keys",
    "key_holders",
    "key_waiting",
    "cron",
    "finished_per_minute",
    "finished_per_hour",
    "listener_counts",
    "listeners_seen",
    "task_log",
    "task_output",
    "outcome_counts",
    "checkpoint",
    "preemption",
    "channel",
    "done_channel",
    "control",
    "preemption_channel",
)
