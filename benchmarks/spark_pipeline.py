"""The Spark page's pipeline (docs/how-to/spark.md) end to end, timed stage by stage (issue 20).

    python -m benchmarks.spark_pipeline                 # 20,000 no-op rows
    python -m benchmarks.spark_pipeline --rows 500 --json out.json

On a private redis-server (a free loopback port, never 6379; or ``--url``, an empty database)
it times, in one fresh process: the start of a local[2] Spark session (the JVM included), the
start of two ``blueque listen`` daemons at concurrency 2 running a no-op task
(``benchmarks/scripts/bench_tasks.py:noop``), ``enqueue_dataframe`` of ``rows`` rows with a
task id column (validated, as on the Spark page), the drain (``wait_for_tasks`` from the moment the
enqueue returns; the listeners already run during the enqueue, as in the example), and
``read_tasks`` with one action that reads every task back. It prints each stage's seconds and
share of the total, and tasks/s from the start of the enqueue to the last task done. Asserts
nothing about speed; checks only that every row ran and was read back as complete.

Modes: how the listeners run a task: ``fork`` (a fresh process per task, the default) and
``warm`` (``blueque listen --reuse 1000``: a task process runs up to 1,000 tasks, PROTOCOL.md
6.7); ``python -m benchmarks.run`` times both.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import blueque
from blueque.process import signal_group
from blueque.testing import RedisServer, wait_for

SCRIPTS = Path(__file__).resolve().parent / "scripts"
#: Each mode drains its own queue, so that modes may share one Redis database (--url).
QUEUE = "spark-pipeline-{mode}"
LISTENERS = 2
CONCURRENCY = 2
CORES = 2


@dataclass(frozen=True)
class Mode:
    """How the listeners run tasks: ``listen_args`` are added to ``blueque listen``."""

    name: str
    label: str
    listen_args: tuple[str, ...] = ()


MODES = (Mode("fork", "fork per task"),
         Mode("warm", "warm processes, --reuse 1000", ("--reuse", "1000")))
#: Modes the issue asks for that cannot be measured yet, and why (none now).
NOT_YET: dict[str, str] = {}
#: The timed stages, in order, and how the tables name them.
STAGES = {
    "session": "Spark session start",
    "listeners": f"{LISTENERS} listeners start",
    "enqueue": "enqueue_dataframe",
    "drain": "drain (wait_for_tasks)",
    "read": "read_tasks + count",
}


def missing() -> str | None:
    """Why the pipeline cannot run here (pyspark or Java missing), or None."""
    if importlib.util.find_spec("pyspark") is None:
        return "pyspark is not installed (this checkout's spark extra: pip install -e '.[spark]')"
    java_home = os.environ.get("JAVA_HOME")
    if shutil.which("java") is None and not (java_home and
                                             os.path.exists(os.path.join(java_home, "bin",
                                                                         "java"))):
        return "no Java runtime (java not on PATH, no JAVA_HOME): PySpark needs Java 17"
    return None


@contextmanager
def listeners(url: str, mode: Mode) -> Iterator[list[subprocess.Popen[bytes]]]:
    """LISTENERS ``blueque listen`` daemons at CONCURRENCY running bench_tasks:noop, each in
    its own process group; on exit each group (the daemon and any task child) is stopped by
    its pid."""
    env = {**os.environ, "BENCH_REDIS_URL": url,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(SCRIPTS),
                                                       os.environ.get("PYTHONPATH")]))}
    processes: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="blueque-bench-task-logs-") as logs:
        command = [sys.executable, "-m", "blueque.cli", "listen", "--url", url,
                   QUEUE.format(mode=mode.name),
                   "bench_tasks:noop", "--concurrency", str(CONCURRENCY), "--log-level",
                   "WARNING", "--log-dir", logs, *mode.listen_args]
        try:
            for _ in range(LISTENERS):
                processes.append(subprocess.Popen(
                    command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    start_new_session=True))
            yield processes
        finally:
            for process in processes:
                _stop_group(process)


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group ``process`` leads, SIGKILL it if it lingers."""
    if process.poll() is None:
        signal_group(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            signal_group(process.pid, signal.SIGKILL)
            process.wait()
    signal_group(process.pid, signal.SIGKILL)  # task children left in the group


def figures(seconds: dict[str, float], rows: int) -> dict[str, float]:
    """Each stage's seconds and share of the total (percent), the total, and tasks/s from the
    start of the enqueue to the last task done."""
    total = sum(seconds.values())
    out = {f"{stage}_s": value for stage, value in seconds.items()}
    out["total_s"] = total
    out.update({f"{stage}_share": 100.0 * value / total for stage, value in seconds.items()})
    out["rate"] = rows / (seconds["enqueue"] + seconds["drain"])
    out["rows"] = float(rows)
    return out


def run_pipeline(url: str, rows: int, mode: Mode,
                 log: Callable[[str], None] = lambda _: None) -> dict[str, float]:
    """One timed run of the pipeline in this process (which must not have started Spark)."""
    # pyspark is an optional extra: imported only once missing() has said it is there
    from pyspark.sql import functions as F

    from blueque.spark import enqueue_dataframe, read_tasks, wait_for_tasks
    from blueque.spark.session import local_session, stop_session

    queue = QUEUE.format(mode=mode.name)
    seconds: dict[str, float] = {}
    client = blueque.Client(url)
    started = time.perf_counter()
    spark = local_session(CORES, "blueque-spark-pipeline-bench")
    try:
        seconds["session"] = time.perf_counter() - started
        log(f"session started in {seconds['session']:.1f} s")
        started = time.perf_counter()
        with listeners(url, mode) as processes:
            wait_for(lambda: len(client.store.listener_ids(queue)) >= LISTENERS
                     or any(p.poll() is not None for p in processes), timeout=60)
            if any(p.poll() is not None for p in processes):
                raise RuntimeError("a listener exited at start")
            seconds["listeners"] = time.perf_counter() - started
            frame = spark.range(0, rows, numPartitions=CORES).select(
                F.concat(F.lit("t"), F.col("id").cast("string")).alias("task_id"),
                F.to_json(F.struct(F.col("id").alias("n"))).alias("parameters"))
            started = time.perf_counter()
            done = enqueue_dataframe(frame, url, queue, parameters="parameters",
                                     task_id="task_id")
            seconds["enqueue"] = time.perf_counter() - started
            log(f"enqueued {done.created:,} in {seconds['enqueue']:.1f} s")
            started = time.perf_counter()
            waited = wait_for_tasks(url, queue, count=rows, timeout=rows * 0.1 + 120,
                                    progress=False)
            seconds["drain"] = time.perf_counter() - started
            log(f"drained in {seconds['drain']:.1f} s more: {waited.counts}")
        started = time.perf_counter()
        counted = read_tasks(spark, url, queue).groupBy("status").count().collect()
        statuses: dict[str, int] = {row["status"]: row["count"] for row in counted}
        seconds["read"] = time.perf_counter() - started
    finally:
        stop_session(spark)
        client.close()
    if done.created != rows or statuses != {"complete": rows}:
        raise RuntimeError(f"expected {rows} complete tasks: created {done.created}, "
                           f"read back {statuses}")
    return figures(seconds, rows)


def render(results: dict[str, dict[str, float]], rows: int) -> str:
    lines = [f"Spark pipeline, {rows:,} no-op rows: local[{CORES}], {LISTENERS} listeners at "
             f"concurrency {CONCURRENCY}; {os.cpu_count()} CPUs, load "
             f"{os.getloadavg()[0]:.2f}"]
    for mode in MODES:
        out = results.get(mode.name)
        if out is None:
            continue
        lines.append(f"  mode {mode.name} ({mode.label}):")
        for stage, label in [*STAGES.items(), ("total", "total")]:
            share = out.get(f"{stage}_share", 100.0)
            lines.append(f"    {label:24s} {out[f'{stage}_s']:8.2f} s  {share:5.1f} %")
        lines.append(f"    {'tasks/s, enqueue to done':24s} {out['rate']:8.0f}")
    lines += [f"  mode {name}: not measured: {why}" for name, why in NOT_YET.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--mode", choices=[m.name for m in MODES],
                        help="only this mode (default: every mode there is)")
    parser.add_argument("--url", help="an empty Redis database to use (default: a private one)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument("--json-line", action="store_true",
                        help="end with one JSON line of the --mode's figures (benchmarks.run)")
    args = parser.parse_args(argv)
    why = missing()
    if why is not None:
        print(f"Spark pipeline: skipped: {why}")
        return 0
    modes = [m for m in MODES if args.mode in (None, m.name)]
    results: dict[str, dict[str, float]] = {}
    for mode in modes:
        server = None if args.url else RedisServer().start()
        try:
            url = args.url or server.url  # type: ignore[union-attr]
            results[mode.name] = run_pipeline(
                url, args.rows, mode, log=lambda line: print(line, file=sys.stderr))
        finally:
            if server is not None:
                server.stop()
    print(render(results, args.rows))
    if args.json:
        report: dict[str, Any] = {"rows": args.rows, "listeners": LISTENERS,
                                  "concurrency": CONCURRENCY, "cores": CORES,
                                  "modes": results, "not_measured": NOT_YET}
        Path(args.json).write_text(json.dumps(report, indent=2), encoding="utf-8")
    if args.json_line:
        print(json.dumps(results[modes[0].name]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
