"""Measurements of RQ with its forking Worker; runs inside RQ's own virtualenv.

Usage: python rq_peer.py COMMAND --url URL [--n N] [--concurrency C] [--batch B] [--op OP]
Commands: enqueue, bulk, memory, pickup, drain, worker. Prints one JSON object on stdout.
``drain --op simple`` (and ``worker --op simple``) use RQ's SimpleWorker, which runs each job in
the worker process itself (no fork): the fastest drain RQ offers, at the price of isolation.
Jobs are enqueued by function name ("rq_peer.noop") with the same parameters string the other
systems enqueue, so the worker imports this file as a module.
"""

from __future__ import annotations

import sys

import benchcommon as bc
from rq import Queue, SimpleWorker, Worker

QUEUE = "bench"
NOOP = "rq_peer.noop"
RECORD = "rq_peer.record"


def noop(parameters: str) -> None:
    return None


def record(parameters: str) -> None:
    bc.record_first_line()


def queue_for(url: str) -> Queue:
    return Queue(QUEUE, connection=bc.connect(url, decode=False))


def finished_count(r: object, queue: Queue) -> int:
    return int(r.zcard(queue.finished_job_registry.key))  # type: ignore[attr-defined]


def enqueue(url: str, n: int) -> dict[str, float]:
    queue = queue_for(url)
    for _ in range(20):
        queue.enqueue(NOOP, bc.PARAMETERS)
    return bc.timed_calls(bc.connect(url), n, lambda: queue.enqueue(NOOP, bc.PARAMETERS))


def bulk(url: str, n: int, batch: int) -> dict[str, float]:
    queue = queue_for(url)

    def many() -> None:
        queue.enqueue_many([Queue.prepare_data(NOOP, args=(bc.PARAMETERS,)) for _ in range(batch)])

    many()

    def body() -> None:
        for _ in range(n // batch):
            many()

    return bc.timed(bc.connect(url), n // batch * batch, body)


def memory(url: str, n: int) -> dict[str, float]:
    r = bc.connect(url)
    queue = queue_for(url)
    worker = SimpleWorker([queue], connection=queue.connection)
    queue.enqueue(NOOP, bc.PARAMETERS)
    worker.work(burst=True, logging_level="ERROR")  # creates registries and worker keys once
    base = bc.used_memory(r)
    for _ in range(n):
        queue.enqueue(NOOP, bc.PARAMETERS)
    pending = bc.used_memory(r)
    worker.work(burst=True, logging_level="ERROR")
    finished = bc.used_memory(r)
    return {"pending_bytes": (pending - base) / n, "finished_bytes": (finished - base) / n}


def start_workers(url: str, count: int, kind: str = "fork") -> list[object]:
    r = bc.connect(url)
    workers = [
        bc.start_process([sys.executable, __file__, "worker", "--url", url, "--op", kind],
                         env={"BENCH_REDIS_URL": url})
        for _ in range(count)
    ]
    bc.wait_until(lambda: r.scard("rq:workers:" + QUEUE) >= count, timeout=30)
    return workers


def pickup(url: str, n: int, spacing: float) -> dict[str, float]:
    r = bc.connect(url)
    queue = queue_for(url)
    workers = start_workers(url, 1)
    try:
        return bc.pickup_latencies(
            r, lambda: queue.enqueue(RECORD, bc.PARAMETERS),
            lambda: finished_count(r, queue), n, spacing,
        )
    finally:
        for worker in workers:
            bc.stop_process(worker)  # type: ignore[arg-type]


def drain(url: str, n: int, concurrency: int, batch: int, kind: str) -> dict[str, float]:
    r = bc.connect(url)
    queue = queue_for(url)
    for start in range(0, n, batch):
        count = min(batch, n - start)
        queue.enqueue_many([Queue.prepare_data(NOOP, args=(bc.PARAMETERS,)) for _ in range(count)])
    workers = start_workers(url, concurrency, kind)
    try:
        return bc.drain_rate(lambda: finished_count(r, queue), n, timeout=n * 0.1 + 30,
                             r=r)
    finally:
        for worker in workers:
            bc.stop_process(worker)  # type: ignore[arg-type]


def worker(url: str, kind: str) -> None:
    queue = queue_for(url)
    worker_class = SimpleWorker if kind == "simple" else Worker
    worker_class([queue], connection=queue.connection).work(logging_level="ERROR")


def main() -> None:
    args = bc.parser(__doc__ or "").parse_args()
    if args.command == "worker":
        worker(args.url, args.op)
        return
    if args.command == "enqueue":
        result = enqueue(args.url, args.n)
    elif args.command == "bulk":
        result = bulk(args.url, args.n, args.batch)
    elif args.command == "memory":
        result = memory(args.url, args.n)
    elif args.command == "pickup":
        result = pickup(args.url, args.n, args.spacing)
    elif args.command == "drain":
        result = drain(args.url, args.n, args.concurrency, args.batch, args.op)
    else:
        raise SystemExit(f"unknown command {args.command}")
    bc.emit(result)


if __name__ == "__main__":
    main()
