"""Concurrency is a per-node promise across redeploys (issue 9, section 3): runs a new listener
adopts occupy its slots, and runs whose listener died and whose task was taken back are
stopped by the next listener or scheduler on their node. Real daemons, real task processes."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

import psutil
import pytest

import blueque
from tests.daemons import FAST, Daemon, adopted_by, daemons, listen_command, wait_until

pytestmark = pytest.mark.slow



def lines(path: Path) -> list[str]:
    return path.read_text().split("\n")[:-1] if path.exists() else []


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class Sampler(threading.Thread):
    """Counts the task processes alive at each moment, from the "start [task] [attempt]
    [pid]" lines tests.jobs:hold writes (each process is known by pid and create time)."""

    def __init__(self, marker: Path) -> None:
        super().__init__(daemon=True)
        self.marker = marker
        self.processes: dict[int, psutil.Process | None] = {}
        self.most = 0
        self.samples = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            for line in lines(self.marker):
                pid = int(line.split()[-1])
                if line.startswith("start") and pid not in self.processes:
                    try:
                        self.processes[pid] = psutil.Process(pid)
                    except psutil.NoSuchProcess:
                        self.processes[pid] = None  # came and went between two samples
            alive = 0
            for process in self.processes.values():
                try:
                    if process is not None and process.is_running() and (
                            process.status() != psutil.STATUS_ZOMBIE):
                        alive += 1
                except psutil.NoSuchProcess:
                    pass
            self.most = max(self.most, alive)
            self.samples += 1
            self._stop_event.wait(0.005)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(10)


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator:  # type: ignore[type-arg]
    with daemons(tmp_path) as started:
        def spawn_daemon(command: Sequence[str]) -> Daemon:
            daemon = Daemon(command, tmp_path / f"daemon{len(started)}.log")
            started.append(daemon)
            return daemon

        yield spawn_daemon


def starts(marker: Path) -> Counter[str]:
    return Counter(line.split()[1] for line in lines(marker) if line.startswith("start"))


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_adopted_runs_occupy_slots_across_two_restarts(  # type: ignore[no-untyped-def]
        client: blueque.Client, redis_url: str, spawn, tmp_path: Path, how: str) -> None:
    """A redeploy (SIGTERM, --on-stop=keep) or a crash (SIGKILL), then a new listener, twice
    in a row: the runs it adopts occupy its slots."""
    marker, release = tmp_path / "marker", tmp_path / "release"
    params = json.dumps({"marker": str(marker), "release": str(release)})
    queue = client.get_queue("work")
    ids = [queue.enqueue(params) for _ in range(4)]  # two run, two wait for a free slot
    sampler = Sampler(marker)
    sampler.start()
    command = listen_command(redis_url, "work", "tests.jobs:hold", *FAST, "--concurrency", "2")
    try:
        listener = spawn(command)
        wait_until(lambda: sum(starts(marker).values()) == 2, what="two tasks running")
        for _ in range(2):  # a redeploy or a crash, then a new listener
            if how == "SIGTERM":
                assert listener.stop() == 0
            else:
                listener.kill()
            listener = spawn(command)
            wait_until(lambda new=listener: "adopted task(s)" in new.log() or sampler.most > 2,
                       what="the new listener adopting the running tasks")
            seen = sampler.samples
            wait_until(lambda seen=seen: sampler.samples > seen + 2, what="samples after it")
        assert sampler.most == 2
        assert sorted(client.get_task(i).status or "" for i in ids) == [
            "pending", "pending", "started", "started"]
        ids += [queue.enqueue(params) for _ in range(2)]
        release.touch()
        for task_id in ids:
            task = client.get_task(task_id).wait(30)
            assert (task.status, task.attempts) == ("complete", 1)
    finally:
        sampler.stop()
    assert sampler.most == 2
    assert starts(marker) == {task_id: 1 for task_id in ids}  # each ran exactly once
    assert listener.alive()


@pytest.mark.parametrize("successor", ["listener", "scheduler"])
def test_next_daemon_on_the_node_stops_a_run_whose_task_was_taken_back(  # type: ignore[no-untyped-def]
        client: blueque.Client, redis_url: str, spawn, tmp_path: Path, successor: str) -> None:
    marker, release = tmp_path / "marker", tmp_path / "release"
    params = json.dumps({"marker": str(marker), "release": str(release)})
    task_id = client.get_queue("work").enqueue(params, max_attempts=2, retry_backoff=0.01)
    node_a = ("--node-name", "node-a.example")
    first = spawn(listen_command(redis_url, "work", "tests.jobs:hold", *FAST, *node_a))
    wait_until(lambda: lines(marker), what="attempt 1 running on node A")
    orphan = client.get_task(task_id).pid
    assert orphan is not None
    first.kill()  # node A's listener dies; its task process runs on (its own session)
    # no listener comes up on node A in time: node B recovers the task when the lease lapses
    spawn(listen_command(redis_url, "work", "tests.jobs:hold", *FAST,
                         "--node-name", "node-b.example"))
    wait_until(lambda: starts(marker)[task_id] == 2, what="attempt 2 running on node B")
    assert running(orphan)  # fenced, beside the next attempt
    if successor == "listener":
        spawn(listen_command(redis_url, "work", "tests.jobs:hold", *FAST, *node_a))
    else:
        spawn([sys.executable, "-m", "blueque.cli", "scheduler", "--url", redis_url,
               "--interval", "0.1", "--recovery-interval", "0.2", *node_a])
    wait_until(lambda: not running(orphan), what="the fenced run stopped by node A's successor")
    task = client.get_task(task_id)
    assert (task.status, task.attempts) == ("started", 2)
    assert task.node is not None and task.node.startswith("node-b.example_")
    release.touch()
    task = client.get_task(task_id).wait(20)
    assert (task.status, task.attempts) == ("complete", 2)
    assert [line.split()[:3] for line in lines(marker) if line.startswith("end")] == [
        ["end", task_id, "2"]]  # the fenced run never got to its end


def test_a_fenced_run_being_stopped_still_occupies_a_slot(  # type: ignore[no-untyped-def]
        client: blueque.Client, redis_url: str, spawn, tmp_path: Path) -> None:
    """The node's next listener stops a fenced run of its dead predecessor; until that
    process is gone (a job may take its whole kill_grace to stop) it holds a slot, or a
    --concurrency 1 node would run two jobs at once after a slow redeploy."""
    marker, release = tmp_path / "marker", tmp_path / "release"
    queue = client.get_queue("work")
    stubborn = queue.enqueue(json.dumps({"marker": str(marker), "release": str(release),
                                         "ignore_term": True}),
                             max_attempts=2, retry_backoff=0.01, kill_grace=3)
    node_a = ("--node-name", "node-a.example", "--concurrency", "1")
    first = spawn(listen_command(redis_url, "work", "tests.jobs:hold", *FAST, *node_a))
    wait_until(lambda: starts(marker)[stubborn] == 1, what="attempt 1 running on node A")
    orphan = client.get_task(stubborn).pid
    assert orphan is not None
    first.kill()
    spawn(listen_command(redis_url, "work", "tests.jobs:hold", *FAST,
                         "--node-name", "node-b.example", "--concurrency", "1"))
    wait_until(lambda: starts(marker)[stubborn] == 2, what="attempt 2 running on node B")
    following = queue.enqueue(json.dumps({"marker": str(marker), "release": str(release)}))
    spawn(listen_command(redis_url, "work", "tests.jobs:hold", *FAST, *node_a))
    while running(orphan):  # being stopped: SIGTERM ignored, SIGKILL after kill_grace
        assert starts(marker)[following] == 0, "a second job started on a 1-slot node"
        time.sleep(0.01)  # the next sample
    wait_until(lambda: starts(marker)[following] == 1, what="the next task once the slot freed")
    release.touch()
    for task_id in (stubborn, following):
        assert client.get_task(task_id).wait(20).status == "complete"


RUNNER = """
import sys
import blueque
from blueque.forking_runner import ForkingRunner
from tests import jobs
ForkingRunner(blueque.Client(sys.argv[1]), "work", jobs.hold).run()
"""


def test_forking_runner_waits_for_the_run_it_adopted(  # type: ignore[no-untyped-def]
        client: blueque.Client, redis_url: str, spawn, tmp_path: Path) -> None:
    """blueque 1.0.1's ForkingRunner.run() waits for a running orphan before taking work; so
    does ours: the adopted run holds its one slot."""
    marker, release = tmp_path / "marker", tmp_path / "release"
    params = json.dumps({"marker": str(marker), "release": str(release)})
    queue = client.get_queue("work")
    running_id, waiting_id = queue.enqueue(params), queue.enqueue(params)
    listener = spawn(listen_command(redis_url, "work", "tests.jobs:hold", *FAST))
    wait_until(lambda: starts(marker)[running_id] == 1, what="the first task running")
    dead = client.get_task(running_id).node
    assert dead is not None and listener.stop() == 0  # --on-stop=keep: its task runs on
    runner = spawn([sys.executable, "-c", RUNNER, redis_url])
    wait_until(lambda: adopted_by(client, running_id).endswith(f"_{runner.pid}")
               or starts(marker)[waiting_id] > 0, what="the runner adopting")
    assert client.get_task(waiting_id).status == "pending"
    assert starts(marker)[waiting_id] == 0
    release.touch()
    first, second = (client.get_task(i).wait(30) for i in (running_id, waiting_id))
    assert (first.status, second.status) == ("complete", "complete")
    assert second.started_at is not None and first.finished_at is not None
    assert second.started_at >= first.finished_at  # one at a time
    assert starts(marker) == {running_id: 1, waiting_id: 1}


def test_a_listener_taking_a_dead_listeners_id_stops_its_fenced_run(  # type: ignore[no-untyped-def]
        client: blueque.Client, redis_url: str, spawn, tmp_path: Path) -> None:
    """The same id on the same node after its holder died (a pid reused, or one explicit id):
    the newcomer waits for the holder's lease, takes its tasks back, and stops the old run,
    which its own id must not shelter."""
    marker, release = tmp_path / "marker", tmp_path / "release"
    params = json.dumps({"marker": str(marker), "release": str(release)})
    task_id = client.get_queue("work").enqueue(params, max_attempts=2, retry_backoff=0.01)
    command = listen_command(redis_url, "work", "tests.jobs:hold", *FAST,
                             "--identity", "reused.example_1")
    first = spawn(command)
    wait_until(lambda: lines(marker), what="attempt 1 running")
    orphan = client.get_task(task_id).pid
    assert orphan is not None
    first.kill()
    second = spawn(command)
    wait_until(lambda: not running(orphan), what="the dead holder's run stopped")
    wait_until(lambda: starts(marker)[task_id] == 2, what="attempt 2 by the new holder")
    release.touch()
    task = client.get_task(task_id).wait(20)
    assert (task.status, task.attempts, task.node) == ("complete", 2, "reused.example_1")
    assert [line.split()[:3] for line in lines(marker) if line.startswith("end")] == [
        ["end", task_id, "2"]]
    assert second.alive()


def adopt_one(client: blueque.Client, redis_url: str, spawn, tmp_path: Path,  # type: ignore[no-untyped-def]
              on_stop: str) -> tuple[str, int, Daemon, Path]:
    """A task started by a listener stopped with --on-stop=keep, adopted by a successor
    started with ``on_stop``: (task id, its pid, the successor, the release file)."""
    marker, release = tmp_path / "marker", tmp_path / "release"
    task_id = client.get_queue("work").enqueue(json.dumps(
        {"marker": str(marker), "release": str(release)}), max_attempts=2, retry_backoff=0.01)
    first = spawn(listen_command(redis_url, "work", "tests.jobs:hold", *FAST))
    wait_until(lambda: starts(marker)[task_id] == 1, what="the task running")
    dead, pid = client.get_task(task_id).node, client.get_task(task_id).pid
    assert dead is not None and pid is not None
    assert first.stop() == 0  # keep: the task runs on
    successor = spawn(listen_command(redis_url, "work", "tests.jobs:hold", *FAST,
                                     "--on-stop", on_stop))
    wait_until(lambda: adopted_by(client, task_id).endswith(f"_{successor.pid}"),
               what="the successor adopting the run")
    return task_id, pid, successor, release


def test_drain_waits_for_the_runs_it_adopted(  # type: ignore[no-untyped-def]
        client: blueque.Client, redis_url: str, spawn, tmp_path: Path) -> None:
    """--on-stop=drain waits for every run on its slots, adopted ones too: leaving them
    would stop renewing their lease, and another node would run them again beside the
    live run (a node being decommissioned with `systemctl stop`)."""
    task_id, pid, draining, release = adopt_one(client, redis_url, spawn, tmp_path, "drain")
    draining_id = next(i for i in client.store.listener_ids("work")
                       if i.endswith(f"_{draining.pid}"))
    draining.signal(signal.SIGTERM)
    wait_until(lambda: "stopping (on-stop=drain)" in draining.log(), what="asked to stop")
    renewed = client.store.listener_info(draining_id).get("renewed")
    for _ in range(2):  # two lease renewals while it drains: it is still there, waiting
        wait_until(lambda r=renewed: client.store.listener_info(draining_id).get(
            "renewed", r) != r, what="a renewal while draining")
        renewed = client.store.listener_info(draining_id)["renewed"]
    assert draining.alive() and running(pid)
    assert client.get_task(task_id).status == "started"
    release.touch()
    assert draining.process.wait(20) == 0
    task = client.get_task(task_id)
    assert (task.status, task.attempts, task.pid) == ("complete", 1, pid)
    assert draining_id not in client.store.listener_ids("work")  # it left cleanly


def test_terminate_stops_the_runs_it_adopted_too(  # type: ignore[no-untyped-def]
        client: blueque.Client, redis_url: str, spawn, tmp_path: Path) -> None:
    """--on-stop=terminate stops every run on its slots, adopted ones too, and records them
    by their retry policy before it exits, instead of leaving them running unwatched."""
    task_id, pid, stopping, _ = adopt_one(client, redis_url, spawn, tmp_path, "terminate")
    assert stopping.stop() == 0
    assert not running(pid)
    task = client.get_task(task_id)
    # retried by its policy (the listener may have moved the retry to pending as it left)
    assert task.status in ("scheduled", "pending") and task.attempts == 1, task.data
    assert "shut down" in (task.error or ""), task.error


def test_a_listener_restarted_with_fewer_queues_still_adopts_the_runs_of_the_others(  # type: ignore[no-untyped-def]
        client: blueque.Client, redis_url: str, spawn, tmp_path: Path) -> None:
    """A redeploy that drops a queue from the listener's list: the run its predecessor left
    on that queue is still on the node, so the new listener adopts it rather than let its
    lease lapse and another node serving that queue run it again. It does not count it in
    its own slots (it serves another queue): the run counts against its queue's capacity on
    the node, for the next listener of that queue (tests/test_node_capacity.py)."""
    marker, release = tmp_path / "marker", tmp_path / "release"
    task_id = client.get_queue("other").enqueue(json.dumps(
        {"marker": str(marker), "release": str(release)}), max_attempts=2, retry_backoff=0.01)
    node_a = ("--node-name", "node-a.example")
    first = spawn(listen_command(redis_url, "work,other", "tests.jobs:hold", *FAST, *node_a))
    wait_until(lambda: starts(marker)[task_id] == 1, what="the task running on node A")
    pid, dead = client.get_task(task_id).pid, client.get_task(task_id).node
    assert pid is not None and dead is not None
    assert first.stop() == 0  # keep
    successor = spawn(listen_command(redis_url, "work", "tests.jobs:hold", *FAST, *node_a))
    wait_until(lambda: f"task {task_id} of queue other (pid {pid})" in successor.log(),
               what="node A's new listener adopting the run on 'other'")
    assert "the next listener of other starts with it counted" in successor.log()
    assert adopted_by(client, task_id) == ""  # on nobody's slots: no listener of 'other
    spawn(listen_command(redis_url, "other", "tests.jobs:hold", *FAST,
                         "--node-name", "node-b.example"))
    # node B sweeps 'other' every 0.5 s: two lease lengths of sweeps find nothing to recover
    leases = client.keys.leases("other")
    leased = client.redis.zscore(leases, dead) or 0
    wait_until(lambda: (client.redis.zscore(leases, dead) or 0) > leased + 2000,
               what="the adopted run's lease carried on for two more lease lengths")
    assert starts(marker)[task_id] == 1 and running(pid)
    release.touch()
    task = client.get_task(task_id).wait(20)
    assert (task.status, task.attempts, task.pid) == ("complete", 1, pid)
