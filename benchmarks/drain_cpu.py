"""Where the CPU of a drained no-op task goes: the listener, its task processes, redis-server.

    python -m benchmarks.drain_cpu [--n 1000] [--repeats 3]

The drain rows of ``benchmarks.run`` give rates; this says why they are what they are. For
Blueque (with and without per-attempt output capture) and for the original 1.0.1
ForkingRunner, it drains ``n`` no-op tasks on a private redis-server and reads, from the
kernel's accounting, the user and system CPU of the worker process itself and of its reaped
children (the task processes), and redis-server's, per task; Blueque also at concurrency 2 and
with warm processes, and for each the cores that CPU keeps busy at its rate (how far a second
slot can go on the machine's cores). Then it times a bare
``fork()`` + ``os._exit(0)`` + ``waitpid`` in two interpreters: one that imported nothing, and
one holding what a listener imports (redis-py 8 alone is most of it), because the cost of a
fork and an exit grows with the memory the parent maps. CPU seconds, unlike rates, hardly
depend on what else the machine runs. It asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import redis

import blueque
from benchmarks import venvs
from blueque.testing import RedisServer

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "scripts"
QUEUE = "bench"
PARAMETERS = '{"n": 1, "kind": "benchmark"}'

FORK_COST = """
import gc, os, resource, sys, time
if sys.argv[1] == "listener":
    import blueque.cli.listen, blueque.daemon  # what a listener process holds
gc.freeze()
n = int(sys.argv[2])
def cpu(who):
    u = resource.getrusage(who)
    return u.ru_utime + u.ru_stime
p0, c0, t0 = cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN), time.perf_counter()
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
t1 = time.perf_counter()
with open("/proc/self/status") as status:  # ru_maxrss would carry the parent's peak
    rss = next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024
print(rss, (cpu(resource.RUSAGE_SELF) - p0) / n * 1e3, (cpu(resource.RUSAGE_CHILDREN) - c0) / n
      * 1e3, (t1 - t0) / n * 1e3)
"""


def _cpu(process: psutil.Process) -> tuple[float, float, float, float]:
    """The worker's CPU and its reaped children's; a listener's fork server (PROTOCOL.md 6.8)
    counts as the worker, the task processes it reaped as the worker's children."""
    t = process.cpu_times()
    found = [t.user, t.system, t.children_user, t.children_system]
    for child in process.children():
        try:
            if not child.cmdline()[:1] or not child.cmdline()[0].startswith("blueque fork"):
                continue
            c = child.cpu_times()
        except psutil.Error:
            continue
        found = [found[0] + c.user, found[1] + c.system, found[2] + c.children_user,
                 found[3] + c.children_system]
    return found[0], found[1], found[2], found[3]


def _wait(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the drain did not finish")
        time.sleep(0.01)


def measure(server: RedisServer, argv: list[str], env: dict[str, str],
            enqueue: Callable[[int], None], finished: Callable[[], int], n: int
            ) -> dict[str, float]:
    """Start the worker ``argv``, warm it with 20 tasks, then drain ``n``: ms of CPU per task."""
    worker = subprocess.Popen(argv, env=env, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        enqueue(20)
        _wait(lambda: finished() >= 20, 60)
        process, server_process = psutil.Process(worker.pid), psutil.Process(server.pid)
        enqueue(n)
        before, server_before = _cpu(process), server_process.cpu_times()
        started = time.perf_counter()
        _wait(lambda: finished() >= n + 20, n * 0.2 + 60)
        after, server_after, ended = _cpu(process), server_process.cpu_times(), time.perf_counter()
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=30)
    per = [(b - a) / n * 1e3 for a, b in zip(before, after, strict=True)]
    redis_ms = ((server_after.user + server_after.system)
                - (server_before.user + server_before.system)) / n * 1e3
    return {"rate": n / (ended - started), "worker_user": per[0], "worker_sys": per[1],
            "tasks_user": per[2], "tasks_sys": per[3], "redis": redis_ms}


def blueque_system(server: RedisServer, n: int, extra: list[str]) -> dict[str, float]:

    client = blueque.Client(server.url)
    queue = client.get_queue(QUEUE)
    env = dict(os.environ, BENCH_REDIS_URL=server.url,
               PYTHONPATH=os.pathsep.join(filter(None, [str(SCRIPTS),
                                                        os.environ.get("PYTHONPATH")])))
    with tempfile.TemporaryDirectory(prefix="blueque-bench-task-logs-") as logs:
        argv = [sys.executable, "-m", "blueque.cli", "listen", "--url", server.url, QUEUE,
                "bench_tasks:noop", "--log-level", "WARNING", "--log-dir", logs, *extra]
        try:
            return measure(server, argv, env, lambda k: queue.enqueue_many([PARAMETERS] * k),
                           lambda: queue.stats().complete, n)
        finally:
            client.close()


def original_system(server: RedisServer, n: int, python: str) -> dict[str, float]:
    r = redis.Redis.from_url(server.url, decode_responses=True)
    env = venvs.clean_env(BENCH_REDIS_URL=server.url)

    def enqueue(k: int) -> None:
        subprocess.run([python, "-c", "import sys, blueque\n"
                        f"q = blueque.Client({server.url!r}).get_queue({QUEUE!r})\n"
                        f"for _ in range({k}): q.enqueue({PARAMETERS!r})"], env=env, check=True,
                       cwd=SCRIPTS)  # not the repository: its blueque/ would come first

    argv = [python, str(SCRIPTS / "original_peer.py"), "worker", "--url", server.url, "--op",
            "noop"]
    return measure(server, argv, env, enqueue,
                   lambda: int(r.llen(f"blueque_complete_tasks_{QUEUE}")), n)


def fork_cost(kind: str, n: int) -> list[float]:
    out = subprocess.run([sys.executable, "-c", FORK_COST, kind, str(n)], check=True,
                         capture_output=True, text=True).stdout.split()
    return [float(x) for x in out]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1000, help="tasks drained per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    original = str(venvs.ensure(venvs.PEERS["original"]))
    warm = ["--reuse", "1000"]
    systems: dict[str, Callable[[RedisServer], dict[str, float]]] = {
        "blueque": lambda s: blueque_system(s, args.n, []),
        "blueque --no-task-logs": lambda s: blueque_system(s, args.n, ["--no-task-logs"]),
        "blueque c=2": lambda s: blueque_system(s, args.n, ["--concurrency", "2"]),
        "blueque warm": lambda s: blueque_system(s, args.n, warm),
        "blueque warm c=2": lambda s: blueque_system(s, args.n, [*warm, "--concurrency", "2"]),
        "original 1.0.1": lambda s: original_system(s, args.n, original),
    }
    results: dict[str, list[dict[str, float]]] = {name: [] for name in systems}
    forks: dict[str, list[list[float]]] = {"bare": [], "listener": []}
    for repeat in range(args.repeats):
        for name, run in systems.items():  # interleaved: machine noise spreads over all
            with RedisServer() as server:
                results[name].append(run(server))
            print(f"  [{repeat + 1}] {name}: {results[name][-1]}", file=sys.stderr)
        for kind in forks:
            forks[kind].append(fork_cost(kind, 300))
    print(f"CPU per drained no-op task, ms (median of {args.repeats} x {args.n} tasks; "
          "concurrency 1 unless named; warm: --reuse 1000)")
    print(f"{'system':24s} {'tasks/s':>8s} {'worker user':>12s} {'worker sys':>11s} "
          f"{'tasks user':>11s} {'tasks sys':>10s} {'all':>6s} {'redis':>6s} {'cores':>6s}")
    for name, runs in results.items():
        med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        total = med["worker_user"] + med["worker_sys"] + med["tasks_user"] + med["tasks_sys"]
        # cores kept busy: CPU per task (worker, tasks, redis-server) times tasks per second;
        # at concurrency 1 it says how far a second slot can go on this machine's cores
        cores = (total + med["redis"]) * med["rate"] / 1e3
        print(f"{name:24s} {med['rate']:8.0f} {med['worker_user']:12.2f} "
              f"{med['worker_sys']:11.2f} "
              f"{med['tasks_user']:11.2f} {med['tasks_sys']:10.2f} {total:6.2f} "
              f"{med['redis']:6.3f} {cores:6.2f}")
    print(f"(this machine: {os.cpu_count()} cores)")
    print("\nfork() + os._exit(0) + waitpid, ms (median of "
          f"{args.repeats} x 300)")
    print(f"{'interpreter':24s} {'RSS MB':>7s} {'parent CPU':>11s} {'child CPU':>10s} {'wall':>6s}")
    for kind, runs in forks.items():
        rss, parent, child, wall = (statistics.median(r[i] for r in runs) for i in range(4))
        label = "bare python" if kind == "bare" else "with a listener's imports"
        print(f"{label:24s} {rss:7.0f} {parent:11.2f} {child:10.2f} {wall:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
