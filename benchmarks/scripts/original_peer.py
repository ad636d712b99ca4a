"""Measurements of the original blueque 1.0.1; runs inside its own virtualenv (redis<6).

Usage: python original_peer.py COMMAND --url URL [--n N] [--concurrency C] [--present P --op OP]
Commands: enqueue, memory, pickup, drain, scale, worker (the ForkingRunner the others start).
Prints one JSON object on stdout.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import benchcommon as bc

import blueque
from blueque.forking_runner import ForkingRunner

QUEUE = "bench"
PENDING = "blueque_pending_tasks_" + QUEUE
COMPLETE = "blueque_complete_tasks_" + QUEUE
LISTENERS = "blueque_listeners_" + QUEUE


def noop(task: object) -> str:
    return "null"


def line(task: object) -> str:
    bc.print_line()
    return "null"


def record(task: object) -> str:
    bc.record_first_line()
    return "null"


def enqueue(url: str, n: int) -> dict[str, float]:
    r = bc.connect(url)
    queue = blueque.Client(url).get_queue(QUEUE)
    for _ in range(20):
        queue.enqueue(bc.PARAMETERS)
    return bc.timed_calls(r, n, lambda: queue.enqueue(bc.PARAMETERS))


def memory(url: str, n: int) -> dict[str, float]:
    """Redis memory per task, pending and finished, as ForkingRunner leaves a no-op task and
    one that printed a line (the original keeps no output)."""
    r = bc.connect(url)
    queue = blueque.Client(url).get_queue(QUEUE)

    def listen(kind: str) -> Callable[[], None]:
        worker = start_workers(url, 1, kind)[0]
        return lambda: bc.stop_process(worker)  # type: ignore[arg-type]

    return bc.memory_per_task(r, lambda: queue.enqueue(bc.PARAMETERS),
                              lambda: r.llen(COMPLETE), listen, n)


def start_workers(url: str, count: int, op: str) -> list[object]:
    r = bc.connect(url)
    before = r.smembers(LISTENERS)  # new ids: one stopped just before may leave it meanwhile
    workers = [
        bc.start_process([sys.executable, __file__, "worker", "--url", url, "--op", op],
                         env={"BENCH_REDIS_URL": url})
        for _ in range(count)
    ]
    bc.wait_until(lambda: len(r.smembers(LISTENERS) - before) >= count, timeout=30)
    return workers


def pickup(url: str, n: int, spacing: float) -> dict[str, float]:
    r = bc.connect(url)
    queue = blueque.Client(url).get_queue(QUEUE)
    workers = start_workers(url, 1, "record")
    try:
        return bc.pickup_latencies(
            r, lambda: queue.enqueue(bc.PARAMETERS), lambda: r.llen(COMPLETE), n, spacing
        )
    finally:
        for worker in workers:
            bc.stop_process(worker)  # type: ignore[arg-type]


def drain(url: str, n: int, concurrency: int) -> dict[str, float]:
    r = bc.connect(url)
    queue = blueque.Client(url).get_queue(QUEUE)
    for _ in range(n):
        queue.enqueue(bc.PARAMETERS)
    workers = start_workers(url, concurrency, "noop")
    try:
        return bc.drain_rate(lambda: r.llen(COMPLETE), n, timeout=n * 0.1 + 30, r=r)
    finally:
        for worker in workers:
            bc.stop_process(worker)  # type: ignore[arg-type]


def scale(url: str, n: int, present: int, op: str) -> dict[str, float]:
    """Microseconds per enqueue, pickup (reserve + mark reserved) or finished-task deletion
    with ``present`` tasks already in the pending (or complete) list."""
    r = bc.connect(url)
    client = blueque.Client(url)
    queue = client.get_queue(QUEUE)
    now = repr(time.time())
    status = "complete" if op == "delete" else "pending"
    # pickups and deletions consume tasks: fill enough that ``present`` remain at every
    # timed call (and the original's listen() never meets an empty queue, where it sleeps)
    filled = present if op == "enqueue" else present + n + bc.WARMUP
    target = COMPLETE if op == "delete" else PENDING
    bc.fill(r, target, "blueque_task_", "fill-", filled,
            {"status": status, "queue": QUEUE, "parameters": bc.PARAMETERS,
             "created": now, "updated": now, "result": "null"})
    if op == "enqueue":
        us = bc.per_op(n, lambda i: queue.enqueue(bc.PARAMETERS))
    elif op == "pickup":
        listener = client.get_listener(QUEUE)
        us = bc.per_op(n, lambda i: listener.listen())
    else:
        oldest = list(reversed(r.lrange(COMPLETE, -(n + 10), -1)))
        us = bc.per_op(n, lambda i: queue.delete_task(client.get_task(oldest[i])))
    return us


def worker(url: str, op: str) -> None:
    callback = {"record": record, "line": line}.get(op, noop)
    ForkingRunner(blueque.Client(url), QUEUE, callback).run()


def main() -> None:
    args = bc.parser(__doc__ or "").parse_args()
    if args.command == "worker":
        worker(args.url, args.op)
        return
    if args.command == "enqueue":
        result = enqueue(args.url, args.n)
    elif args.command == "memory":
        result = memory(args.url, args.n)
    elif args.command == "pickup":
        result = pickup(args.url, args.n, args.spacing)
    elif args.command == "drain":
        result = drain(args.url, args.n, args.concurrency)
    elif args.command == "scale":
        result = scale(args.url, args.n, args.present, args.op)
    else:
        raise SystemExit(f"unknown command {args.command}")
    bc.emit(result)


if __name__ == "__main__":
    main()
