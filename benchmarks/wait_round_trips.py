"""How many Redis round trips ``blueque wait`` costs on 10,000 tasks.

    python -m benchmarks.wait_round_trips              # 10,000 tasks, 3 runs per scenario
    python -m benchmarks.wait_round_trips --smoke      # 200 tasks, 1 run: proves it runs

Starts a private redis-server on a free loopback port and runs ``blueque wait`` in this process
(``blueque.cli.main``, stdout discarded) in three scenarios:

- *finished*: every task is complete before the wait starts;
- *idle*: no task finishes; the wait gives up after ``--timeout 3`` (the cost of waiting);
- *finishing*: another thread finishes the tasks, 100 at a time every 20 ms, as finish.lua
  does for a waiter (``HSET status complete`` and ``PUBLISH blueque_done_[queue] id``).

A round trip is one request the waiter's thread sends (one command, or one pipeline however
many commands it holds: redis-py's ``send_packed_command``), counted in that thread only; the
commands are the server's ``INFO commandstats`` total over the wait, less the writer's. Prints
the median of the runs and their range. Asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import redis
import redis.connection

import blueque
from blueque import cli
from blueque import keys as k
from blueque.statuses import COMPLETE
from blueque.testing import RedisServer

QUEUE = "bench-wait"
BATCH = 100
BATCH_EVERY = 0.02


@contextlib.contextmanager
def counting(thread: threading.Thread) -> Iterator[list[int]]:
    """Counts the requests ``thread`` sends while the block runs (one per packed send)."""
    count = [0]
    original: Callable[..., None] = redis.connection.AbstractConnection.send_packed_command

    def send(self: Any, command: Any, check_health: bool = True) -> None:
        if threading.current_thread() is thread:
            count[0] += 1
        original(self, command, check_health)

    redis.connection.AbstractConnection.send_packed_command = send  # type: ignore[method-assign]
    try:
        yield count
    finally:
        redis.connection.AbstractConnection.send_packed_command = original  # type: ignore[method-assign]


def commands_run(admin: redis.Redis) -> int:
    stats = admin.info("commandstats")
    return sum(int(v["calls"]) for name, v in stats.items() if name != "cmdstat_info")


def finish(admin: redis.Redis, keys: k.Keys, ids: list[str]) -> None:
    """What finish.lua does that a waiter sees: the status, then the publish."""
    pipe = admin.pipeline(transaction=False)
    for task_id in ids:
        pipe.hset(keys.task(task_id), "status", COMPLETE)
        pipe.publish(keys.done_channel(QUEUE), task_id)
    pipe.execute()


def run_wait(url: str, ids: list[str], *extra: str) -> tuple[int, int]:
    """Round trips of one ``blueque wait`` in this thread, and its exit code (its output
    discarded)."""
    with counting(threading.current_thread()) as count, \
            contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = cli.main(["wait", *ids, "--url", url, "--progress", "never", *extra])
    return count[0], code


def scenario(server: RedisServer, tasks: int, name: str) -> tuple[int, int, float]:
    """(round trips, commands the waiter caused, seconds) of one run of ``name``."""
    admin = redis.Redis(port=server.port, decode_responses=True)
    admin.flushdb()  # our private server only
    client = blueque.Client(server.url)
    keys = client.keys
    ids = list(client.get_queue(QUEUE).enqueue_many(["{}"] * tasks).task_ids)
    writer: threading.Thread | None = None
    written = [0]
    if name == "finished":
        for start in range(0, tasks, BATCH):
            finish(admin, keys, ids[start : start + BATCH])
    elif name == "finishing":
        def write() -> None:
            writer_admin = redis.Redis(port=server.port, decode_responses=True)
            for start in range(0, tasks, BATCH):
                time.sleep(BATCH_EVERY)
                finish(writer_admin, keys, ids[start : start + BATCH])
                written[0] += 2 * len(ids[start : start + BATCH])
            writer_admin.close()

        writer = threading.Thread(target=write)
    before = commands_run(admin)
    started = time.monotonic()
    if writer is not None:
        writer.start()
    trips, code = run_wait(server.url, ids, *(["--timeout", "3"] if name == "idle" else []))
    seconds = time.monotonic() - started
    if writer is not None:
        writer.join()
    commands = commands_run(admin) - before - written[0]
    expected = 1 if name == "idle" else 0
    assert code == expected, f"{name}: blueque wait exited {code}, not {expected}"
    client.close()
    admin.close()
    return trips, commands, seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="200 tasks, 1 run")
    args = parser.parse_args(argv)
    tasks, runs = (200, 1) if args.smoke else (args.tasks, args.runs)
    print(f"blueque wait on {tasks:,} tasks: median of {runs} run(s) [min-max]")
    print(f"{'scenario':<10} {'round trips':>22} {'commands':>26} {'seconds':>8}")
    with RedisServer() as server:
        for name in ("finished", "idle", "finishing"):
            results = [scenario(server, tasks, name) for _ in range(runs)]
            trips, commands, seconds = zip(*results, strict=True)
            print(f"{name:<10} {_spread(trips):>22} {_spread(commands):>26} "
                  f"{statistics.median(seconds):8.2f}")
    return 0


def _spread(values: tuple[int, ...] | tuple[float, ...],
            show: Callable[[float], str] = lambda v: f"{v:,.0f}") -> str:
    return f"{show(statistics.median(values))} [{show(min(values))}-{show(max(values))}]"


if __name__ == "__main__":
    raise SystemExit(main())
