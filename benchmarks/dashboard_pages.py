"""How long each dashboard page takes with 10,000 tasks per queue and state, and with a queue
of 120,000 pending tasks.

    python -m benchmarks.dashboard_pages                # 3 queues x 10,000 per state + 120,000
    python -m benchmarks.dashboard_pages --smoke        # seconds: proves it runs

Starts a private redis-server on a free loopback port, fills each queue through Blueque's own
operations (enqueue_many, then reserve/start/finish for the finished ones) with N pending, N
complete, N failed, N/10 scheduled tasks and a few running ones held by a registered listener,
gives one failed task the output of 5 attempts (64 KiB each, the most its log stream keeps of
an attempt), fills queue ``big`` with --pending pending tasks (120,000) and a week of hourly
outcome counters, starts a real `blueque dashboard` process, and times full HTTP requests of every
page from this process (server rendering + transfer; no browser). Prints median, p95 and max
per page in milliseconds. Asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlencode

import blueque
from blueque.statuses import FAILED
from blueque.tasklog import TAIL_BYTES
from blueque.testing import RedisServer, stop_process

ROOT = Path(__file__).resolve().parent.parent
RUNNING = 8  # tasks per queue left started, held by one registered listener (--running)


def fill(client: blueque.Client, queue_name: str, per_state: int, running_count: int = RUNNING
         ) -> list[str]:
    """per_state pending, complete and failed tasks, per_state/10 scheduled, running_count
    started."""
    queue = client.get_queue(queue_name)
    params = json.dumps({"document": "x" * 200, "pages": list(range(20))})
    finished = per_state * 2 + running_count
    queue.enqueue_many([params] * finished)
    listener = client.get_listener(queue_name)
    running = []
    for n in range(finished):
        task = listener.reserve()
        assert task is not None
        processor = client.get_processor(task)
        processor.start(100_000 + n)
        if n < per_state:
            processor.complete(json.dumps({"pages": 20, "ok": True}))
        elif n < 2 * per_state:
            processor.fail("Traceback (most recent call last):\n  File \"job.py\", line 3\n"
                           "ValueError: page 7 is unreadable")
        else:
            processor.progress(0.5, "half way")
            running.append(task.id)
    queue.enqueue_many([params] * per_state)
    now = time.time()
    for n in range(per_state // 10):
        queue.schedule(params, now + 60 + n)
    return running


def give_output(client: blueque.Client, task_id: str, attempts: int = 5) -> None:
    """The output of a task that ran ``attempts`` times, each printing 64 KiB (what Redis
    keeps of an attempt) in 4 KiB shipments, then ended (its tail moved to the task's output
    tails): the heaviest task page there is."""
    line = "page 0007: OCR confidence 0.93, 412 words, 3 tables\n"
    chunk = line * (4096 // len(line))
    for attempt in range(1, attempts + 1):
        for n in range(TAIL_BYTES // len(chunk)):
            client.store.append_output(task_id, str(attempt), chunk, (n + 1) * len(chunk))
        client.store.end_output(task_id, str(attempt), "", TAIL_BYTES, 7 * 86400 * 1000,
                                TAIL_BYTES)


def start_dashboard(url: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(log, "ab") as handle:
        process = subprocess.Popen(
            [sys.executable, "-m", "blueque.cli", "dashboard", "--url", url, "--port",
             str(port), "--cron", "nightly=0 3 * * *:queue0"],
            cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5):
                return process
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                raise SystemExit(f"the dashboard did not start: see {log}") from None
            time.sleep(0.1)


def timed(url: str) -> tuple[float, int]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as response:
        size = len(response.read())
        assert response.status == 200, url
    return (time.perf_counter() - started) * 1000, size


def fill_big(client: blueque.Client, pending: int) -> None:
    """``pending`` tasks in queue ``big`` (enqueue_many, 10,000 a call) and a week of hourly
    outcome counters, as the scripts would have left them."""
    queue = client.get_queue("big")
    params = json.dumps({"document": "x" * 200, "pages": list(range(20))})
    for start in range(0, pending, 10_000):
        queue.enqueue_many([params] * min(10_000, pending - start))
    hour = int(client.store.now() // 3600 * 3600)
    pipe = client.store.redis.pipeline(transaction=False)
    for back in range(168):
        pipe.hset(client.store.keys.finished_per_hour("big", str(hour - back * 3600)),
                  mapping={"complete": 400 + back, "failed": back % 7, "retry": back % 3})
    pipe.execute()


def pages(queues: int, per_state: int, running: str, some_failed: str, pending: int
          ) -> list[str]:
    last = max(1, -(-per_state // 50))
    return [
        "/",
        "/nodes",
        "/schedule",
        "/metrics",
        "/queue?" + urlencode({"name": "queue0", "state": "pending"}),
        "/queue?" + urlencode({"name": "queue0", "state": "pending", "page": last}),
        "/queue?" + urlencode({"name": "queue0", "state": "complete", "page": last // 2}),
        "/queue?" + urlencode({"name": "queue0", "state": "failed"}),
        "/queue?" + urlencode({"name": "queue0", "state": "scheduled"}),
        "/queue?" + urlencode({"name": "queue0", "state": "started"}),
        "/queue?" + urlencode({"name": "queue0", "id": some_failed}),
        "/?range=24h",
        "/?range=7d",
        "/redis",
        "/queue?" + urlencode({"name": "big", "state": "pending"}),
        "/queue?" + urlencode({"name": "big", "state": "pending", "page": -(-pending // 50)}),
        "/queue?" + urlencode({"name": "big", "id": "no-such-prefix"}),
        "/queue?" + urlencode({"name": "big", "node": "no-such-node"}),
        "/queue?" + urlencode({"name": "big", "created_from": "2020-01-01T00:00",
                               "created_to": "2021-01-01T00:00", "offset": pending // 2}),
        "/task?" + urlencode({"id": running}),
        "/task?" + urlencode({"id": some_failed}),
        "/task?" + urlencode({"id": some_failed, "attempt": 1}),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queues", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=10_000, help="per queue and state")
    parser.add_argument("--repeat", type=int, default=30, help="requests per page")
    parser.add_argument("--running", type=int, default=RUNNING,
                        help=f"started tasks per queue (default {RUNNING})")
    parser.add_argument("--pending", type=int, default=120_000,
                        help="pending tasks of queue big (default 120,000)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: proves it runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.queues, args.tasks, args.repeat, args.pending = 2, 60, 2, 3000
    with RedisServer() as server:
        client = blueque.Client(server.url)
        started = time.monotonic()
        running = []
        for n in range(args.queues):
            running += fill(client, f"queue{n}", args.tasks, args.running)
        some_failed = client.get_queue("queue0").task_ids(FAILED, 5, 5)[0]
        give_output(client, some_failed)
        fill_big(client, args.pending)
        print(f"filled {args.queues} queue(s) x ({args.tasks} pending, complete, failed; "
              f"{args.tasks // 10} scheduled; {args.running} started) and big "
              f"({args.pending} pending) in "
              f"{time.monotonic() - started:.0f} s")
        log = Path(os.environ.get("TMPDIR", "/tmp")) / f"dashboard-bench-{os.getpid()}.log"
        port = _free_port()
        process = start_dashboard(server.url, port, log)
        try:
            base = f"http://127.0.0.1:{port}"
            print(f"{'page':<58} {'median':>8} {'p95':>8} {'max':>8} {'bytes':>8}")
            worst = 0.0
            for page in pages(args.queues, args.tasks, running[0], some_failed, args.pending):
                timed(base + page)  # warm: template compiled, scripts loaded
                figures = [timed(base + page) for _ in range(args.repeat)]
                times = sorted(ms for ms, _ in figures)
                p95 = times[min(len(times) - 1, int(len(times) * 0.95))]
                worst = max(worst, times[-1])
                print(f"{page[:58]:<58} {statistics.median(times):8.1f} {p95:8.1f} "
                      f"{times[-1]:8.1f} {figures[-1][1]:8d}")
            print(f"slowest single request: {worst:.1f} ms")
        finally:
            stop_process(process)
    return 0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


if __name__ == "__main__":
    sys.exit(main())
