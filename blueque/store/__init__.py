"""The one package that talks to Redis: every Blueque protocol operation is a method of
RedisStore.

Each method names the keys it touches (see PROTOCOL.md for the exact command sequences).
Multi-key read-modify-write steps are Lua scripts in ``blueque/lua``, registered once, with
every key passed in through KEYS. Redis errors are translated into Blueque errors here. The
methods are grouped by role, one module each (redis-py's client is built the same way, from
its command groups): tasks (create, read, cancel, delete, configure), runs (reserve, stamp,
start, finish, progress, recover), listeners (leases, listener info, cron, preemption
requests), nodes (a node's runs and listeners) and watch (the dashboard's and metrics' reads,
task output), over the
core (connection, retry policy, scripts, the runner of blueque.protocol's operations).
"""

from __future__ import annotations

from blueque.ended import DELETE_WINDOW
from blueque.protocol import BULK_CHUNK, CHECKPOINT_KEEP, QueueCounts
from blueque.retry import NoRetry
from blueque.store.core import (
    BLOCK_SLICE,
    CHECKPOINT_MAX_BYTES,
    RedisLike,
    Reservation,
    StoreCore,
    apart,
)
from blueque.store.errors import (
    MIN_REDIS_VERSION,
    check_version,
    describe,
    load_script,
    translate,
    translate_errors,
)
from blueque.store.health import Health
from blueque.store.listeners import ListenerOperations, NodeRenewal, RenewalReply
from blueque.store.nodes import NodeOperations, NodeView
from blueque.store.runs import RunOperations
from blueque.store.subscription import (
    CLOSED_UNDER_US,
    CONFIRM_WAIT,
    MISSED,
    RESUBSCRIBE_BACKOFF,
    Confirmation,
    Message,
    Resubscribing,
    Subscription,
    lost_connection,
    published,
)
from blueque.store.taking import Take, Taken
from blueque.store.tasks import TaskOperations
from blueque.store.watch import ListenersAtWork, WatchOperations

__all__ = [
    "BLOCK_SLICE",
    "BULK_CHUNK",
    "CHECKPOINT_KEEP",
    "CHECKPOINT_MAX_BYTES",
    "CLOSED_UNDER_US",
    "CONFIRM_WAIT",
    "DELETE_WINDOW",
    "MIN_REDIS_VERSION",
    "MISSED",
    "RESUBSCRIBE_BACKOFF",
    "Confirmation",
    "Health",
    "ListenersAtWork",
    "Message",
    "NoRetry",
    "NodeRenewal",
    "NodeView",
    "QueueCounts",
    "RedisLike",
    "RedisStore",
    "RenewalReply",
    "Reservation",
    "Resubscribing",
    "StoreCore",
    "Subscription",
    "Take",
    "Taken",
    "apart",
    "check_version",
    "describe",
    "load_script",
    "lost_connection",
    "published",
    "translate",
    "translate_errors",
]


class RedisStore(TaskOperations, RunOperations, ListenerOperations, NodeOperations,
                 WatchOperations):
    """Named protocol operations over one Redis connection and one key layout."""
