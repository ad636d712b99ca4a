"""A listener in a container (issue 31.4), end to end: a real `blueque listen` as pid 1 of its
own PID namespace (`unshare --pid --fork --mount-proc`), stopped as a container runtime stops
it: SIGTERM, then SIGKILL of the whole namespace once the runtime's grace period is over.
As pid 1 the listener preempts its runs (--on-stop=preempt is its default there): every task
is told, saves its checkpoint and is put back pending without spending an attempt, and the
listener exits before the runtime's grace runs out; nothing is lost, nothing done twice."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import psutil
import pytest

import blueque
from blueque.keys import Keys
from tests.daemons import FAST, Daemon, lines, listen_command, wait_until
from tests.test_node_identity import needs_pid_namespaces

pytestmark = [pytest.mark.slow, needs_pid_namespaces]

KEYS = Keys()


def in_container(started: list[Daemon], tmp_path: Path, url: str, function: str,
                 *options: str) -> tuple[Daemon, psutil.Process]:
    """`blueque listen` as pid 1 of a new PID namespace (unshare outside it), and the
    listener's process as this namespace sees it."""
    daemon = Daemon(["unshare", "--pid", "--fork", "--mount-proc",
                     *listen_command(url, "work", f"tests.checkpoint_jobs:{function}", *FAST,
                                     *options)],
                    tmp_path / f"container{len(started)}.log")
    started.append(daemon)
    found: list[psutil.Process] = []

    def listener_up() -> bool:
        found[:] = [p for p in psutil.Process(daemon.pid).children()
                    if "listen" in " ".join(p.cmdline())]
        return bool(found) and "listening on work" in daemon.log()

    wait_until(listener_up, what="the listener up as pid 1 of its namespace")
    return daemon, found[0]


def stop_as_a_runtime_does(container: Daemon, listener: psutil.Process, grace: float
                           ) -> float | None:
    """SIGTERM to the container's main process; SIGKILL of it (and so of every process of
    its namespace) if it is still there after ``grace`` seconds, as Docker and the kubelet
    do. How long it took to exit by itself, or None if it had to be killed."""
    sent = time.monotonic()
    listener.send_signal(signal.SIGTERM)
    try:
        listener.wait(grace)
    except psutil.TimeoutExpired:
        listener.send_signal(signal.SIGKILL)
        container.process.wait(10)
        return None
    container.process.wait(10)
    return time.monotonic() - sent


def test_a_container_stop_puts_every_run_back_with_its_checkpoint_and_loses_nothing(  # type: ignore[no-untyped-def]
        client, redis_client, redis_url, started, tmp_path) -> None:
    queue = client.get_queue("work")
    n, k = 400, 5
    markers = [tmp_path / f"task{i}.marker" for i in range(5)]
    ids = [queue.enqueue(json.dumps({"marker": str(m), "n": n, "k": k, "step": 0.02}),
                         max_attempts=1) for m in markers]
    container, listener = in_container(started, tmp_path, redis_url, "count_until_preempted",
                                       "--concurrency", "3", "--preempt-grace", "5s")
    running = markers[:3]  # the oldest three, taken first (one queue, its order)
    wait_until(lambda: all(sum(line.startswith("step 1 ") for line in lines(m)) >= 12
                           for m in running), what="three tasks a dozen steps in")
    assert all(not m.exists() for m in markers[3:])  # two still pending: 3 slots

    took = stop_as_a_runtime_does(container, listener, grace=15)
    assert took is not None and took < 5, "the listener had to be SIGKILLed" + container.log()
    assert container.process.returncode == 0
    log = container.log()
    assert "runs as pid 1 of its PID namespace" in log  # preempt: its default there
    assert "(SIGTERM): taking no more tasks; told 3 task(s)" in log
    stopped = {}
    for task_id, marker in zip(ids[:3], running, strict=True):
        task = client.get_task(task_id)
        assert (task.status, task.attempts, task.data.get("preemptions")) == (
            "pending", 1, "1"), task.data
        saved = json.loads(task.checkpoint or "{}")["done"]
        last = next(line for line in lines(marker) if line.startswith("preempted")).split()
        stopped[task_id] = int(last[2])
        assert saved == stopped[task_id] > 0  # saved where it stopped
    for task_id in ids[3:]:  # never started
        task = client.get_task(task_id)
        assert task.status == "pending" and not task.attempts, task.data
    assert redis_client.llen(KEYS.pending("work")) == 5
    assert not redis_client.exists(KEYS.started("work"))
    assert not client.store.listener_ids("work")  # it left cleanly: nothing to recover

    # a listener elsewhere finishes them all: from their checkpoints, on their only attempt
    started.append(Daemon(listen_command(redis_url, "work",
                                         "tests.checkpoint_jobs:count_until_preempted", *FAST,
                                         "--concurrency", "5"), tmp_path / "after.log"))
    for task_id, marker in zip(ids, markers, strict=True):
        task = client.get_task(task_id).wait(60)
        assert task.status == "complete", task.data
        result = json.loads(task.result or "{}")
        assert result["resumed_from"] == stopped.get(task_id, 0)
        steps = [line.split()[3] for line in lines(marker) if line.startswith("step ")]
        assert len(steps) == n == len(set(steps)), "a step lost or done twice"


def test_a_run_that_ignores_the_notice_is_put_back_before_the_runtime_kills(  # type: ignore[no-untyped-def]
        client, redis_url, started, tmp_path) -> None:
    """A task that does not stop when told is terminated at --preempt-grace and put back
    (no attempt spent), and the listener still exits before the runtime's grace is over."""
    marker, release = tmp_path / "marker", tmp_path / "release"
    task_id = client.get_queue("work").enqueue(
        json.dumps({"marker": str(marker), "release": str(release)}), max_attempts=1,
        kill_grace=1)
    container, listener = in_container(started, tmp_path, redis_url, "ignores_preemption",
                                       "--preempt-grace", "2s")
    wait_until(lambda: lines(marker), what="running")
    took = stop_as_a_runtime_does(container, listener, grace=10)
    assert took is not None and 2 <= took < 10, container.log()
    task = client.get_task(task_id)
    assert (task.status, task.attempts, task.data.get("preemptions")) == (
        "pending", 1, "1"), task.data
    release.touch()
    started.append(Daemon(listen_command(redis_url, "work",
                                         "tests.checkpoint_jobs:ignores_preemption", *FAST),
                          tmp_path / "after.log"))
    task = client.get_task(task_id).wait(30)
    assert (task.status, task.result) == ("complete", "done by attempt 2")


def test_the_default_on_stop_is_preempt_only_as_pid_1() -> None:
    from blueque.daemon.loop import on_stop_here

    assert on_stop_here("keep", "l", pid=1) == "preempt"
    assert on_stop_here("keep", "l", pid=4242) == "keep"
    assert on_stop_here("drain", "l", pid=1) == "drain"  # what is asked for is kept
    assert on_stop_here("terminate", "l", pid=1) == "terminate"


def test_on_stop_preempt_outside_a_container(  # type: ignore[no-untyped-def]
        client: blueque.Client, redis_url, started, tmp_path) -> None:
    """--on-stop=preempt asked for: the same stop, for a listener that is not pid 1."""
    marker = tmp_path / "marker"
    task_id = client.get_queue("work").enqueue(
        json.dumps({"marker": str(marker), "n": 400, "k": 5, "step": 0.02}), max_attempts=1)
    daemon = Daemon(listen_command(redis_url, "work",
                                   "tests.checkpoint_jobs:count_until_preempted", *FAST,
                                   "--on-stop", "preempt"), tmp_path / "plain.log")
    started.append(daemon)
    wait_until(lambda: sum(line.startswith("step 1 ") for line in lines(marker)) >= 6,
               what="running")
    assert daemon.stop() == 0
    task = client.get_task(task_id)
    assert (task.status, task.attempts, task.data.get("preemptions")) == ("pending", 1, "1")
    assert json.loads(task.checkpoint or "{}")["done"] > 0
