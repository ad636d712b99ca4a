"""The reporting path of PROTOCOL.md 6.2, window by window, with real processes: a listener
that forks, stamps and records; a task process that reports over its socket; the listener (or
the child) killed at each point by BLUEQUE_FAILPOINTS, or Redis away at the stamp. Whatever
dies where, every task runs once (a marker line per run) and its ending is recorded once (the
queue's outcome counter)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import psutil
import pytest

import blueque
from blueque.keys import Keys
from tests.daemons import FAST, Daemon, listen_command, wait_until

pytestmark = pytest.mark.slow

KEYS = Keys()


def lines(path: Path) -> list[str]:
    return path.read_text().split("\n")[:-1] if path.exists() else []


def start(started: list[Daemon], tmp_path: Path, url: str, *options: str,
          failpoints: str = "", function: str = "tests.jobs:echo") -> Daemon:
    daemon = Daemon(listen_command(url, "work", function, *FAST, *options),
                    tmp_path / f"daemon{len(started)}.log",
                    env={"BLUEQUE_FAILPOINTS": failpoints} if failpoints else None)
    started.append(daemon)
    return daemon


def outcomes(redis_client: object, outcome: str) -> int:
    return int(redis_client.hget(KEYS.outcome_counts("work"), outcome) or 0)  # type: ignore[attr-defined]


def run_once_through(client: blueque.Client, redis_client: object, started: list[Daemon],
                     tmp_path: Path, redis_url: str, failpoint: str,
                     *options: str) -> tuple[Daemon, str, Path]:
    """A listener killed at ``failpoint`` while running one task; a second listener on the
    same node takes over what is left. The task must complete, having run exactly once."""
    marker = tmp_path / "marker"
    first = start(started, tmp_path, redis_url, *options, failpoints=failpoint)
    wait_until(lambda: redis_client.scard(KEYS.listeners("work")) == 1,  # type: ignore[attr-defined]
               what="the first listener")
    task_id = client.get_queue("work").enqueue(json.dumps({"marker": str(marker), "value": 7}))
    first.process.wait(20)
    assert first.process.returncode == -signal.SIGKILL, first.log()
    start(started, tmp_path, redis_url, *options)
    task = client.get_task(task_id).wait(20)
    assert task.status == "complete" and task.result == "7", task.data
    return first, task_id, marker


@pytest.mark.parametrize("failpoint, runs_in", [
    # the stamp never reached Redis: the child, told nothing, leaves without running; the
    # task, pending in the dead listener's reserved list, is put back and runs under the next
    ("listener-before-stamp", "the next listener"),
    # the stamp started it for the child: the child runs it as an orphan, records it itself
    ("listener-before-go", "the orphan"),
    # the child reported; the listener died before (or after) recording: the child records
    ("listener-before-finish", "the orphan"),
    ("listener-before-recorded", "the orphan"),
])
@pytest.mark.parametrize("mode", [(), ("--reuse", "3")], ids=["fork", "warm"])
def test_a_listener_killed_at_each_point_loses_nothing_and_runs_nothing_twice(  # type: ignore[no-untyped-def]
        client, redis_client, started, tmp_path, redis_url, failpoint, runs_in, mode) -> None:
    """In both modes: a process per task, and warm processes (PROTOCOL.md 6.7)."""
    first, task_id, marker = run_once_through(client, redis_client, started, tmp_path,
                                              redis_url, failpoint, *mode)
    assert len(lines(marker)) == 1, lines(marker)  # ran once
    task = client.get_task(task_id)
    assert task.attempts == 1  # a stamp that never happened counted nothing
    assert outcomes(redis_client, "complete") == 1  # recorded once
    assert redis_client.llen(KEYS.complete("work")) == 1
    assert redis_client.scard(KEYS.started("work")) == 0
    orphan_pid = int(lines(marker)[0].split()[-1])
    if runs_in == "the orphan":
        assert orphan_pid == task.pid  # the first listener's child ran and recorded it
        assert f"{first.pid}" in (task.node or "")
    else:
        assert f"{first.pid}" not in (task.node or "")  # the next listener ran it


def test_a_child_killed_after_reporting_has_its_outcome_recorded(  # type: ignore[no-untyped-def]
        client, redis_client, started, tmp_path, redis_url) -> None:
    """The listener records the outcome it received; the child's death (SIGKILL) adds
    nothing: complete, not a retry or a failure naming the signal."""
    marker = tmp_path / "marker"
    daemon = start(started, tmp_path, redis_url, failpoints="child-after-outcome")
    task_id = client.get_queue("work").enqueue(json.dumps({"marker": str(marker), "value": 3}),
                                                max_attempts=2)
    task = client.get_task(task_id).wait(20)
    assert task.status == "complete" and task.result == "3" and task.attempts == 1
    assert len(lines(marker)) == 1
    assert outcomes(redis_client, "complete") == 1 and outcomes(redis_client, "retry") == 0
    assert daemon.alive()


def test_every_stamp_the_listener_made_runs_the_task_of_that_very_process(  # type: ignore[no-untyped-def]
        client, redis_client, started, tmp_path, redis_url) -> None:
    """Many tasks, concurrency 3: each complete task was run by the pid its stamp recorded
    (marker lines name the running pid), once, and no child opened a Redis connection."""
    marker = tmp_path / "marker"
    start(started, tmp_path, redis_url, "--concurrency", "3")
    queue = client.get_queue("work")
    wait_until(lambda: redis_client.scard(KEYS.listeners("work")) == 1, what="the listener")
    connections = int(redis_client.info("stats")["total_connections_received"])
    ids = [queue.enqueue(json.dumps({"marker": str(marker), "value": n})) for n in range(30)]
    # read on this test's one connection (Task.wait would open a subscription each)
    wait_until(lambda: redis_client.llen(KEYS.complete("work")) == 30, what="30 complete")
    ran = [line.split()[-1] for line in lines(marker)]
    assert len(ran) == 30
    assert sorted(ran) == sorted(str(client.get_task(i).pid) for i in ids)
    # the listener's own pool may open one or two more; 30 children would open 30
    assert int(redis_client.info("stats")["total_connections_received"]) - connections < 5
    assert outcomes(redis_client, "complete") == 30


def test_redis_away_at_the_stamp_the_child_waits_and_runs_once(  # type: ignore[no-untyped-def]
        aof_server, started, tmp_path) -> None:
    """The listener forked the child and Redis went away before the stamp (or took its
    reply along): the child waits while the listener repeats the idempotent stamp, then runs
    the task, once, at attempt 1."""
    marker = tmp_path / "marker"
    client = blueque.Client(aof_server.url)
    daemon = start(started, tmp_path, aof_server.url, failpoints="listener-before-stamp:1.5")
    wait_until(lambda: client.store.listener_ids("work"), what="the listener")
    task_id = client.get_queue("work").enqueue(json.dumps({"marker": str(marker), "value": 1}))

    def forked() -> list[int]:  # the listener's, or its fork server's (PROTOCOL.md 6.8)
        return [p.pid for p in psutil.Process(daemon.pid).children(recursive=True)
                if p.cmdline()[:1] == [f"blueque: work {task_id} starting"]]

    wait_until(forked, what="the child forked, waiting for its stamp")
    waiting = forked()[0]
    aof_server.kill()
    time.sleep(3.0)  # the outage itself, not a wait for a state
    aof_server.start()
    task = client.get_task(task_id).wait(30)
    assert task.status == "complete" and task.result == "1"
    assert len(lines(marker)) == 1 and task.attempts == 1
    assert int(lines(marker)[0].split()[-1]) == waiting == task.pid


def test_a_child_killed_before_go_never_ran_and_its_task_goes_back(  # type: ignore[no-untyped-def]
        client, redis_client, started, tmp_path, redis_url) -> None:
    """Killed while it waits for the word (the stamp may have started the task for it): it
    never ran, so the task is put back at the head of the line, not failed; it then runs."""
    marker = tmp_path / "marker"
    daemon = start(started, tmp_path, redis_url, failpoints="listener-before-stamp:1.0")
    wait_until(lambda: redis_client.scard(KEYS.listeners("work")) == 1, what="the listener")
    task_id = client.get_queue("work").enqueue(json.dumps({"marker": str(marker), "value": 2}))

    def waiting() -> list[psutil.Process]:
        return [p for p in psutil.Process(daemon.pid).children(recursive=True)
                if p.cmdline()[:1] == [f"blueque: work {task_id} starting"]]

    wait_until(waiting, what="the child forked, waiting for its stamp")
    victim = waiting()[0].pid
    psutil.Process(victim).kill()
    task = client.get_task(task_id).wait(30)
    assert task.status == "complete" and task.result == "2"
    assert len(lines(marker)) == 1 and int(lines(marker)[0].split()[-1]) != victim
    assert outcomes(redis_client, "failed") == 0 and outcomes(redis_client, "retry") == 0
    assert "put back" in daemon.log()
    assert task.attempts == 2  # the stamp made for the killed child counted one
