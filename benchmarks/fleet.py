"""What a fleet of idle listeners costs Redis, per listener, as it grows (issue 29, point 2).

    python -m benchmarks.fleet              # real: 10, 20 listeners; simulated: 10, 100, 1,000
    python -m benchmarks.fleet --smoke      # seconds: proves every part runs (figures meaningless)
    python -m benchmarks.fleet --json FILE  # the figures as JSON too (benchmarks/results/)

On a private redis-server (never 6379), every listener idle on one queue and on a node of its
own (``--node-name``), as the issue measured:

- **real listeners**: ``blueque listen`` processes, as many as this machine holds (tens);
- **a simulated fleet**: 10, 100 and 1,000 listeners in 4 worker processes, each listener
  the daemon's own parts — a ``ListenerStep``
  (blueque/daemon/step.py: Membership's registration and one-round-trip renewal, Recovery's
  sweep, the due-task move, the reserve, the node's preemption check) stepped on the daemon's
  cadence (a step every ``--poll`` or when a timer is due, as its loop wakes), with its real
  subscriber thread. Only the fork and the task function are missing: an idle listener calls
  neither. Started over one interval, as a fleet's listeners start at random times.

For each: after every listener registered and swept once, ``INFO commandstats`` and ``INFO
cpu`` are read before and after a window of ``--window`` seconds. Per listener and second:
the commands Redis ran, the microseconds it spent in them (commandstats ``usec``) and its
process's CPU (``used_cpu_sys`` + ``used_cpu_user``, less what it spends idle with no
client: measured first). The simulated workers count, in their listeners' loop thread, the
round trips of each renewal (``Membership.renew``) and each sweep (``Recovery.sweep``), and
how many of the renewals and sweeps the cadence asked for they did (``cadence``: a
worker that cannot keep up would make the fleet look cheaper than it is; it is printed).

Beside the biggest simulated fleet, 10 blueque 1.0.1 listeners (members of the queue's set
with no lease, which every sweep must then page through), and what reading that set whole
would cost instead. Then, while a simulated fleet of 1,000 listeners over 50 queues renews and
sweeps, the views' section: ``benchmarks.fleet_views.measure`` (issue 29, point 3: status,
dashboard and Prometheus with such a fleet; another module, skipped with a note while it is
absent). It asserts nothing about speed; tests/test_benchmarks.py runs the
smoke mode and tests/test_node_sweep.py asserts the counts (round trips per sweep, commands
per renewal).
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import importlib
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any

import redis

import blueque
from benchmarks.wait_round_trips import counting
from blueque.daemon.options import ListenerOptions
from blueque.daemon.step import ListenerStep
from blueque.task import Task
from blueque.testing import RedisServer

QUEUE = "fleet"
#: Where the views' section lives (issue 29, point 3): ``measure(url, queues, listeners,
#: smoke) -> list of rows`` ({"label", "value", "unit"}, and any more keys), called while a
#: simulated fleet of ``listeners`` listeners spread over ``queues`` renews and sweeps
#: against ``url``; its rows are printed and kept in the JSON.
VIEWS_MODULE = "benchmarks.fleet_views"
#: The target of issue 29: idle per-listener cost at 1,000 listeners within this of 10's.
TARGET_RATIO = 1.2


@dataclass(frozen=True)
class Profile:
    name: str
    real: tuple[int, ...]
    simulated: tuple[int, ...]
    interval: float
    poll: float
    window: float
    workers: int
    views_listeners: int
    views_queues: int
    #: blueque 1.0.1 listeners (members of the queue's set without a lease, on other hosts)
    #: beside the biggest simulated fleet, in a mixed run
    legacy: int


PROFILES = {
    "full": Profile("full", (10, 20), (10, 100, 1000), 10.0, 1.0, 30.0, 4, 1000, 50, 10),
    "smoke": Profile("smoke", (3,), (5, 20), 1.0, 1.0, 3.0, 2, 20, 4, 3),
}


def idle(task: Task) -> str:
    """The simulated listeners' task function: never called (their queues stay empty)."""
    return "idle"


# --- Redis' side ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Snapshot:
    at: float
    calls: Counter[str]
    usec: Counter[str]
    cpu: float


def snapshot(admin: redis.Redis) -> Snapshot:
    """INFO commandstats and cpu in one command (Redis 7 takes several sections)."""
    info: dict[str, Any] = admin.execute_command("INFO", "commandstats", "cpu")
    calls: Counter[str] = Counter()
    usec: Counter[str] = Counter()
    for name, value in info.items():
        if name.startswith("cmdstat_"):
            command = name[len("cmdstat_"):].upper()
            calls[command] = int(value["calls"])
            usec[command] = int(value["usec"])
    cpu = float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
    return Snapshot(time.monotonic(), calls, usec, cpu)


@dataclass
class Cost:
    """What a window cost Redis, per listener and second."""

    commands: float
    usec: float  # microseconds in commands (commandstats)
    cpu_ms: float  # the server process's CPU, less its idle cost
    by_command: dict[str, float]


def cost(before: Snapshot, after: Snapshot, listeners: int, idle_cpu: float) -> Cost:
    seconds = after.at - before.at
    calls = after.calls - before.calls
    calls["INFO"] -= 1  # the reading of the window's start (the end's is not counted yet)
    usec = after.usec - before.usec
    per = listeners * seconds
    cpu = max(0.0, (after.cpu - before.cpu) / seconds - idle_cpu)
    return Cost(sum(calls.values()) / per, sum(usec.values()) / per, cpu * 1000 / listeners,
                {name: count / per for name, count in calls.most_common() if count > 0})


def idle_cpu(admin: redis.Redis, seconds: float) -> float:
    """redis-server's CPU per second with no work (its timers): not any listener's cost."""
    before = snapshot(admin)
    time.sleep(seconds)
    after = snapshot(admin)
    return (after.cpu - before.cpu) / (after.at - before.at)


@dataclass
class Figures:
    kind: str  # "real" or "simulated"
    listeners: int
    queues: int
    window: float
    cost: Cost
    trips_per_sweep: float | None = None
    trips_per_renewal: float | None = None
    cadence: float | None = None  # done / asked, of renewals and sweeps (simulated)
    note: str = ""


def leases(admin: redis.Redis, queues: Sequence[str]) -> int:
    return sum(int(admin.zcard(f"blueque_leases_{queue}")) for queue in queues)


def wait_for(what: str, predicate: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.2)


# --- real listeners --------------------------------------------------------------------------
def real_fleet(url: str, admin: redis.Redis, size: int, p: Profile, idle: float,
               logs: Path) -> Figures:
    """``size`` `blueque listen` processes, each its own node, idle; measured over a window
    once each has registered and swept (an interval after the last registered)."""
    processes = []
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    try:
        for i in range(size):
            with open(logs / f"real-{size}-{i}.log", "wb") as log:
                processes.append(subprocess.Popen(
                    [sys.executable, "-m", "blueque.cli", "listen", QUEUE,
                     "blueque.demo_tasks:work", "--url", url, "--node-name",
                     f"real-{i}.fleet", "--interval", str(p.interval), "--poll", str(p.poll)],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env))
        wait_for(f"{size} real listeners registered", lambda: leases(admin, [QUEUE]) == size,
                 60 + size * 2)
        time.sleep(p.interval + 1)  # each swept once (its first sweep reads the whole set)
        before = snapshot(admin)
        time.sleep(p.window)
        after = snapshot(admin)
        return Figures("real", size, 1, p.window, cost(before, after, size, idle))
    finally:
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


# --- the simulated fleet: its workers --------------------------------------------------------
class Counts:
    """A worker's running counts (its listeners' loop thread only)."""

    def __init__(self) -> None:
        self.steps = self.renewals = self.sweeps = 0
        self.renewal_trips = self.sweep_trips = 0

    def as_dict(self) -> dict[str, float]:
        return dict(vars(self))


def counted(action: Callable[..., Any], sent: list[int], add: Callable[[int], None]
            ) -> Callable[..., Any]:
    """``action``, calling ``add`` with the requests it sent (``sent``: the running count of
    benchmarks.wait_round_trips.counting, in the loop's thread)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        before = sent[0]
        try:
            return action(*args, **kwargs)
        finally:
            add(sent[0] - before)
    return call


def simulated_listener(url: str, name: str, queues: dict[str, int], p: Profile,
                       spool: Path, counts: Counts, sent: list[int]) -> ListenerStep:
    """One listener daemon's parts on a node of its own (its id ``[name]_[worker pid]``),
    its renewal and sweep counted."""
    step = ListenerStep(blueque.Client(url), ListenerOptions(
        queues, idle, interval=p.interval, poll=p.poll, node_name=name, spool_dir=spool))

    def renewed(trips: int) -> None:
        counts.renewals += 1
        counts.renewal_trips += trips

    def swept(trips: int) -> None:
        counts.sweeps += 1
        counts.sweep_trips += trips

    step.membership.renew = counted(step.membership.renew, sent, renewed)  # type: ignore[method-assign]
    step.recovery.sweep = counted(step.recovery.sweep, sent, swept)  # type: ignore[method-assign]
    return step


def join(step: ListenerStep) -> None:
    """What the daemon's first step does before its loop (ListenerStep.run_once): claim the
    id, register, heal, subscribe."""
    step.store.check_server()
    step.spool.replay(step.store)
    step.membership.claim(step.recovery, lambda: False)
    step.register()
    step.heal()
    step.start_subscriber()


def next_wake(step: ListenerStep, current: float) -> float:
    """When the daemon's loop wakes next: ``--poll`` after this step, or a timer sooner."""
    deadlines = step.cadence.deadlines()
    return current + max(0.0, min([step.options.poll, *(d - current for d in deadlines)]))


def run_worker(args: argparse.Namespace) -> int:
    """A worker process: ``args.count`` simulated listeners, stepped until SIGTERM; on each
    SIGUSR1 a line of its counts is appended to ``args.report``."""
    p = replace(PROFILES[args.profile], interval=args.interval, poll=args.poll)
    queues = args.queues.split(",")
    counts = Counts()
    stop, report = threading.Event(), threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()

    def on_usr1(signum: int, frame: FrameType | None) -> None:
        report.set()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGUSR1, on_usr1)
    spool = Path(tempfile.mkdtemp(prefix="fleet-spool-"))
    with counting(threading.current_thread()) as sent:
        steps = [simulated_listener(args.url, f"sim-{i}.fleet", {queues[i % len(queues)]: 1},
                                    p, spool, counts, sent)
                 for i in range(args.first, args.first + args.count)]
        wakes = join_all(steps, p, random.Random(args.first), stop)
        with open(args.report, "a", encoding="utf-8") as out:
            out.write(json.dumps({"joined": len(steps)}) + "\n")
        while not stop.is_set():
            if report.is_set():
                report.clear()
                with open(args.report, "a", encoding="utf-8") as out:
                    out.write(json.dumps({"at": time.monotonic(), **counts.as_dict()}) + "\n")
            step_next(steps, wakes, stop, counts)
    for step in steps:
        with contextlib.suppress(Exception):
            step.membership.release()
            step.wakeup.close()
    return 0


def join_all(steps: list[ListenerStep], p: Profile, rng: random.Random,
             stop: threading.Event) -> list[tuple[float, int]]:
    """Join the listeners spread over one interval, as a fleet's listeners start; each first
    wakes within a poll after it joined. Returns the wake-ups (a heap: when, which)."""
    start = time.monotonic()
    wakes: list[tuple[float, int]] = []
    for index, step in enumerate(steps):
        at = start + p.interval * index / max(1, len(steps))
        while time.monotonic() < at and not stop.is_set():
            time.sleep(min(0.05, at - time.monotonic()))
        join(step)
        heapq.heappush(wakes, (time.monotonic() + rng.random() * p.poll, index))
    return wakes


def step_next(steps: list[ListenerStep], wakes: list[tuple[float, int]],
              stop: threading.Event, counts: Counts) -> None:
    """Step the listener whose loop wakes next (or wait for it, at most 0.2 s)."""
    at, index = heapq.heappop(wakes)
    wait = at - time.monotonic()
    if wait > 0:
        stop.wait(min(wait, 0.2))
        heapq.heappush(wakes, (at, index))
        return
    step = steps[index]
    counts.steps += 1
    current = step.clock()
    step._step(current)  # one step of the daemon's loop, as run_once makes it
    heapq.heappush(wakes, (next_wake(step, current), index))


# --- the simulated fleet: its parent ---------------------------------------------------------
@dataclass
class Workers:
    """Worker processes simulating ``size`` listeners over ``queues``."""

    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    reports: list[Path] = field(default_factory=list)

    def signal(self, signum: int) -> None:
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signum)

    def counts(self, lines_before: list[int]) -> list[dict[str, float]]:
        """Ask each worker for its counts (SIGUSR1) and read the line it appends."""
        self.signal(signal.SIGUSR1)
        found: list[dict[str, float]] = []
        for report, before in zip(self.reports, lines_before, strict=True):
            wait_for("a worker's counts", lambda r=report, b=before: len(
                r.read_text().splitlines()) > b, 60)
            found.append(json.loads(report.read_text().splitlines()[before]))
        return found

    def lines(self) -> list[int]:
        return [len(report.read_text().splitlines()) for report in self.reports]

    def stop(self) -> None:
        self.signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(120)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


@contextlib.contextmanager
def simulated(url: str, size: int, queues: Sequence[str], p: Profile, profile: str,
              logs: Path) -> Iterator[Workers]:
    workers = Workers()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    shares = [size // p.workers + (1 if i < size % p.workers else 0) for i in range(p.workers)]
    first = 0
    try:
        for index, share in enumerate(s for s in shares if s):
            report = logs / f"sim-{size}-{index}.jsonl"
            report.write_text("")
            with open(logs / f"sim-{size}-{index}.log", "wb") as log:
                workers.processes.append(subprocess.Popen(
                    [sys.executable, "-m", "benchmarks.fleet", "worker", "--url", url,
                     "--first", str(first), "--count", str(share), "--queues",
                     ",".join(queues), "--interval", str(p.interval), "--poll", str(p.poll),
                     "--profile", profile, "--report", str(report)],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env))
            workers.reports.append(report)
            first += share
        yield workers
    finally:
        workers.stop()


def simulated_fleet(url: str, admin: redis.Redis, size: int, p: Profile, profile: str,
                    idle: float, logs: Path, legacy: int = 0) -> Figures:
    """``size`` simulated listeners, and ``legacy`` 1.0.1 listeners beside them (a member of
    the queue's set each, no lease: every sweep then reads a page of the set)."""
    with simulated(url, size, [QUEUE], p, profile, logs) as workers:
        wait_for(f"{size} simulated listeners registered",
                 lambda: leases(admin, [QUEUE]) == size, 120 + size * 0.5)
        if legacy:
            admin.sadd(f"blueque_listeners_{QUEUE}",
                       *(f"legacy-{i}.fleet_{i + 1}" for i in range(legacy)))
        time.sleep(p.interval + 1)  # each swept once (its first sweep reads the whole set)
        lines = workers.lines()
        first = workers.counts(lines)
        before = snapshot(admin)
        time.sleep(p.window)
        after = snapshot(admin)
        last = workers.counts([n + 1 for n in lines])
    done = {key: sum(b[key] - a[key] for a, b in zip(first, last, strict=True))
            for key in ("steps", "renewals", "sweeps", "renewal_trips", "sweep_trips")}
    seconds = after.at - before.at
    asked = {"renewals": size * seconds / (p.interval / 2), "sweeps": size * seconds / p.interval}
    cadence = min(done[key] / asked[key] for key in asked)
    return Figures("mixed" if legacy else "simulated", size, 1, p.window,
                   cost(before, after, size, idle),
                   trips_per_sweep=done["sweep_trips"] / max(1, done["sweeps"]),
                   trips_per_renewal=done["renewal_trips"] / max(1, done["renewals"]),
                   cadence=cadence)


def set_reads(admin: redis.Redis, members: int, calls: int = 200) -> dict[str, float]:
    """What reading a queue's listener set costs Redis per sweep, with ``members`` in it
    (INFO commandstats usec per call): the whole set (SMEMBERS, what a sweep would read if it
    read every member) against one SSCAN page (what it reads while 1.0.1 listeners are
    there)."""
    key = f"blueque_listeners_{QUEUE}"
    admin.sadd(key, *(f"member-{i}.fleet_{i + 1}" for i in range(members)))
    figures: dict[str, float] = {"members": float(members)}
    for name, read in (("smembers", lambda: admin.smembers(key)),
                       ("sscan", lambda: admin.sscan(key, 0, count=100))):
        before = snapshot(admin)
        for _ in range(calls):
            read()
        after = snapshot(admin)
        figures[f"{name}_usec"] = (after.usec[name.upper()] - before.usec[name.upper()]) / calls
    admin.delete(key)
    return figures


def views_section(url: str, admin: redis.Redis, p: Profile, profile: str,
                  logs: Path) -> tuple[list[dict[str, Any]], str]:
    """The views' rows (issue 29, point 3: ``VIEWS_MODULE``), measured while a simulated
    fleet of ``p.views_listeners`` listeners over ``p.views_queues`` queues renews and sweeps;
    ([], why) when that module is not there."""
    try:
        views = importlib.import_module(VIEWS_MODULE)
    except ModuleNotFoundError as missing:
        if missing.name != VIEWS_MODULE:
            raise
        return [], f"skipped: {VIEWS_MODULE} is not there"
    queues = [f"{QUEUE}-{i}" for i in range(p.views_queues)]
    with simulated(url, p.views_listeners, queues, p, profile, logs):
        wait_for(f"{p.views_listeners} listeners over {len(queues)} queues registered",
                 lambda: leases(admin, queues) == p.views_listeners,
                 120 + p.views_listeners * 0.5)
        rows: list[dict[str, Any]] = views.measure(url, queues, p.views_listeners,
                                                   profile == "smoke")
    return rows, ""


# --- the report ------------------------------------------------------------------------------
def table(rows: Sequence[Figures]) -> str:
    head = (f"{'fleet':<10} {'listeners':>9} {'commands/s':>10} {'Redis usec/s':>12} "
            f"{'Redis CPU ms/s':>14} {'trips/sweep':>11} {'trips/renewal':>13} {'cadence':>7}")
    lines = [head, "-" * len(head)]
    for row in rows:
        def number(value: float | None, digits: int) -> str:
            return "-" if value is None else f"{value:.{digits}f}"
        lines.append(
            f"{row.kind:<10} {row.listeners:>9} {row.cost.commands:>10.2f} "
            f"{row.cost.usec:>12.1f} {row.cost.cpu_ms:>14.3f} "
            f"{number(row.trips_per_sweep, 1):>11} {number(row.trips_per_renewal, 1):>13} "
            f"{number(None if row.cadence is None else row.cadence * 100, 0):>7}")
    return "\n".join(lines)


def by_command(rows: Sequence[Figures]) -> str:
    """Per listener and second, each command, for every fleet measured."""
    names = sorted({name for row in rows for name in row.cost.by_command},
                   key=lambda name: -max(row.cost.by_command.get(name, 0.0) for row in rows))
    short = {"real": "real", "simulated": "sim", "mixed": "mixed"}
    head = f"{'command':<16}" + "".join(f"{short[row.kind] + ' ' + str(row.listeners):>11}"
                                        for row in rows)
    lines = [head]
    for name in names:
        lines.append(f"{name:<16}" + "".join(
            f"{row.cost.by_command.get(name, 0.0):>11.3f}" for row in rows))
    return "\n".join(lines)


def ratios(rows: Sequence[Figures]) -> list[str]:
    """Issue 29's target: idle per-listener cost at the biggest simulated fleet against the
    smallest (commands, Redis time in commands, Redis CPU), and round trips per sweep."""
    simulated_rows = [row for row in rows if row.kind == "simulated"]
    if len(simulated_rows) < 2:
        return []
    small, big = simulated_rows[0], simulated_rows[-1]
    out = []
    for label, pick in (("commands/s", lambda c: c.commands), ("Redis usec/s", lambda c: c.usec),
                        ("Redis CPU ms/s", lambda c: c.cpu_ms)):
        a, b = pick(small.cost), pick(big.cost)
        ratio = b / a if a else float("nan")
        out.append(f"per-listener {label} at {big.listeners} / at {small.listeners}: "
                   f"{ratio:.2f} (target <= {TARGET_RATIO})")
    trips = {row.listeners: row.trips_per_sweep for row in simulated_rows}
    out.append("round trips per sweep by fleet size: " + ", ".join(
        f"{size}: {value:.1f}" for size, value in trips.items() if value is not None))
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fleet", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    worker = sub.add_parser("worker", help="(internal) one worker of the simulated fleet")
    for name in ("--url", "--queues", "--report", "--profile"):
        worker.add_argument(name, required=True)
    for name in ("--first", "--count"):
        worker.add_argument(name, type=int, required=True)
    for name in ("--interval", "--poll"):
        worker.add_argument(name, type=float, required=True)
    parser.add_argument("--smoke", action="store_true", help="seconds: proves it runs")
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    parser.add_argument("--real", type=int, nargs="*", help="real listener counts")
    parser.add_argument("--simulated", type=int, nargs="*", help="simulated fleet sizes")
    parser.add_argument("--window", type=float, help="seconds measured per size")
    parser.add_argument("--no-views", action="store_true", help="skip the views' section")
    return parser.parse_args(argv)


@dataclass
class Run:
    """One benchmark run's figures."""

    profile: Profile
    rows: list[Figures]
    idle_cpu: float
    views: list[dict[str, Any]]
    views_note: str
    redis_version: str
    #: a listener set's read, whole and a page at a time (set_reads)
    set_reads: dict[str, float]


def measure(p: Profile, with_views: bool) -> Run:
    """Every size of each fleet, then the views' section, on one private redis-server."""
    rows: list[Figures] = []
    logs = Path(tempfile.mkdtemp(prefix="blueque-fleet-"))
    with RedisServer(extra_args=("--maxclients", "10000")) as server:
        admin = redis.Redis.from_url(server.url, decode_responses=True)
        quiet = idle_cpu(admin, min(5.0, p.window))
        biggest = max(p.simulated, default=0)
        runs: list[tuple[str, int]] = [*(("real", n) for n in p.real),
                                       *(("simulated", n) for n in p.simulated)]
        if p.legacy and biggest:
            runs.append(("mixed", biggest))
        for kind, size in runs:
            admin.flushall()
            rows.append(real_fleet(server.url, admin, size, p, quiet, logs) if kind == "real"
                        else simulated_fleet(server.url, admin, size, p, p.name, quiet, logs,
                                             p.legacy if kind == "mixed" else 0))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
        admin.flushall()
        reads = set_reads(admin, biggest + p.legacy) if biggest else {}
        views, note = (views_section(server.url, admin, p, p.name, logs) if with_views
                       else ([], "skipped (--no-views)"))
        version = str(admin.info("server")["redis_version"])
    return Run(p, rows, quiet, views, note, version, reads)


def report(run: Run, header: str) -> None:
    p = run.profile
    print()
    print(header)
    print("Per listener and second (Redis usec: time in commands, INFO commandstats; Redis "
          f"CPU: the server process's, less its idle {run.idle_cpu * 1000:.2f} ms/s):")
    print(table(run.rows))
    print()
    print("Commands per listener and second:")
    print(by_command(run.rows))
    print()
    for line in ratios(run.rows):
        print(line)
    reads = run.set_reads
    if reads:
        members = int(reads["members"])
        print(f"With 1.0.1 listeners (no lease) in a set of {members} members, a sweep reads one "
              f"SSCAN page of it: {reads['sscan_usec']:.1f} us of Redis, "
              f"{reads['sscan_usec'] / p.interval:.2f} us/s per listener; reading it whole "
              f"(SMEMBERS) would cost {reads['smembers_usec']:.1f} us, "
              f"{reads['smembers_usec'] / p.interval:.2f} us/s per listener, and grow with "
              "the fleet")
    print()
    print(f"Views ({VIEWS_MODULE}, {p.views_listeners} listeners over {p.views_queues} queues):")
    if run.views_note:
        print(f"  {run.views_note}")
    for row in run.views:
        print(f"  {row.get('label', '?')}: {row.get('value', '?')} {row.get('unit', '')}")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.command == "worker":
        return run_worker(args)
    base = PROFILES["smoke" if args.smoke else "full"]
    p = replace(base, real=tuple(base.real if args.real is None else args.real),
                simulated=tuple(base.simulated if args.simulated is None else args.simulated),
                window=args.window or base.window)
    started = time.monotonic()
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    run = measure(p, not args.no_views)
    header = (f"Blueque fleet benchmark ({p.name}: python -m benchmarks.fleet), "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, "
              f"Python {platform.python_version()}, Redis {run.redis_version}; idle listeners "
              f"on one queue, each its own node, --interval {p.interval:g} --poll "
              f"{p.poll:g}, {p.window:g}-s windows; load average before {load_before}, after "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
              f"{time.monotonic() - started:.0f} s.")
    report(run, header)
    if args.json:
        args.json.write_text(json.dumps({
            "profile": asdict(p), "header": header, "redis_idle_cpu_s": run.idle_cpu,
            "rows": [asdict(row) for row in run.rows], "targets": ratios(run.rows),
            "views": run.views, "views_note": run.views_note, "set_reads": run.set_reads,
            "environment": {"python": platform.python_version(), "cpus": os.cpu_count(),
                            "redis_server": run.redis_version, "redis_py": redis.__version__},
        }, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
