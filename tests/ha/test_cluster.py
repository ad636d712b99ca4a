"""Redis Cluster: three masters with a replica each, started on loopback by the test.

Queues are chosen so that their hash tags land on three different masters. Tests that kill a
node get a fresh cluster; the others share one (flushed before each test)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemons import Daemon, daemons
from failover import listen_command, run_failover
from redis.cluster import RedisCluster

import blueque
from blueque.keys import Keys
from blueque.testing import ClusterTopology, wait_for

pytestmark = [pytest.mark.ha, pytest.mark.slow]


def queues_on_distinct_masters(cluster: ClusterTopology, count: int = 3) -> list[str]:
    """Queue names whose keys live on ``count`` different masters."""
    keys = Keys(hash_tags=True)
    chosen: dict[int, str] = {}
    for n in range(200):
        name = f"shard{n}"
        chosen.setdefault(cluster.master_for_key(keys.pending(name)).port, name)
        if len(chosen) == count:
            return list(chosen.values())
    raise AssertionError("could not spread queues over the masters")


@pytest.fixture(scope="module")
def shared_cluster() -> Iterator[ClusterTopology]:
    with ClusterTopology() as cluster:
        yield cluster


@pytest.fixture
def cluster(shared_cluster: ClusterTopology) -> ClusterTopology:
    client = blueque.Client(shared_cluster.url)
    client.redis.flushall(target_nodes=RedisCluster.PRIMARIES)
    client.close()
    return shared_cluster


@pytest.fixture
def fresh_cluster() -> Iterator[ClusterTopology]:
    with ClusterTopology() as cluster:
        yield cluster


def test_cluster_url_selects_the_hash_tagged_layout(cluster: ClusterTopology) -> None:
    client = blueque.Client(cluster.url)
    assert isinstance(client.redis, RedisCluster)
    assert client.keys.hash_tags
    task_id = client.get_queue("reports").enqueue("{}")
    assert task_id.startswith("{reports}")
    # the task hash and the queue's pending list share a slot: scripts stay atomic
    assert client.redis.keyslot(client.keys.task(task_id)) == client.redis.keyslot(
        client.keys.pending("reports"))
    client.close()


def test_the_readmes_cluster_line_runs(cluster: ClusterTopology) -> None:
    """The high availability page's "Redis Cluster": its Client line with this cluster's
    first three nodes for node1:7000, node2:7001, node3:7002 (a client needs one that
    answers)."""
    from tests.readme import block

    nodes = cluster.url.split("://", 1)[1].split(",")[:3]
    code = block("Redis Cluster", 1, "how-to/high-availability.md").text.replace(
        "node1:7000,node2:7001,node3:7002", ",".join(nodes))
    namespace: dict[str, object] = {"blueque": blueque}
    exec(code, namespace)  # the page's own line
    client = namespace["client"]
    assert isinstance(client, blueque.Client) and client.keys.hash_tags
    task_id = client.get_queue("documents").enqueue("{}")
    assert task_id.startswith("{documents}") and client.get_task(task_id).status == "pending"
    client.close()


def test_forget_queue_and_idempotent_enqueue_in_the_cluster_layout(cluster: ClusterTopology
                                                                    ) -> None:
    """forget_queue.lua runs in the queue's slot and blueque_queues is updated outside it; a
    re-enqueued id says it existed; the version check reads INFO from a cluster node."""
    client = blueque.Client(cluster.url)
    try:
        client.ping()
        queue = client.get_queue("old")
        first = queue.enqueue("x", task_id="job-1")
        assert first.created and not queue.enqueue("x", task_id="job-1").created
        with pytest.raises(blueque.InvalidTaskState, match="not empty"):
            client.store.forget_queue("old")
        task = client.get_listener("old").reserve()
        assert task is not None
        processor = client.get_processor(task)
        processor.start(os.getpid())
        processor.complete("done")
        client.get_listener("old").close()
        client.get_queue("old").delete_task(client.get_task(first))
        client.get_queue("empty").configure(max_attempts=2)
        assert set(client.queue_names()) >= {"old", "empty"}
        assert client.store.forget_queue("empty") and client.store.forget_queue("old")
        assert not {"old", "empty"} & set(client.queue_names())
        assert not client.store.forget_queue("empty")
    finally:
        client.close()


def test_checkpoints_live_in_their_tasks_slot(cluster: ClusterTopology) -> None:
    """checkpoint.lua, finish.lua (result TTL) and delete.lua touch the checkpoint key in one
    slot with the task hash: on a cluster they run, and do what they do on one server."""
    client = blueque.Client(cluster.url)
    try:
        for name in queues_on_distinct_masters(cluster):
            queue = client.get_queue(name)
            task_id = queue.enqueue("{}")
            key = client.keys.checkpoint(task_id)
            assert client.redis.keyslot(key) == client.redis.keyslot(client.keys.task(task_id))
            task = client.get_listener(name).reserve()
            assert task is not None and task.id == task_id
            processor = client.get_processor(task)
            processor.start(os.getpid())
            task.save_checkpoint(json.dumps({"queue": name}))
            assert client.get_task(task_id).checkpoint == json.dumps({"queue": name})
            processor.complete("done", result_ttl_ms=60_000)
            assert 0 < client.redis.pttl(key) <= 60_000
            queue.delete_task(client.get_task(task_id))
            assert client.redis.exists(key) == 0
    finally:
        client.close()


def test_full_lifecycle_on_three_shards(cluster: ClusterTopology) -> None:
    client = blueque.Client(cluster.url)
    names = queues_on_distinct_masters(cluster)
    for name in names:
        queue = client.get_queue(name)
        task_id = queue.enqueue(json.dumps({"queue": name}))
        listener = client.get_listener(name)
        task = listener.listen(timeout=5)
        assert task is not None and task.id == task_id and task.status == "reserved"
        processor = client.get_processor(task)
        assert processor.start(os.getpid()) == json.dumps({"queue": name})
        assert client.get_task(task_id).status == "started"
        waited: list[object] = []
        waiter = threading.Thread(target=lambda w=waited, i=task_id: w.append(
            client.get_task(i).wait(timeout=20)))
        waiter.start()  # Task.wait subscribes to the queue's done channel on some node
        processor.complete({"ok": name})
        waiter.join(30)
        assert [getattr(t, "status", None) for t in waited] == ["complete"]
        done = client.get_task(task_id)
        assert (done.status, done.result) == ("complete", json.dumps({"ok": name}))
        stats = queue.stats()
        assert (stats.pending, stats.started, stats.complete, stats.listeners) == (0, 0, 1, 1)
        listener.close()
    assert sorted(client.queue_names()) == sorted(names)
    client.close()


def test_dashboard_and_metrics_read_queues_on_three_shards(cluster: ClusterTopology) -> None:
    """The dashboard's and the collector's pipelines of many queues span the shards."""
    from blueque.metrics import queue_registry, scrape
    from blueque.web import views

    client = blueque.Client(cluster.url)
    names = queues_on_distinct_masters(cluster)
    for n, name in enumerate(names):
        queue = client.get_queue(name)
        queue.enqueue_many(["{}"] * (n + 2))
        task = client.get_listener(name).reserve()
        assert task is not None
        processor = client.get_processor(task)
        processor.start(4242)
        processor.complete("done")
    rows = {row["name"]: row for row in views.queues_page(client.store, time.time())["queues"]}
    for n, name in enumerate(names):
        counts = client.store.counts(name)
        assert rows[name]["counts"]["pending"] == counts.pending == n + 1
        assert rows[name]["counts"]["complete"] == 1 and rows[name]["last_hour"]["complete"] == 1
        assert rows[name]["oldest_pending_age"] >= 0
    nodes = views.nodes_page(client.store, time.time())
    assert {lease["queue"] for entry in nodes["listeners"] for lease in entry["leases"]} <= set(
        names)
    text = scrape(queue_registry(client.store)).decode()
    assert "blueque_redis_up 1.0" in text
    for n, name in enumerate(names):
        assert f'blueque_tasks{{queue="{name}",state="pending"}} {n + 1}.0' in text
        assert f'blueque_tasks_finished_total{{outcome="complete",queue="{name}"}} 1.0' in text
    client.close()


def test_scheduled_tasks_on_three_shards(cluster: ClusterTopology) -> None:
    client = blueque.Client(cluster.url)
    names = queues_on_distinct_masters(cluster)
    eta = time.time() + 0.3
    scheduled = {name: [client.get_queue(name).schedule(str(n), eta) for n in range(5)]
                 for name in names}
    for name in names:
        assert client.get_queue(name).stats().scheduled == 5
        assert client.get_queue(name).enqueue_due_tasks() == []
    wait_for(lambda: time.time() > eta + 0.01, timeout=5)
    for name in names:
        moved = client.get_queue(name).enqueue_due_tasks()
        assert sorted(moved) == sorted(scheduled[name])
        assert all(client.get_task(i).status == "pending" for i in moved)
        assert client.get_queue(name).stats().pending == 5
    client.close()


def test_daemons_recover_a_killed_listener_on_a_cluster(
    cluster: ClusterTopology, tmp_path: Path
) -> None:
    client = blueque.Client(cluster.url)
    queue = client.get_queue("recovery")
    marker = tmp_path / "marker"
    # a second attempt is allowed, so a run cut short by a dead listener is retried
    task_id = queue.enqueue(json.dumps({"marker": str(marker), "seconds": 30}),
                            max_attempts=2, retry_backoff=0.1)
    with daemons(tmp_path) as started:
        first = Daemon(listen_command(cluster.url, "recovery", 1, 1.0, "tests.jobs:sleep"),
                       tmp_path / "first.log")
        started.append(first)
        wait_for(lambda: client.get_task(task_id).status == "started", timeout=30)
        child = client.get_task(task_id).pid
        first.kill()  # the listener dies, and so does the task process it ran
        os.kill(child, 9)
        started.append(Daemon(
            listen_command(cluster.url, "recovery", 1, 1.0, "tests.jobs:echo"),
            tmp_path / "second.log"))
        wait_for(lambda: client.get_task(task_id).status == "complete", timeout=60)
    task = client.get_task(task_id)
    assert task.attempts == 2
    assert task.node != f"{first.pid}" and not task.node.endswith(f"_{first.pid}")
    client.close()


def test_master_killed_and_replica_promoted_mid_run(
    fresh_cluster: ClusterTopology, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    names = queues_on_distinct_masters(fresh_cluster)
    victim_key = Keys(hash_tags=True).pending(names[0])
    victim = fresh_cluster.master_for_key(victim_key)

    def bring_back() -> None:
        fresh_cluster.wait_for_failover(victim_key, victim.port)
        # the dead node comes back as a replica, so its shard can acknowledge WAIT 1 again
        fresh_cluster.restart(victim)

    restarter = threading.Thread(target=bring_back, name="restarter")

    def kill_master() -> None:
        fresh_cluster.kill_master_of(victim_key)
        restarter.start()

    try:
        outcome = run_failover(
            tmp_path, fresh_cluster.url + "?wait_replicas=1&wait_timeout=500", kill_master,
            queues=tuple(names), listeners=1, tasks=300, kill_at=90, probe_queue=names[0],
        )
    finally:
        if restarter.is_alive():
            restarter.join(60)
    assert fresh_cluster.master_for_key(victim_key).port != victim.port
    with capsys.disabled():
        print(f"\ncluster failover figures: {json.dumps(outcome.figures())}")
    assert len(outcome.acknowledged) == 300
    assert outcome.statuses == {"complete": 300}, outcome.statuses
    assert outcome.ran_twice == []
    assert outcome.daemons_alive
    assert outcome.daemon_exit_codes == [0, 0, 0]
