"""The harness's own promise: the processes a test's daemons start, task processes included
and even once orphaned, are found by the test run's mark in their environment. Every "nothing
left behind" check (tests.daemons.daemons, the chaos test, the demo test) relies on it, and
a listener's or task process's title (setproctitle) erases /proc/[pid]/environ unless told
not to (tests.daemons.KEEP_ENVIRON)."""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest

import blueque
from tests.daemons import Daemon, daemons, listen_command, owned_processes, wait_until

pytestmark = pytest.mark.slow


def test_titled_listeners_and_orphaned_task_processes_are_found(
        client: blueque.Client, redis_url: str, tmp_path: Path) -> None:
    marker, release = tmp_path / "marker", tmp_path / "release"
    task_id = client.get_queue("work").enqueue(json.dumps({"marker": str(marker),
                                                           "release": str(release)}))
    with daemons(tmp_path) as started:
        listener = Daemon(listen_command(redis_url, "work", "tests.jobs:hold",
                                         "--interval", "0.5", "--poll", "0.1"),
                          tmp_path / "listen.log")
        started.append(listener)
        wait_until(lambda: marker.exists(), what="the task running")
        child = client.get_task(task_id).pid
        assert child is not None
        assert psutil.Process(child).cmdline()[0].startswith("blueque: work")  # titled
        assert psutil.Process(listener.pid).cmdline()[0].startswith("blueque listen")
        assert {listener.pid, child} <= {p.pid for p in owned_processes()}
        listener.kill()  # the task process runs on, orphaned
        assert child in {p.pid for p in owned_processes()}
    wait_until(lambda: not psutil.pid_exists(child)
               or psutil.Process(child).status() == psutil.STATUS_ZOMBIE,
               what="the orphan stopped by the harness")
