"""blueque.spark on a local[2] session against the suite's private redis-server."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import psutil
import pytest
import redis

import blueque
from blueque.config import Settings
from blueque.testing import RedisServer, free_port, wait_for

pytest.importorskip("pyspark")

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from blueque.spark import (
    BatchProgress,
    InvalidDataFrame,
    SparkEnqueueError,
    WaitTimeout,
    enqueue_dataframe,
    read_tasks,
    wait_for_tasks,
)
from blueque.spark.session import local_session, stop_session

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    """One local[2] session for every Spark test (it takes ~20 s to start on two cores); its
    JVM is stopped by pid after this module, so later tests do not run beside an idle JVM."""
    session = local_session(cores=2, app_name="blueque-tests")
    try:
        yield session
    finally:
        stop_session(session)


@pytest.fixture
def url(redis_client: redis.Redis, redis_url: str) -> str:
    """The private server's URL; redis_client has emptied its database."""
    return redis_url


def numbered(spark: SparkSession, rows: int, prefix: str = "t", partitions: int = 2) -> DataFrame:
    """rows of (tid, n, payload): ids t0..t{rows-1}, payload a JSON object."""
    return spark.range(0, rows, numPartitions=partitions).select(
        F.concat(F.lit(prefix), F.col("id").cast("string")).alias("tid"),
        F.col("id").alias("n"),
        F.to_json(F.struct(F.col("id").alias("n"), F.lit("x").alias("kind"))).alias("payload"),
    )


def task_keys(redis_client: redis.Redis) -> int:
    return sum(1 for _ in redis_client.scan_iter(match="blueque_task_*", count=10_000))


def test_100k_rows_enqueued_read_back_exactly_and_rerun_creates_nothing(
    spark: SparkSession, url: str, redis_client: redis.Redis
) -> None:
    rows = 100_000
    df = numbered(spark, rows)
    first = enqueue_dataframe(df, url, "pages", parameters="payload", task_id="tid")
    assert (first.created, first.existing, first.partitions) == (rows, 0, 2)
    assert redis_client.llen("blueque_pending_tasks_pages") == rows

    again = enqueue_dataframe(df, url, "pages", parameters="payload", task_id="tid")
    assert (again.created, again.existing) == (0, rows)
    assert redis_client.llen("blueque_pending_tasks_pages") == rows
    assert task_keys(redis_client) == rows

    tasks = read_tasks(spark, url, "pages").cache()
    assert tasks.count() == rows
    expected = df.select(F.col("tid").alias("id"), F.col("payload").alias("parameters"))
    got = tasks.select("id", "parameters")
    assert got.exceptAll(expected).count() == 0
    assert expected.exceptAll(got).count() == 0
    summary = tasks.agg(
        F.count_if(F.col("status") != "pending").alias("not_pending"),
        F.count_if(F.col("created").isNull()).alias("no_created"),
        F.count_if(F.col("result").isNotNull() | F.col("pid").isNotNull()).alias("ran"),
    ).first()
    assert summary is not None
    assert (summary["not_pending"], summary["no_created"], summary["ran"]) == (0, 0, 0)
    tasks.unpersist()


def test_overlapping_rerun_counts_new_and_existing_ids(
    spark: SparkSession, url: str, redis_client: redis.Redis
) -> None:
    enqueue_dataframe(numbered(spark, 3_000), url, "q", parameters="payload", task_id="tid")
    more = numbered(spark, 5_000)  # t0..t4999: 3,000 old ids, 2,000 new
    result = enqueue_dataframe(more, url, "q", parameters="payload", task_id="tid",
                               batch_size=700)
    assert (result.created, result.existing, result.rows) == (2_000, 3_000, 5_000)
    assert redis_client.llen("blueque_pending_tasks_q") == 5_000
    nothing = enqueue_dataframe(more.limit(0), url, "q", parameters="payload", task_id="tid")
    assert (nothing.created, nothing.existing) == (0, 0)
    assert redis_client.llen("blueque_pending_tasks_q") == 5_000


def test_executors_get_the_drivers_settings_and_layout(
    spark: SparkSession, url: str, redis_client: redis.Redis
) -> None:
    """A Settings in place of the URL, parsed once on the driver and pickled to executors,
    keeps its layout there; cluster=True, hash_tags' deprecated name, still selects it."""
    settings = Settings.from_url(url, hash_tags=True, socket_timeout=5)
    df = numbered(spark, 40)
    assert enqueue_dataframe(df, settings, "tagged", parameters="payload",
                             task_id="tid").created == 40
    assert redis_client.llen("blueque_pending_tasks_{tagged}") == 40
    ids = {r["id"] for r in read_tasks(spark, settings, "tagged").collect()}
    assert ids == {f"{{tagged}}t{n}" for n in range(40)}
    with pytest.warns(DeprecationWarning, match="hash_tags=True"):
        old = enqueue_dataframe(df, url, "tagged", parameters="payload", task_id="tid",
                                cluster=True)
    assert (old.created, old.existing) == (0, 40)
    with pytest.warns(DeprecationWarning, match="hash_tags=True"):
        assert read_tasks(spark, url, "tagged", cluster=True).count() == 40
    with pytest.raises(blueque.ConfigurationError, match="go with a URL"):
        enqueue_dataframe(df, settings, "tagged", redis_kwargs={"socket_timeout": 1})


def test_default_parameters_are_each_row_as_json_with_fresh_ids(
    spark: SparkSession, url: str, client: blueque.Client
) -> None:
    df = spark.createDataFrame([(1, "a", [1, 2]), (2, "b", [])], "n int, s string, xs array<int>")
    result = enqueue_dataframe(df, url, "q")
    assert (result.created, result.existing) == (2, 0)
    ids = client.get_queue("q").task_ids("pending")
    params = sorted((json.loads(client.get_task(i).parameters or "") for i in ids),
                    key=lambda p: p["n"])
    assert params == [{"n": 1, "s": "a", "xs": [1, 2]}, {"n": 2, "s": "b", "xs": []}]
    assert all(len(i) == 36 for i in ids)  # uuid4


def test_struct_and_integer_columns_are_converted(
    spark: SparkSession, url: str, client: blueque.Client
) -> None:
    df = spark.createDataFrame([(7, "x")], "n long, s string")
    enqueue_dataframe(df, url, "q", parameters=F.struct("n", "s"), task_id="n")
    assert json.loads(client.get_task("7").parameters or "") == {"n": 7, "s": "x"}


def test_unusable_parameter_column_type_is_refused_before_any_job(
    spark: SparkSession, url: str, redis_client: redis.Redis
) -> None:
    df = spark.createDataFrame([(1,)], "n int").select(F.current_timestamp().alias("when"))
    with pytest.raises(blueque.ConfigurationError, match="timestamp"):
        enqueue_dataframe(df, url, "q", parameters="when")
    assert redis_client.dbsize() == 0


@pytest.mark.parametrize("with_ids", [True, False])
def test_null_parameters_write_nothing(
    spark: SparkSession, url: str, redis_client: redis.Redis, with_ids: bool
) -> None:
    df = numbered(spark, 1_000).withColumn(
        "payload", F.when(F.col("n") % 250 == 3, F.lit(None)).otherwise(F.col("payload"))
    )
    with pytest.raises(InvalidDataFrame, match=r"4 rows (with|have) null"
                       ) as caught:
        enqueue_dataframe(df, url, "q", parameters="payload",
                          task_id="tid" if with_ids else None)
    assert caught.value.null_parameters == 4
    assert "nothing was written" in str(caught.value)
    assert redis_client.dbsize() == 0


def test_unvalidated_null_stops_its_partition_and_says_what_it_wrote(
    spark: SparkSession, url: str, redis_client: redis.Redis
) -> None:
    df = numbered(spark, 1_000, partitions=1).withColumn(
        "payload", F.when(F.col("n") == 600, F.lit(None)).otherwise(F.col("payload")))
    with pytest.raises(SparkEnqueueError, match="row 601 of partition 0 has null") as caught:
        enqueue_dataframe(df, url, "q", parameters="payload", task_id="tid", batch_size=250,
                          validate=False)
    error = caught.value
    assert (error.created, error.existing, error.unknown) == (500, 0, 0)
    assert "500 tasks created, 0 already existed, nothing else" in str(error)
    assert redis_client.llen("blueque_pending_tasks_q") == 500


def test_ids_and_parameters_with_separators_and_unicode_round_trip(
    spark: SparkSession, url: str, client: blueque.Client
) -> None:
    rows = [("a:1", '{"x": "y z"}'), ("12:ab", "plain text: with spaces"), ("é:ü", "∑ ünï"),
            ("+", ""), ("!", "!")]
    df = spark.createDataFrame(rows, "id string, p string")
    assert enqueue_dataframe(df, url, "q", parameters="p", task_id="id").created == 5
    assert {i: client.get_task(i).parameters for i, _ in rows} == dict(rows)
    assert enqueue_dataframe(df.select("p"), url, "q2", parameters="p").created == 5
    stored = client.get_queue("q2").task_ids("pending")
    assert sorted(client.get_task(i).parameters or "" for i in stored) == sorted(p for _, p in rows)


def test_duplicate_ids_in_one_dataframe_write_nothing(
    spark: SparkSession, url: str, redis_client: redis.Redis
) -> None:
    df = numbered(spark, 1_000).union(numbered(spark, 1_000).where("n in (5, 17)"))
    with pytest.raises(InvalidDataFrame, match="2 task ids used by more than one row") as caught:
        enqueue_dataframe(df, url, "q", parameters="payload", task_id="tid")
    assert caught.value.duplicate_ids == 2
    assert sorted(e.split()[0] for e in caught.value.examples) == ["'t17'", "'t5'"]
    assert redis_client.dbsize() == 0


def test_null_empty_and_spaced_ids_write_nothing(
    spark: SparkSession, url: str, redis_client: redis.Redis
) -> None:
    df = spark.createDataFrame(
        [("a", "{}"), (None, "{}"), ("", "{}"), ("b c", "{}"), ("d", "{}")], "id string, p string"
    )
    with pytest.raises(InvalidDataFrame, match="3 rows with a null, empty or space") as caught:
        enqueue_dataframe(df, url, "q", parameters="p", task_id="id")
    assert caught.value.bad_ids == 3
    assert redis_client.dbsize() == 0


def test_unreachable_redis_is_reported_by_the_driver_check(spark: SparkSession) -> None:
    port = free_port()
    with pytest.raises(blueque.RedisUnavailable, match=f"127.0.0.1:{port} is unreachable"):
        enqueue_dataframe(numbered(spark, 10), f"redis://127.0.0.1:{port}/0", "q",
                          task_id="tid")


def test_unreachable_redis_fails_the_spark_job_clearly(spark: SparkSession) -> None:
    port = free_port()
    url = f"redis://:secret@127.0.0.1:{port}/0?retry_deadline=0.5"  # default: 30 s
    with pytest.raises(SparkEnqueueError) as caught:
        enqueue_dataframe(numbered(spark, 10), url, "q", task_id="tid", check_connection=False)
    message = str(caught.value)
    assert f"127.0.0.1:{port}" in message and "unreachable" in message
    assert "secret" not in message
    assert "failed in 2 of 2 partitions" in message
    assert (caught.value.created, caught.value.existing, caught.value.unknown) == (0, 0, 0)


def test_redis_lost_midway_reports_what_was_written(spark: SparkSession, tmp_path: str) -> None:
    """Redis dies while partitions write; the error's counts bracket what Redis kept."""
    directory = str(tmp_path)
    server = RedisServer(directory=directory,
                         extra_args=("--appendonly", "yes", "--appendfsync", "always"))
    server.start()
    port = server.port
    watcher = redis.Redis(port=port)

    def kill_after_1000_tasks() -> None:
        try:
            wait_for(lambda: watcher.llen("blueque_pending_tasks_q") >= 1_000, 120, 0.001)
        finally:
            server.kill()

    killer = threading.Thread(target=kill_after_1000_tasks)
    killer.start()
    try:
        with pytest.raises(SparkEnqueueError) as caught:
            # retried for 0.5 s after the kill (the default is 30 s), then given up
            enqueue_dataframe(numbered(spark, 200_000), server.url + "?retry_deadline=0.5",
                              "q", parameters="payload",
                              task_id="tid", batch_size=100, validate=False)
        killer.join()
        error = caught.value
        assert "unreachable" in str(error) and f"127.0.0.1:{port}" in str(error)
        # whole batches before the kill; each failed partition's batch in flight is in doubt
        # (a batch whose reply was lost counts as in doubt, though Redis may have applied it)
        assert error.failures and error.created % 100 == 0
        assert error.created + error.unknown >= 1_000
        assert all(r.unknown in (0, 100) for r in error.failures)
        assert all(r.unknown == 100 for r in error.failures if r.created)
        assert f"{error.created} tasks created, 0 already existed, and {error.unknown} rows" \
            in str(error)
        server = RedisServer(port=port, directory=directory, extra_args=("--appendonly", "yes"))
        server.start()
        survivor = blueque.Client(server.url)
        try:
            kept = survivor.get_queue("q").stats().pending
        finally:
            survivor.close()
        assert error.created <= kept <= error.created + error.unknown
    finally:
        killer.join()
        watcher.close()
        server.stop()


def test_a_failing_spark_job_names_the_python_error(
    spark: SparkSession, url: str, redis_client: redis.Redis
) -> None:
    @F.udf(returnType=T.StringType(), useArrow=False)
    def broken(n: int) -> str:
        if n == 7:
            raise ValueError(f"cannot render row {n}")
        return "{}"

    df = spark.range(0, 20, numPartitions=1).select(
        F.col("id").alias("tid"), broken("id").alias("payload"))
    with pytest.raises(SparkEnqueueError, match=re.escape(
            "failed: ValueError: cannot render row 7. Partitions that ran before the failure "
            "may have written tasks")):
        enqueue_dataframe(df, url, "q", parameters="payload", task_id="tid", validate=False)
    assert redis_client.dbsize() == 0


def finish(client: blueque.Client, queue: str, outcome: str) -> blueque.Task:
    task = client.get_listener(queue).listen(timeout=5)
    assert task is not None
    processor = client.get_processor(task)
    processor.start(os.getpid())
    if outcome == "complete":
        processor.complete('{"words": 3}')
    elif outcome == "failed":
        processor.fail("page unreadable")
    return task.refresh()


def test_read_tasks_types_every_field_and_filters_statuses(
    spark: SparkSession, url: str, client: blueque.Client
) -> None:
    queue = client.get_queue("q")
    for n in range(5):
        queue.enqueue(json.dumps({"n": n}), task_id=f"t{n}")
    done, broken, running = (finish(client, "q", o) for o in ("complete", "failed", "started"))
    rows = {r["id"]: r for r in read_tasks(spark, url, "q", partition_size=2).collect()}
    assert {i: r["status"] for i, r in rows.items()} == {
        done.id: "complete", broken.id: "failed", running.id: "started",
        "t3": "pending", "t4": "pending",
    }
    complete = rows[done.id]
    assert complete["result"] == '{"words": 3}' and complete["error"] is None
    assert complete["pid"] == os.getpid() and complete["attempts"] == 1
    assert complete["node"] == client.get_listener("q").id
    assert complete["created"] <= complete["started"] <= complete["finished"]
    # its finished column is when it ended: its updated (no finished_at field since issue 29)
    assert abs(complete["finished"].timestamp() - float(done.data["updated"])) < 1e-3
    assert rows[broken.id]["error"] == "page unreadable"
    assert rows[running.id]["finished"] is None and rows[running.id]["started"] is not None
    assert rows["t3"]["attempts"] is None and rows["t3"]["started"] is None

    finished = read_tasks(spark, url, "q", statuses=["failed", "complete"])
    assert sorted(r["id"] for r in finished.collect()) == sorted([done.id, broken.id])
    assert read_tasks(spark, url, "q", statuses="started").count() == 1
    assert read_tasks(spark, url, "empty").count() == 0
    with pytest.raises(blueque.ConfigurationError, match="unknown status"):
        read_tasks(spark, url, "q", statuses=["done"])


def test_read_tasks_groups_cancelled_tasks_apart(spark: SparkSession, url: str,
                                                 client: blueque.Client) -> None:
    """A cancelled task is failed in its hash; its row's status says cancelled, so a
    ``groupBy("status")`` counts it apart, and ``statuses`` may name it."""
    queue = client.get_queue("q")
    ids = [queue.enqueue("{}", task_id=f"t{n}") for n in range(4)]
    broken = finish(client, "q", "failed")
    assert broken.id == ids[0]
    for task_id in ids[1:3]:
        client.cancel_task(task_id)
    counts = {r["status"]: r["count"]
              for r in read_tasks(spark, url, "q").groupBy("status").count().collect()}
    assert counts == {"failed": 1, "cancelled": 2, "pending": 1}
    cancelled = read_tasks(spark, url, "q", statuses="cancelled").collect()
    assert sorted(r["id"] for r in cancelled) == ["t1", "t2"]
    assert cancelled[0]["error"] == "cancelled: cancelled"
    assert [r["id"] for r in read_tasks(spark, url, "q", statuses="failed").collect()] == ["t0"]


def test_wait_for_tasks_counts_cancelled_ones_as_finished_apart(client: blueque.Client
                                                                ) -> None:
    queue = client.get_queue("q")
    ids = queue.enqueue_many(["{}"] * 3, task_ids=["a", "b", "c"]).task_ids
    finish(client, "q", "complete")
    for task_id in ids[1:]:
        client.cancel_task(task_id)
    last = wait_for_tasks(client, "q", task_ids=ids, progress=False)
    assert last.done and last.counts == {"complete": 1, "cancelled": 2} and last.finished == 3
    assert "3/3 finished (complete 1, failed 0, cancelled 2)" in last.line()
    assert wait_for_tasks(client, "q", count=3, progress=False).finished == 3


def test_wait_for_task_ids_reports_counts_until_all_finish(client: blueque.Client) -> None:
    queue = client.get_queue("q")
    ids = queue.enqueue_many(["{}"] * 3, task_ids=["a", "b", "c"]).task_ids
    seen: list[BatchProgress] = []
    outcomes = iter(["complete", "failed", "complete"])

    def work(progress: BatchProgress) -> None:  # after each look of the waiter, one task ends
        seen.append(progress)
        if not progress.done:
            finish(client, "q", next(outcomes))

    last = wait_for_tasks(client, "q", task_ids=[*ids, "nope"], progress=work)
    assert [p.finished for p in seen] == [0, 1, 2, 3]
    assert seen[0].counts == {"pending": 3, "missing": 1}
    assert last.done and last.counts == {"complete": 2, "failed": 1, "missing": 1}
    assert last.total == 4
    assert "3/4 finished (complete 2, failed 1)" in last.line()


def test_wait_for_count_and_for_the_queue_to_drain(client: blueque.Client) -> None:
    client.get_queue("q").enqueue_many(["{}"] * 2)
    with pytest.raises(WaitTimeout, match="did not finish within 0 s") as caught:
        wait_for_tasks(client, "q", count=1, timeout=0, progress=False)
    assert caught.value.progress.counts["pending"] == 2
    finish(client, "q", "complete")
    assert wait_for_tasks(client, "q", count=1, progress=False).done
    with pytest.raises(WaitTimeout):
        wait_for_tasks(client, "q", timeout=0, progress=False)
    finish(client, "q", "failed")
    drained = wait_for_tasks(client, "q", progress=False)
    assert (drained.finished, drained.active, drained.total) == (2, 0, None)


def load_example(name: str) -> ModuleType:
    path = Path(__file__).resolve().parent.parent / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"example_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_document_pipeline_end_to_end_with_listener_daemons(
    spark: SparkSession, url: str, tmp_path: Path
) -> None:
    example = load_example("document_pipeline")
    corpus = example.generate_corpus(12, seed=3)
    unreadable = example.UNREADABLE
    expected = {
        d.doc_id: (
            len(d.pages),
            [n for n, page in enumerate(d.pages, 1) if page.startswith(unreadable)],
            sum(len(p.split()) for p in d.pages if not p.startswith(unreadable)),
            sum(len(p) for p in d.pages if not p.startswith(unreadable)),
        )
        for d in corpus
    }
    pages = sum(len(d.pages) for d in corpus)
    assert any(failed for _, failed, _, _ in expected.values())  # seed 3 has unreadable pages

    report = example.run_pipeline(spark, url, str(tmp_path), documents=12, seed=3,
                                  listener_count=2, concurrency=2, timeout=240,
                                  progress=False)
    daemons = [p for p in psutil.Process().children(recursive=True) if _is_listener(p)]
    assert daemons == []  # stopped by pid
    assert (report.tasks, report.created) == (pages, pages)
    assert report.failed == sum(len(f) for _, f, _, _ in expected.values())
    assert report.complete + report.failed == pages

    stats = {r["doc_id"]: r for r in spark.read.parquet(report.output).collect()}
    got = {i: (r["pages"], list(r["failed_pages"]), r["words"], r["characters"])
           for i, r in stats.items()}
    assert got == expected
    assert all(r["pages_failed"] == len(r["failed_pages"]) for r in stats.values())
    assert all(r["processing_seconds"] > 0 for r in stats.values())
    assert all(r["first_started"] <= r["last_finished"] for r in stats.values())

    again = example.run_pipeline(spark, url, str(tmp_path / "again"), documents=12, seed=3,
                                 listener_count=0, timeout=30, progress=False)
    assert (again.tasks, again.created, again.complete) == (pages, 0, report.complete)


def _is_listener(process: psutil.Process) -> bool:
    """A `blueque listen` process; short-lived zombies (a JVM's helper shells) are not."""
    try:
        return "listen" in process.cmdline()
    except (psutil.ZombieProcess, psutil.NoSuchProcess):
        return False


# --- the Spark page's blocks ------------------------------------------------------------------
SPARK_PAGE, SPARK_SECTION = "how-to/spark.md", "From a DataFrame to tasks and back"


@pytest.mark.slow
def test_the_readme_spark_example_runs_as_written(spark: SparkSession, url: str,
                                                  tmp_path: Path) -> None:
    """The Spark page's code with its ``docs`` (documents whose pages a form feed separates) and
    ``spark``, redis.internal being the test's Redis, and a listener serving "pages"
    (tests.jobs:words: counts a page's words)."""
    from tests.daemons import Daemon, daemons, listen_command
    from tests.readme import block

    code = block(SPARK_SECTION, 1, SPARK_PAGE).text.replace("redis://redis.internal:6379/0", url)
    *program, last = code.rstrip("\n").split("\n")
    docs = spark.createDataFrame([("d1", "one two\fthree"), ("d2", "four five six")],
                                 ["doc_id", "text"])
    namespace: dict[str, object] = {"docs": docs, "spark": spark}
    with daemons(tmp_path) as started:
        started.append(Daemon(listen_command(url, "pages", "tests.jobs:words", "--interval",
                                             "0.5", "--poll", "0.1", "--concurrency", "2"),
                              tmp_path / "listener.log"))
        exec("\n".join(program), namespace)  # the page's own lines
    rows = eval(last, namespace).collect()  # its last line: the results, read back
    assert sorted((r["id"], r["status"], r["r"]["words"]) for r in rows) == [
        ("d1:0", "complete", 2), ("d1:1", "complete", 1), ("d2:0", "complete", 3)]
    assert all(r["finished"] is not None for r in rows)


def test_the_readme_pipeline_commands() -> None:
    """The example's two command lines are accepted by its own parser, as written: the local
    one (its run is test_document_pipeline_end_to_end_with_listener_daemons's, on fewer
    documents) and the YARN one, which needs a cluster this machine is not."""
    from tests.readme import block, commands
    from tests.test_readme import parses

    (local,) = commands(block(SPARK_SECTION, 2, SPARK_PAGE).text)
    (submit,) = commands(block(SPARK_SECTION, 3, SPARK_PAGE).text)
    assert local.split()[:2] == ["python", "examples/document_pipeline.py"]
    words = submit.split()
    assert words[:5] == ["spark-submit", "--master", "yarn", "--py-files", "blueque.zip"]
    for line in (local.split(), ["python", *words[5:]]):
        done = parses(line)
        assert done.returncode == 0, (line, done.stderr)
