"""The floor for a Python client: plain redis-py sending the minimum one task needs.

One task is a hash (status, queue, parameters, created, updated) and its id LPUSHed onto the
pending list: ``loop`` sends those two commands per task in one round trip (a non-transactional
pipeline); ``bulk`` sends 1,000 tasks' worth of them per pipeline. ``lpush`` is the floor of
any enqueue: one bare ``LPUSH`` of a task id per call, no hash at all (the yardstick of issue
11's "enqueue near the one-command floor").

Usage: python raw_redis.py loop|lpush|bulk --url URL [--n N] [--batch B]. Prints one JSON
object.
"""

from __future__ import annotations

import time
import uuid

import benchcommon as bc

QUEUE = "bench"
PENDING = "blueque_pending_tasks_" + QUEUE


def add_task(pipe: object) -> None:
    task_id = str(uuid.uuid4())
    now = repr(time.time())
    pipe.hset(  # type: ignore[attr-defined]
        "blueque_task_" + task_id,
        mapping={"status": "pending", "queue": QUEUE, "parameters": bc.PARAMETERS,
                 "created": now, "updated": now},
    )
    pipe.lpush(PENDING, task_id)  # type: ignore[attr-defined]


def loop(url: str, n: int) -> dict[str, float]:
    r = bc.connect(url)

    def one() -> None:
        pipe = r.pipeline(transaction=False)
        add_task(pipe)
        pipe.execute()

    for _ in range(20):
        one()
    return bc.timed_calls(r, n, one)


def lpush(url: str, n: int) -> dict[str, float]:
    r = bc.connect(url)
    for _ in range(20):
        r.lpush(PENDING, str(uuid.uuid4()))
    return bc.timed_calls(r, n, lambda: r.lpush(PENDING, str(uuid.uuid4())))


def bulk(url: str, n: int, batch: int) -> dict[str, float]:
    r = bc.connect(url)

    def many() -> None:
        pipe = r.pipeline(transaction=False)
        for _ in range(batch):
            add_task(pipe)
        pipe.execute()

    many()

    def body() -> None:
        for _ in range(n // batch):
            many()

    return bc.timed(r, n // batch * batch, body)


def main() -> None:
    args = bc.parser(__doc__ or "").parse_args()
    if args.command == "loop":
        bc.emit(loop(args.url, args.n))
    elif args.command == "lpush":
        bc.emit(lpush(args.url, args.n))
    elif args.command == "bulk":
        bc.emit(bulk(args.url, args.n, args.batch))
    else:
        raise SystemExit(f"unknown command {args.command}")


if __name__ == "__main__":
    main()
