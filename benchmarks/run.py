"""Blueque against its peers and against the Redis ceiling, in one run, on one private Redis.

    python -m benchmarks.run            # the full run (about 22 minutes on 2 cores)
    python -m benchmarks.run --quick    # shorter: fewer tasks and repeats (a few minutes)
    python -m benchmarks.run --smoke    # seconds: proves every scenario runs, figures meaningless

It builds the peers' virtualenvs under .cache/bench-venvs/ (the original blueque 1.0.1 with
redis<6, and RQ), starts a private redis-server on a free loopback port (never 6379), runs each
scenario in the interpreter of the system it measures (benchmarks/scripts/*.py, one JSON
object on stdout each), repeats the scenarios with the systems interleaved so machine noise
spreads over all of them, and prints one table of medians with min-max, then the targets of
issues 4 and 11 as ratios of figures measured in this same run. It asserts nothing about speed.
Scenario 10, the Spark pipeline (benchmarks/spark_pipeline.py, in a fresh process each run), is
skipped with the reason in its rows where pyspark or Java is missing.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.metadata
import importlib.resources
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from benchmarks import spark_pipeline, venvs
from blueque.policy import QUEUE_LIMITS
from blueque.store.errors import load_script
from blueque.testing import DelayingProxy, RedisServer

SCRIPTS = Path(__file__).resolve().parent / "scripts"
#: Coroutines enqueueing at once on one blueque.aio client (scenario 9, issue 12).
AIO_CONCURRENCY = 100


@dataclass(frozen=True)
class Profile:
    name: str
    repeats: int  # fast scenarios (enqueue, memory, scale, redis-benchmark)
    slow_repeats: int  # scenarios with processes and forks (pickup, drain, recovery)
    enqueue_n: int
    bulk_n: int
    pickup_n: int
    pickup_n_original: int  # the original polls once a second: fewer samples, same phase mix
    drain_n: int
    memory_n: int
    scale_small: int
    scale_big: int
    scale_ops: int
    recovery_default: bool  # the default lease is 10 s: up to 30 s a run
    redis_benchmark_n: int
    spark_n: int  # rows of the Spark pipeline (scenario 10)
    #: scenario 11, through the delaying proxy: enqueues, drained tasks, pickup samples (the
    #: original's fewer: it polls once a second)
    rtt_n: tuple[int, int, int, int] = (1000, 300, 30, 6)


PROFILES = {
    "full": Profile("full", 3, 3, 5000, 20000, 200, 40, 2000, 10000, 1000, 1_000_000, 1000,
                    True, 200_000, 20_000),
    "quick": Profile("quick", 3, 2, 2000, 5000, 60, 15, 500, 2000, 1000, 100_000, 300,
                     True, 50_000, 500, (300, 100, 10, 4)),
    "smoke": Profile("smoke", 1, 1, 100, 1000, 4, 2, 20, 100, 100, 2000, 20, False, 2000,
                     100, (20, 10, 2, 1)),
}
#: Added round-trip times of scenario 11 (ms): loopback through the proxy, and a network's.
RTTS_MS = (0, 1, 2)


@dataclass(frozen=True)
class Row:
    key: str
    scenario: str
    label: str
    system: str
    unit: str
    digits: int = 0


@dataclass
class Job:
    """One measurement: a script run in one interpreter; ``rows`` maps row key -> result field."""

    name: str
    system: str
    scenario: str
    argv: Callable[[str], list[str]]
    rows: dict[str, str]
    slow: bool = False
    timeout: float = 600.0
    #: run through a DelayingProxy adding this round-trip time (ms) to every Redis command
    rtt_ms: float | None = None


@dataclass
class Results:
    values: dict[str, list[float]] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)

    def add(self, key: str, value: float) -> None:
        self.values.setdefault(key, []).append(value)

    def median(self, key: str) -> float | None:
        values = self.values.get(key)
        return statistics.median(values) if values else None


#: Systems that drain: RQ twice, with its forking Worker (one process per job, as Blueque and
#: the original) and with its SimpleWorker (jobs in the worker process: no fork, no isolation).
DRAIN_SYSTEMS = ("blueque", "original", "rq", "rq_simple")
#: Row labels of systems whose key is not their name.
SYSTEM_NAMES = {"rq_simple": "rq SimpleWorker", "raw": "redis-py loop",
                "lpush": "bare LPUSH loop"}


def drain_cost_rows(p: Profile) -> list[Row]:
    """Redis commands and Redis CPU per drained task (INFO commandstats and INFO cpu)."""
    rows = []
    for c in (1, 2):
        for system in DRAIN_SYSTEMS:
            name = SYSTEM_NAMES.get(system, system)
            rows.append(Row(f"drain_cmds_c{c}.{system}", f"4 drain {p.drain_n:,} no-op tasks",
                            f"Redis commands per task, c={c}", name, "commands", 1))
            rows.append(Row(f"drain_trips_c{c}.{system}", f"4 drain {p.drain_n:,} no-op tasks",
                            f"Redis round trips per task, c={c}", name, "round trips", 1))
            rows.append(Row(f"drain_redis_cpu_c{c}.{system}",
                            f"4 drain {p.drain_n:,} no-op tasks",
                            f"Redis CPU per task, c={c}", name, "us", 1))
        for key, what, unit in (("cmds", "Redis commands", "commands"),
                                ("trips", "Redis round trips", "round trips"),
                                ("redis_cpu", "Redis CPU", "us")):
            rows.append(Row(f"drain_{key}_c{c}_warm.blueque", f"4 drain {p.drain_n:,} no-op tasks",
                            f"{what} per task, c={c}, warm", "blueque", unit, 1))
    return rows


def build_rows(p: Profile) -> list[Row]:
    """Every row of the table, scenario by scenario."""
    return [*_enqueue_rows(), *_pickup_and_drain_rows(p), *_cost_rows(p), *_ceiling_rows(),
            *_spark_rows(p), *_rtt_rows(p)]


#: Scenario 11's systems per measurement: (key, row's system name).
RTT_SYSTEMS = {
    "enqueue": (("blueque", "blueque"), ("original", "original"), ("rq", "rq")),
    "drain": (("blueque", "blueque"), ("blueque_warm", "blueque, warm (--reuse)"),
              ("original", "original"), ("rq_simple", "rq SimpleWorker")),
    "pickup": (("blueque", "blueque"), ("original", "original"), ("rq", "rq")),
}


def _rtt_rows(p: Profile) -> list[Row]:
    """Scenario 11: enqueue, drain (concurrency 1) and idle pickup p50 at each added
    round-trip time, where round trips per task decide."""
    enqueue_n, drain_n = p.rtt_n[0], p.rtt_n[1]
    rows = []
    for rtt in RTTS_MS:
        scenario = f"11 at +{rtt} ms round trip"
        for what, label, unit, digits in (
                ("enqueue", f"enqueue {enqueue_n:,}, one per call", "tasks/s", 0),
                ("drain", f"drain {drain_n:,} no-op, concurrency 1", "tasks/s", 0),
                ("pickup", "idle pickup p50", "ms", 1)):
            rows += [Row(f"rtt{rtt}_{what}.{key}", scenario, label, name, unit, digits)
                     for key, name in RTT_SYSTEMS[what]]
    return rows


def _rtt_jobs(p: Profile, py: dict[str, str]) -> list[Job]:
    """Scenario 11's measurements: each system's scripts through a DelayingProxy."""
    enqueue_n, drain_n, pickup_n, pickup_n_original = p.rtt_n
    scripts = {"blueque": "blueque_bench.py", "original": "original_peer.py",
               "rq": "rq_peer.py"}

    def job(rtt: int, what: str, key: str, system: str, field_name: str, *args: object) -> Job:
        command = [py[system], str(SCRIPTS / scripts[system]), *map(str, args)]
        return Job(what, system, "11", lambda url: [*command, "--url", url],
                   {f"rtt{rtt}_{what}.{key}": field_name}, slow=what != "enqueue", rtt_ms=rtt)

    jobs = []
    for rtt in RTTS_MS:
        jobs += [job(rtt, "enqueue", system, system, "rate", "enqueue", "--n", enqueue_n)
                 for system in ("blueque", "original", "rq")]
        jobs += [job(rtt, "drain", key, system, "rate", "drain", "--n", drain_n,
                     "--concurrency", 1, "--op", op)
                 for key, system, op in (("blueque", "blueque", "-"),
                                         ("blueque_warm", "blueque", "warm"),
                                         ("original", "original", "-"),
                                         ("rq_simple", "rq", "simple"))]
        jobs += [job(rtt, "pickup", system, system, "p50_ms", "pickup", "--n",
                     pickup_n_original if system == "original" else pickup_n, "--spacing",
                     1.02 if system == "original" else 0.2)
                 for system in ("blueque", "original", "rq")]
    return jobs


def _enqueue_rows() -> list[Row]:
    rows = [
        Row("enqueue.blueque", "1 enqueue, one task per call", "tasks/s", "blueque", "tasks/s"),
        Row("enqueue.original", "1 enqueue, one task per call", "tasks/s", "original", "tasks/s"),
        Row("enqueue.rq", "1 enqueue, one task per call", "tasks/s", "rq", "tasks/s"),
        Row("enqueue.raw", "1 enqueue, one task per call", "tasks/s", "redis-py loop",
            "tasks/s"),
        Row("enqueue.lpush", "1 enqueue, one task per call", "tasks/s", "bare LPUSH loop",
            "tasks/s"),
    ]
    for system in ("blueque", "original", "rq", "raw", "lpush"):
        name = SYSTEM_NAMES.get(system, system)
        rows.append(Row(f"enqueue_cpu.{system}", "1 enqueue, one task per call",
                        "client CPU per task", name, "us"))
        rows.append(Row(f"enqueue_redis_cpu.{system}", "1 enqueue, one task per call",
                        "Redis CPU per task", name, "us", 1))
    return [*rows,
            Row("bulk.blueque", "2 bulk enqueue, 1,000 per call", "tasks/s", "blueque",
                "tasks/s"),
            Row("bulk.rq", "2 bulk enqueue, 1,000 per call", "tasks/s", "rq", "tasks/s"),
            Row("bulk.raw", "2 bulk enqueue, 1,000 per call", "tasks/s", "redis-py pipeline",
                "tasks/s")]


def _pickup_and_drain_rows(p: Profile) -> list[Row]:
    rows = [Row(f"pickup_{pct}.{system}", "3 pickup latency, idle listener", pct, system, "ms", 1)
            for system in ("blueque", "original", "rq") for pct in ("p50", "p95", "p99")]
    rows += [Row(f"pickup_{pct}_warm.blueque", "3 pickup latency, idle listener",
                 f"{pct}, warm processes (--reuse)", "blueque", "ms", 1)
             for pct in ("p50", "p95", "p99")]
    rows += [Row(f"drain_c{c}.{system}", f"4 drain {p.drain_n:,} no-op tasks",
                 f"concurrency {c}", SYSTEM_NAMES.get(system, system), "tasks/s")
             for c in (1, 2) for system in DRAIN_SYSTEMS]
    rows.append(Row("drain_c1_nologs.blueque", f"4 drain {p.drain_n:,} no-op tasks",
                    "concurrency 1, --no-task-logs", "blueque", "tasks/s"))
    rows.append(Row("drain_c1_runner.blueque", f"4 drain {p.drain_n:,} no-op tasks",
                    "concurrency 1, 1.0.1's API (ForkingRunner.run)", "blueque", "tasks/s"))
    rows += [Row(f"drain_c{c}_warm.blueque", f"4 drain {p.drain_n:,} no-op tasks",
                 f"concurrency {c}, warm processes (--reuse)", "blueque", "tasks/s")
             for c in (1, 2)]
    return [*rows, *drain_cost_rows(p),
            Row("recovery_default.blueque", "5 recovery after SIGKILL", "default lease (10 s)",
                "blueque", "s", 2),
            Row("recovery_fastest.blueque", "5 recovery after SIGKILL", "fastest lease (0.2 s)",
                "blueque", "s", 2)]


def _cost_rows(p: Profile) -> list[Row]:
    small, big = f"{p.scale_small:,}", f"{p.scale_big:,}"
    rows = [Row(f"memory_{kind}.{system}", "6 Redis memory per task", kind, system, "bytes")
            for kind in ("pending", "finished") for system in ("blueque", "original", "rq")]
    rows += [Row(f"memory_finished_line.{system}", "6 Redis memory per task",
                 "finished, printed a 100-byte line", system, "bytes")
             for system in ("blueque", "original")]
    return rows + [Row(f"scale_{op}_{size}.{system}", "7 cost per operation",
                       f"{op} with {text} present", system, "us")
                   for op in ("enqueue", "pickup", "delete") for system in ("blueque", "original")
                   for size, text in (("small", small), ("big", big))]


def _ceiling_rows() -> list[Row]:
    rows = [Row(f"ceiling.{name}", "8 redis-benchmark ceiling", name, "redis-server", "req/s")
            for name in ("LPUSH", "HSET", "LMOVE", "RPOPLPUSH", "EVALSHA small",
                         "EVALSHA submit.lua")]
    aio = f"9 asyncio enqueue, {AIO_CONCURRENCY} at once"
    return [*rows,
            Row("aio_enqueue.blueque", aio, f"{AIO_CONCURRENCY} coroutines", "blueque.aio",
                "tasks/s"),
            Row("aio_enqueue_sync.blueque", aio, "sync, one at a time", "blueque", "tasks/s"),
            Row("aio_enqueue_cpu.blueque", aio, "client CPU, at once", "blueque.aio", "us"),
            Row("aio_enqueue_sync_cpu.blueque", aio, "client CPU, one by one", "blueque", "us"),
            Row("aio_enqueue_alone_cpu.blueque", aio, "client CPU, one by one",
                "blueque.aio", "us"),
            Row("aio_burst.blueque", aio, "200 at once / 200 sync in a row (wall)",
                "blueque.aio", "x", 2)]


def _spark_rows(p: Profile) -> list[Row]:
    """The Spark pipeline (benchmarks.spark_pipeline): each stage's seconds and share of the
    total, and tasks/s, for each mode the listeners can run in."""
    scenario = f"10 Spark pipeline, {p.spark_n:,} no-op rows"
    rows = []
    for mode in spark_pipeline.MODES:
        system = f"blueque, {mode.label}"
        for stage, label in [*spark_pipeline.STAGES.items(), ("total", "total")]:
            rows.append(Row(f"spark_{stage}_s.{mode.name}", scenario, label, system, "s", 2))
        rows += [Row(f"spark_{stage}_share.{mode.name}", scenario, f"share, {stage}", system,
                     "%", 1) for stage in spark_pipeline.STAGES]
        rows.append(Row(f"spark_rate.{mode.name}", scenario, "tasks/s, enqueue to done",
                        system, "tasks/s"))
    return rows


def _spark_jobs(p: Profile) -> list[Job]:
    """One fresh process per run: the Spark session's start (its JVM) is one of the stages."""
    stages = [*spark_pipeline.STAGES, "total"]

    def argv(mode: str) -> Callable[[str], list[str]]:
        return lambda url: [sys.executable, "-m", "benchmarks.spark_pipeline", "--rows",
                            str(p.spark_n), "--mode", mode, "--json-line", "--url", url]

    return [Job("spark", "spark", "10", argv(mode.name),
                {**{f"spark_{stage}_s.{mode.name}": f"{stage}_s" for stage in stages},
                 **{f"spark_{stage}_share.{mode.name}": f"{stage}_share"
                    for stage in spark_pipeline.STAGES},
                 f"spark_rate.{mode.name}": "rate"},
                slow=True, timeout=p.spark_n * 0.1 + 600)
            for mode in spark_pipeline.MODES]


def build_jobs(p: Profile, py: dict[str, str]) -> list[Job]:
    """Every measurement of one repeat. ``py`` maps system -> interpreter path."""

    def script(system: str, name: str, *args: object) -> Callable[[str], list[str]]:
        return lambda url: [py[system], str(SCRIPTS / name), *map(str, args), "--url", url]

    bq, orig, rq = "blueque_bench.py", "original_peer.py", "rq_peer.py"
    jobs = [
        Job("enqueue", "blueque", "1", script("blueque", bq, "enqueue", "--n", p.enqueue_n),
            {"enqueue.blueque": "rate", "enqueue_cpu.blueque": "client_cpu_us",
             "enqueue_redis_cpu.blueque": "server_cpu_us"}),
        Job("enqueue", "original", "1", script("original", orig, "enqueue", "--n", p.enqueue_n),
            {"enqueue.original": "rate", "enqueue_cpu.original": "client_cpu_us",
             "enqueue_redis_cpu.original": "server_cpu_us"}),
        Job("enqueue", "rq", "1", script("rq", rq, "enqueue", "--n", p.enqueue_n),
            {"enqueue.rq": "rate", "enqueue_cpu.rq": "client_cpu_us",
             "enqueue_redis_cpu.rq": "server_cpu_us"}),
        Job("enqueue", "raw", "1", script("blueque", "raw_redis.py", "loop", "--n", p.enqueue_n),
            {"enqueue.raw": "rate", "enqueue_cpu.raw": "client_cpu_us",
             "enqueue_redis_cpu.raw": "server_cpu_us"}),
        Job("enqueue", "lpush", "1",
            script("blueque", "raw_redis.py", "lpush", "--n", p.enqueue_n),
            {"enqueue.lpush": "rate", "enqueue_cpu.lpush": "client_cpu_us",
             "enqueue_redis_cpu.lpush": "server_cpu_us"}),
        Job("bulk", "blueque", "2", script("blueque", bq, "bulk", "--n", p.bulk_n),
            {"bulk.blueque": "rate"}),
        Job("bulk", "rq", "2", script("rq", rq, "bulk", "--n", p.bulk_n), {"bulk.rq": "rate"}),
        Job("bulk", "raw", "2", script("blueque", "raw_redis.py", "bulk", "--n", p.bulk_n),
            {"bulk.raw": "rate"}),
    ]
    jobs.append(Job("aio enqueue", "blueque", "9",
                    script("blueque", bq, "aio_enqueue", "--n", p.enqueue_n,
                           "--concurrency", AIO_CONCURRENCY),
                    {"aio_enqueue.blueque": "rate", "aio_enqueue_sync.blueque": "sync_rate",
                     "aio_enqueue_cpu.blueque": "client_cpu_us",
                     "aio_enqueue_sync_cpu.blueque": "sync_client_cpu_us",
                     "aio_enqueue_alone_cpu.blueque": "alone_client_cpu_us",
                     "aio_burst.blueque": "burst_speedup"}))
    for system, name, n, spacing in (("blueque", bq, p.pickup_n, 0.2),
                                     ("original", orig, p.pickup_n_original, 1.02),
                                     ("rq", rq, p.pickup_n, 0.2)):
        jobs.append(Job(
            "pickup", system, "3",
            script(system, name, "pickup", "--n", n, "--spacing", spacing),
            {f"pickup_{pct}.{system}": f"{pct}_ms" for pct in ("p50", "p95", "p99")},
            slow=True))
    jobs.append(Job(  # an idle warm process is ready before the task arrives (6.7)
        "pickup", "blueque", "3",
        script("blueque", bq, "pickup", "--n", p.pickup_n, "--spacing", 0.2, "--op", "warm"),
        {f"pickup_{pct}_warm.blueque": f"{pct}_ms" for pct in ("p50", "p95", "p99")},
        slow=True))
    jobs += _drain_jobs(p, script)
    if p.recovery_default:
        jobs.append(Job("recovery", "blueque", "5",
                        script("blueque", bq, "recovery", "--lease", "default"),
                        {"recovery_default.blueque": "seconds"}, slow=True))
    jobs.append(Job("recovery", "blueque", "5",
                    script("blueque", bq, "recovery", "--lease", "fastest"),
                    {"recovery_fastest.blueque": "seconds"}, slow=True))
    for system, name in (("blueque", bq), ("original", orig), ("rq", rq)):
        lines = {} if system == "rq" else {f"memory_finished_line.{system}": "finished_line_bytes"}
        jobs.append(Job("memory", system, "6", script(system, name, "memory", "--n", p.memory_n),
                        {f"memory_pending.{system}": "pending_bytes",
                         f"memory_finished.{system}": "finished_bytes", **lines},
                        slow=system != "rq", timeout=1800.0))  # 2 x memory_n drained tasks
    for op in ("enqueue", "pickup", "delete"):
        for system, name in (("blueque", bq), ("original", orig)):
            for size, present in (("small", p.scale_small), ("big", p.scale_big)):
                jobs.append(Job(
                    "scale", system, "7",
                    script(system, name, "scale", "--op", op, "--present", present,
                           "--n", p.scale_ops),
                    {f"scale_{op}_{size}.{system}": "us_per_op"}))
    return [*jobs, *_spark_jobs(p), *_rtt_jobs(p, py)]


def _drain_jobs(p: Profile, script: Callable[..., Callable[[str], list[str]]]) -> list[Job]:
    """Scenario 4: every system at concurrency 1 and 2, and blueque's other modes."""
    bq, orig, rq = "blueque_bench.py", "original_peer.py", "rq_peer.py"
    jobs: list[Job] = []
    for c in (1, 2):
        for system, name, kind in (("blueque", bq, "-"), ("original", orig, "-"),
                                   ("rq", rq, "fork"), ("rq_simple", rq, "simple")):
            interpreter = "rq" if system == "rq_simple" else system
            jobs.append(Job(
                "drain", system, "4",
                script(interpreter, name, "drain", "--n", p.drain_n, "--concurrency", c,
                       "--op", kind),
                {f"drain_c{c}.{system}": "rate", f"drain_cmds_c{c}.{system}": "commands",
                 f"drain_trips_c{c}.{system}": "round_trips",
                 f"drain_redis_cpu_c{c}.{system}": "server_cpu_us"}, slow=True))
    # blueque's other modes: no output capture; warm task processes (--reuse, 6.7)
    for c, op, key in ((1, "no-task-logs", "drain_c1_nologs.blueque"),
                       (1, "forking-runner", "drain_c1_runner.blueque"),
                       (1, "warm", "drain_c1_warm.blueque"), (2, "warm", "drain_c2_warm.blueque")):
        jobs.append(Job("drain", "blueque", "4",
                        script("blueque", bq, "drain", "--n", p.drain_n, "--concurrency", c,
                               "--op", op),
                        {key: "rate", **({
                            f"drain_cmds_c{c}_warm.blueque": "commands",
                            f"drain_trips_c{c}_warm.blueque": "round_trips",
                            f"drain_redis_cpu_c{c}_warm.blueque": "server_cpu_us"}
                            if op == "warm" else {})}, slow=True))
    return jobs


# --- redis-benchmark -----------------------------------------------------------------------
def redis_benchmark(server: RedisServer, n: int) -> dict[str, float]:
    """Requests/s of the commands one task's life uses, 50 clients, pipelines of 16."""
    r = redis.Redis.from_url(server.url, decode_responses=True)
    r.flushall()
    r.lpush("bench:ring", *range(1000))
    small = r.script_load("return redis.call('LPUSH', KEYS[1], ARGV[1])")
    submit = r.script_load(load_script("submit"))  # with the libraries it uses
    base = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(server.port), "-n", str(n),
            "-c", "50", "-P", "16", "-r", "100000000", "--csv"]
    commands = {
        "LPUSH": ["-t", "lpush"],
        "HSET": ["-t", "hset"],
        "LMOVE": ["LMOVE", "bench:ring", "bench:ring", "RIGHT", "LEFT"],
        "RPOPLPUSH": ["RPOPLPUSH", "bench:ring", "bench:ring"],
        "EVALSHA small": ["EVALSHA", small, "1", "bench:eval", "__rand_int__"],
        # the real enqueue: its queue's size limit read, PUBLISH, a task hash, LPUSH, as
        # Queue.enqueue sends it (protocol.submit)
        "EVALSHA submit.lua": ["EVALSHA", submit, "4", "blueque_task_rb-__rand_int__",
                               "blueque_pending_tasks_rb", "blueque_queue_config_rb",
                               "blueque_queues", "rb-__rand_int__", "rb", '{"n": 1}',
                               "1795000000.0", "", "blueque_channel_rb",
                               str(QUEUE_LIMITS["max_parameters_bytes"])],
    }
    out: dict[str, float] = {}
    for name, args in commands.items():
        result = subprocess.run([*base, *args], capture_output=True, text=True, check=True,
                                timeout=600)
        lines = [line for line in result.stdout.splitlines() if line and '"test"' not in line]
        out[name] = float(lines[-1].split('","')[1])
    r.flushall()
    r.close()
    return out


# --- running -------------------------------------------------------------------------------
def run_job(job: Job, server: RedisServer, env: dict[str, str]) -> dict[str, float]:
    flush(server)
    with contextlib.ExitStack() as stack:
        url = server.url
        if job.rtt_ms is not None:  # half the round trip each way
            url = stack.enter_context(DelayingProxy(server.port, job.rtt_ms / 2000)).url()
        result = subprocess.run(job.argv(url), capture_output=True, text=True, env=env,
                                timeout=job.timeout, cwd=str(SCRIPTS))
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"{job.name}/{job.system} failed: {' | '.join(tail)}")
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def flush(server: RedisServer) -> None:
    r = redis.Redis.from_url(server.url)
    r.flushall()
    r.script_flush()
    r.close()


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "(not installed: from the work tree)"


def blueque_env() -> dict[str, str]:
    """Blueque's scripts import blueque from this work tree even when it is not installed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(venvs.REPO),
                                                      env.get("PYTHONPATH")]))
    return env


def loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def prepare(log: Callable[[str], None]) -> tuple[dict[str, str], dict[str, str],
                                                   dict[str, Any]]:
    """Interpreters per system (building the peers' virtualenvs), the peers that could not
    be built and why, and what this run ran on."""
    py: dict[str, str] = {"blueque": sys.executable, "raw": sys.executable}
    env_info: dict[str, Any] = {
        "python": platform.python_version(), "cpus": os.cpu_count(),
        "platform": platform.platform(), "load_before": loadavg(),
        "blueque_env": {"blueque": _version("blueque"), "redis": _version("redis")},
        "redis_server": subprocess.run(["redis-server", "--version"], capture_output=True,
                                       text=True).stdout.strip(),
    }
    unavailable: dict[str, str] = {}
    spark_missing = spark_pipeline.missing()
    if spark_missing is not None:
        unavailable["spark"] = f"skipped: {spark_missing}"
        log(f"  ! Spark pipeline {unavailable['spark']}")
    for name, peer in venvs.PEERS.items():
        try:
            python = venvs.ensure(peer)
            py[name] = str(python)
            env_info[f"{name}_env"] = venvs.versions(python, (peer.import_name, "redis"))
        except (OSError, subprocess.CalledProcessError) as error:
            unavailable[name] = f"virtualenv could not be built: {error}"
            log(f"  ! {name}: {unavailable[name]}")
    return py, unavailable, env_info


def run_one(job: Job, server: RedisServer, results: Results, repeat: int,
            log: Callable[[str], None]) -> None:
    started = time.monotonic()
    try:
        env = venvs.clean_env() if job.system in venvs.PEERS else blueque_env()
        out = run_job(job, server, env)
    except (RuntimeError, subprocess.TimeoutExpired, ValueError) as error:
        log(f"  ! {error}")
        for key in job.rows:
            results.notes[key] = f"failed: {error}"[:200]
        return
    for key, field_name in job.rows.items():
        results.add(key, float(out[field_name]))
    log(f"  [{repeat + 1}] {job.name:8s} {job.system:9s} {time.monotonic() - started:5.1f} s  "
        + ", ".join(f"{k}={float(v):.4g}" for k, v in out.items()))


def measure(p: Profile, only: set[str] | None, log: Callable[[str], None]) -> tuple[
        Results, dict[str, Any]]:
    """Every job, repeated; the systems interleaved within each repeat."""
    results = Results()
    py, unavailable, env_info = prepare(log)
    jobs = [j for j in build_jobs(p, py) if only is None or j.scenario in only]
    for job in jobs:
        if job.system in unavailable:
            results.notes.update(dict.fromkeys(job.rows, unavailable[job.system]))
    jobs = [j for j in jobs if j.system not in unavailable]
    with RedisServer() as server:
        for repeat in range(max(p.repeats, p.slow_repeats)):
            for job in jobs:
                if repeat < (p.slow_repeats if job.slow else p.repeats):
                    run_one(job, server, results, repeat, log)
            if (only is None or "8" in only) and repeat < p.repeats:
                for name, rps in redis_benchmark(server, p.redis_benchmark_n).items():
                    results.add(f"ceiling.{name}", rps)
                log(f"  [{repeat + 1}] redis-benchmark done")
    if not p.recovery_default:
        results.notes["recovery_default.blueque"] = (
            f"skipped in --{p.name}: the default lease takes up to 30 s")
    env_info["load_after"] = loadavg()
    return results, env_info


# --- reporting -----------------------------------------------------------------------------
def fmt(value: float, digits: int) -> str:
    return f"{value:,.{digits}f}"


@dataclass(frozen=True)
class Target:
    text: str
    value: Callable[[Results], float | None]
    goal: float
    at_most: bool = False  # goal is an upper bound
    unit: str = "x"


def ratio(a: str, b: str) -> Callable[[Results], float | None]:
    def compute(results: Results) -> float | None:
        x, y = results.median(a), results.median(b)
        return None if x is None or not y else x / y
    return compute


def smallest_ratio(a: str, b: str) -> Callable[[Results], float | None]:
    """The smallest of the repeats' ratios (each repeat's two figures were taken side by
    side): a target held in every repeat, not only by the medians."""
    def compute(results: Results) -> float | None:
        pairs = list(zip(results.values.get(a, []), results.values.get(b, []), strict=False))
        return min((x / y for x, y in pairs if y), default=None)
    return compute


def value_of(key: str) -> Callable[[Results], float | None]:
    return lambda results: results.median(key)


def recovery_intervals(key: str, interval: float) -> Callable[[Results], float | None]:
    def compute(results: Results) -> float | None:
        seconds = results.median(key)
        return None if seconds is None else seconds / interval
    return compute


TARGETS = [
    Target("enqueue one at a time: blueque / original", ratio("enqueue.blueque",
                                                              "enqueue.original"), 2.0),
    Target("enqueue one at a time: blueque / original, worst repeat (issue 33)",
           smallest_ratio("enqueue.blueque", "enqueue.original"), 1.5),
    Target("enqueue one at a time: blueque / rq", ratio("enqueue.blueque", "enqueue.rq"), 5.0),
    Target("enqueue_many: blueque / redis-py 1,000-task pipeline",
           ratio("bulk.blueque", "bulk.raw"), 3.0),
    Target("idle pickup p50 (ms, fork included)", value_of("pickup_p50.blueque"), 10.0, True,
           " ms"),
    Target("idle pickup p99 (ms, fork included)", value_of("pickup_p99.blueque"), 25.0, True,
           " ms"),
    Target("idle pickup p50, warm processes (ms)", value_of("pickup_p50_warm.blueque"), 5.0,
           True, " ms"),
    Target("idle pickup p99, warm processes (ms)", value_of("pickup_p99_warm.blueque"), 15.0,
           True, " ms"),
    Target("drain c=1: blueque / original ForkingRunner",
           ratio("drain_c1.blueque", "drain_c1.original"), 2.0),
    Target("drain c=1, 1.0.1's ForkingRunner API: blueque / original",
           ratio("drain_c1_runner.blueque", "drain_c1.original"), 2.0),
    Target("drain c=1: blueque / rq SimpleWorker (no fork)",
           ratio("drain_c1.blueque", "drain_c1.rq_simple"), 1.0),
    Target("drain: blueque c=2 / c=1", ratio("drain_c2.blueque", "drain_c1.blueque"), 1.7),
    Target("drain c=1, warm processes: blueque / rq SimpleWorker (no fork)",
           ratio("drain_c1_warm.blueque", "drain_c1.rq_simple"), 2.0),
    Target("drain, warm processes: blueque c=2 / c=1",
           ratio("drain_c2_warm.blueque", "drain_c1_warm.blueque"), 1.7),
    Target("Redis CPU per drained task (c=1): blueque / original",
           ratio("drain_redis_cpu_c1.blueque", "drain_redis_cpu_c1.original"), 1.0, True),
    Target(f"asyncio: {AIO_CONCURRENCY} concurrent enqueues / sync one at a time",
           ratio("aio_enqueue.blueque", "aio_enqueue_sync.blueque"), 3.0),
    Target("asyncio client CPU per enqueue, one by one: blueque.aio / sync",
           ratio("aio_enqueue_alone_cpu.blueque", "aio_enqueue_sync_cpu.blueque"), 1.3, True),
    Target("asyncio: 200 enqueues at once / 200 sync in a row (wall)",
           value_of("aio_burst.blueque"), 2.0, unit="x"),
    Target("enqueue one at a time: blueque / redis-py HSET+LPUSH loop",
           ratio("enqueue.blueque", "enqueue.raw"), 0.8),
    Target("enqueue one at a time: blueque / bare single-LPUSH loop",
           ratio("enqueue.blueque", "enqueue.lpush"), 0.8),
    Target("Redis commands per drained task (c=1): blueque / original",
           ratio("drain_cmds_c1.blueque", "drain_cmds_c1.original"), 1.0, True),
    Target("Redis round trips per drained task (c=1): blueque",
           value_of("drain_trips_c1.blueque"), 2.0, True, ""),
    Target("Redis round trips per drained task (c=1), warm processes: blueque",
           value_of("drain_trips_c1_warm.blueque"), 2.0, True, ""),
    Target("Redis commands per drained task (c=1), warm processes: blueque / original",
           ratio("drain_cmds_c1_warm.blueque", "drain_cmds_c1.original"), 1.0, True),
    Target("Redis CPU per drained task (c=1), warm processes: blueque / original",
           ratio("drain_redis_cpu_c1_warm.blueque", "drain_redis_cpu_c1.original"), 1.0, True),
    Target("memory per finished task: blueque / original",
           ratio("memory_finished.blueque", "memory_finished.original"), 1.0, True),
    Target("memory per finished task that printed a line: blueque / original's finished task",
           ratio("memory_finished_line.blueque", "memory_finished.original"), 2.0, True),
    Target("memory per pending task (bytes): blueque", value_of("memory_pending.blueque"),
           313.0, True, " B"),
    Target("memory per pending task: blueque / original",
           ratio("memory_pending.blueque", "memory_pending.original"), 1.0, True),
    Target("enqueue cost, big / small queue", ratio("scale_enqueue_big.blueque",
                                                    "scale_enqueue_small.blueque"), 1.5, True),
    Target("pickup cost, big / small queue", ratio("scale_pickup_big.blueque",
                                                   "scale_pickup_small.blueque"), 1.5, True),
    Target("finished-task deletion cost, big / small list",
           ratio("scale_delete_big.blueque", "scale_delete_small.blueque"), 1.5, True),
    Target("recovery, default lease (lease intervals of 10 s)",
           recovery_intervals("recovery_default.blueque", 10.0), 3.0, True, ""),
    Target("recovery, fastest lease (lease intervals of 0.2 s)",
           recovery_intervals("recovery_fastest.blueque", 0.2), 3.0, True, ""),
    Target("drain c=1 at +1 ms round trip: blueque / rq SimpleWorker",
           ratio("rtt1_drain.blueque", "rtt1_drain.rq_simple"), 3.0),
    Target("drain c=1 at +1 ms round trip: blueque / original",
           ratio("rtt1_drain.blueque", "rtt1_drain.original"), 3.0),
    Target("drain c=1 at +1 ms round trip, warm processes: blueque / rq SimpleWorker",
           ratio("rtt1_drain.blueque_warm", "rtt1_drain.rq_simple"), 3.0),
    Target("drain c=1 at +1 ms round trip, warm processes: blueque / original",
           ratio("rtt1_drain.blueque_warm", "rtt1_drain.original"), 3.0),
]


def table(rows: Sequence[Row], results: Results) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        values = results.values.get(row.key, [])
        entry: dict[str, Any] = {**dataclasses.asdict(row), "values": values}
        if values:
            entry.update(median=statistics.median(values), min=min(values), max=max(values))
        else:
            entry["note"] = results.notes.get(row.key, "not measured")
        out.append(entry)
    return out


def render(entries: Sequence[dict[str, Any]], targets: Sequence[dict[str, Any]],
           header: str) -> str:
    lines = [header, ""]
    widths = (34, 22, 18, 12, 25, 8)
    titles = ("scenario", "measurement", "system", "median", "min-max", "unit")
    lines.append("  ".join(t.ljust(w) if i < 3 else t.rjust(w)
                           for i, (t, w) in enumerate(zip(titles, widths, strict=True))))
    lines.append("-" * (sum(widths) + 2 * (len(widths) - 1)))
    previous = None
    for e in entries:
        scenario = e["scenario"] if e["scenario"] != previous else ""
        previous = e["scenario"]
        if "median" in e:
            d = e["digits"]
            median = fmt(e["median"], d)
            spread = f"{fmt(e['min'], d)}-{fmt(e['max'], d)}" if len(e["values"]) > 1 else ""
        else:
            median, spread = "n/a", e["note"]
        cells = (scenario, e["label"], e["system"], median, spread, e["unit"])
        line = "  ".join(c.ljust(w) if i < 3 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True)))
        if "median" not in e:
            line = "  ".join(c.ljust(w) for c, w in zip(cells[:4], widths, strict=False))
            line += "  " + e["note"]
        lines.append(line.rstrip())
    lines += ["", "Targets (issues 4, 11 and 12), from the medians above:"]
    for t in targets:
        if t["value"] is None:
            lines.append(f"  {t['text']:58s}  n/a")
            continue
        sign = "<=" if t["at_most"] else ">="
        verdict = "met" if t["met"] else "NOT met"
        lines.append(f"  {t['text']:58s} {t['value']:9.2f}{t['unit']:3s} (target {sign} "
                     f"{t['goal']:g}{t['unit']})  {verdict}")
    return "\n".join(lines)


def markdown(entries: Sequence[dict[str, Any]], targets: Sequence[dict[str, Any]]) -> str:
    """The same table as Markdown, for docs/performance.md."""
    lines = ["| scenario | measurement | system | median | min-max | unit |",
             "| --- | --- | --- | ---: | ---: | --- |"]
    previous = None
    for e in entries:
        scenario = e["scenario"] if e["scenario"] != previous else ""
        previous = e["scenario"]
        if "median" in e:
            d = e["digits"]
            cells = [fmt(e["median"], d),
                     f"{fmt(e['min'], d)}-{fmt(e['max'], d)}" if len(e["values"]) > 1 else ""]
        else:
            cells = ["n/a", e["note"]]
        lines.append(f"| {scenario} | {e['label']} | {e['system']} | {cells[0]} | {cells[1]} "
                     f"| {e['unit']} |")
    lines += ["", "| target (issues 4, 11, 12) | measured | goal | |",
              "| --- | ---: | ---: | --- |"]
    for t in targets:
        if t["value"] is None:
            lines.append(f"| {t['text']} | n/a | | |")
            continue
        sign = "<=" if t["at_most"] else ">="
        lines.append(f"| {t['text']} | {t['value']:.2f}{t['unit']} | {sign} {t['goal']:g}"
                     f"{t['unit']} | {'met' if t['met'] else '**not met**'} |")
    return "\n".join(lines) + "\n"


def evaluate(results: Results) -> list[dict[str, Any]]:
    out = []
    for t in TARGETS:
        value = t.value(results)
        met = None if value is None else (value <= t.goal if t.at_most else value >= t.goal)
        out.append({"text": t.text, "value": value, "goal": t.goal, "at_most": t.at_most,
                    "unit": t.unit, "met": met})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="fewer tasks and repeats")
    mode.add_argument("--smoke", action="store_true",
                      help="the smallest run that exercises every scenario (seconds)")
    parser.add_argument("--only", help="comma-separated scenario numbers, e.g. 1,2,8,10")
    parser.add_argument("--json", metavar="PATH", help="also write every figure as JSON")
    parser.add_argument("--markdown", metavar="PATH", help="also write the table as Markdown")
    parser.add_argument("--from-json", metavar="PATH",
                        help="print (and --markdown) the figures of an earlier --json run")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)
    profile = PROFILES["smoke" if args.smoke else "quick" if args.quick else "full"]
    only = set(args.only.split(",")) if args.only else None

    def log(text: str) -> None:
        if not args.quiet:
            print(text, file=sys.stderr, flush=True)

    if args.from_json:
        report = json.loads(Path(args.from_json).read_text())
        print(render(report["rows"], report["targets"], report.get("header", "")))
        if args.markdown:
            Path(args.markdown).write_text(markdown(report["rows"], report["targets"]))
        return 0
    # a SIGTERM unwinds like Ctrl-C, so the private redis-server is stopped and removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.monotonic()
    log(f"benchmarks: profile {profile.name}; load average {loadavg()}")
    results, env_info = measure(profile, only, log)
    rows = [r for r in build_rows(profile) if only is None or r.scenario.split()[0] in only]
    entries = table(rows, results)
    targets = evaluate(results)
    header = (
        f"Blueque benchmark ({profile.name}: python -m benchmarks.run"
        f"{' --' + profile.name if profile.name != 'full' else ''}), "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {env_info['cpus']} CPUs, "
        f"Python {env_info['python']}, {env_info['redis_server'].split(' sha=')[0]}\n"
        f"blueque {env_info['blueque_env']['blueque']} (redis-py "
        f"{env_info['blueque_env']['redis']}); original "
        f"{env_info.get('original_env', {}).get('blueque', '-')} (redis-py "
        f"{env_info.get('original_env', {}).get('redis', '-')}); rq "
        f"{env_info.get('rq_env', {}).get('rq', '-')} (redis-py "
        f"{env_info.get('rq_env', {}).get('redis', '-')}). Load average before "
        f"{env_info['load_before']}, after {env_info['load_after']}; "
        f"{time.monotonic() - started:.0f} s."
    )
    print(render(entries, targets, header))
    if only is None or "10" in only:
        for name, why in spark_pipeline.NOT_YET.items():
            print(f"\nSpark pipeline, {name} mode: not measured: {why}")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"profile": dataclasses.asdict(profile), "environment": env_info, "header": header,
             "rows": entries, "targets": targets}, indent=2))
    if args.markdown:
        Path(args.markdown).write_text(markdown(entries, targets))
    return 0


if __name__ == "__main__":
    sys.exit(main())
