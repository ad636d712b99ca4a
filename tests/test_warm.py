"""Warm task processes (PROTOCOL.md 6.7, ``blueque listen --reuse N``), end to end with real
processes: each task in a warm process gets its own attempt, stamp, output file, progress,
checkpoint and outcome; a warm process killed between two tasks or in the middle of one, one
stopped by a time limit or a cancel, and a listener SIGKILLed while warm processes live: every
task runs once, its ending is recorded once, and the node never holds more task processes than
--concurrency."""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path

import psutil
import pytest

import blueque
from blueque.keys import Keys
from tests.daemons import Daemon, gone, lines, listen_command, owned_processes, wait_until

pytestmark = pytest.mark.slow

FAST = ("--interval", "0.5", "--poll", "0.1")
KEYS = Keys()


def start(started: list[Daemon], tmp_path: Path, url: str, *options: str) -> Daemon:
    daemon = Daemon(listen_command(url, "work", "tests.jobs:acts", *FAST, "--log-dir",
                                   str(tmp_path / "task-logs"), *options),
                    tmp_path / f"daemon{len(started)}.log")
    started.append(daemon)
    return daemon


def outcomes(redis_client: object, outcome: str) -> int:
    return int(redis_client.hget(KEYS.outcome_counts("work"), outcome) or 0)  # type: ignore[attr-defined]


def task_processes() -> list[psutil.Process]:
    """This test run's task processes, busy or idle (their titles say so)."""
    found = []
    for process in owned_processes():
        try:
            if process.cmdline()[:1] and process.cmdline()[0].startswith("blueque: work "):
                found.append(process)
        except psutil.Error:
            continue
    return found


def idle(daemon: Daemon) -> list[int]:
    """The listener's warm processes waiting for a task."""
    found = []
    for process in psutil.Process(daemon.pid).children():
        try:
            if process.cmdline()[:1] == ["blueque: work idle"]:
                found.append(process.pid)
        except psutil.Error:
            continue
    return found


def node_runs(redis_client: object) -> dict[str, str]:
    """Every run record of every node (blueque_node_[node])."""
    records: dict[str, str] = {}
    for key in redis_client.keys(KEYS.node_runs("*")):  # type: ignore[attr-defined]
        records.update(redis_client.hgetall(key))  # type: ignore[attr-defined]
    return records


def ran_by(marker: Path) -> list[int]:
    """The pid of each run the marker file records, in order."""
    return [int(line.split()[-1]) for line in lines(marker)]


def enqueue(client: blueque.Client, **params: object) -> str:
    options = {key: params.pop(key) for key in ("max_attempts", "time_limit") if key in params}
    return client.get_queue("work").enqueue(json.dumps(params), **options)  # type: ignore[arg-type]


def test_a_warm_process_runs_up_to_n_tasks_each_as_its_own_run(  # type: ignore[no-untyped-def]
        client, redis_client, started, tmp_path, redis_url) -> None:
    """Seven tasks at --reuse 3: three processes (3, 3, 1 tasks), each task stamped with the
    pid that ran it, its own output file holding only its own output, its progress and
    checkpoint its own, and each ending recorded once."""
    marker = tmp_path / "marker"
    ids = [enqueue(client, marker=str(marker), print=f"output of task {n}",
                   progress=[0.5, f"half of {n}"], checkpoint=f"state {n}", value=n)
           for n in range(7)]
    start(started, tmp_path, redis_url, "--reuse", "3")
    tasks = [client.get_task(task_id).wait(30) for task_id in ids]
    assert [t.status for t in tasks] == ["complete"] * 7, [t.data for t in tasks]
    assert [t.result for t in tasks] == [str(n) for n in range(7)]
    pids = ran_by(marker)
    assert sorted(Counter(pids).values()) == [1, 3, 3]
    for n, task in enumerate(tasks):
        assert task.attempts == 1 and task.pid == pids[n]
        assert task.progress == 0.5 and task.progress_message == f"half of {n}"
        assert task.checkpoint == f"state {n}"
        output = (tmp_path / "task-logs" / "work" / f"{task.id}.1.log").read_text()
        assert output == f"output of task {n}\n"
    assert outcomes(redis_client, "complete") == 7
    assert node_runs(redis_client) == {}  # no process is named as running a task
    wait_until(lambda: len(task_processes()) <= 1, what="the two used-up processes gone")
