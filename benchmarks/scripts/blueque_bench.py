"""Measurements of Blueque itself; runs in the interpreter Blueque is installed in.

Usage: python blueque_bench.py COMMAND --url URL [--n N] [--batch B] [--present P --op OP]
Commands: enqueue, aio_enqueue, bulk, memory, scale, pickup, drain, recovery (each prints one
JSON object), and runner (a ForkingRunner program, for the drain).
The daemon scenarios start ``blueque listen`` (python -m blueque.cli) with the task functions of
benchmarks/scripts/bench_tasks.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable

import benchcommon as bc

import blueque
import blueque.aio

QUEUE = "bench"
#: The listeners' task output directory: this run's own, so that no file left by earlier runs
#: (or by anything else on the machine) weighs on the figures; removed when the script exits.
TASK_LOGS = tempfile.TemporaryDirectory(prefix="blueque-bench-task-logs-")


def enqueue(url: str, n: int) -> dict[str, float]:
    client = blueque.Client(url)
    queue = client.get_queue(QUEUE)
    for _ in range(20):
        queue.enqueue(bc.PARAMETERS)
    return bc.timed_calls(client.redis, n, lambda: queue.enqueue(bc.PARAMETERS))


def aio_enqueue(url: str, n: int, concurrency: int) -> dict[str, float]:
    """``n`` enqueues by ``concurrency`` coroutines sharing one blueque.aio client (its pool
    opens a connection per coroutine in flight), then ``n`` by the sync client one at a time,
    in this same process: tasks/s and client CPU per task of each."""
    sync_client = blueque.Client(url)
    sync_queue = sync_client.get_queue(QUEUE)
    for _ in range(20):
        sync_queue.enqueue(bc.PARAMETERS)

    def sync_body() -> None:
        for _ in range(n):
            sync_queue.enqueue(bc.PARAMETERS)

    sync = bc.timed(sync_client.redis, n, sync_body)
    loop = asyncio.new_event_loop()
    client = blueque.aio.Client(url)
    queue = client.get_queue(QUEUE)

    async def worker(count: int) -> None:
        for _ in range(count):
            await queue.enqueue(bc.PARAMETERS)

    async def run(total: int) -> None:
        share, extra = divmod(total, concurrency)
        await asyncio.gather(*(worker(share + (i < extra)) for i in range(concurrency)))

    try:
        loop.run_until_complete(run(concurrency))  # the pool's connections, the scripts
        result = bc.timed(sync_client.redis, n, lambda: loop.run_until_complete(run(n)))
        # one coroutine, one enqueue awaited after another: the asyncio client's own cost
        alone = bc.timed(sync_client.redis, n, lambda: loop.run_until_complete(worker(n)))
        burst = _bursts(loop, queue, sync_queue, n)
    finally:
        loop.run_until_complete(client.aclose())
        loop.close()
        sync_client.close()
    return {**result, "sync_rate": sync["rate"], "sync_client_cpu_us": sync["client_cpu_us"],
            "alone_client_cpu_us": alone["client_cpu_us"], "burst_speedup": burst}


#: Enqueues of one burst (issue 33): that many asyncio ones at once against as many sync
#: ones in a row.
BURST = 200


def _bursts(loop: asyncio.AbstractEventLoop, queue: blueque.aio.Queue,
            sync_queue: blueque.Queue, n: int) -> float:
    """Wall time of BURST sync enqueues one after another over that of BURST asyncio ones
    at once (gather), the two alternating; the median of the rounds' ratios."""
    async def burst() -> None:
        await asyncio.gather(*(queue.enqueue(bc.PARAMETERS) for _ in range(BURST)))

    ratios = []
    for _ in range(max(3, n // BURST)):
        started = time.perf_counter()
        loop.run_until_complete(burst())
        middle = time.perf_counter()
        for _ in range(BURST):
            sync_queue.enqueue(bc.PARAMETERS)
        ratios.append((time.perf_counter() - middle) / (middle - started))
    return sorted(ratios)[len(ratios) // 2]


def bulk(url: str, n: int, batch: int) -> dict[str, float]:
    client = blueque.Client(url)
    queue = client.get_queue(QUEUE)
    parameters = [bc.PARAMETERS] * batch
    queue.enqueue_many(parameters)

    def body() -> None:
        for _ in range(n // batch):
            queue.enqueue_many(parameters)

    return bc.timed(client.redis, n // batch * batch, body)


def memory(url: str, n: int) -> dict[str, float]:
    """Redis memory per task, pending and finished, as ``blueque listen`` (warm task
    processes: the fastest drain; the memory is a process per task's) leaves a no-op task and
    one that printed a line (its output tail, PROTOCOL.md 5.19)."""
    client = blueque.Client(url)
    queue = client.get_queue(QUEUE)

    def listen(kind: str) -> Callable[[], None]:
        listener = start_listener(url, kind, 1, ["--reuse", str(WARM_REUSE)])
        return lambda: bc.stop_process(listener)  # type: ignore[arg-type]

    return bc.memory_per_task(client.redis, lambda: queue.enqueue(bc.PARAMETERS),
                              lambda: queue.stats().complete, listen, n)


def scale(url: str, n: int, present: int, op: str) -> dict[str, float]:
    """Microseconds per enqueue, pickup (LMOVE + stamp) or finished-task deletion with
    ``present`` tasks already in the pending (or complete) list."""
    client = blueque.Client(url)
    keys = client.keys
    queue = client.get_queue(QUEUE)
    now = repr(time.time())
    status = "complete" if op == "delete" else "pending"
    # pickups and deletions consume tasks: fill enough that ``present`` remain at every
    # timed call (and the original's listen() never meets an empty queue, where it sleeps)
    filled = present if op == "enqueue" else present + n + bc.WARMUP
    target = keys.complete(QUEUE) if op == "delete" else keys.pending(QUEUE)
    bc.fill(client.redis, target, keys.task(""), "fill-", filled,
            {"status": status, "queue": QUEUE, "parameters": bc.PARAMETERS,
             "created": now, "updated": now, "result": "null"})
    if op == "enqueue":
        us = bc.per_op(n, lambda i: queue.enqueue(bc.PARAMETERS))
    elif op == "pickup":
        listener = client.get_listener(QUEUE)
        us = bc.per_op(n, lambda i: listener.reserve())
    else:
        oldest = list(reversed(queue.task_ids("complete", -(n + 10), -1)))
        us = bc.per_op(n, lambda i: queue.delete_task(client.get_task(oldest[i])))
    return us


HERE = os.path.dirname(os.path.abspath(__file__))
#: Lease settings: the daemon's defaults, and the fastest the benchmark uses (sub-second).
LEASES = {"default": ["--interval", "10", "--poll", "1"],
          "fastest": ["--interval", "0.2", "--poll", "0.05"]}


#: Tasks per warm task process in the "warm" drain (blueque listen --reuse).
WARM_REUSE = 1000


def listen_command(url: str, function: str, concurrency: int, extra: list[str]) -> list[str]:
    """``blueque listen bench bench_tasks:FUNCTION`` in this interpreter."""
    return [sys.executable, "-m", "blueque.cli", "listen", "--url", url, QUEUE,
            f"bench_tasks:{function}", "--concurrency", str(concurrency), "--log-level",
            "WARNING", "--log-dir", TASK_LOGS.name, *extra]


def runner_command(url: str, function: str) -> list[str]:
    """A program written against blueque 1.0.1's API: ``ForkingRunner(client, queue,
    callback).run()`` (this script's ``runner`` command), what 1.0.1 programs run."""
    return [sys.executable, os.path.abspath(__file__), "runner", "--url", url, "--op", function]


def start_listener(url: str, function: str, concurrency: int = 1,
                   extra: list[str] | None = None, runner: bool = False) -> object:
    """``blueque listen``, or (``runner``) a ForkingRunner program; once it registered."""
    client = blueque.Client(url)
    before = len(client.store.listener_ids(QUEUE))
    env = {"BENCH_REDIS_URL": url,
           "PYTHONPATH": os.pathsep.join(filter(None, [HERE, os.environ.get("PYTHONPATH")]))}
    command = (runner_command(url, function) if runner
               else listen_command(url, function, concurrency, extra or []))
    process = bc.start_process(command, env)
    bc.wait_until(lambda: len(client.store.listener_ids(QUEUE)) > before, timeout=30)
    return process


def run_forking_runner(url: str, function: str) -> None:
    import bench_tasks

    from blueque.forking_runner import ForkingRunner

    ForkingRunner(blueque.Client(url), QUEUE, getattr(bench_tasks, function)).run()


def pickup(url: str, n: int, spacing: float, op: str = "fork") -> dict[str, float]:
    """``op`` "warm": the listener keeps warm task processes (``--reuse``, PROTOCOL.md 6.7),
    so that after the first task an idle process is ready before the next task arrives."""
    client = blueque.Client(url)
    queue = client.get_queue(QUEUE)
    listener = start_listener(url, "record", 1,
                              ["--reuse", str(WARM_REUSE)] if op == "warm" else [])
    try:
        return bc.pickup_latencies(
            bc.connect(url), lambda: queue.enqueue(bc.PARAMETERS),
            lambda: queue.stats().complete, n, spacing,
        )
    finally:
        bc.stop_process(listener)  # type: ignore[arg-type]


def drain(url: str, n: int, concurrency: int, op: str) -> dict[str, float]:
    """``op`` "no-task-logs": the listener captures no task output (``--no-task-logs``), which
    measures what the per-attempt output file and its shipping cost each task; "warm": warm
    task processes (``--reuse``, PROTOCOL.md 6.7), each running up to WARM_REUSE tasks;
    "forking-runner": blueque 1.0.1's API, ``ForkingRunner.run()`` (concurrency 1)."""
    client = blueque.Client(url)
    queue = client.get_queue(QUEUE)
    queue.enqueue_many([bc.PARAMETERS] * n)
    extra = (["--no-task-logs"] if op == "no-task-logs"
             else ["--reuse", str(WARM_REUSE)] if op == "warm" else [])
    listener = start_listener(url, "noop", concurrency, extra, runner=op == "forking-runner")
    try:
        return bc.drain_rate(lambda: queue.stats().complete, n, timeout=n * 0.1 + 30,
                             r=bc.connect(url))
    finally:
        bc.stop_process(listener)  # type: ignore[arg-type]


def recovery(url: str, lease: str) -> dict[str, float]:
    """SIGKILL a listener (and its task's process group: the host is gone) while it runs a
    started task; seconds until the task's function runs again under another listener.

    The victim has another host's identity, so the survivor cannot check its pid and must
    wait for the lease to expire: the slow path, as after a real host failure."""
    client = blueque.Client(url)
    queue = client.get_queue(QUEUE)
    r = bc.connect(url)  # blocking pops outlast a default socket timeout
    settings = LEASES[lease]
    interval = float(settings[1])
    victim = start_listener(url, "record_then_sleep",
                            extra=[*settings, "--identity", "bench-dead-host_4242"])
    survivor = None
    try:
        task_id = queue.enqueue(bc.PARAMETERS, max_attempts=2, retry_backoff=0)
        if r.blpop([bc.PICKUP_LIST], timeout=30) is None:
            raise TimeoutError("the task did not start")
        survivor = start_listener(url, "record", extra=settings)
        bc.wait_until(lambda: client.get_task(task_id).status == "started", timeout=30)
        child = client.get_task(task_id).pid
        killed = time.time()
        os.killpg(victim.pid, signal.SIGKILL)  # type: ignore[attr-defined]
        if child:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child, signal.SIGKILL)
        popped = r.blpop([bc.PICKUP_LIST], timeout=interval * 10 + 30)
        if popped is None:
            raise TimeoutError("the task was not run again")
        seconds = float(popped[1]) - killed
        return {"seconds": seconds, "intervals": seconds / interval, "interval": interval}
    finally:
        bc.stop_process(victim)  # type: ignore[arg-type]
        if survivor is not None:
            bc.stop_process(survivor)  # type: ignore[arg-type]


def main() -> int:
    args = bc.parser(__doc__ or "").parse_args()
    if args.command == "runner":
        run_forking_runner(args.url, args.op)
        return 0
    if args.command == "pickup":
        result = pickup(args.url, args.n, args.spacing, args.op)
    elif args.command == "drain":
        result = drain(args.url, args.n, args.concurrency, args.op)
    elif args.command == "recovery":
        result = recovery(args.url, args.lease)
    elif args.command == "enqueue":
        result = enqueue(args.url, args.n)
    elif args.command == "aio_enqueue":
        result = aio_enqueue(args.url, args.n, args.concurrency)
    elif args.command == "bulk":
        result = bulk(args.url, args.n, args.batch)
    elif args.command == "memory":
        result = memory(args.url, args.n)
    elif args.command == "scale":
        result = scale(args.url, args.n, args.present, args.op)
    else:
        raise SystemExit(f"unknown command {args.command}")
    bc.emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
