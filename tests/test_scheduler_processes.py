"""Real `blueque scheduler` and `blueque demo` processes against the private redis-server.

Two schedulers race: over 1,000 due tasks (each enqueued exactly once) and over a per-second
cron entry (each tick fired exactly once, none skipped). Every process is stopped by pid."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import redis

import blueque
from blueque.keys import Keys
from blueque.testing import wait_for
from tests.daemons import KEEP_ENVIRON

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
KEYS = Keys()


class Processes:
    """Started processes, logged to files; all stopped by pid at the end."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.started: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(self, *arguments: str, env: dict[str, str] | None = None
              ) -> subprocess.Popen[bytes]:
        log = self.directory / f"process{len(self.started)}.log"
        with log.open("wb") as stream:
            process = subprocess.Popen(
                [sys.executable, "-m", "blueque.cli", *arguments], cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
                stdin=subprocess.DEVNULL, stdout=stream, stderr=subprocess.STDOUT)
        self.started.append((process, log))
        return process

    def log(self, process: subprocess.Popen[bytes]) -> str:
        return next(log for p, log in self.started if p is process).read_text()

    def stop_all(self) -> list[int]:
        codes = []
        for process, _ in self.started:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.kill(process.pid, signal.SIGKILL)
                    process.wait()
            codes.append(process.returncode)
        return codes


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    started = Processes(tmp_path)
    try:
        yield started
    finally:
        started.stop_all()


def test_two_schedulers_race_over_1000_due_tasks(redis_url, client, redis_client,  # type: ignore[no-untyped-def]
                                                 processes) -> None:
    schedulers = [processes.start("scheduler", "--url", redis_url, "--interval", "0.005",
                                  "--recovery-interval", "3600") for _ in range(2)]
    wait_for(lambda: all("scheduler started" in processes.log(s) for s in schedulers),
             timeout=30)
    queue = client.get_queue("race")
    first_due = time.time() + 0.5
    # etas spread over 1.5 s so both schedulers move tasks in many small steps
    ids = [queue.schedule(str(n), first_due + n * 0.0015, task_id=f"due-{n:04d}")
           for n in range(1000)]
    wait_for(lambda: redis_client.zcard(KEYS.scheduled("race")) == 0, timeout=60)
    wait_for(lambda: redis_client.llen(KEYS.pending("race")) >= 1000, timeout=30)
    assert processes.stop_all() == [0, 0]

    pending = redis_client.lrange(KEYS.pending("race"), 0, -1)
    assert Counter(pending) == Counter(ids)  # each exactly once
    statuses = Counter(redis_client.hget(KEYS.task(i), "status") for i in ids)
    assert statuses == {"pending": 1000}
    moved = [sum(int(n) for n in re.findall(r"enqueued (\d+) due task", processes.log(s)))
             for s in schedulers]
    assert sum(moved) == 1000  # the schedulers' own accounts agree: nothing moved twice
    print(f"\n1000 due tasks moved by two racing schedulers: {moved[0]} + {moved[1]}")


def test_two_schedulers_fire_each_cron_tick_exactly_once(redis_url, redis_client,  # type: ignore[no-untyped-def]
                                                         processes) -> None:
    spec = 'beat=* * * * * *:cron:{"source": "test"}'
    schedulers = [processes.start("scheduler", "--url", redis_url, "--interval", "0.05",
                                  "--cron", spec) for _ in range(2)]
    wait_for(lambda: redis_client.hexists(KEYS.cron(), "beat"), timeout=30)
    registered = int(redis_client.hget(KEYS.cron(), "beat"))  # type: ignore[arg-type]
    wait_for(lambda: int(redis_client.hget(KEYS.cron(), "beat")) >= registered + 5,  # type: ignore[arg-type]
             timeout=30)
    assert processes.stop_all() == [0, 0]

    last = int(redis_client.hget(KEYS.cron(), "beat"))  # type: ignore[arg-type]
    expected = [f"cron-beat-{tick}" for tick in range(registered + 1, last + 1)]
    pending = redis_client.lrange(KEYS.pending("cron"), 0, -1)
    assert sorted(pending) == expected  # none doubled, none skipped
    assert redis_client.hget(KEYS.task(expected[0]), "parameters") == '{"source": "test"}'
    fired = [[line.split("tick ")[1].split(" ")[0] for line in processes.log(s).splitlines()
              if "fired tick" in line] for s in schedulers]
    assert sorted(f"cron-beat-{tick}" for tick in fired[0] + fired[1]) == expected
    print(f"\n{len(expected)} cron ticks fired by two schedulers: "
          f"{len(fired[0])} + {len(fired[1])}")


def _processes_with(marker: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get("BLUEQUE_TEST_MARKER") == marker:
                found.append(process)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found


def test_demo_runs_to_the_end_and_leaves_no_process_behind(tmp_path: Path) -> None:
    marker = f"demo-{os.getpid()}-{time.time()}"
    # KEEP_ENVIRON: the listener's and its task processes' titles would erase the marker
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BLUEQUE_TEST_MARKER": marker,
           **KEEP_ENVIRON}
    env.pop("BLUEQUE_URL", None)
    process = subprocess.Popen([sys.executable, "-m", "blueque.cli", "demo"], cwd=tmp_path,
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        out, err = process.communicate(timeout=180)
    finally:
        if process.poll() is None:
            for child in psutil.Process(process.pid).children(recursive=True):
                child.kill()
            process.kill()
            process.wait()
    assert process.returncode == 0, out + err
    assert "7 of 7 tasks complete, the long task cancelled: demo OK" in out
    assert out.count("complete  ") >= 7 and "cancelled" in out
    assert re.search(r"stopped the listener \(pid \d+, exit code 0\)", out)
    assert re.search(r"stopped the scheduler \(pid \d+, exit code 0\)", out)
    assert "stopped the redis-server" in out
    assert "8/8 finished, 0 failed, 1 cancelled" in err  # the progress bar: cancelled apart
    leftovers = _processes_with(marker)
    for leftover in leftovers:  # clean up before failing
        leftover.kill()
    assert leftovers == []


def test_demo_on_a_given_url(redis_url: str, redis_client: redis.Redis, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "blueque.cli", "demo", "--url", redis_url,
                           "--queue", "my-demo"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "redis-server" not in done.stdout  # no private server: the given one was used
    assert redis_client.llen(KEYS.complete("my-demo")) == 7
    assert redis_client.llen(KEYS.failed("my-demo")) == 0
    assert redis_client.llen(KEYS.cancelled("my-demo")) == 1  # the long task: cancelled
    assert blueque.Client(redis_url).get_queue("my-demo").stats().listeners == 0
