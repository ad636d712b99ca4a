"""The Redis commands and round trips of one drained no-op task, each named and explained.

    python -m benchmarks.commands_per_task [--n 1000] [--no-original]

For Blueque's listener (``blueque listen``, concurrency 1, a real task process per task) and
for the original 1.0.1's ForkingRunner, on a private redis-server: the worker is started and
warmed with a few tasks, stopped (SIGSTOP to its process group), ``n`` no-op tasks are
enqueued, MONITOR starts, the worker is let go (SIGCONT) and drains them. Every command the
worker's connections sent is counted from MONITOR (a script's own commands, which MONITOR
shows after it as sent by "lua", under that script), and the round trips are the server's
read events (INFO stats ``total_reads_processed``: a pipeline is one), net of this
module's own polling. Per task = count / n. The worker's periodic work (lease renewal, due
tasks, recovery sweep) falls in the window too, spread over the tasks as in a real drain.
Each row says why the command is there (WHY); a command no row explains is printed as
"not explained", which tests/test_benchmarks.py refuses. It asserts nothing about speed.

``rows(n)`` gives the table to other runners; ``main`` prints it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis

import blueque
from benchmarks import venvs
from blueque.store import load_script
from blueque.testing import RedisServer

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "scripts"
LUA = HERE.parent / "blueque" / "lua"
QUEUE = "bench"
PARAMETERS = '{"n": 1, "kind": "benchmark"}'
END = "commands-per-task-end"
#: The original's figure (docs/performance.md, INFO commandstats over a drain).
ORIGINAL_COMMANDS = 13

#: Why each command a drained task costs is sent, by (system, command); a script's own
#: commands are keyed "script.lua: COMMAND". The order of a task's life: reserve, fork, stamp,
#: the child's run, its ending recorded.
WHY: dict[tuple[str, str], str] = {
    # --- Blueque's listener: per task -----------------------------------------------------
    ("blueque", "LMOVE"): "reserve when no id was taken ahead (5.4): the first task, and "
                          "once more to find the queue empty",
    ("blueque", "HSET"): "the run on its node: HSET blueque_node_[node] [pid] (6.2), for a "
                         "dead listener's successor; round trip 1, pipelined with the stamp",
    ("blueque", "EXPIRE"): "the node's runs hash lives a week after its last write (6.2)",
    ("blueque", "EVALSHA stamp.lua"): "stamp: reserved -> started with the child's pid in one "
                                      "script (5.4), round trip 1 of 2",
    ("blueque", "stamp.lua: HINCRBY"): "attempts + 1 (only when attempts is no integer)",
    ("blueque", "stamp.lua: HDEL"): "eta, error, traceback of an earlier attempt (a retry)",
    ("blueque", "stamp.lua: SADD"): "the run joins blueque_started_tasks_[queue] (1.0.1's)",
    ("blueque", "stamp.lua: HSET"): "status started, node, pid, pid_created, started_at, "
                                    "updated, attempts + 1",
    ("blueque", "stamp.lua: HGETALL"): "the one read: is it still this listener's to run, "
                                       "what to clear; returned with the writes applied, so "
                                       "the listener reads nothing more",
    ("blueque", "EVALSHA finish.lua"): "the ending: complete (5.6), round trip 2 of 2, "
                                       "pipelined with the next reservation (take.lua)",
    ("blueque", "finish.lua: HSET"): "status complete, result, updated, finished_at (and the "
                                     "history with this run's entry, when it had one: 3.2)",
    ("blueque", "finish.lua: HMGET"): "status, attempts, pid, node, started_at, error, "
                                      "traceback, history: the fence (is this run still the "
                                      "task's current one), what to clear, the history",
    ("blueque", "finish.lua: LREM"): "out of this listener's reserved list",
    ("blueque", "finish.lua: SREM"): "out of the started set",
    ("blueque", "finish.lua: HDEL"): "an earlier attempt's error and traceback (a retry)",
    ("blueque", "finish.lua: LPUSH"): "onto the complete list (1.0.1's)",
    ("blueque", "finish.lua: HINCRBY"): "outcome counters: this minute's, this hour's, all "
                                        "time's and the listener's (5.6, the dashboard)",
    ("blueque", "finish.lua: EXPIRE"): "a minute's or hour's counter its TTL at its first "
                                       "ending; the listener's counts and last-seen entry at "
                                       "its first ending (then its renewals keep them)",
    ("blueque", "finish.lua: ZADD"): "blueque_listeners_seen_[queue]: the listener's first "
                                     "ending (its renewals write the later ones)",
    ("blueque", "finish.lua: ZREMRANGEBYSCORE"): "listeners seen: entries older than 7 days "
                                                 "dropped when a listener joins the set",
    ("blueque", "finish.lua: PUBLISH"): "blueque_done_[queue] [id]: wakes wait_for_tasks",
    ("blueque", "HDEL"): "the run leaves its node's runs hash once reaped (6.2), pipelined "
                         "with the ending",
    ("blueque", "EVALSHA take.lua"): "the next reservation, taken in the ending's round trip "
                                     "(6.2, taking ahead)",
    ("blueque", "take.lua: LMOVE"): "the next pending id onto this listener's reserved list "
                                    "(5.4); with --reuse stamped for the warm process there",
    ("blueque", "take.lua: LINDEX"): "the oldest pending id, looked at before it is moved: "
                                     "its key and resources decide (5.22)",
    ("blueque", "take.lua: HMGET"): "its queue's default concurrency_key and requires, and "
                                    "the task's own (5.22); with --reuse the stamp's own too",
    ("blueque", "finish.lua: HGET"): "the task's concurrency_key: the run's hold released "
                                     "(5.22; none: nothing more)",
    ("blueque", "take.lua: EXISTS"): "is the queue paused (lib/pause, 5.16c): a paused "
                                     "queue's tasks are not taken",
    ("blueque", "EVALSHA reserve.lua"): "reserve when no id was taken ahead, on a Redis "
                                        "Cluster (5.4)",
    ("blueque", "reserve.lua: EXISTS"): "is the queue paused (lib/pause, 5.16c)",
    ("blueque", "reserve.lua: LMOVE"): "the next pending id onto this listener's reserved list",
    ("blueque", "take.lua: SADD"): "with --reuse: the run joins the started set",
    ("blueque", "take.lua: HSET"): "with --reuse: status started for the warm process's pid, "
                                   "attempts + 1; then its run on the node",
    ("blueque", "take.lua: HGETALL"): "with --reuse: the stamp's one read (as stamp.lua's), "
                                      "returned with the writes applied",
    ("blueque", "take.lua: EXPIRE"): "with --reuse: the node's runs hash lives a week after "
                                     "its last write",
    # --- Blueque's listener: periodic, spread over the tasks -------------------------------
    ("blueque", "ZRANGEBYSCORE"): "due scheduled tasks, every --poll (5.3)",
    ("blueque", "HGETALL"): "renewal and sweep reads: the node's runs, preemption notice",
    ("blueque", "EVALSHA lease.lua"): "lease renewal, every half interval (6.1)",
    ("blueque", "lease.lua: TIME"): "the lease is timed on Redis' clock",
    ("blueque", "lease.lua: ZSCORE"): "renew: is the lease still there",
    ("blueque", "lease.lua: ZADD"): "renew: the new deadline",
    ("blueque", "LRANGE"): "heal at each renewal: this listener's reserved list (6)",
    ("blueque", "ZADD"): "renewal: when the listener's last run ended, in "
                         "blueque_listeners_seen_[queue]; with EXPIRE of it and of the "
                         "listener's counts (6, step 2)",
    ("blueque", "TIME"): "Redis' clock, measured once a minute (clock.py)",
    ("blueque", "INFO"): "the eviction policy, where CONFIG is refused; and the server check",
    ("blueque", "CONFIG"): "the eviction policy, read after each lease renewal (a CONFIG SET "
                           "to an evicting one is said: eviction.PolicyWatch)",
    ("blueque", "HLEN"): "renewal of a listener with no run: the node's runs hash is read, "
                         "not written (6, step 2)",
    ("blueque", "SMEMBERS"): "the ended task's dependents (5.21), pipelined with the ending; "
                             "and the recovery sweep's listeners of a queue (6)",
    ("blueque", "ZRANGE"): "recovery sweep: the queue's leases (6)",
    ("blueque", "SCARD"): "recovery sweep: the size of each queue's listeners set (node_view: "
                          "are there 1.0.1 listeners to page through)",
    ("blueque", "ZCARD"): "recovery sweep: the size of each queue's leases (node_view)",
    ("blueque", "HMGET"): "renewal: the running tasks' fields (superseded, cancelled, "
                          "reclaimed runs: 6, step 2)",
    ("blueque", "EVALSHA keyed_heal.lua"): "recovery sweep: the holds no ending released, "
                                           "the waiters they hold up (5.22)",
    ("blueque", "keyed_heal.lua: SCARD"): "are any concurrency keys in use (none: done)",
    ("blueque", "keyed_heal.lua: SMEMBERS"): "the concurrency keys in use",
    ("blueque", "PING"): "the subscription's keepalive, once an interval (6, step 7)",
    # --- the original 1.0.1's ForkingRunner ---------------------------------------------------
    ("original", "RPOPLPUSH"): "reserve: the next pending id onto the node's reserved list",
    ("original", "HGETALL"): "read the reserved task (its parameters)",
    ("original", "HSET"): "status reserved, then started (pid), then complete (result)",
    ("original", "MULTI"): "start and complete are transactions",
    ("original", "EXEC"): "start and complete are transactions",
    ("original", "SADD"): "start: the run joins the started set",
    ("original", "SREM"): "complete: the run leaves the started set",
    ("original", "LREM"): "complete: out of the node's reserved list",
    ("original", "LPUSH"): "complete: onto the complete list",
}


#: What every task a Blueque listener drains costs (the rest of WHY is periodic work).
PER_TASK = ("HSET", "EXPIRE", "EVALSHA stamp.lua", "stamp.lua: SADD", "stamp.lua: HSET",
            "stamp.lua: HGETALL", "EVALSHA finish.lua", "finish.lua: HSET", "finish.lua: HMGET",
            "finish.lua: LREM", "finish.lua: SREM", "finish.lua: LPUSH", "finish.lua: HINCRBY",
            "finish.lua: PUBLISH", "SMEMBERS", "HDEL", "EVALSHA take.lua", "take.lua: LMOVE")


@dataclass(frozen=True)
class Row:
    system: str
    command: str  # "LMOVE", "EVALSHA finish.lua", "finish.lua: HSET"
    per_task: float
    why: str


@dataclass(frozen=True)
class Totals:
    system: str
    sent: float  # commands the worker sent, per task
    all_commands: float  # sent plus the scripts' own (from MONITOR)
    commandstats: float  # the same, as INFO commandstats counts it (a cross-check)
    round_trips: float


def why(system: str, command: str) -> str:
    """WHY's reason; warm processes' commands are the listener's ("blueque")."""
    return WHY.get(("blueque" if system == "warm" else system, command), "not explained")


def script_names() -> dict[str, str]:
    """sha1 -> "name.lua" for Blueque's scripts, as EVALSHA names them."""
    return {hashlib.sha1(load_script(path.stem).encode()).hexdigest(): path.name
            for path in sorted(LUA.glob("*.lua"))}


def name_of(command: str, scripts: dict[str, str]) -> str:
    words = command.split()
    verb = words[0].upper()
    if verb in ("EVALSHA", "EVAL") and len(words) > 1:
        return f"EVALSHA {scripts.get(words[1].lower(), 'another script')}"
    return verb


class Monitor:
    """MONITOR in a thread until ``stop``: every command but ``exclude``'s (this module's
    own connection), a script's own commands named after it."""

    def __init__(self, url: str, exclude: str) -> None:
        self._client = redis.Redis.from_url(url, decode_responses=True)
        self._exclude = exclude
        self._scripts = script_names()
        self.sent: Counter[str] = Counter()
        self.inner: Counter[str] = Counter()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise TimeoutError("MONITOR did not start")

    def _run(self) -> None:
        script = "?"
        with self._client.monitor() as monitor:  # type: ignore[no-untyped-call]
            self._ready.set()
            for entry in monitor.listen():
                command = entry["command"]
                if entry["client_type"] == "lua":
                    self.inner[f"{script.removeprefix('EVALSHA ')}: "
                               f"{command.split()[0].upper()}"] += 1
                    continue
                where = f"{entry['client_address']}:{entry['client_port']}"
                if where == self._exclude:
                    if command == f"ECHO {END}":
                        return
                    continue
                script = name_of(command, self._scripts)
                self.sent[script] += 1

    def stop(self, own: redis.Redis) -> None:
        own.echo(END)
        self._thread.join(30)
        self._client.close()


@contextmanager
def worker(argv: list[str], env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(argv, env=env, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield process
    finally:
        os.killpg(process.pid, signal.SIGCONT)
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _wait(condition: Callable[[], bool], timeout: float) -> int:
    """Poll until ``condition``; how many polls it took."""
    deadline, polls = time.monotonic() + timeout, 0
    while True:
        polls += 1
        if condition():
            return polls
        if time.monotonic() > deadline:
            raise TimeoutError("the drain did not finish")
        time.sleep(0.05)


def measure(system: str, server: RedisServer, argv: list[str], env: dict[str, str],
            enqueue: Callable[[int], object], n: int) -> tuple[list[Row], Totals]:
    own = redis.Redis.from_url(server.url, decode_responses=True)
    own.ping()
    addr = str(own.client_info()["addr"])
    complete = f"blueque_complete_tasks_{QUEUE}"
    with worker(argv, env) as process:
        enqueue(5)
        _wait(lambda: own.llen(complete) >= 5, 60)
        os.killpg(process.pid, signal.SIGSTOP)
        enqueue(n)
        monitor = Monitor(server.url, addr)
        before = counters(own)
        os.killpg(process.pid, signal.SIGCONT)
        polls = _wait(lambda: own.llen(complete) >= n + 5, n * 0.5 + 60)
        after = counters(own)
        monitor.stop(own)
    own.close()
    rows = [Row(system, command, count / n, why(system, command))
            for command, count in sorted(monitor.sent.items(), key=lambda item: -item[1])]
    for script_row in list(rows):
        prefix = script_row.command.removeprefix("EVALSHA ") + ": "
        at = rows.index(script_row) + 1
        for command, count in sorted(monitor.inner.items(), key=lambda item: -item[1]):
            if command.startswith(prefix):
                rows.insert(at, Row(system, command, count / n, why(system, command)))
                at += 1
    sent = sum(monitor.sent.values()) / n
    everything = sent + sum(monitor.inner.values()) / n
    # this module's own, between the two INFOs: its polls, and one INFO (commandstats count
    # the first, whose call ends after its reply is made; reads count the second)
    stats = (after[0] - before[0] - polls - 1) / n
    trips = (after[1] - before[1] - polls - 1) / n
    return rows, Totals(system, sent, everything, stats, trips)


def counters(r: redis.Redis) -> tuple[int, int]:
    """(every command INFO commandstats counted, read events) so far."""
    info = r.info("all")
    calls = sum(int(v["calls"]) for k, v in info.items() if k.startswith("cmdstat_"))
    return calls, int(info["total_reads_processed"])


def blueque_drain(server: RedisServer, n: int, reuse: int = 1) -> tuple[list[Row], Totals]:
    """Blueque's listener; ``reuse`` > 1: warm processes (``--reuse``, system "warm")."""
    client = blueque.Client(server.url)
    queue = client.get_queue(QUEUE)
    env = dict(os.environ, BENCH_REDIS_URL=server.url,
               PYTHONPATH=os.pathsep.join(filter(None, [str(SCRIPTS),
                                                        os.environ.get("PYTHONPATH")])))
    with tempfile.TemporaryDirectory(prefix="blueque-bench-task-logs-") as logs:
        argv = [sys.executable, "-m", "blueque.cli", "listen", "--url", server.url, QUEUE,
                "bench_tasks:noop", "--concurrency", "1", "--log-level", "WARNING",
                "--log-dir", logs, "--reuse", str(reuse)]
        try:
            return measure("blueque" if reuse == 1 else "warm", server, argv, env,
                           lambda k: queue.enqueue_many([PARAMETERS] * k), n)
        finally:
            client.close()


def original_drain(server: RedisServer, n: int) -> tuple[list[Row], Totals]:
    python = str(venvs.ensure(venvs.PEERS["original"]))
    client = blueque.Client(server.url)  # tasks 1.0.1 reads: a plain enqueue's five fields
    queue = client.get_queue(QUEUE)
    argv = [python, str(SCRIPTS / "original_peer.py"), "worker", "--url", server.url,
            "--op", "noop"]
    try:
        return measure("original", server, argv, venvs.clean_env(BENCH_REDIS_URL=server.url),
                       lambda k: queue.enqueue_many([PARAMETERS] * k), n)
    finally:
        client.close()


def warm_drain(server: RedisServer, n: int) -> tuple[list[Row], Totals]:
    return blueque_drain(server, n, reuse=n + 1000)


def rows(n: int, original: bool = True, warm: bool = True) -> tuple[list[Row], list[Totals]]:
    """Every command per drained task, Blueque's (a process per task, then with ``warm``
    warm processes) then (with ``original``) the original's."""
    table: list[Row] = []
    totals: list[Totals] = []
    systems: list[Callable[[RedisServer, int], tuple[list[Row], Totals]]] = [blueque_drain]
    systems += [warm_drain] if warm else []
    systems += [original_drain] if original else []
    for drain in systems:
        with RedisServer() as server:
            found, total = drain(server, n)
        table += found
        totals.append(total)
    return table, totals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1000, help="tasks drained")
    parser.add_argument("--no-original", action="store_true",
                        help="Blueque only (no virtualenv of the original needed)")
    parser.add_argument("--no-warm", action="store_true",
                        help="a process per task only (no --reuse run)")
    args = parser.parse_args(argv)
    table, totals = rows(args.n, not args.no_original, not args.no_warm)
    print(f"Redis commands per drained no-op task ({args.n:,} tasks, concurrency 1, MONITOR)")
    print(f"{'system':9s} {'command':32s} {'per task':>8s}  why")
    for row in table:
        indent = "  " if ": " in row.command else ""
        print(f"{row.system:9s} {indent + row.command:32s} {row.per_task:8.3f}  {row.why}")
    print()
    print(f"{'system':9s} {'commands sent':>13s} {'all commands':>13s} {'commandstats':>13s} "
          f"{'round trips':>12s}   per drained task")
    for total in totals:
        print(f"{total.system:9s} {total.sent:13.2f} {total.all_commands:13.2f} "
              f"{total.commandstats:13.2f} {total.round_trips:12.2f}")
    print(f"(all commands: sent ones plus those the scripts run, as INFO commandstats counts "
          f"them; issue 20's target is the original's {ORIGINAL_COMMANDS})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
