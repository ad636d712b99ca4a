"""Bad input to a listener: a corrupt policy field in a task hash stops neither the daemon nor
the sweep, and `blueque listen` with a bad Redis URL exits 2 with a clear error."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from blueque.keys import Keys
from tests.daemons import FAST, ROOT, listen_command

pytestmark = pytest.mark.slow

KEYS = Keys()


def test_corrupt_policy_field_neither_stops_daemon_nor_sweep(client, start, redis_client):  # type: ignore[no-untyped-def]
    daemon = start("work", "tests.jobs:echo", *FAST)
    queue = client.get_queue("work")
    bad = queue.enqueue(json.dumps({"value": "odd"}))
    redis_client.hset(KEYS.task(bad), "max_attempts", "inf")  # float() reads it; int() cannot
    good = queue.enqueue(json.dumps({"value": "fine"}))
    assert client.get_task(good).wait(20).status == "complete"
    assert client.get_task(bad).wait(20).status == "complete"
    assert daemon.alive()


def listen(url: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(listen_command(url, "work", "tests.jobs:echo"), cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("url", ["http://localhost:6379", "redis://localhost:port/0",
                                 "redis://localhost:6379/zero"])
def test_listen_with_a_bad_url_exits_2_with_a_clear_error(url):  # type: ignore[no-untyped-def]
    done = listen(url)
    assert done.returncode == 2
    assert done.stderr.startswith("blueque: error: ") and "Redis URL" in done.stderr
    assert "Traceback" not in done.stderr
