"""What task dependencies (``after=``, PROTOCOL.md 5.21) cost.

    python -m benchmarks.dependencies          # 2,000 enqueues, 200 releases, 10,000 edges
    python -m benchmarks.dependencies --smoke  # 100, 10, 1,000: proves it runs

Starts a private redis-server on a free loopback port and measures, one client, loopback:

- enqueue: one ``Queue.enqueue`` per task, without ``after=`` and with ``after=`` one parent
  (that has not ended: the task waits), in ms per task;
- release latency: a real ``blueque listen`` runs a parent; the time from the parent's
  ``finished_at`` to its dependent's ``started_at`` (both written on Redis' clock by the
  listener), median and 95th percentile over sequential pairs;
- memory: ``INFO memory`` used_memory before and after one task enqueued after N parents,
  per edge (the awaited set's member and the parent's dependents set).

Prints a table; asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import blueque
from blueque.task import Task
from blueque.testing import RedisServer, stop_process

QUEUE = "bench-deps"
ROOT = Path(__file__).resolve().parent.parent


def job(task: Task) -> str:
    """The listener's task function: nothing, so the figures are Blueque's own."""
    return "done"


def enqueue_ms(client: blueque.Client, count: int) -> tuple[float, float]:
    """ms per enqueue without after=, then with after= one (pending) parent."""
    queue = client.get_queue(QUEUE + "-enqueue")
    started = time.perf_counter()
    for _ in range(count):
        queue.enqueue("{}")
    plain = (time.perf_counter() - started) / count * 1000
    parent = queue.enqueue("{}")
    started = time.perf_counter()
    for _ in range(count):
        queue.enqueue("{}", after=parent)
    after = (time.perf_counter() - started) / count * 1000
    return plain, after


def release_latencies(client: blueque.Client, url: str, pairs: int) -> list[float]:
    """Seconds from each parent's finished_at to its dependent's started_at, one pair at a
    time, run by a real listener."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    listener = subprocess.Popen(
        [sys.executable, "-m", "blueque.cli", "listen", QUEUE, "benchmarks.dependencies:job",
         "--url", url, "--interval", "1", "--poll", "0.1"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        queue, found = client.get_queue(QUEUE), []
        for _ in range(pairs):
            parent = queue.enqueue("{}")
            child = client.get_task(queue.enqueue("{}", after=parent)).wait(timeout=60)
            finished = client.get_task(parent).finished_at
            assert finished is not None and child.started_at is not None
            found.append(child.started_at - finished)
        return found
    finally:
        stop_process(listener)


def bytes_per_edge(client: blueque.Client, edges: int) -> float:
    """used_memory growth per edge of one task enqueued after ``edges`` parents."""
    queue = client.get_queue(QUEUE + "-memory")
    parents = queue.enqueue_many(["{}"] * edges).task_ids
    before = int(client.redis.info("memory")["used_memory"])
    queue.enqueue("{}", after=parents)
    after = int(client.redis.info("memory")["used_memory"])
    return (after - before) / edges


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dependencies")
    parser.add_argument("--smoke", action="store_true", help="small counts: proves it runs")
    args = parser.parse_args(argv)
    count, pairs, edges = (100, 10, 1000) if args.smoke else (2000, 200, 10_000)
    with RedisServer() as server:
        client = blueque.Client(server.url)
        plain, after = enqueue_ms(client, count)
        latencies = sorted(release_latencies(client, server.url, pairs))
        per_edge = bytes_per_edge(client, edges)
    p95 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.95))]
    print(f"enqueue without after=            {plain:8.3f} ms per task ({count} tasks)")
    print(f"enqueue with after= (one parent)  {after:8.3f} ms per task ({count} tasks)")
    print(f"parent's end -> dependent starts  {statistics.median(latencies) * 1000:8.1f} ms "
          f"median, {p95 * 1000:.1f} ms p95 ({pairs} pairs, a real listener)")
    print(f"Redis memory per dependency edge  {per_edge:8.1f} bytes ({edges} parents of one "
          f"task)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
