"""A node's sweep, step by step on the private redis-server (issue 29): whose slots a run left
by a dead listener occupies (a listener serving its queue, the one it was counted against;
until one is up, the queue's capacity on the node), and what a sweep and a renewal cost Redis
as the fleet grows (counts of round trips and commands, never times)."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable

import pytest
import redis

import blueque
from benchmarks.wait_round_trips import commands_run, counting
from blueque.adoption import LocalListeners, Placement, place
from blueque.daemon.membership import Membership
from blueque.keys import NODE_RUNS_TTL, Keys
from blueque.node import NodeListener
from blueque.recovery import Recovery, RecoveryReport
from blueque.store import RedisStore

KEYS = Keys()
NODE = "box:cccccccccccc"


class Node:
    """Listeners of one node, written as their daemons write them; which processes live is
    the test's to say."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self.alive: set[int] = set()

    def listener(self, listener: str, pid: int, *queues: str) -> None:
        """A listener daemon's entry, its info, its lease and set membership on each queue."""
        self.store.join_node(NODE, listener, NodeListener(listener, pid, 1.0, queues).entry(),
                             NODE_RUNS_TTL)
        self.store.write_listener_info(listener, {"node": NODE, "pid": str(pid),
                                                  "pid_created": "1.0"}, 60)
        for queue in queues:
            self.store.lease(queue, listener, 60_000, "register")
            self.store.add_listener(queue, listener)
        self.alive.add(pid)

    def run(self, client: blueque.Client, queue: str, listener: str, pid: int) -> str:
        """A started task of ``listener`` whose process ``pid`` lives, and its run record."""
        task_id = client.get_queue(queue).enqueue("{}")
        client.redis.lmove(KEYS.pending(queue), KEYS.reserved(queue, listener), "RIGHT", "LEFT")
        client.redis.hset(KEYS.task(task_id), mapping={
            "status": "started", "attempts": "1", "node": listener, "pid": str(pid),
            "pid_created": "5.0"})
        owner = int(listener.rpartition("_")[2])
        self.store.record_runs(NODE, {str(pid): json.dumps({
            "task": task_id, "queue": queue, "attempt": 1, "created": 5.0,
            "listener": listener, "listener_pid": owner, "listener_created": 1.0})}, 60)
        self.alive.add(pid)
        return task_id

    def sweeper(self) -> Recovery:
        return Recovery(self.store, host="box", node=NODE,
                        alive=lambda pid, _: pid in self.alive, kill=lambda pid, signum: None)

    def counted_by(self, pid: int) -> str | None:
        raw = self.store.node_run(NODE, pid)
        return None if raw is None else json.loads(raw).get("adopted_by")


def sweep(recovery: Recovery, listener: str, *queues: str) -> RecoveryReport:
    return recovery.sweep(list(queues), exclude=[listener], adopter=listener)


def test_a_run_left_behind_occupies_the_slots_of_a_listener_of_its_queue(
        client: blueque.Client, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="blueque.recovery")
    node = Node(client.store)
    node.listener("box_10", 10, "gpu")
    node.listener("box_20", 20, "documents")
    task = node.run(client, "gpu", "box_10", 101)
    node.alive.discard(10)  # the gpu listener is redeployed; its run goes on
    documents = node.sweeper()
    report = sweep(documents, "box_20", "documents")
    # adopted (its lease carried), but on no slots: gpu's capacity on the node
    assert report.carried_runs == {task: (101, 5.0)} and report.adopted_runs == {}
    assert node.counted_by(101) is None
    assert client.redis.zscore(KEYS.leases("gpu"), "box_10") is not None
    assert client.store.listener_info("box_10")["left"]  # out of status from now on
    assert (f"task {task} of queue gpu (pid 101), left running by dead listener box_10, "
            "adopted: no listener of queue gpu runs on this node") in caplog.text
    node.listener("box_30", 30, "gpu")  # the next gpu listener: its first sweep counts it
    gpu = node.sweeper()
    assert sweep(gpu, "box_30", "gpu").adopted_runs == {task: (101, 5.0)}
    assert node.counted_by(101) == "box_30"
    assert "adopted: on the slots of listener box_30" in caplog.text
    report = sweep(documents, "box_20", "documents")
    assert report.carried_runs == {} and report.adopted_runs == {}  # box_30's now
    node.listener("box_40", 40, "gpu")  # a second gpu listener: the run stays where it was
    other_gpu = node.sweeper()
    assert sweep(other_gpu, "box_40", "gpu").adopted_runs == {}
    assert sweep(gpu, "box_30", "gpu").adopted_runs == {task: (101, 5.0)}
    node.alive.discard(30)  # the one it was counted against dies: the other takes it
    assert sweep(other_gpu, "box_40", "gpu").adopted_runs == {task: (101, 5.0)}
    assert node.counted_by(101) == "box_40"
    assert "box_30" not in client.redis.hgetall(KEYS.node_listeners(NODE))  # nothing left
    node.alive.discard(101)  # the run ends: its task is recorded, its listener let go
    report = sweep(other_gpu, "box_40", "gpu")
    assert report.adopted_runs == {} and report.retried + report.failed == 1
    assert set(client.redis.hgetall(KEYS.node_listeners(NODE))) == {"box_20", "box_40"}
    assert client.redis.smembers(KEYS.listeners("gpu")) == {"box_40"}


def test_a_scheduler_adopts_and_counts_nothing(client: blueque.Client) -> None:
    node = Node(client.store)
    node.listener("box_10", 10, "gpu")
    task = node.run(client, "gpu", "box_10", 101)
    node.alive.discard(10)
    report = node.sweeper().sweep(["gpu"])
    assert report.adopted == 1 and report.adopted_runs == {} and report.carried_runs == {
        task: (101, 5.0)}
    assert node.counted_by(101) is None


def test_a_dead_1_0_1_listener_among_many_members_is_found_a_page_at_a_time(
        client: blueque.Client, redis_client: redis.Redis) -> None:
    """1.0.1 listeners write no entry, no lease, no info: a member of the queue's set whose
    id names this host. While the set has members without a lease, each sweep reads one
    SSCAN page of it, never the whole set: the dead one is found within a few sweeps, each
    costing the same."""
    node = Node(client.store)
    node.listener("box_20", 20, "work")
    client.store.add_listener("work", "box_88")  # 1.0.1 on this host, alive
    node.alive.add(88)
    sweeper = node.sweeper()
    sweep(sweeper, "box_20", "work")  # the first sweep reads the whole set, once
    # a live one found gets its entry: its node's sweeps judge it by its pid from now on
    assert NodeListener.all_of(client.redis.hgetall(KEYS.node_listeners(NODE)))[
        "box_88"] == NodeListener("box_88", 88, None, ("work",))
    with counting(threading.current_thread()) as count:
        sweep(sweeper, "box_20", "work")
    alone = count[0]
    for i in range(300):  # live 1.0.1 listeners of other hosts
        client.store.add_listener("work", f"host{i}.example_{i}")
    client.store.add_listener("work", "box_77")  # 1.0.1 on this host, dead
    task_id = client.get_queue("work").enqueue("{}")
    client.redis.lmove(KEYS.pending("work"), KEYS.reserved("work", "box_77"), "RIGHT", "LEFT")
    client.redis.hset(KEYS.task(task_id), mapping={"status": "reserved", "node": "box_77"})
    stats = redis_client.info("commandstats")
    read, paged = (stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("smembers",
                                                                                  "sscan"))
    trips = []
    for _ in range(12):  # about 100 ids a page: 4 pages go through the set
        with counting(threading.current_thread()) as count:
            report = sweep(sweeper, "box_20", "work")
        trips.append(count[0])
        if report.listeners:
            break
    assert report.listeners == ["box_77"] and report.requeued == 1  # box_88 left alone
    assert set(trips[:-1]) <= {alone}  # the sweeps that did not find it cost the same
    stats = redis_client.info("commandstats")
    assert stats["cmdstat_smembers"]["calls"] == read  # never the whole set again
    assert stats["cmdstat_sscan"]["calls"] == paged + len(trips)  # a page a sweep
    assert "box_77" not in client.redis.smembers(KEYS.listeners("work"))


def fleet(store: RedisStore, size: int) -> None:
    """``size`` idle listener daemons registered each on a node of its own, as Membership
    registers them."""
    for i in range(size):
        Membership(store, f"node{i}_{10_000 + i}", f"node{i}:aaaaaaaaaaaa", f"node{i}",
                   {"work": 1}, 10.0).register(1)


def cost(redis_client: redis.Redis, action: Callable[[], object]) -> tuple[int, int]:
    """The round trips ``action`` sends from this thread, and the commands Redis ran for it
    (INFO commandstats, the measurement's own INFO left out)."""
    before = commands_run(redis_client)
    with counting(threading.current_thread()) as count:
        action()
    return count[0], commands_run(redis_client) - before


@pytest.mark.parametrize("queues", [["work"], ["work", "other"]])
def test_a_sweep_and_a_renewal_cost_the_same_at_10_and_100_listeners(
        client: blueque.Client, redis_client: redis.Redis, queues: list[str]) -> None:
    """What one idle listener's sweep and renewal send does not grow with the fleet: the
    node's own listeners in one read, the lapsed leases only."""
    costs = []
    for size in (10, 100):
        redis_client.flushdb()
        store = client.store
        fleet(store, size)
        me = Membership(store, "me_1", "me:bbbbbbbbbbbb", "me", dict.fromkeys(queues, 1), 10.0)
        me.register(1)
        recovery = Recovery(store, host="me", node="me:bbbbbbbbbbbb")
        for _ in range(2):  # the first sweep reads each queue's whole set, once
            recovery.sweep(queues, exclude=["me_1"], adopter="me_1")
        swept = cost(redis_client, lambda r=recovery: r.sweep(queues, exclude=["me_1"],
                                                               adopter="me_1"))
        renewed = cost(redis_client, lambda m=me: m.renew(0, {}, NODE_RUNS_TTL, []))
        costs.append((swept, renewed))
    assert costs[0] == costs[1]
    (sweep_trips, _), (renewal_trips, renewal_commands) = costs[0]
    assert renewal_trips == 1  # the renewal: one pipeline
    # INFO, TIME, the node, the keys' heal (PROTOCOL.md 5.22); per queue two
    assert sweep_trips == 4 + 2 * len(queues)
    # the info hash, the node's runs and its listeners (HSET or HLEN, EXPIRE each); per
    # queue lease.lua (EVALSHA and its TIME, ZSCORE, ZADD) and the reserved list's LRANGE
    assert renewal_commands == 6 + 5 * len(queues)


def local(**listeners: tuple[bool, tuple[str, ...]]) -> LocalListeners:
    """A node's listeners: id -> (alive, queues)."""
    return LocalListeners(
        {name: NodeListener(name, 1, 1.0, queues) for name, (_, queues) in listeners.items()},
        frozenset(name for name, (alive, _) in listeners.items() if alive))


@pytest.mark.parametrize(("holder", "adopter", "serves", "expected"), [
    (None, "g2", True, Placement("g2", claim=True)),  # nobody counts it: the sweeper claims
    ("g2", "g2", True, Placement("g2")),  # its own: kept, no write
    ("g2", "g3", True, Placement("g2")),  # another live listener of its queue counts it
    ("g2", "d1", False, Placement("g2")),
    ("dead", "g3", True, Placement("g3", claim=True)),  # counted against a dead one
    ("d1", "g3", True, Placement("g3", claim=True)),  # one that does not serve the queue
    (None, "d1", False, Placement("")),  # the queue's capacity on the node
    ("dead", "d1", False, Placement("")),
    (None, None, False, Placement("")),  # a scheduler counts nothing
    (["g2"], "g3", True, Placement("g3", claim=True)),  # an unreadable holder
])
def test_place(holder: object, adopter: str | None, serves: bool, expected: Placement) -> None:
    node = local(g2=(True, ("gpu",)), g3=(True, ("gpu",)), d1=(True, ("documents",)),
                 dead=(False, ("gpu",)))
    assert place("gpu", holder, adopter, serves, node) == expected
