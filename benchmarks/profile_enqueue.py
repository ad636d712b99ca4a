"""Where the client's CPU goes per ``Queue.enqueue`` (and per ``enqueue_many`` task).

    python -m benchmarks.profile_enqueue [--n 5000]

Runs the calls against a private redis-server under cProfile (the standard library, so it runs
anywhere) and groups the self time of every function by layer: Blueque's own code, redis-py's
command machinery, the socket calls, uuid, the rest. cProfile inflates pure-Python layers, so
the shares matter more than the absolute figures; the total is also measured without the
profiler. For a sampling view, ``py-spy record -- python -m benchmarks.profile_enqueue``.

Then Redis' side of one enqueue: INFO commandstats over ``n`` calls (reset first), each
command the call runs (the script and the commands it runs itself), how many per enqueue and
their microseconds of Redis CPU per enqueue (the script's figure includes its commands').
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from collections.abc import Callable, Sequence

import redis

from blueque import Client
from blueque.queue import Queue
from blueque.testing import RedisServer

PARAMETERS = '{"n": 1, "kind": "benchmark"}'


def layer(filename: str, function: str) -> str:
    if "/blueque/" in filename:
        return "blueque"
    if "/redis/" in filename:
        return "redis-py"
    if "socket" in function or "sendall" in function or "recv" in function:
        return "socket I/O (kernel)"
    if filename.endswith("uuid.py"):
        return "uuid4"
    return "other (builtins, stdlib)"


def profile(body: Callable[[], None], per: int) -> tuple[float, dict[str, float]]:
    t0 = time.process_time()
    body()
    plain_us = (time.process_time() - t0) / per * 1e6
    profiler = cProfile.Profile()
    profiler.runcall(body)
    stats = pstats.Stats(profiler)
    shares: dict[str, float] = {}
    for (filename, _, function), row in stats.stats.items():  # type: ignore[attr-defined]
        tottime = row[2]
        name = layer(filename, function)
        shares[name] = shares.get(name, 0.0) + tottime
    total = sum(shares.values()) or 1.0
    return plain_us, {name: value / total for name, value in shares.items()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=5000)
    args = parser.parse_args(argv)
    with RedisServer() as server:
        client = Client(server.url)
        queue = client.get_queue("profile")
        for _ in range(100):
            queue.enqueue(PARAMETERS)
        batch = [PARAMETERS] * 1000

        def one_at_a_time() -> None:
            for _ in range(args.n):
                queue.enqueue(PARAMETERS)

        def bulk() -> None:
            for _ in range(max(1, args.n // 1000)):
                queue.enqueue_many(batch)

        for title, body, per in (("Queue.enqueue, one task per call", one_at_a_time, args.n),
                                 ("Queue.enqueue_many, 1,000 per call", bulk,
                                  max(1, args.n // 1000) * 1000)):
            plain_us, shares = profile(body, per)
            print(f"{title}: {plain_us:.1f} us of client CPU per task (without profiler)")
            for name, share in sorted(shares.items(), key=lambda item: -item[1]):
                print(f"  {share * 100:5.1f}%  {name}")
        server_side(client.redis, queue, args.n)
    return 0


def server_side(r: redis.Redis, queue: Queue, n: int) -> None:
    """Redis' commands and CPU per Queue.enqueue (INFO commandstats over ``n`` calls)."""
    r.config_resetstat()
    for _ in range(n):
        queue.enqueue(PARAMETERS)
    stats = {name.removeprefix("cmdstat_"): row for name, row in r.info("commandstats").items()
             if name.startswith("cmdstat_") and int(row["calls"]) >= n}
    print(f"Queue.enqueue, Redis' side (INFO commandstats over {n:,} calls)")
    for name, row in sorted(stats.items(), key=lambda item: -float(item[1]["usec"])):
        print(f"  {name.upper():10s} {int(row['calls']) / n:5.2f} per enqueue "
              f"{float(row['usec']) / n:6.2f} us")


if __name__ == "__main__":
    sys.exit(main())
