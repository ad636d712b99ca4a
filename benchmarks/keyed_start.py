"""What a start costs Redis with a concurrency key or requires, against one without (issue 31).

    python -m benchmarks.keyed_start [--n 500] [--json FILE]

On a private redis-server (never 6379), a listener's start and ending are the daemon's own
store calls, in this process, over one connection: ``RedisStore.take`` (take.lua, move only:
the daemon's reservation when a slot is free, PROTOCOL.md 5.22), ``begin_run`` (the stamp
with the child's pid, 6.2) and ``finish`` (the ending, which releases a key's slot). For each
kind of task, ``n`` of them are enqueued, then each is started and ended in turn; ``INFO
commandstats`` (every command, those the scripts run included), its ``usec`` and ``INFO
stats`` ``total_reads_processed`` (round trips: a pipeline is one) are read before and after
the starts and the endings, net of the reads' own. The kinds:

- **unkeyed, LMOVE**: no option, reserved by ``LMOVE`` as the daemon did before issue 31;
- **unkeyed**: no option, reserved by take.lua (what every task costs now);
- **keyed**: ``concurrency_key`` with a limit it never reaches (a hold taken and released);
- **keyed, full**: a limit of 1: each start is followed by a take that finds the key full
  and moves the next task of the key to its waiting list (counted in the start), and each
  ending wakes it (counted in the ending);
- **requires**: ``requires={"gpu": 1}`` on a listener that offers ``gpu=1``.

Rows {label, value, unit}: per start and per ending, Redis commands, round trips and Redis
microseconds. It asserts nothing about speed; tests/test_benchmarks.py runs it small.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

import blueque
from blueque.endings import RunEnd
from blueque.store import RedisStore, Take, Taken
from blueque.testing import RedisServer

QUEUE = "bench"
LISTENER = "bench-node_1"


@dataclass(frozen=True)
class Cost:
    commands: float
    round_trips: float
    usec: float


def _stats(raw: redis.Redis) -> tuple[int, int, int]:
    stats = raw.info("commandstats")
    calls = sum(int(v["calls"]) for v in stats.values())
    usec = sum(int(v["usec"]) for v in stats.values())
    return calls, usec, int(raw.info("stats")["total_reads_processed"])


def measured(raw: redis.Redis, action: Callable[[], int]) -> Cost:
    """The cost of ``action`` (which returns how many it did), per one, net of the reads."""
    before = _stats(raw)
    count = action()
    after = _stats(raw)
    # the two reads of each _stats are seen by the next one: 2 commands (INFO), 2 reads
    calls, usec, reads = (a - b for a, b in zip(after, before, strict=True))
    return Cost((calls - 2) / count, (reads - 2) / count, usec / count)


def enqueue_kind(client: blueque.Client, kind: str, n: int) -> str:
    """``n`` tasks of ``kind``; the listener's free resources (JSON) for it."""
    options: dict[str, Any] = {}
    if kind.startswith("keyed"):
        client.set_limit("db-7", 1 if kind == "keyed, full" else n + 1)
        options["concurrency_key"] = "db-7"
    if kind == "requires":
        options["requires"] = {"gpu": 1}
    client.get_queue(QUEUE).enqueue_many(["{}"] * n, **options)
    return json.dumps({"gpu": 1}) if kind == "requires" else "{}"


def reserve(store: RedisStore, kind: str, resources: str) -> Taken | None:
    if kind == "unkeyed, LMOVE":  # the daemon's reservation before issue 31
        moved = store.move_pending(QUEUE, LISTENER, block=None)
        return None if moved is None else Taken(QUEUE, moved)
    return store.take(LISTENER, Take([QUEUE], resources=resources))


def run_kind(client: blueque.Client, kind: str, n: int) -> tuple[Cost, Cost]:
    store = client.store
    resources = enqueue_kind(client, kind, n)
    started: list[tuple[str, int]] = []

    def starts() -> int:
        for pid in range(1, n + 1):
            taken = reserve(store, kind, resources)
            if taken is None:
                break
            reservation = store.begin_run(QUEUE, LISTENER, taken.task_id, store.now(), pid,
                                          None, "bench-node", "{}", 3600)
            started.append((taken.task_id, int(reservation.detail)))
            if kind == "keyed, full":  # the next take finds the key full: to its waiting list
                assert reserve(store, kind, resources) is None
                break
        return len(started)

    def endings() -> int:
        for pid, (task_id, attempt) in enumerate(started, 1):
            store.finish(RunEnd(QUEUE, task_id, LISTENER, pid, attempt, "complete", "",
                                store.now()))
        return len(started)

    if kind != "keyed, full":
        return measured(client.redis, starts), measured(client.redis, endings)
    start_costs, end_costs = [], []
    for _ in range(n):  # one start (its key's next task waits) then its ending (it wakes)
        started.clear()
        start_costs.append(measured(client.redis, starts))
        end_costs.append(measured(client.redis, endings))
    return _mean(start_costs), _mean(end_costs)


def _mean(costs: list[Cost]) -> Cost:
    return Cost(*(sum(getattr(c, f) for c in costs) / len(costs)
                  for f in ("commands", "round_trips", "usec")))


KINDS = ("unkeyed, LMOVE", "unkeyed", "keyed", "keyed, full", "requires")


def rows(n: int) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    with RedisServer() as server:
        for kind in KINDS:
            raw = redis.Redis.from_url(server.url, decode_responses=True)
            client = blueque.Client(raw)
            for size in (2, n):  # the first: its connections made, its scripts loaded
                raw.flushall()
                start, end = run_kind(client, kind, size)
            for what, cost in (("start", start), ("ending", end)):
                found += [
                    {"label": f"{kind} {what}: Redis commands", "value": round(cost.commands, 2),
                     "unit": "commands"},
                    {"label": f"{kind} {what}: round trips", "value": round(cost.round_trips, 2),
                     "unit": "round trips"},
                    {"label": f"{kind} {what}: Redis time", "value": round(cost.usec, 1),
                     "unit": "us"}]
            client.close()
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=500, help="tasks of each kind")
    parser.add_argument("--json", type=Path, help="write the rows as JSON there too")
    args = parser.parse_args(argv)
    found = rows(args.n)
    width = max(len(row["label"]) for row in found)
    for row in found:
        print(f"{row['label']:<{width}}  {row['value']:>9}  {row['unit']}")
    if args.json:
        args.json.write_text(json.dumps({"n": args.n, "rows": found}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
