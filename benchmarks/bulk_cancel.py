"""How long a bulk cancel of 120,000 pending tasks takes, and how long it holds Redis at most.

    python -m benchmarks.bulk_cancel                  # 120,000 pending + 1,000 scheduled tasks
    python -m benchmarks.bulk_cancel --smoke          # 2,000 + 50: proves it runs
    python -m benchmarks.bulk_cancel --match 'x-*'    # only half of them (ids x-N and y-N)

Starts a private redis-server on a free loopback port, enqueues the tasks (enqueue_many), and
runs ``Queue.cancel_waiting`` (what ``blueque cancel --all QUEUE`` runs) with the server's
SLOWLOG recording every command slower than 100 µs: the longest one is the longest time Redis
was held, the batch scripts (cancel_pending.lua, cancel_scheduled.lua) being the bulk cancel's
only long commands (a threshold of 0 would log, and slow down, every command the scripts
call). ``INFO commandstats`` gives the mean script call. Prints the wall time, the tasks per
second, the script calls, the longest and the mean script call (server time), and compares
with one ``Client.cancel_task`` per task on a sample. Asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import time

import blueque
from blueque.testing import RedisServer

QUEUE = "bench-cancel"


def script_times(server_client: blueque.Client) -> list[float]:
    """Seconds each EVALSHA took on the server, from the SLOWLOG (all of it, then reset)."""
    entries = server_client.redis.slowlog_get(1_000_000)
    server_client.redis.slowlog_reset()
    return [entry["duration"] / 1e6 for entry in entries
            if _text(entry["command"]).upper().startswith("EVALSHA")]


def _text(command: bytes | str) -> str:
    return command.decode("utf-8", "replace") if isinstance(command, bytes) else command


def run(pending: int, scheduled: int, match: str | None) -> dict[str, float]:
    with RedisServer() as server:
        client = blueque.Client(server.url)
        queue = client.get_queue(QUEUE)
        ids = [f"{'x' if n % 2 else 'y'}-{n}" for n in range(pending)]
        for start in range(0, pending, 10_000):
            queue.enqueue_many(["{}"] * len(ids[start : start + 10_000]),
                               task_ids=ids[start : start + 10_000])
        later = time.time() + 86400
        for n in range(scheduled):
            queue.schedule("{}", later + n, task_id=f"x-later-{n}")
        client.redis.config_set("slowlog-max-len", 1_000_000)
        client.redis.config_set("slowlog-log-slower-than", 100)
        client.redis.slowlog_reset()
        client.redis.config_resetstat()
        started = time.perf_counter()
        done = queue.cancel_waiting(match=match, reason="benchmark")
        seconds = time.perf_counter() - started
        scripts = script_times(client)
        evalsha = client.redis.info("commandstats").get("cmdstat_evalsha", {})
        left = queue.stats()
        # one by one, as before: a sample of cancel_task calls (each reads the task first)
        sample = queue.task_ids("pending", 0, 199) or queue.enqueue_many(["{}"] * 200).task_ids
        started = time.perf_counter()
        for task_id in sample:
            client.cancel_task(task_id)
        one_by_one = (time.perf_counter() - started) / len(sample)
        client.close()
    return {"cancelled": done.cancelled, "pending_cancelled": done.pending,
            "scheduled_cancelled": done.scheduled, "calls": done.calls, "seconds": seconds,
            "longest_script": max(scripts, default=0.0),
            "mean_script": float(evalsha.get("usec_per_call", 0)) / 1e6,
            "left_pending": left.pending,
            "one_by_one": one_by_one}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=120_000, help="pending tasks")
    parser.add_argument("--scheduled", type=int, default=1_000)
    parser.add_argument("--match", help="an id pattern (ids are x-N and y-N, half each)")
    parser.add_argument("--smoke", action="store_true", help="2,000 + 50 tasks")
    args = parser.parse_args(argv)
    pending, scheduled = (2_000, 50) if args.smoke else (args.tasks, args.scheduled)
    print(f"bulk cancel of {pending:,} pending and {scheduled:,} scheduled tasks"
          + (f" matching {args.match!r}" if args.match else ""))
    figures = run(pending, scheduled, args.match)
    print(f"cancelled        {figures['cancelled']:,.0f} ({figures['pending_cancelled']:,.0f} "
          f"pending, {figures['scheduled_cancelled']:,.0f} scheduled; "
          f"{figures['left_pending']:,.0f} left pending)")
    print(f"wall time        {figures['seconds']:.2f} s "
          f"({figures['cancelled'] / figures['seconds']:,.0f} tasks/s)")
    print(f"script calls     {figures['calls']:,.0f}")
    print(f"longest call     {figures['longest_script'] * 1000:.2f} ms (server time, SLOWLOG)")
    print(f"mean call        {figures['mean_script'] * 1000:.2f} ms (INFO commandstats)")
    print(f"one by one       {figures['one_by_one'] * 1000:.2f} ms per cancel_task: "
          f"{figures['one_by_one'] * pending:,.0f} s for {pending:,}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
