"""enqueue_dataframe: every row of a DataFrame becomes one Blueque task, written by executors.

Each partition opens its own connection (a redis-py client cannot be pickled from the driver)
and calls ``Queue.enqueue_many`` in batches. Each partition returns a small report (created,
existing, rows whose write failed midway, error) and the driver collects them: the counts come
from exactly one successful attempt per partition, by construction. Accumulators would need
care to mean the same (updates made in transformations are re-applied when a stage is
recomputed), and a failing partition could not report what it had already written through
them: a report row can.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.rdd import RDD
from pyspark.serializers import UTF8Deserializer
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from blueque.client import Client
from blueque.config import Settings, hash_tags_option, hide_password, settings_for
from blueque.errors import BluequeError, ConfigurationError

#: Column names the selected (parameters, id) DataFrame uses; unlikely to clash with a user's.
PARAMETERS = "__blueque_parameters"
TASK_ID = "__blueque_task_id"
#: How many offending ids or rows an InvalidDataFrame error quotes.
EXAMPLES = 5


@dataclass(frozen=True)
class EnqueueResult:
    """What enqueue_dataframe did. ``existing`` counts ids that were already in Redis: from an
    earlier run, or written by a failed attempt of this run's Spark task that was retried."""

    created: int
    existing: int
    partitions: int
    seconds: float

    @property
    def rows(self) -> int:
        return self.created + self.existing


@dataclass(frozen=True)
class PartitionReport:
    """One partition's outcome, collected by the driver."""

    partition: int
    created: int = 0
    existing: int = 0
    #: rows of a batch whose write failed midway: each may or may not exist now
    unknown: int = 0
    error: str = ""


class InvalidDataFrame(BluequeError, ValueError):
    """The DataFrame cannot become tasks: null parameters, missing or malformed ids, or an id
    used by more than one row. Found before anything was written."""

    def __init__(
        self,
        message: str,
        null_parameters: int = 0,
        bad_ids: int = 0,
        duplicate_ids: int = 0,
        examples: Sequence[str] = (),
    ) -> None:
        super().__init__(message)
        self.null_parameters = null_parameters
        self.bad_ids = bad_ids
        self.duplicate_ids = duplicate_ids
        self.examples = list(examples)


class SparkEnqueueError(BluequeError):
    """Some partitions could not write their tasks. The counts say exactly what the other
    partitions (and the failed ones, up to their failure) did write."""

    def __init__(self, message: str, reports: Sequence[PartitionReport] = ()) -> None:
        super().__init__(message)
        self.reports = list(reports)
        self.created = sum(r.created for r in reports)
        self.existing = sum(r.existing for r in reports)
        self.unknown = sum(r.unknown for r in reports)
        self.failures = [r for r in reports if r.error]


@dataclass
class Tally:
    """What a partition has written so far."""

    created: int = 0
    existing: int = 0


@dataclass(frozen=True)
class PartitionWriter:
    """The function each partition runs (pickled by reference: blueque must be installed on
    the executors), over the lines task_lines() makes."""

    settings: Settings
    queue: str
    batch_size: int
    with_ids: bool

    def __call__(self, index: int, lines: Iterable[str]) -> Iterator[PartitionReport]:
        done = Tally()
        client: Client | None = None
        params: list[str] = []
        ids: list[str] = []
        seen = 0
        try:
            for line in lines:
                seen += 1
                if line[0] != "+":
                    raise InvalidDataFrame(
                        f"row {seen} of partition {index} has null parameters or a null id; "
                        "the partition stopped there, having written only the tasks counted here"
                    )
                if self.with_ids:
                    colon = line.index(":", 1)
                    end = colon + 1 + int(line[1:colon])
                    ids.append(line[colon + 1 : end])
                    params.append(line[end:])
                else:
                    params.append(line[1:])
                if len(params) >= self.batch_size:
                    client = client or self._connect()
                    self._write(client, params, ids, done)
            if params:
                client = client or self._connect()
                self._write(client, params, ids, done)
        except BluequeError as error:
            # a batch cut short by a lost connection may or may not have been written; one
            # rejected before sending (bad id) or never sent (no connection) was not
            unknown = len(params) if client is not None and not isinstance(
                error, (ConfigurationError, InvalidDataFrame)) else 0
            yield PartitionReport(index, done.created, done.existing, unknown, str(error))
            return
        finally:
            if client is not None:
                client.close()
        yield PartitionReport(index, done.created, done.existing)

    def _connect(self) -> Client:
        """A client that has answered a PING: if Redis cannot be reached, the partition fails
        here, before its first batch, and nothing of it is in doubt."""
        client = Client(self.settings)
        try:
            client.ping()
        except BluequeError:
            client.close()
            raise
        return client

    def _write(
        self, client: Client, params: list[str], ids: list[str], done: Tally
    ) -> None:
        outcome = client.get_queue(self.queue).enqueue_many(
            params, task_ids=ids if self.with_ids else None
        )
        done.created += outcome.created
        done.existing += outcome.existing
        params.clear()
        ids.clear()


def _as_parameters(df: DataFrame, parameters: str | Column | None) -> Column:
    if parameters is None:
        return F.to_json(F.struct(*[df[name] for name in df.columns]))
    column = df[parameters] if isinstance(parameters, str) else parameters
    kind = df.select(column).schema.fields[0].dataType
    if isinstance(kind, T.StringType):
        return column
    if isinstance(kind, (T.StructType, T.MapType, T.ArrayType)):
        return F.to_json(column)
    if isinstance(kind, (T.NumericType, T.BooleanType)):
        return column.cast("string")
    raise ConfigurationError(
        f"parameters must be a string column (JSON by convention), a struct, map or array "
        f"(written as JSON), or a number; {parameters!r} is {kind.simpleString()}: convert it"
    )


def _as_task_id(df: DataFrame, task_id: str | Column) -> Column:
    column = df[task_id] if isinstance(task_id, str) else task_id
    kind = df.select(column).schema.fields[0].dataType
    if isinstance(kind, T.StringType):
        return column
    if isinstance(kind, T.IntegralType):
        return column.cast("string")
    raise ConfigurationError(
        f"task_id must be a string or integer column; {task_id!r} is {kind.simpleString()}"
    )


def select_tasks(
    df: DataFrame, parameters: str | Column | None, task_id: str | Column | None
) -> DataFrame:
    """The (parameters, task id) DataFrame that enqueue_dataframe validates and writes."""
    columns = [_as_parameters(df, parameters).alias(PARAMETERS)]
    if task_id is not None:
        columns.append(_as_task_id(df, task_id).alias(TASK_ID))
    return df.select(*columns)


def task_lines(selected: DataFrame) -> RDD[str]:
    """Each task as one string, handed from the JVM to the Python workers as plain UTF-8 (as
    DataFrame.toJSON does) rather than as pickled Row objects, which costs twice as much per
    row: ``!`` for a row with a null, else ``+``, the id's length, ``:``, the id and the
    parameters (``+`` and the parameters without ids)."""
    params = F.col(PARAMETERS)
    if TASK_ID in selected.columns:
        task_id = F.col(TASK_ID)
        nulls = params.isNull() | task_id.isNull()
        line = F.concat(F.lit("+"), F.length(task_id).cast("string"), F.lit(":"), task_id, params)
    else:
        nulls = params.isNull()
        line = F.concat(F.lit("+"), params)
    lines: Any = selected.select(F.when(nulls, F.lit("!")).otherwise(line))
    context = selected.sparkSession.sparkContext
    jvm: Any = context._jvm
    strings = getattr(lines._jdf, "as")(jvm.org.apache.spark.sql.Encoders.STRING())
    deserializer: Any = UTF8Deserializer
    return RDD(strings.toJavaRDD(), context, deserializer())


def _total(value: Any) -> int:
    return int(value or 0)


def validate_tasks(selected: DataFrame) -> None:
    """Raise InvalidDataFrame if a row has null parameters or, with task ids, a null, empty or
    space-containing id, or an id that another row also uses. One Spark job (a shuffle on the
    id when there are ids); a second one only to quote examples when something is wrong."""
    params = F.col(PARAMETERS)
    if TASK_ID not in selected.columns:
        missing = selected.where(params.isNull()).count()
        if missing:
            raise InvalidDataFrame(
                f"{missing} rows have null parameters: nothing was written; filter them out or "
                "fill them in",
                null_parameters=missing,
            )
        return
    task_id = F.col(TASK_ID)
    bad_id = F.coalesce((task_id == "") | task_id.contains(" "), F.lit(True))
    per_id = selected.groupBy(TASK_ID).agg(
        F.count(F.lit(1)).alias("rows"),
        F.sum(params.isNull().cast("long")).alias("nulls"),
    )
    rows, nulls = F.col("rows"), F.col("nulls")
    summary = per_id.agg(
        F.sum(F.when(bad_id, rows).otherwise(0)).alias("bad_ids"),
        F.sum(F.when(~bad_id & (rows > 1), 1).otherwise(0)).alias("duplicate_ids"),
        F.sum(nulls).alias("null_parameters"),
    ).first()
    assert summary is not None
    bad, duplicates, null_params = (_total(summary[i]) for i in range(3))
    if not (bad or duplicates or null_params):
        return
    offending = per_id.where(bad_id | (rows > 1) | (nulls > 0)).limit(EXAMPLES).collect()
    examples = [f"{row[TASK_ID]!r} ({row['rows']} rows, {row['nulls']} null)" for row in offending]
    problems = [
        f"{null_params} rows with null parameters" if null_params else "",
        f"{bad} rows with a null, empty or space-containing task id" if bad else "",
        f"{duplicates} task ids used by more than one row" if duplicates else "",
    ]
    raise InvalidDataFrame(
        f"nothing was written: {', '.join(p for p in problems if p)}; for example "
        f"{'; '.join(examples)}. Each row needs its own non-empty task id without spaces "
        "(dropDuplicates on the id if the rows are true duplicates) and non-null parameters",
        null_parameters=null_params,
        bad_ids=bad,
        duplicate_ids=duplicates,
        examples=examples,
    )


def _failure_message(settings: Settings, queue: str, reports: Sequence[PartitionReport]
                     ) -> str:
    failed = [r for r in reports if r.error]
    created = sum(r.created for r in reports)
    existing = sum(r.existing for r in reports)
    unknown = sum(r.unknown for r in reports)
    first = failed[0]
    return (
        f"enqueue_dataframe into queue {queue!r} at {hide_password(settings.url)} failed in "
        f"{len(failed)} of {len(reports)} partitions; partition {first.partition}: "
        f"{first.error}. Written before stopping: {created} tasks created, {existing} "
        f"already existed" + (f", and {unknown} rows in batches cut short may or may not "
                              "exist" if unknown else ", nothing else")
        + ". With a task_id column, running the same call again completes the batch "
        "without duplicates."
    )


def enqueue_dataframe(
    df: DataFrame,
    url: str | Settings,
    queue: str,
    parameters: str | Column | None = None,
    task_id: str | Column | None = None,
    *,
    batch_size: int = 1000,
    validate: bool = True,
    check_connection: bool = True,
    hash_tags: bool = False,
    cluster: bool | None = None,
    redis_kwargs: dict[str, Any] | None = None,
) -> EnqueueResult:
    """Make one pending task per row of ``df`` in ``queue``, written by the executors.

    ``parameters``: a column name or Column; strings are written as they are, structs, maps
    and arrays as JSON; by default the whole row as a JSON object. ``task_id``: an optional
    column of ids. With ids, enqueueing is idempotent: re-running the call, or Spark re-running
    a failed task or stage, creates no duplicate (the ids are counted as ``existing``).
    Without ids every row gets a fresh uuid4, so a retried Spark task duplicates its rows.

    ``validate`` (default) runs one Spark job before writing that rejects null parameters and
    null, empty, space-containing or repeated ids with InvalidDataFrame, so bad input writes
    nothing; it evaluates ``df`` twice, so its id column must be deterministic (which
    idempotency needs anyway). ``check_connection`` pings Redis from the driver first (turn it
    off where only the executors can reach Redis). ``url`` may be a ``blueque.config.Settings``
    (what the executors receive either way); ``hash_tags`` and ``redis_kwargs`` are Client's
    options (``cluster`` is the deprecated name of ``hash_tags``).

    Keys: per task blueque_task_[id]; blueque_pending_tasks_[queue]; blueque_queues (the
    submit_many script). Raises ConfigurationError (bad URL, queue or column),
    RedisUnavailable (the driver's check), InvalidDataFrame, or SparkEnqueueError (partitions
    failed; it says exactly how many tasks were written before they stopped)."""
    if batch_size < 1:
        raise ConfigurationError(f"batch_size must be at least 1, not {batch_size}")
    settings = settings_for(url, hash_tags_option(hash_tags, cluster), **(redis_kwargs or {}))
    client = Client(settings)  # connects lazily
    try:
        client.get_queue(queue)  # checks the queue name
        if check_connection:
            client.ping()
    finally:
        client.close()
    selected = select_tasks(df, parameters, task_id)
    if validate:
        validate_tasks(selected)
    writer = PartitionWriter(settings, queue, batch_size, task_id is not None)
    started = time.monotonic()
    reports = run_writer(selected, writer)
    if any(report.error for report in reports):
        raise SparkEnqueueError(_failure_message(settings, queue, reports), reports)
    return EnqueueResult(
        created=sum(r.created for r in reports),
        existing=sum(r.existing for r in reports),
        partitions=len(reports),
        seconds=time.monotonic() - started,
    )


def spark_failure_cause(error: BaseException) -> str:
    """The Python exception line inside a Spark job failure (whose text is mostly JVM stack),
    else Spark's reason for aborting the job, else the failure's first line."""
    lines = str(error).splitlines()
    tracebacks = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent")]
    if tracebacks:
        for line in lines[tracebacks[-1] + 1 :]:
            if line.strip() and not line[0].isspace():
                return line.strip()
    for line in lines:
        if "Job aborted due to stage failure" in line:
            return line.strip()
    first = next((line.strip() for line in lines if line.strip()), "")
    return first or repr(error)


def run_writer(selected: DataFrame, writer: PartitionWriter) -> list[PartitionReport]:
    """Run the writer over every partition and collect the reports. A failure outside the
    writer's control (an executor lost for good, a Python error) fails the Spark job; it is
    re-raised as SparkEnqueueError that says the counts are unknown."""
    try:
        reports: list[PartitionReport] = (
            task_lines(selected).mapPartitionsWithIndex(writer).collect()
        )
    except Exception as error:
        if isinstance(error, BluequeError):
            raise
        raise SparkEnqueueError(
            f"the Spark job writing queue {writer.queue!r} at {hide_password(writer.settings.url)} "
            f"failed: {spark_failure_cause(error)}. Partitions that ran before the failure may "
            "have written tasks (how many is unknown); with a task_id column, running the same "
            "call again completes the batch without duplicates"
        ) from error
    return reports
