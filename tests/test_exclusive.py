"""Exclusive runs (PROTOCOL.md 6.6; issue 19 item 5): a listener cut off from Redis (its link
through blueque.testing.DelayingProxy cut) stops its exclusive run before its lease can lapse,
and the task's retry on another node starts only after: the two runs never overlap. The runs
hold a flock on one file, which the kernel drops only when the holder dies."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import redis

import blueque
from blueque.keys import Keys
from blueque.policy import encode_options
from blueque.testing import DelayingProxy, RedisServer
from tests.daemons import Daemon, daemons, lines, listen_command, wait_until

pytestmark = pytest.mark.slow

KEYS = Keys()


@pytest.fixture
def cuttable(redis_server: RedisServer, redis_client: redis.Redis
             ) -> Iterator[tuple[str, str, DelayingProxy]]:
    """The test's database directly, and through a proxy whose link can be cut."""
    db = int(redis_client.connection_pool.connection_kwargs.get("db", 0))
    with DelayingProxy(redis_server.port) as proxy:
        yield f"redis://127.0.0.1:{redis_server.port}/{db}", proxy.url(db), proxy


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("how", ["task option", "listen --exclusive"])
def test_a_cut_off_exclusive_run_stops_before_its_lease_lapses_and_never_overlaps(  # type: ignore[no-untyped-def]
        cuttable, redis_client, tmp_path: Path, how: str):
    direct, through_proxy, proxy = cuttable
    marker, release, lock = tmp_path / "marker", tmp_path / "release", tmp_path / "lock"
    client = blueque.Client(direct)
    flag = ("--exclusive",) if how == "listen --exclusive" else ()
    with daemons(tmp_path) as started:
        far = Daemon(listen_command(through_proxy, "work", "tests.jobs:holds_a_lock",
                                    "--interval", "1", "--poll", "0.1", "--identity",
                                    "far.example_1", "--no-task-logs", *flag),
                     tmp_path / "far.log")
        started.append(far)
        wait_until(lambda: redis_client.scard(KEYS.listeners("work")) == 1, what="listener")
        options = {} if flag else {"exclusive": True}
        task_id = client.get_queue("work").enqueue(json.dumps(
            {"marker": str(marker), "release": str(release), "lock": str(lock)}),
            max_attempts=3, retry_backoff=0.01, **options)
        wait_until(lambda: lines(marker), what="running on the listener to be cut off")
        first = client.get_task(task_id).pid
        assert first is not None
        near = Daemon(listen_command(direct, "work", "tests.jobs:holds_a_lock", "--interval",
                                     "0.5", "--poll", "0.1", "--identity", "near.example_2",
                                     "--no-task-logs", *flag), tmp_path / "near.log")
        started.append(near)
        wait_until(lambda: redis_client.scard(KEYS.listeners("work")) == 2, what="two")
        proxy.cut()
        wait_until(lambda: gone(first), timeout=10, what="the cut-off run stopped")
        # stopped before its lease lapsed: the lease (2 s) is still live on Redis' clock
        deadline = redis_client.zscore(KEYS.leases("work"), "far.example_1")
        seconds, micros = redis_client.time()
        assert deadline is not None and deadline > seconds * 1000 + micros / 1000
        wait_until(lambda: any(line.startswith("start 2") for line in lines(marker)),
                   timeout=20, what="the retry running on the other node")
        assert not any(line.startswith("overlap") for line in lines(marker)), lines(marker)
        assert "preemption notice" in far.log()
        proxy.restore()
        release.touch()
        task = client.get_task(task_id).wait(30)
        assert task.status == "complete" and task.attempts == 2
        assert task.node == "near.example_2"
        assert far.alive() and near.alive()


def test_exclusive_is_a_task_and_queue_option() -> None:
    assert encode_options({"exclusive": True}) == {"exclusive": "1"}
    assert encode_options({"exclusive": 0}) == {"exclusive": "0"}
    with pytest.raises(blueque.errors.ConfigurationError, match="exclusive=2 must be 0 or 1"):
        encode_options({"exclusive": 2})


def test_a_cut_off_node_records_the_late_ending_of_its_only_attempt(  # type: ignore[no-untyped-def]
        cuttable, redis_client, tmp_path: Path):
    """Default mode, max_attempts=1: the node is cut off past its lease, another node's sweep
    records the task failed, the run completes during the cut; when the link is back its
    ending is recorded (PROTOCOL.md 5.6, a late ending): complete, not failed."""
    direct, through_proxy, proxy = cuttable
    marker, release, lock = tmp_path / "marker", tmp_path / "release", tmp_path / "lock"
    client = blueque.Client(direct)
    with daemons(tmp_path) as started:
        far = Daemon(listen_command(through_proxy, "work", "tests.jobs:holds_a_lock",
                                    "--interval", "0.5", "--poll", "0.1", "--identity",
                                    "far.example_1", "--no-task-logs"), tmp_path / "far.log")
        started.append(far)
        wait_until(lambda: redis_client.scard(KEYS.listeners("work")) == 1, what="listener")
        task_id = client.get_queue("work").enqueue(json.dumps(
            {"marker": str(marker), "release": str(release), "lock": str(lock)}),
            max_attempts=1)
        wait_until(lambda: lines(marker), what="running on the listener to be cut off")
        near = Daemon(listen_command(direct, "work", "tests.jobs:holds_a_lock", "--interval",
                                     "0.5", "--poll", "0.1", "--identity", "near.example_2",
                                     "--no-task-logs"), tmp_path / "near.log")
        started.append(near)
        wait_until(lambda: redis_client.scard(KEYS.listeners("work")) == 2, what="two")
        proxy.cut()
        wait_until(lambda: client.get_task(task_id).status == "failed", timeout=15,
                   what="the cut-off node's task recorded failed by the other node")
        release.touch()  # its only run completes while the node is cut off
        wait_until(lambda: lines(marker)[-1].startswith("end"), what="the run completed")
        proxy.restore()
        wait_until(lambda: client.get_task(task_id).status == "complete", timeout=20,
                   what="the late ending recorded")
        task = client.get_task(task_id)
        assert task.attempts == 1 and task.result == "done"
        assert [entry["outcome"] for entry in task.history] == ["failed", "complete"]
        assert [line.split()[0] for line in lines(marker)] == ["start", "end"]  # ran once
        assert far.alive() and near.alive()


def test_an_exclusive_listener_declared_dead_runs_its_next_task_once_it_registers_again(  # type: ignore[no-untyped-def]
        cuttable, redis_client, tmp_path: Path):
    """Seen in an operator trial (a node cut off by iptables, --exclusive): past the cut, the
    renewal found its lease taken (declared dead), registered again, and took tasks; but its
    guard still counted the silence from the last renewal before the cut, and SIGKILLed each
    new run at once (ended "preempted", taken again, killed again: 10 runs in half a second).
    A lease registered again runs from that renewal: the guard counts from it."""
    direct, through_proxy, proxy = cuttable
    marker, release = tmp_path / "marker", tmp_path / "release"
    client = blueque.Client(direct)
    with daemons(tmp_path) as started:
        far = Daemon(listen_command(through_proxy, "work", "tests.jobs:hold", "--interval",
                                    "0.5", "--poll", "0.1", "--identity", "far.example_1",
                                    "--no-task-logs", "--exclusive"), tmp_path / "far.log")
        started.append(far)
        wait_until(lambda: redis_client.zscore(KEYS.leases("work"), "far.example_1"),
                   what="its lease")
        proxy.cut()
        wait_until(lambda: "unreachable" in far.log(), what="the listener cut off")
        redis_client.zrem(KEYS.leases("work"), "far.example_1")  # a sweep took it for dead
        task_id = client.get_queue("work").enqueue(json.dumps(
            {"marker": str(marker), "release": str(release)}), max_attempts=3)
        info = KEYS.listener_info("far.example_1")
        # its info hash lives 3 intervals past its last renewal: gone, the listener has been
        # silent longer than its lease
        wait_until(lambda: not redis_client.exists(info), what="a silence longer than a lease")
        proxy.restore()
        wait_until(lambda: lines(marker), what="the task running after the listener is back")
        renewed = redis_client.hget(info, "renewed")
        wait_until(lambda: redis_client.hget(info, "renewed") not in (None, renewed),
                   what="a renewal after the run started")
        release.touch()
        task = client.get_task(task_id).wait(20)
        assert (task.status, task.attempts) == ("complete", 1), task.data
        assert [line.split()[0] for line in lines(marker)] == ["start", "end"]  # ran once
        assert "lost its lease on work" in far.log()


def test_a_node_cut_off_past_its_lease_reclaims_the_runs_no_other_node_started(  # type: ignore[no-untyped-def]
        cuttable, redis_client, tmp_path: Path):
    """Issue 30 item 1. Default mode, every other slot busy: a node is cut off longer than its
    lease, a sweep puts its two running tasks back for their retries (one due at once, so
    pending; one scheduled an hour ahead), and no slot is free to start them. Before: at the
    heal the node stopped both runs as superseded and ran them again from zero. Now it takes
    both tasks back (reclaim.lua) and the runs go on: each task runs once, attempt 1."""
    direct, through_proxy, proxy = cuttable
    client = blueque.Client(direct)
    queue = client.get_queue("work")
    markers = {name: tmp_path / name for name in ("blocker", "due", "later")}
    release, blocker_release = tmp_path / "release", tmp_path / "blocker-release"
    with daemons(tmp_path) as started:
        near = Daemon(listen_command(direct, "work", "tests.jobs:waits_for_release",
                                     "--interval", "0.5", "--poll", "0.1", "--identity",
                                     "near.example_2", "--no-task-logs"), tmp_path / "near.log")
        started.append(near)
        blocker = queue.enqueue(json.dumps({"marker": str(markers["blocker"]),
                                            "release": str(blocker_release)}))
        wait_until(lambda: lines(markers["blocker"]), what="the other node's only slot busy")
        far = Daemon(listen_command(through_proxy, "work", "tests.jobs:waits_for_release",
                                    "--interval", "0.5", "--poll", "0.1", "--concurrency", "2",
                                    "--identity", "far.example_1", "--no-task-logs"),
                     tmp_path / "far.log")
        started.append(far)
        wait_until(lambda: redis_client.scard(KEYS.listeners("work")) == 2, what="two")
        ids = {name: queue.enqueue(json.dumps({"marker": str(markers[name]),
                                               "release": str(release)}),
                                   max_attempts=3, retry_backoff=backoff)
               for name, backoff in (("due", 0.01), ("later", 3600))}
        wait_until(lambda: lines(markers["due"]) and lines(markers["later"]),
                   what="both running on the node to be cut off")
        pids = {name: client.get_task(task_id).pid for name, task_id in ids.items()}
        proxy.cut()
        wait_until(lambda: [client.get_task(ids[name]).status for name in ("due", "later")]
                   == ["pending", "scheduled"], timeout=15,
                   what="both put back for their retries by the other node's sweep")
        proxy.restore()
        wait_until(lambda: all(client.get_task(task_id).status == "started"
                               for task_id in ids.values()), timeout=15,
                   what="both taken back by the node that runs them")
        for name, task_id in ids.items():
            task = client.get_task(task_id)
            assert (task.node, task.attempts, task.pid) == ("far.example_1", 1, pids[name])
            assert task.history[-1]["outcome"] == "retry" and task.history[-1]["reclaimed"]
        assert redis_client.llen(KEYS.pending("work")) == 0
        assert redis_client.zcard(KEYS.scheduled("work")) == 0
        assert far.log().count("taken back, its run") == 2
        assert all(not gone(pid) for pid in pids.values() if pid is not None)
        release.touch()
        for name, task_id in ids.items():
            task = client.get_task(task_id).wait(20)
            assert (task.status, task.attempts, task.node) == ("complete", 1, "far.example_1")
            assert [entry["outcome"] for entry in task.history] == ["retry", "complete"]
            # its work ran once, to its end, in the process that ran before the cut
            assert lines(markers[name]) == [f"start {pids[name]}", f"end {pids[name]}"]
        assert "superseded" not in far.log()
        blocker_release.touch()
        assert client.get_task(blocker).wait(20).status == "complete"
        assert far.alive() and near.alive()


def test_an_adopted_run_cut_off_past_its_lease_is_reclaimed_not_stopped(  # type: ignore[no-untyped-def]
        cuttable, redis_client, tmp_path: Path):
    """Issue 30 item 1, for a run adopted from a listener that left (--on-stop=keep): its
    adopter is cut off longer than the lease, another node's sweep recovers the dead
    listener's carried lease (the task retried, pending: no slot free), and at the heal the
    adopter's sweep stopped the run as fenced and it ran again from zero (the chaos test,
    seed 788770248: "runs stopped that nobody signalled"). Now the adopter takes the task
    back for it and the run goes on: one run, attempt 1."""
    direct, through_proxy, proxy = cuttable
    client = blueque.Client(direct)
    queue = client.get_queue("work")
    marker, blocker_marker = tmp_path / "marker", tmp_path / "blocker"
    release, blocker_release = tmp_path / "release", tmp_path / "blocker-release"
    fast = ("--interval", "0.5", "--poll", "0.1", "--no-task-logs")

    def far(name: str) -> Daemon:
        daemon = Daemon(listen_command(through_proxy, "work", "tests.jobs:waits_for_release",
                                       *fast, "--node-name", "far"), tmp_path / f"{name}.log")
        started.append(daemon)
        return daemon

    with daemons(tmp_path) as started:
        near = Daemon(listen_command(direct, "work", "tests.jobs:waits_for_release", *fast,
                                     "--node-name", "near"), tmp_path / "near.log")
        started.append(near)
        blocker = queue.enqueue(json.dumps({"marker": str(blocker_marker),
                                            "release": str(blocker_release)}))
        wait_until(lambda: lines(blocker_marker), what="the other node's only slot busy")
        first = far("first")
        task_id = queue.enqueue(json.dumps({"marker": str(marker), "release": str(release)}),
                                max_attempts=3, retry_backoff=0.01)
        wait_until(lambda: lines(marker), what="running on the node to be cut off")
        pid = client.get_task(task_id).pid
        first.stop()
        assert first.process.wait(20) == 0
        second = far("second")
        wait_until(lambda: "adopted" in second.log(), what="the run adopted by the next listener")
        proxy.cut()
        wait_until(lambda: client.get_task(task_id).status == "pending", timeout=15,
                   what="put back for its retry by the other node's sweep")
        proxy.restore()
        wait_until(lambda: client.get_task(task_id).status == "started", timeout=15,
                   what="taken back by the node that runs it")
        task = client.get_task(task_id)
        assert (task.attempts, task.pid) == (1, pid)
        assert task.history[-1]["reclaimed"]
        assert redis_client.llen(KEYS.pending("work")) == 0
        wait_until(lambda: "taken back, the run goes on" in second.log(),
                   what="the reclaim logged (after the script that the status shows)")
        assert pid is not None and not gone(pid)
        release.touch()
        task = client.get_task(task_id).wait(20)
        assert (task.status, task.attempts) == ("complete", 1)
        assert lines(marker) == [f"start {pid}", f"end {pid}"]  # ran once, to its end
        assert "was taken back" not in second.log()
        blocker_release.touch()
        assert client.get_task(blocker).wait(20).status == "complete"
        assert second.alive() and near.alive()


def test_a_partition_costs_an_exclusive_run_no_attempt(  # type: ignore[no-untyped-def]
        cuttable, redis_client, tmp_path: Path):
    """Issue 30 item 2. `--exclusive`, max_attempts=1: the node is cut off, its guard stops the
    run before its lease lapses, and a sweep elsewhere recovers the listener. Before: the
    sweep recorded "stopped renewing its lease" as a failure, and the job failed for good.
    The run was stopped by its own node for fencing, as a preemption stops one: the task is
    put back without spending an attempt, its checkpoint kept, and resumes from it."""
    direct, through_proxy, proxy = cuttable
    marker = tmp_path / "marker"
    client = blueque.Client(direct)
    with daemons(tmp_path) as started:
        far = Daemon(listen_command(through_proxy, "work", "tests.checkpoint_jobs:count",
                                    "--interval", "1", "--poll", "0.1", "--identity",
                                    "far.example_1", "--no-task-logs", "--exclusive"),
                     tmp_path / "far.log")
        started.append(far)
        wait_until(lambda: redis_client.scard(KEYS.listeners("work")) == 1, what="listener")
        task_id = client.get_queue("work").enqueue(json.dumps(
            {"marker": str(marker), "n": 60, "k": 5, "step": 0.1}), max_attempts=1)
        wait_until(lambda: client.get_task(task_id).checkpoint, what="a checkpoint saved")
        # the sweeper, near Redis (a scheduler: it runs no task)
        scheduler = Daemon([sys.executable, "-m", "blueque.cli", "scheduler", "--url", direct,
                            "--interval", "0.5", "--recovery-interval", "0.5"],
                           tmp_path / "scheduler.log")
        started.append(scheduler)
        wait_until(lambda: "scheduler started" in scheduler.log(), what="the sweeper")
        proxy.cut()
        wait_until(lambda: client.get_task(task_id).status != "started", timeout=20,
                   what="the cut-off listener recovered by the sweep")
        task = client.get_task(task_id)
        assert (task.status, task.attempts, task.data.get("preemptions")) == (
            "pending", 1, "1"), task.data
        assert task.history[-1]["outcome"] == "preempted"
        assert "exclusive" in task.history[-1]["error"]
        saved = json.loads(task.checkpoint or "{}")["done"]
        assert saved >= 5  # kept for the next attempt
        proxy.restore()
        task = client.get_task(task_id).wait(30)
        assert task.status == "complete", task.data
        result = json.loads(task.result or "{}")
        assert result["attempt"] == 2 and result["resumed_from"] >= saved
        assert [entry["outcome"] for entry in task.history] == ["preempted", "complete"]
        assert far.alive()
