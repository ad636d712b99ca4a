"""enqueue_dataframe on a local Spark session against single-process enqueue_many.

    python -m benchmarks.spark_bench                  # 200,000 rows, 3 repeats, local[2]
    python -m benchmarks.spark_bench --rows 50000 --repeats 1 --json out.json

Both sides write the same rows (caller ids ``r0``.., JSON parameters) into an emptied queue on
a private redis-server. The single process gets its lists ready-made; Spark gets a cached
DataFrame with 2 partitions, and its Python workers are warmed up first, so both figures are
the writing alone. Spark's figures: with validation (one extra job, a shuffle on the id),
without, and without ids (fresh uuid4 per row; compared with enqueue_many without ids). On one
machine Spark and Redis share the cores: Spark's gain is scale-out on a cluster, here it should
simply not be much slower (target: spark / single >= 0.7). Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import redis
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import blueque
from blueque.spark import enqueue_dataframe
from blueque.spark.session import local_session, stop_session
from blueque.testing import RedisServer

QUEUE = "spark-bench"
BATCH = 1000
TARGET = 0.7


def rows_as_lists(rows: int) -> tuple[list[str], list[str]]:
    ids = [f"r{n}" for n in range(rows)]
    params = [json.dumps({"n": n, "doc": f"doc-{n // 10}", "page": n % 10}) for n in range(rows)]
    return ids, params


def rows_as_dataframe(spark: SparkSession, rows: int, partitions: int) -> DataFrame:
    n = F.col("id")
    frame = spark.range(0, rows, numPartitions=partitions).select(
        F.concat(F.lit("r"), n.cast("string")).alias("tid"),
        F.to_json(F.struct(n.alias("n"),
                           F.concat(F.lit("doc-"), F.floor(n / 10).cast("string")).alias("doc"),
                           (n % 10).alias("page"))).alias("payload"),
    ).cache()
    frame.count()
    return frame


def single_process(url: str, ids: list[str], params: list[str], with_ids: bool) -> float:
    client = blueque.Client(url)
    try:
        queue = client.get_queue(QUEUE)
        started = time.perf_counter()
        for start in range(0, len(params), BATCH):
            queue.enqueue_many(params[start : start + BATCH],
                               task_ids=ids[start : start + BATCH] if with_ids else None)
        return time.perf_counter() - started
    finally:
        client.close()


def with_spark(url: str, frame: DataFrame, with_ids: bool, validate: bool) -> float:
    started = time.perf_counter()
    result = enqueue_dataframe(frame, url, QUEUE, parameters="payload",
                               task_id="tid" if with_ids else None, validate=validate,
                               batch_size=BATCH)
    seconds = time.perf_counter() - started
    assert result.created == frame.count(), result
    return seconds


def measure(
    spark: SparkSession, url: str, rows: int, repeats: int, partitions: int = 2,
    log: Callable[[str], None] = lambda _: None,
) -> dict[str, float]:
    """Median rows/s of each way of writing, and the ratios of issue 5's target."""
    empty = redis.Redis.from_url(url)
    ids, params = rows_as_lists(rows)
    frame = rows_as_dataframe(spark, rows, partitions)
    with_spark(url, rows_as_dataframe(spark, 2_000, partitions), True, True)  # warm workers
    ways: dict[str, Callable[[], float]] = {
        "single_ids": lambda: single_process(url, ids, params, True),
        "spark_ids_validated": lambda: with_spark(url, frame, True, True),
        "spark_ids": lambda: with_spark(url, frame, True, False),
        "single_no_ids": lambda: single_process(url, ids, params, False),
        "spark_no_ids": lambda: with_spark(url, frame, False, False),
    }
    rates: dict[str, list[float]] = {name: [] for name in ways}
    try:
        for repeat in range(repeats):
            for name, run in ways.items():  # interleaved, so machine noise hits every way
                empty.flushdb()
                seconds = run()
                rates[name].append(rows / seconds)
                log(f"repeat {repeat + 1}: {name:20} {rows / seconds:10,.0f} rows/s")
    finally:
        empty.flushdb()
        empty.close()
        frame.unpersist()
    figures = {f"{name}_rows_per_s": statistics.median(r) for name, r in rates.items()}
    single = figures["single_ids_rows_per_s"]
    figures["ratio_spark_ids_validated"] = figures["spark_ids_validated_rows_per_s"] / single
    figures["ratio_spark_ids"] = figures["spark_ids_rows_per_s"] / single
    figures["ratio_spark_no_ids"] = (figures["spark_no_ids_rows_per_s"]
                                     / figures["single_no_ids_rows_per_s"])
    return figures


def render(figures: dict[str, float], rows: int, repeats: int, cores: int) -> str:
    lines = [f"enqueue {rows:,} rows, median of {repeats}, Spark local[{cores}], "
             f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"]
    for key, value in figures.items():
        if key.endswith("_rows_per_s"):
            lines.append(f"  {key[:-11]:22} {value:10,.0f} rows/s")
    for key in ("ratio_spark_ids_validated", "ratio_spark_ids", "ratio_spark_no_ids"):
        verdict = "meets" if figures[key] >= TARGET else "misses"
        lines.append(f"  {key:26} {figures[key]:5.2f}x  ({verdict} the {TARGET}x target)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--url", help="an empty Redis database to use (default: a private one)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    server = None if args.url else RedisServer().start()
    url = args.url or server.url  # type: ignore[union-attr]
    spark = local_session(args.cores, "blueque-spark-bench")
    try:
        figures = measure(spark, url, args.rows, args.repeats, partitions=args.cores,
                          log=lambda line: print(line, file=sys.stderr))
    finally:
        stop_session(spark)
        if server is not None:
            server.stop()
    print(render(figures, args.rows, args.repeats, args.cores))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump({"rows": args.rows, "repeats": args.repeats, "cores": args.cores,
                       **figures}, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
