"""A document pipeline: Spark splits documents into pages, Blueque listeners process each page,
a task per document enqueued after its pages sums them up, and Spark writes per-document
statistics as Parquet.

    python examples/document_pipeline.py                      # everything local, one command
    python examples/document_pipeline.py --documents 500 --listeners 2 --concurrency 4

Steps: generate a corpus of documents (JSON lines, pages separated by form feeds, as pdftotext
writes them) -> Spark reads it and explodes it into one row per page -> enqueue_dataframe makes
one task per page (the id ``run:doc:page`` makes re-running idempotent) -> ``blueque listen``
daemons run ``document_tasks:process_page`` -> one task per document, enqueued ``after=`` its
pages (``after_any``: once they have all ended, however), runs
``document_tasks:summarize_document`` -> wait_for_tasks shows progress -> read_tasks brings
the summaries and every page's times back into Spark -> per-document statistics -> Parquet.

Without ``--redis-url`` it starts a private redis-server on a free loopback port and stops it
at the end. On a real cluster, see docs/how-to/spark.md: run it with spark-submit,
``--cluster``, a shared ``--workdir`` (hdfs://, s3a://...) and listeners on worker machines.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from blueque.client import Client
from blueque.private_redis import RedisServer
from blueque.spark import enqueue_dataframe, read_tasks, wait_for_tasks
from blueque.spark.session import local_session, stop_session

EXAMPLES = Path(__file__).resolve().parent
TASK_FUNCTION = "document_tasks:process_page"
SUMMARY_FUNCTION = "document_tasks:summarize_document"
SUMMARY_SCHEMA = ("doc_id string, pages int, pages_failed int, failed_pages array<int>, "
                  "words long, characters long")
UNREADABLE = "[unreadable scan]"  # document_tasks.UNREADABLE: such pages fail
WORDS = (
    "queue", "task", "listener", "redis", "spark", "page", "document", "result", "error", "retry",
    "lease", "worker", "node", "process", "parameter", "schedule", "pending", "started",
    "complete", "failed", "batch", "partition", "executor", "driver", "cluster", "report",
    "status", "analysis", "corpus", "index", "archive", "invoice", "contract", "letter",
)

RESULT_SCHEMA = (
    "words int, characters int, distinct_words int, top_word string, seconds double"
)
PARAMETERS_SCHEMA = "doc_id string, page int"


@dataclass(frozen=True)
class Document:
    doc_id: str
    title: str
    pages: tuple[str, ...]


@dataclass(frozen=True)
class PipelineReport:
    tasks: int
    created: int
    complete: int
    failed: int
    output: str


def generate_corpus(documents: int, seed: int = 7) -> list[Document]:
    """Documents of 1 to 8 pages of 20 to 400 words; about 1 page in 25 is an unreadable scan."""
    rng = random.Random(seed)
    corpus = []
    for number in range(1, documents + 1):
        pages = []
        for _ in range(rng.randint(1, 8)):
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 400)))
            pages.append(f"{UNREADABLE} {text}" if rng.random() < 0.04 else text)
        title = " ".join(rng.choice(WORDS) for _ in range(3)).title()
        corpus.append(Document(f"doc-{number:05d}", title, tuple(pages)))
    return corpus


def write_corpus(spark: SparkSession, corpus: Sequence[Document], path: str) -> None:
    """The corpus as JSON lines (doc_id, title, text with pages joined by form feeds), written
    by Spark so that ``path`` may be any file system Spark knows (hdfs://, s3a://...)."""
    rows = [(d.doc_id, d.title, "\f".join(d.pages)) for d in corpus]
    frame = spark.createDataFrame(rows, "doc_id string, title string, text string")
    frame.write.mode("overwrite").json(path)


def split_pages(documents: DataFrame, run_id: str) -> DataFrame:
    """One row per page: doc_id, page (from 1), text, and the task id ``run:doc_id:page``."""
    pages = documents.select(
        "doc_id", F.posexplode(F.split("text", "\f")).alias("index", "text")
    ).select("doc_id", (F.col("index") + 1).alias("page"), "text")
    return pages.withColumn(
        "task_id", F.concat_ws(":", F.lit(run_id), "doc_id", F.col("page").cast("string"))
    )


def document_stats(tasks: DataFrame, summaries: DataFrame, documents: DataFrame
                   ) -> DataFrame:
    """Per document: pages, pages failed (and which), words and characters of the pages
    processed — what its summary task (run after its pages) returned — and, from the pages'
    tasks, processing seconds and when its first page started and its last finished."""
    pages = tasks.select(
        F.from_json("parameters", PARAMETERS_SCHEMA).alias("p"), "started", "finished")
    times = pages.groupBy(F.col("p.doc_id").alias("doc_id")).agg(
        F.round(F.sum(F.unix_micros("finished") - F.unix_micros("started")) / 1e6, 3)
        .alias("processing_seconds"),
        F.min("started").alias("first_started"),
        F.max("finished").alias("last_finished"),
    )
    summary = summaries.select(F.from_json("result", SUMMARY_SCHEMA).alias("s")).select("s.*")
    return (documents.select("doc_id", "title").join(summary, "doc_id").join(times, "doc_id")
            .orderBy("doc_id"))


def enqueue_summaries(url: str, queue: str, run_id: str, pages: DataFrame) -> list[str]:
    """One summary task per document, after every page task of it (``after_any``: it runs
    once they have all ended, failed ones included): the driver knows the page ids. The id
    ``run:doc:summary`` makes re-running idempotent."""
    by_document: dict[str, list[str]] = {}
    for row in pages.select("doc_id", "task_id").collect():
        by_document.setdefault(row["doc_id"], []).append(row["task_id"])
    summaries = Client(url).get_queue(queue)
    return [summaries.enqueue(json.dumps({"doc_id": doc_id}),
                              task_id=f"{run_id}:{doc_id}:summary", after=page_ids,
                              after_any=True)
            for doc_id, page_ids in sorted(by_document.items())]


@contextmanager
def listeners(url: str, queue: str, count: int, concurrency: int,
              function: str = TASK_FUNCTION) -> Iterator[list[int]]:
    """``count`` listener daemons (``blueque listen``) on this machine, stopped by pid at the
    end (SIGTERM with --on-stop drain: they finish what they run, then exit)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(EXAMPLES), *filter(None, [os.environ.get("PYTHONPATH")])])}
    command = [sys.executable, "-m", "blueque.cli", "listen", "--url", url, queue,
               function, "--concurrency", str(concurrency), "--on-stop", "drain",
               "--log-level", "WARNING"]
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(count):
            processes.append(subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL))
        yield [p.pid for p in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait()


def run_pipeline(
    spark: SparkSession,
    url: str,
    workdir: str,
    *,
    documents: int = 40,
    seed: int = 7,
    queue: str = "document-pages",
    run_id: str | None = None,
    listener_count: int = 2,
    concurrency: int = 4,
    timeout: float | None = 600,
    progress: bool = True,
) -> PipelineReport:
    """Run every step; returns the counts and where the Parquet output is."""
    run_id = run_id or f"corpus{seed}x{documents}"
    corpus_path = f"{workdir}/corpus"
    output = f"{workdir}/document_stats.parquet"
    write_corpus(spark, generate_corpus(documents, seed), corpus_path)
    docs = spark.read.json(corpus_path)
    pages = split_pages(docs, run_id).cache()
    task_ids = [row["task_id"] for row in pages.select("task_id").collect()]

    stats_queue = f"{queue}-summaries"
    with listeners(url, queue, listener_count, concurrency), \
            listeners(url, stats_queue, min(listener_count, 1), concurrency, SUMMARY_FUNCTION):
        enqueued = enqueue_dataframe(
            pages, url, queue, parameters=F.to_json(F.struct("doc_id", "page", "text")),
            task_id="task_id",
        )
        print(f"enqueued {enqueued.rows} pages ({enqueued.created} new) in "
              f"{enqueued.seconds:.1f} s", file=sys.stderr)
        summaries = enqueue_summaries(url, stats_queue, run_id, pages)
        waited = wait_for_tasks(url, queue, task_ids=task_ids, timeout=timeout,
                                progress=progress)
        wait_for_tasks(url, stats_queue, task_ids=summaries, timeout=timeout, progress=False)
    pages.unpersist()

    tasks = read_tasks(spark, url, queue, statuses=["complete", "failed"])
    mine = tasks.where(F.col("id").startswith(f"{run_id}:"))
    summary_tasks = read_tasks(spark, url, stats_queue, statuses=["complete"])
    document_stats(mine, summary_tasks.where(F.col("id").startswith(f"{run_id}:")), docs) \
        .write.mode("overwrite").parquet(output)
    return PipelineReport(
        tasks=len(task_ids),
        created=enqueued.created,
        complete=waited.counts.get("complete", 0),
        failed=waited.counts.get("failed", 0),
        output=output,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=40)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--queue", default="document-pages")
    parser.add_argument("--redis-url", help="default: a private redis-server for this run")
    parser.add_argument("--workdir", help="corpus and Parquet output (default: a new temp dir)")
    parser.add_argument("--listeners", type=int, default=2,
                        help="listener daemons to start here (0: they run elsewhere)")
    parser.add_argument("--concurrency", type=int, default=4, help="tasks per listener")
    parser.add_argument("--cores", type=int, default=2, help="local[N] Spark session")
    parser.add_argument("--cluster", action="store_true",
                        help="use the session spark-submit configured instead of local[N]")
    parser.add_argument("--timeout", type=float, default=3600)
    args = parser.parse_args(argv)

    workdir = args.workdir or tempfile.mkdtemp(prefix="blueque-documents-")
    with ExitStack() as stack:
        url = args.redis_url
        if url is None:
            url = stack.enter_context(RedisServer()).url
        if args.cluster:
            spark = SparkSession.builder.appName("blueque-documents").getOrCreate()
            stack.callback(spark.stop)
        else:
            spark = local_session(args.cores, "blueque-documents")
            stack.callback(stop_session, spark)
        report = run_pipeline(
            spark, url, workdir, documents=args.documents, seed=args.seed, queue=args.queue,
            listener_count=args.listeners, concurrency=args.concurrency, timeout=args.timeout,
        )
        stats = spark.read.parquet(report.output)
        stats.select("doc_id", "title", "pages", "pages_failed", "words",
                     "processing_seconds").show(10, truncate=False)
        print(f"{report.tasks} pages: {report.complete} complete, {report.failed} failed; "
              f"per-document statistics of {stats.count()} documents in {report.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
