"""A listener's and a scheduler's bookkeeping: listener sets, leases, info hashes, a node's
run records, the server's clock and restarts, cron ticks and preemption requests."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any, cast

import redis

from blueque.eviction import MemoryPolicy
from blueque.keys import LISTENER_COUNTS_TTL
from blueque.statuses import LeaseMode
from blueque.store.core import StoreCore
from blueque.store.errors import translate_errors

#: The fields of a running task a lease renewal reads (PROTOCOL.md 6, step 2): whether it was
#: taken back, cancelled, or recovered while it lived.
RENEWAL_FIELDS = ("status", "attempts", "node", "cancel_requested", "cancelled", "history")


@dataclass(frozen=True)
class NodeRenewal:
    """What one lease renewal writes and reads (RedisStore.renew_node)."""

    listener: str
    node: str
    queues: Sequence[str]
    lease_ms: int
    info: dict[str, str]
    info_ttl: int
    runs: dict[str, str]
    runs_ttl: int
    tasks: Sequence[str]
    #: queue -> when our last run recorded since the last renewal ended (PROTOCOL.md 6, 2)
    seen: Mapping[str, float] = dataclass_field(default_factory=dict)
    #: our entry among the node's listeners (blueque.node.NodeListener), written with its
    #: expiry (runs_ttl) when given
    entry: str | None = None


@dataclass(frozen=True)
class RenewalReply:
    """What a renewal found: each queue's lease (-1: it was lost), the read fields of each
    task (missing ones left out; {} for a missing hash), each queue's reserved ids."""

    leases: dict[str, int]
    tasks: list[dict[str, str]]
    reserved: dict[str, list[str]]

    @classmethod
    def of(cls, renewal: NodeRenewal, replies: Sequence[Any]) -> RenewalReply:
        queues = list(renewal.queues)
        leases = {q: int(r) for q, r in zip(queues, replies, strict=False)}
        tasks_from = len(queues) + 4 + (2 if renewal.entry is not None else 0)
        tasks = [{name: value for name, value in zip(RENEWAL_FIELDS, values, strict=True)
                  if value is not None}
                 for values in replies[tasks_from:tasks_from + len(renewal.tasks)]]
        lists_from = tasks_from + len(renewal.tasks)
        lists = replies[lists_from:lists_from + len(queues)]
        return cls(leases, tasks, {q: list(ids) for q, ids in zip(queues, lists, strict=True)})


class ListenerOperations(StoreCore):
    # --- listeners ------------------------------------------------------------------------
    @translate_errors
    def add_listener(self, queue: str, listener_id: str) -> None:
        """SADD blueque_listeners_[queue]; ZINCRBY blueque_queues 1 (as blueque 1.0.1)."""
        pipe = self.redis.pipeline(transaction=not self.keys.hash_tags)
        pipe.sadd(self.keys.listeners(queue), listener_id)
        pipe.zincrby(self.keys.queues(), 1, queue)
        pipe.execute()

    @translate_errors
    def remove_listener(self, queue: str, listener_id: str) -> bool:
        """SREM the listener; only the caller that removed it decrements blueque_queues."""
        removed = bool(self.redis.srem(self.keys.listeners(queue), listener_id))
        if removed:
            self.redis.zincrby(self.keys.queues(), -1, queue)
        return removed

    @translate_errors
    def lease(self, queue: str, listener_id: str, ttl_ms: int, mode: LeaseMode) -> int:
        """register | renew | release a listener's lease (server clock). -1: lease was lost."""
        return int(self._run("lease", [self.keys.leases(queue)], [listener_id, ttl_ms, mode]))

    @translate_errors
    def expired_listeners(self, queue: str) -> list[str]:
        """Listeners whose lease deadline has passed by the Redis server's clock."""
        seconds, micros = self.redis.time()
        now_ms = seconds * 1000 + micros // 1000
        return cast(list[str], self.redis.zrangebyscore(self.keys.leases(queue), "-inf", now_ms))

    @translate_errors
    def leases(self, queue: str) -> dict[str, float]:
        """Every lease of a queue: listener id -> deadline (server ms)."""
        return dict(self.redis.zrange(self.keys.leases(queue), 0, -1, withscores=True))

    @translate_errors
    def lapsed_leases(self, queue: str, server_ms: float) -> dict[str, float]:
        """The leases of a queue whose deadline is at or before ``server_ms`` (ZRANGEBYSCORE):
        listener id -> deadline (server ms). A sweep reads only these, however many
        listeners renew."""
        return dict(self.redis.zrangebyscore(self.keys.leases(queue), "-inf", server_ms,
                                             withscores=True))

    @translate_errors
    def lease_deadline(self, queue: str, listener_id: str) -> float | None:
        """ZSCORE blueque_leases_[queue] [listener id]: its lease's deadline, if it has one."""
        deadline = self.redis.zscore(self.keys.leases(queue), listener_id)
        return None if deadline is None else float(deadline)

    @translate_errors
    def scan_listeners(self, queue: str, cursor: int, count: int) -> tuple[int, list[str]]:
        """SSCAN blueque_listeners_[queue] [cursor] COUNT [count]: the next page of a queue's
        listener ids, and the cursor of the one after (0: the set was gone through)."""
        after, ids = self.redis.sscan(self.keys.listeners(queue), cursor, count=count)
        return int(after), list(ids)

    @translate_errors
    def server_run(self) -> tuple[str, float, float]:
        """(run id, start time by the server clock in Unix s, the server clock now) from INFO
        server and TIME: a Redis restart changes the first two, even one this client never
        saw as a lost connection. For a cluster, every master's run ids and the latest
        start."""
        info: dict[str, Any] = self.redis.info("server")
        nodes = [info] if "run_id" in info else [v for v in info.values() if isinstance(v, dict)]
        seconds, micros = self.redis.time()
        clock = float(seconds) + float(micros) / 1e6
        run_ids = sorted(str(node.get("run_id", "")) for node in nodes)
        uptime = min((float(node.get("uptime_in_seconds", 0)) for node in nodes), default=0.0)
        return ",".join(run_ids), clock - uptime - 1.0, clock  # whole s: the earliest start

    @translate_errors
    def memory_policy(self) -> MemoryPolicy:
        """The server's maxmemory-policy and maxmemory (blueque.eviction), from ``CONFIG GET
        maxmemory*``, else (CONFIG renamed or refused, as managed Redis services do) from
        ``INFO memory``; unknown when neither tells. For a cluster, each master's: the first
        that evicts, else the first."""
        target: dict[str, Any] = {}
        if hasattr(self.redis, "get_nodes"):  # a RedisCluster: ask every master
            target["target_nodes"] = self.redis.get_primaries()
        asked: tuple[tuple[str, str, Callable[[], Any]], ...] = (
            ("CONFIG GET", "maxmemory-policy",
             lambda: self.redis.config_get("maxmemory*", **target)),
            ("INFO memory", "maxmemory_policy", lambda: self.redis.info("memory", **target)))
        why = []
        for source, field, ask in asked:
            try:
                replies = _per_node(ask(), self.where)
            except redis.exceptions.ResponseError as refused:  # renamed, disabled, ACL
                why.append(f"{source}: {refused}")
                continue
            found = [MemoryPolicy(where, str(reply[field]), _bytes(reply.get("maxmemory")),
                                  source) for where, reply in replies if reply.get(field)]
            if found and len(found) == len(replies):
                return next((policy for policy in found if policy.evicts), found[0])
            why.append(f"{source} did not say")
        return MemoryPolicy(self.where, None, why="; ".join(why))

    @translate_errors
    def server_infos(self) -> list[tuple[str, dict[str, Any]]]:
        """INFO (its default sections: server, clients, memory, persistence, stats,
        replication...) of the server, or of each master of a cluster, as (where, fields)."""
        target: dict[str, Any] = {}
        if hasattr(self.redis, "get_nodes"):  # a RedisCluster: ask every master
            target["target_nodes"] = self.redis.get_primaries()
        return _per_node(self.redis.info(**target), self.where)

    @translate_errors
    def save_rules(self) -> dict[str, str]:
        """Each server's RDB ``save`` rules (CONFIG GET save; "" when snapshots are off);
        {} when CONFIG is renamed or refused, as managed Redis services do."""
        target: dict[str, Any] = {}
        if hasattr(self.redis, "get_nodes"):
            target["target_nodes"] = self.redis.get_primaries()
        try:
            replies = _per_node(self.redis.config_get("save", **target), self.where)
        except redis.exceptions.ResponseError:
            return {}
        return {where: str(reply["save"]) for where, reply in replies if "save" in reply}

    @translate_errors
    def server_time(self) -> float:
        seconds, micros = self.redis.time()
        return float(seconds) + float(micros) / 1e6

    @translate_errors
    def write_listener_info(self, listener_id: str, info: dict[str, str], ttl_s: int) -> None:
        """The listener's description (host, pid, create time, queues), expiring with it."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(self.keys.listener_info(listener_id), mapping=info)
        pipe.expire(self.keys.listener_info(listener_id), ttl_s)
        pipe.execute()

    @translate_errors
    def listener_info(self, listener_id: str) -> dict[str, str]:
        return cast(dict[str, str], self.redis.hgetall(self.keys.listener_info(listener_id)))

    @translate_errors
    def delete_listener_info(self, listener_id: str) -> None:
        self.redis.delete(self.keys.listener_info(listener_id))

    @translate_errors
    def renew_node(self, renewal: NodeRenewal) -> RenewalReply:
        """A listener's whole lease renewal in one round trip (PROTOCOL.md 6, step 2): its
        leases (lease.lua renew), its info hash and its node's runs, the few fields of its
        running tasks a renewal looks at (never their parameters), and its reserved lists.
        A pipeline, sent again whole after a NOSCRIPT (each command may be repeated); on a
        Redis Cluster (whose pipelines refuse scripts) command by command."""
        return RenewalReply.of(renewal, _with_leases(
            self, lambda pipe, script: self._renewal_commands(pipe, renewal, script)))

    @translate_errors
    def renew_leases(self, listener_id: str, queues: Sequence[str], lease_ms: int,
                     info_ttl: int) -> dict[str, int]:
        """The lease keeper's renewal (PROTOCOL.md 6, step 2): lease.lua renew on each queue
        and EXPIRE blueque_listener_[id], in one round trip; each queue's new deadline, -1
        for a lease that was lost (renew never registers again)."""
        info = self.keys.listener_info(listener_id)

        def commands(pipe: Any, script: Any) -> list[Any]:
            out = _lease_commands(self, pipe, script, listener_id, queues, lease_ms)
            out.append(pipe.expire(info, info_ttl))
            return out

        replies = _with_leases(self, commands)
        return {queue: int(reply) for queue, reply in zip(queues, replies, strict=False)}

    def _renewal_commands(self, pipe: Any, renewal: NodeRenewal, script: Any) -> list[Any]:
        """Queue the renewal's commands on a pipeline, or run them one by one on a cluster
        client (``pipe`` is then the client: their replies are returned)."""
        out = _lease_commands(self, pipe, script, renewal.listener, renewal.queues,
                              renewal.lease_ms)
        info, runs = self.keys.listener_info(renewal.listener), self.keys.node_runs(renewal.node)
        out.append(pipe.hset(info, mapping=renewal.info))
        out.append(pipe.expire(info, renewal.info_ttl))
        # with no run to write, HLEN keeps the replies in place
        out.append(pipe.hset(runs, mapping=renewal.runs) if renewal.runs else pipe.hlen(runs))
        out.append(pipe.expire(runs, renewal.runs_ttl))
        if renewal.entry is not None:  # we stay known to our node's sweeps
            here = self.keys.node_listeners(renewal.node)
            out.append(pipe.hset(here, renewal.listener, renewal.entry))
            out.append(pipe.expire(here, renewal.runs_ttl))
        for task_id in renewal.tasks:
            out.append(pipe.hmget(self.keys.task(task_id), list(RENEWAL_FIELDS)))
        for queue in renewal.queues:
            out.append(pipe.lrange(self.keys.reserved(queue, renewal.listener), 0, -1))
        # our record of the runs we ended since the last renewal (finish.lua leaves it to us)
        for queue, ended in renewal.seen.items():
            seen, counts = (self.keys.listeners_seen(queue),
                            self.keys.listener_counts(queue, renewal.listener))
            out.append(pipe.zadd(seen, {renewal.listener: ended}, gt=True))
            out.append(pipe.expire(seen, LISTENER_COUNTS_TTL))
            out.append(pipe.expire(counts, LISTENER_COUNTS_TTL))
        return out

    @translate_errors
    def probe_writes(self, listener_id: str) -> None:
        """SET blueque_write_probe_[listener id] 1 PX 1000: raises WritesRefused (or
        RedisUnavailable) while Redis cannot take a write (PROTOCOL.md 6.5)."""
        self.redis.set(self.keys.write_probe(listener_id), "1", px=1000)

    @translate_errors
    def reserved_ids(self, queue: str, listener_id: str) -> list[str]:
        return cast(list[str], self.redis.lrange(self.keys.reserved(queue, listener_id), 0, -1))

    # --- preemption (PROTOCOL.md 6.3) --------------------------------------------------------
    @translate_errors
    def request_preemption(self, node_name: str, fields: dict[str, str], ttl_s: int) -> None:
        """HSET blueque_preempt_[node name] (deadline, grace, requested_at, reason); EXPIRE;
        PUBLISH blueque_preempt_channel_[node name]: its listeners hear it at once, or read
        the hash at their next renewal."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(self.keys.preemption(node_name), mapping=fields)
        pipe.expire(self.keys.preemption(node_name), ttl_s)
        pipe.publish(self.keys.preemption_channel(node_name), node_name)
        pipe.execute()

    @translate_errors
    def preemption(self, node_name: str) -> dict[str, str]:
        """HGETALL blueque_preempt_[node name] ({}: no preemption announced)."""
        return cast(dict[str, str], self.redis.hgetall(self.keys.preemption(node_name)))

    @translate_errors
    def withdraw_preemption(self, node_name: str) -> bool:
        """DEL blueque_preempt_[node name]; False if there was none."""
        return bool(self.redis.delete(self.keys.preemption(node_name)))

    # --- scheduler and operator tools -----------------------------------------------------
    @translate_errors
    def cron_ticks(self) -> dict[str, str]:
        """blueque_cron: periodic task name -> last tick fired (Unix s)."""
        return cast(dict[str, str], self.redis.hgetall(self.keys.cron()))

    @translate_errors
    def advance_cron(self, name: str, expected: str | None, tick: int) -> bool:
        """Compare-and-set a periodic task's last fired tick (cron_advance.lua); False if
        another scheduler moved it first. Keys: blueque_cron."""
        return bool(self._run("cron_advance", [self.keys.cron()],
                              [name, expected or "", str(tick)]))



def _with_leases(store: StoreCore, commands: Callable[[Any, Any], list[Any]]) -> list[Any]:
    """The replies of ``commands(pipe, lease.lua)`` sent in one pipeline, sent again whole
    after a NOSCRIPT (a restart emptied the script cache: each command may be repeated); on
    a Redis Cluster, whose pipelines refuse scripts, ``commands`` runs them one by one on the
    client and returns their replies."""
    script = store._script("lease")
    if store.clustered:
        return commands(store.redis, script)
    for _ in range(2):
        pipe = store.redis.pipeline(transaction=False)
        commands(pipe, script)
        replies: list[Any] = pipe.execute(raise_on_error=False)
        if any(isinstance(r, redis.exceptions.NoScriptError) for r in replies):
            script.sha = store.redis.script_load(script.script)
            continue
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies
    raise redis.exceptions.NoScriptError("lease.lua: the server did not keep it")


def _lease_commands(store: StoreCore, pipe: Any, script: Any, listener_id: str,
                    queues: Sequence[str], lease_ms: int) -> list[Any]:
    """lease.lua renew for each queue, on a pipeline or (a cluster client) one by one."""
    cluster = pipe is store.redis
    out: list[Any] = []
    for queue in queues:
        keys, args = [store.keys.leases(queue)], [listener_id, lease_ms, "renew"]
        out.append(script(keys=keys, args=args) if cluster
                   else pipe.evalsha(script.sha, 1, *keys, *args))
    return out


def _per_node(reply: Any, where: str) -> list[tuple[str, dict[str, Any]]]:
    """A reply of one server, or a cluster's {node name: reply}, as (server, reply) pairs."""
    if isinstance(reply, dict) and reply and all(isinstance(v, dict) for v in reply.values()):
        return [(str(node), value) for node, value in reply.items()]
    return [(where, reply if isinstance(reply, dict) else {})]


def _bytes(raw: Any) -> int | None:
    try:
        return int(raw)
    except (TypeError, ValueError):
        return None
