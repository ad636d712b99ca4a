"""A memory bound for warm processes (issue 30 item 6): a task that leaks 30 MiB a run grew
its warm process from 48 to 618 MB over 20 runs, and the process then sat idle at 618 MB.
With ``--max-memory-per-process`` a process over the bound once its task has ended retires
(logged), a fresh one takes the next task; each task process's resident memory is in
`blueque status` (the listener info hash's ``task_memory``) and the listener's metrics."""

from __future__ import annotations

import itertools
import json
import urllib.request
from pathlib import Path

import pytest

import blueque
from blueque.testing import free_port
from tests.conftest import Run
from tests.daemons import Daemon, listen_command, wait_until

pytestmark = pytest.mark.slow

MIB = 1024 * 1024
LEAK_MB = 30
BOUND = 150 * MIB


def test_a_leaking_warm_process_retires_past_its_memory_bound(
        client: blueque.Client, redis_url: str, tmp_path: Path, started: list[Daemon],
        run: Run) -> None:
    port = free_port()
    listener = Daemon(listen_command(redis_url, "work", "tests.jobs:leaks", "--interval", "0.5",
                                     "--poll", "0.1", "--reuse", "100",
                                     "--max-memory-per-process", "150M",
                                     "--metrics-port", str(port)), tmp_path / "listener.log")
    started.append(listener)
    queue = client.get_queue("work")
    ends = []
    for _ in range(12):  # one at a time: each run's memory is its process's after it
        task = client.get_task(queue.enqueue(json.dumps({"mb": LEAK_MB}))).wait(60)
        assert task.status == "complete", task.error
        ends.append(json.loads(task.result or "{}"))
    pids = [end["pid"] for end in ends]
    # a process over the bound took no further task: the run that crossed it was its last
    for before, after in itertools.pairwise(ends):
        if before["rss"] > BOUND:
            assert after["pid"] != before["pid"], ends
    assert max(end["rss"] for end in ends) < BOUND + (LEAK_MB + 10) * MIB, ends
    assert len(set(pids)) >= 2, ends  # retired at least once in 12 runs of 30 MiB
    assert len(set(pids)) < len(pids), ends  # and still warm: several tasks per process
    log = listener.log()
    assert "retires: its resident memory" in log and "over --max-memory-per-process " \
        "150.0 MiB" in log, log

    # the idle process's memory, in status (the info hash, written at each renewal) and in
    # the listener's metrics (read at the scrape)
    def shown() -> dict[str, int]:
        status = json.loads(run("status", "--json").stdout)
        info = status["listeners"][0]["info"]
        return dict(info.get("task_memory") or {}) if info else {}

    wait_until(lambda: shown().get(str(pids[-1]), 0) >= LEAK_MB * MIB,
               what="the idle process's memory (past its leak) in status")
    text = run("status").stdout
    assert "MEMORY" in text and " MiB" in text.split("MEMORY", 1)[1], text
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        metrics = response.read().decode()
    assert 'blueque_listener_task_process_resident_bytes{listener="' in metrics
    assert f'pid="{pids[-1]}"' in metrics, metrics
