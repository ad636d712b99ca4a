"""Helpers shared by every measurement script, whatever interpreter runs it.

The scripts in this folder run as plain files (``python script.py ...``) inside the interpreter
of the system they measure: Blueque's own environment, or a peer's virtualenv (the original
blueque 1.0.1, RQ). So this module needs nothing but the standard library and redis-py, and each
script prints exactly one JSON object on its last line of stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis

#: The parameters every system enqueues: a small JSON document, as a real producer would send.
PARAMETERS = '{"n": 1, "kind": "benchmark"}'
#: List the task functions push "<time.time()>" to on their first line (pickup, recovery).
PICKUP_LIST = "bench:pickup"
#: Untimed calls before a per-operation measurement (script loading, first connection).
WARMUP = 10


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("command")
    p.add_argument("--url", required=True)
    p.add_argument("--n", type=int, default=1000, help="tasks (or samples) to measure")
    p.add_argument("--present", type=int, default=0, help="tasks already present (scale)")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--op", default="enqueue")
    p.add_argument("--lease", default="default")
    p.add_argument("--spacing", type=float, default=0.2,
                   help="pickup: longest random pause between tasks, seconds")
    return p


def connect(url: str, decode: bool = True) -> redis.Redis:
    """A plain client; no socket timeout (redis-py 8 defaults to 5 s), so long blocking pops
    (recovery waits up to 30 s at the default lease) are not cut short."""
    return redis.Redis.from_url(url, decode_responses=decode, socket_timeout=None)


def emit(result: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


def server_cpu(r: redis.Redis) -> float:
    """Seconds of CPU the redis-server process has used (user + system)."""
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def used_memory(r: redis.Redis) -> int:
    return int(r.info("memory")["used_memory"])


#: The task functions of the memory scenario: one that does nothing, one that prints a line of
#: LINE_BYTES (its output is what Blueque keeps of a run's output; the original keeps none).
MEMORY_KINDS = ("noop", "line")
LINE_BYTES = 100


def print_line() -> None:
    """What the ``line`` task functions do: one line of LINE_BYTES, newline included."""
    print("x" * (LINE_BYTES - 1), flush=True)


def memory_per_task(r: redis.Redis, enqueue: Callable[[], None], finished: Callable[[], int],
                    listen: Callable[[str], Callable[[], None]], n: int) -> dict[str, float]:
    """Redis memory (the used_memory delta) per task: ``n`` tasks enqueued (pending), then the
    same tasks drained by a real listener of the system (``listen(kind)`` starts one running
    that kind of task function and returns what stops it), for each of MEMORY_KINDS.

    Each kind's listener first runs one task of its own (the lists, counters and listener
    keys a queue has once, not per task); no listener runs while tasks are enqueued."""
    def drain(kind: str, count: int, timeout: float) -> None:
        done = finished()
        stop = listen(kind)
        try:
            wait_until(lambda: finished() >= done + count, timeout=timeout)
        finally:
            stop()

    result: dict[str, float] = {}
    for kind in MEMORY_KINDS:
        enqueue()
        drain(kind, 1, 60)
        base = used_memory(r)
        for _ in range(n):
            enqueue()
        if kind == MEMORY_KINDS[0]:
            result["pending_bytes"] = (used_memory(r) - base) / n
        drain(kind, n, n * 0.1 + 60)
        result[f"finished_{kind}_bytes"] = (used_memory(r) - base) / n
    result["finished_bytes"] = result["finished_noop_bytes"]
    return result


def timed(r: redis.Redis, n: int, body: Callable[[], None]) -> dict[str, float]:
    """Run ``body`` once (it does ``n`` tasks' worth of work); rate and CPU per task."""
    cpu0, srv0, t0 = time.process_time(), server_cpu(r), time.perf_counter()
    body()
    t1, cpu1, srv1 = time.perf_counter(), time.process_time(), server_cpu(r)
    return {
        "rate": n / (t1 - t0),
        "wall_us": (t1 - t0) / n * 1e6,
        "client_cpu_us": (cpu1 - cpu0) / n * 1e6,
        "server_cpu_us": (srv1 - srv0) / n * 1e6,
    }


#: Chunks a timed_calls run is cut into (its rate is the median chunk's).
CHUNKS = 10


def timed_calls(r: redis.Redis, n: int, call: Callable[[], object]) -> dict[str, float]:
    """``call`` ``n`` times, in CHUNKS chunks timed each: the rate of the median chunk (a
    burst of another process's work on a shared machine slows a chunk or two, not the
    figure: the systems compared are measured alike), the whole run's rate (``rate_all``),
    and client and Redis CPU per call over the whole run."""
    size = max(1, n // CHUNKS)
    cpu0, srv0, t0 = time.process_time(), server_cpu(r), time.perf_counter()
    chunks = []
    done = 0
    while done < n:
        count = min(size, n - done)
        started = time.perf_counter()
        for _ in range(count):
            call()
        chunks.append((time.perf_counter() - started) / count)
        done += count
    t1, cpu1, srv1 = time.perf_counter(), time.process_time(), server_cpu(r)
    per_call = statistics.median(chunks)
    return {
        "rate": 1 / per_call,
        "rate_all": n / (t1 - t0),
        "wall_us": per_call * 1e6,
        "client_cpu_us": (cpu1 - cpu0) / n * 1e6,
        "server_cpu_us": (srv1 - srv0) / n * 1e6,
    }


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.005) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"benchmark condition not met within {timeout} s")
        time.sleep(interval)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100.0 * len(ordered))))
    return ordered[rank - 1]


def record_first_line(started: float | None = None) -> None:
    """What a task function calls on its first line: push the time it started running
    (``started``: taken by a caller that had to import this module first, before it did)."""
    started = time.time() if started is None else started
    r = connect(os.environ["BENCH_REDIS_URL"])
    r.rpush(PICKUP_LIST, repr(started))
    r.close()


def pickup_latencies(
    r: redis.Redis,
    enqueue: Callable[[], None],
    finished: Callable[[], int],
    samples: int,
    spacing: float,
) -> dict[str, float]:
    """Enqueue one task at a time into an idle system and time enqueue -> task's first line.

    Each sample waits until the previous task has finished, then a pause of 20 ms to
    ``spacing`` s, so the listener is idle (blocked, or sleeping in a poll loop at a random
    phase) when the next task arrives."""
    latencies: list[float] = []
    # stratified pauses, shuffled: an even spread of phases against a poll loop even for a
    # handful of samples
    pauses = [0.02 + (i + 0.5) / samples * (spacing - 0.02) for i in range(samples)]
    random.Random(4).shuffle(pauses)
    for i in range(samples):
        time.sleep(pauses[i])
        before = time.time()
        enqueue()
        popped = r.blpop([PICKUP_LIST], timeout=30)
        if popped is None:
            raise TimeoutError("the task did not start within 30 s")
        latencies.append(float(popped[1]) - before)
        wait_until(lambda i=i: finished() >= i + 1, timeout=30)
    ms = [value * 1000.0 for value in latencies]
    return {
        "p50_ms": percentile(ms, 50),
        "p95_ms": percentile(ms, 95),
        "p99_ms": percentile(ms, 99),
        "samples": float(len(ms)),
    }


def command_calls(r: redis.Redis) -> int:
    """Commands the server has run (INFO commandstats, every command summed)."""
    stats = r.info("commandstats")
    return sum(int(v["calls"]) for v in stats.values() if isinstance(v, dict) and "calls" in v)


def read_events(r: redis.Redis) -> int:
    """Read events the server has processed (INFO stats): one per request a client sent, a
    pipeline being one, so a count of round trips."""
    return int(r.info("stats")["total_reads_processed"])


def drain_rate(
    finished: Callable[[], int], n: int, timeout: float, r: redis.Redis | None = None
) -> dict[str, float]:
    """Poll the finished count; tasks/s between the first and the last completion.

    With ``r``, also the Redis commands, round trips and Redis CPU per drained task, from
    before the first completion to the last, net of this loop's own polling (its per-poll
    cost is measured right after the drain and subtracted), and counting the INFO calls that
    measure it."""
    polls = 0

    def poll() -> int:
        nonlocal polls
        polls += 1
        return finished()

    calls0 = command_calls(r) if r is not None else 0
    srv0 = server_cpu(r) if r is not None else 0.0
    reads0 = read_events(r) if r is not None else 0
    wait_until(lambda: poll() >= 1, timeout=timeout, interval=0.002)
    first = time.perf_counter()
    wait_until(lambda: poll() >= n, timeout=timeout, interval=0.005)
    last = time.perf_counter()
    result = {"rate": (n - 1) / (last - first), "seconds": last - first}
    if r is None:
        return result
    calls1, srv1, reads1 = command_calls(r), server_cpu(r), read_events(r)
    probe = 200
    for _ in range(probe):
        finished()
    calls2, srv2, reads2 = command_calls(r), server_cpu(r), read_events(r)
    # each command_calls/server_cpu/read_events trio is 3 INFO calls, counted in the deltas
    per_poll_calls = (calls2 - calls1 - 3) / probe
    per_poll_cpu = (srv2 - srv1) / probe
    per_poll_reads = (reads2 - reads1 - 3) / probe
    result["commands"] = max(0.0, (calls1 - calls0 - 3 - polls * per_poll_calls) / n)
    result["round_trips"] = max(0.0, (reads1 - reads0 - 3 - polls * per_poll_reads) / n)
    result["server_cpu_us"] = max(0.0, (srv1 - srv0 - polls * per_poll_cpu) / n * 1e6)
    return result


def start_process(
    args: Sequence[str], env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """A child whose whole process group (workers fork) can be stopped with stop_process."""
    return subprocess.Popen(
        list(args),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the child's process group, then SIGKILL it if it lingers."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # forked task children left in the group


def fill(r: redis.Redis, list_key: str, hash_prefix: str, id_prefix: str, n: int,
         fields: dict[str, str]) -> None:
    """Create ``n`` task hashes and push their ids onto ``list_key``, server-side.

    A benchmark fixture, not a protocol operation: a Lua loop writes 50,000 tasks per call so
    a million tasks take seconds, not minutes of round trips."""
    script = r.register_script(FILL_LUA)
    flat = [item for pair in fields.items() for item in pair]
    done = 0
    while done < n:
        count = min(50_000, n - done)
        script(keys=[list_key], args=[hash_prefix, id_prefix, done, count, *flat])
        done += count


FILL_LUA = """
local prefix, idp, start, count = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local fields = {}
for i = 5, #ARGV do fields[#fields + 1] = ARGV[i] end
local batch = {}
for i = start, start + count - 1 do
  local id = idp .. i
  redis.call('HSET', prefix .. id, unpack(fields))
  batch[#batch + 1] = id
  if #batch == 1000 then
    redis.call('LPUSH', KEYS[1], unpack(batch))
    batch = {}
  end
end
if #batch > 0 then redis.call('LPUSH', KEYS[1], unpack(batch)) end
return count
"""


def per_op(n: int, body: Callable[[int], None], warmup: int = WARMUP) -> dict[str, float]:
    """Microseconds per call of ``body(i)``: the median of ``n`` timed calls (robust to the
    odd scheduling hiccup of a busy machine) and their mean, after ``warmup`` untimed calls
    (script loading, first connection) numbered from ``n``."""
    for i in range(n, n + warmup):
        body(i)
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        body(i)
        times.append(time.perf_counter() - t0)
    return {"us_per_op": statistics.median(times) * 1e6, "mean_us": sum(times) / n * 1e6}
