"""Short Redis stalls (DEBUG SLEEP: longer than a lease, shorter than the socket timeout) with
real `blueque listen` daemons and a real `blueque scheduler`: no live listener is taken for
dead (issue 19 item 3; PROTOCOL.md 6, "Outages")."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import blueque
from blueque.keys import Keys
from blueque.recovery import Recovery
from blueque.testing import RedisServer
from tests.daemons import Daemon, daemons, listen_command, wait_until

pytestmark = pytest.mark.slow

KEYS = Keys()
NODES = 4


@pytest.fixture
def debug_server() -> Iterator[RedisServer]:
    """A private redis-server of the test's own that takes DEBUG SLEEP from loopback."""
    with RedisServer(extra_args=("--enable-debug-command", "local")) as server:
        yield server


def lines(path: Path) -> list[str]:
    return path.read_text().split("\n")[:-1] if path.exists() else []


def test_stalls_longer_than_a_lease_kill_no_live_listener_with_a_scheduler(  # type: ignore[no-untyped-def]
        debug_server, tmp_path):
    """Four listeners (--interval 1: 2-s leases) each run two tasks while a scheduler sweeps
    every tenth of a second; Redis stalls 4 s, three times. Before, the scheduler (which took itself
    for stalled only after 30 s) declared live listeners dead in 4 of 10 such stalls."""
    marker, release, phase = tmp_path / "marker", tmp_path / "release", tmp_path / "phase"
    client = blueque.Client(debug_server.url)
    queue = client.get_queue("work")
    watcher = redis.Redis(port=debug_server.port, decode_responses=True)
    with daemons(tmp_path) as started:
        for n in range(NODES):
            started.append(Daemon(listen_command(
                debug_server.url, "work", "tests.jobs:keeps_reporting", "--interval", "1",
                "--poll", "0.1", "--concurrency", "2", "--identity", f"node{n}.example_{n}"),
                tmp_path / f"listener{n}.log"))
        scheduler = Daemon([sys.executable, "-m", "blueque.cli", "scheduler", "--url",
                            debug_server.url, "--interval", "0.1", "--recovery-interval",
                            "0.1"], tmp_path / "scheduler.log")
        started.append(scheduler)
        wait_until(lambda: watcher.scard(KEYS.listeners("work")) == NODES, what="listeners")
        ids = [queue.enqueue(json.dumps({"marker": str(marker), "release": str(release),
                                         "phase": str(phase)}), max_attempts=3,
                             retry_backoff=0.01) for _ in range(2 * NODES)]
        wait_until(lambda: len(lines(marker)) == 2 * NODES, what="every task running")
        wait_until(lambda: "scheduler started" in scheduler.log(), what="the scheduler")
        for _ in range(3):
            watcher.execute_command("DEBUG", "SLEEP", "4")  # every client waits 4 s
            time.sleep(1.5)  # everyone renews and sweeps between stalls
        release.touch()
        for task_id in ids:
            task = client.get_task(task_id).wait(30)
            assert task.status == "complete" and task.attempts == 1, task.history
        assert sorted(line.split()[0] for line in lines(marker)) == (
            ["end"] * 2 * NODES + ["start"] * 2 * NODES)  # each ran once, never stopped
        assert "recovered listener" not in scheduler.log()
        for daemon in started:
            assert daemon.alive()
            assert "recovered listener" not in daemon.log()
            assert "lost its lease" not in daemon.log()


def test_a_sweep_that_waited_out_a_stall_recovers_no_one_whose_lease_lapsed_in_it(  # type: ignore[no-untyped-def]
        debug_server, tmp_path):
    """Step by step, the race the scheduler lost: its sweep waits behind a 3-s DEBUG SLEEP
    and reads a 2-s lease that lapsed during the stall, before the listener's own renewal
    (queued behind the stall too) comes in. It recovers no one; once the listener renewed
    and then really stops, its lease lapses again after the stall and it is recovered."""
    client = blueque.Client(debug_server.url)
    store = client.store
    recovery = Recovery(store, host="sweeper.example", watch_ms=4000)  # a scheduler's
    listener = "node1.example_1"
    store.add_listener("work", listener)
    store.write_listener_info(listener, {"interval": "1"}, 60)  # a 2-s lease
    store.lease("work", listener, 2000, "register")
    assert recovery.sweep(["work"]).listeners == []
    staller = redis.Redis(port=debug_server.port)
    stall = threading.Thread(target=staller.execute_command, args=("DEBUG", "SLEEP", "3"))
    stall.start()
    time.sleep(0.2)  # the stall has begun: the sweep's first command waits behind it
    assert recovery.sweep(["work"]).listeners == []  # its lease lapsed in the stall
    stall.join()
    store.lease("work", listener, 2000, "renew")  # it renews once Redis answers again...
    assert recovery.sweep(["work"]).listeners == []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # ... then stops: its lease lapses again
        time.sleep(0.25)
        if recovery.sweep(["work"]).listeners == [listener]:
            break
    else:
        pytest.fail("the listener that stopped after the stall was never recovered")
