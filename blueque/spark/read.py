"""read_tasks: a queue's tasks as a typed DataFrame, read by the executors.

The driver lists only task ids (the lists, sorted set and sets that hold each status, lists in
chunks), spreads them over partitions, and each partition reads its task hashes with
pipelined HGETALLs over its own connection.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from blueque.client import Client
from blueque.config import Settings, hash_tags_option, settings_for
from blueque.errors import ConfigurationError
from blueque.statuses import RESERVED, SCHEDULED, STARTED, STATES, finish_time, state_of
from blueque.store import RedisStore

#: Ids per LRANGE / ZRANGE call when listing a status on the driver.
LIST_CHUNK = 10_000
#: HGETALLs per pipeline on an executor.
FETCH_CHUNK = 1_000

TASK_SCHEMA = T.StructType(
    [
        T.StructField("id", T.StringType(), nullable=False),
        T.StructField("status", T.StringType(), nullable=False),
        T.StructField("parameters", T.StringType()),
        T.StructField("result", T.StringType()),
        T.StructField("error", T.StringType()),
        T.StructField("node", T.StringType()),
        T.StructField("pid", T.LongType()),
        T.StructField("attempts", T.IntegerType()),
        T.StructField("created", T.TimestampType()),
        T.StructField("updated", T.TimestampType()),
        T.StructField("started", T.TimestampType()),
        T.StructField("finished", T.TimestampType()),
    ]
)


def _integer(raw: str | None) -> int | None:
    try:
        return int(float(raw)) if raw else None
    except ValueError:
        return None


def _time(raw: str | None) -> datetime | None:
    try:
        return datetime.fromtimestamp(float(raw), tz=UTC) if raw else None
    except (ValueError, OverflowError, OSError):
        return None


def task_row(task_id: str, data: dict[str, str]) -> tuple[Any, ...]:
    """One task hash as a TASK_SCHEMA row. A field that is absent or does not parse is null
    (a corrupt hash should not stop a read of a whole queue); ``attempts`` is null when the
    hash has no count (never reserved, or run by blueque 1.0.1). ``status`` is the task's
    state: its status, or ``cancelled`` for a failed task that was cancelled."""
    return (
        task_id,
        state_of(data),
        data.get("parameters"),
        data.get("result"),
        data.get("error"),
        data.get("node"),
        _integer(data.get("pid")),
        _integer(data.get("attempts")),
        _time(data.get("created")),
        _time(data.get("updated")),
        _time(data.get("started_at")),
        _time(finish_time(data)),
    )


def statuses_wanted(statuses: Iterable[str] | str | None) -> tuple[str, ...]:
    """The requested states (a status, or cancelled) in workflow order (all by default)."""
    if statuses is None:
        return STATES
    wanted = {statuses} if isinstance(statuses, str) else set(statuses)
    unknown = wanted - set(STATES)
    if unknown:
        raise ConfigurationError(
            f"unknown status {sorted(unknown)}; choose among {', '.join(STATES)}"
        )
    return tuple(status for status in STATES if status in wanted)


def _ids_of(store: RedisStore, queue: str, status: str, chunk: int) -> Iterator[str]:
    if status in (STARTED, RESERVED, SCHEDULED):
        yield from store.task_ids(queue, status)  # sets, and a sorted set read at once
        return
    start = 0
    while True:
        batch = store.task_ids(queue, status, start, start + chunk - 1)
        yield from batch
        if len(batch) < chunk:
            return
        start += chunk


def list_task_ids(
    store: RedisStore, queue: str, statuses: Sequence[str], chunk: int = LIST_CHUNK
) -> list[str]:
    """Ids of a queue's tasks in ``statuses``, each once, read in workflow order.

    While listeners work, a task moves forward (scheduled, pending, reserved, started,
    finished) between reads; reading the states in that order means a task is seen in an
    earlier or a later list, never in neither. Lists are read from the left in chunks: new
    ids pushed at the left only shift the rest right, so chunking re-reads some ids (dropped
    here) and skips none. Only a concurrent deletion or a retry (started -> scheduled) can
    hide a task from one listing."""
    seen: set[str] = set()
    ids: list[str] = []
    for status in statuses:
        for task_id in _ids_of(store, queue, status, chunk):
            if task_id not in seen:
                seen.add(task_id)
                ids.append(task_id)
    return ids


@dataclass(frozen=True)
class TaskFetcher:
    """The function each partition runs: pipelined HGETALLs over its own connection."""

    settings: Settings
    statuses: tuple[str, ...]

    def __call__(self, ids: Iterable[str]) -> Iterator[tuple[Any, ...]]:
        client: Client | None = None
        batch: list[str] = []
        try:
            for task_id in ids:
                batch.append(task_id)
                if len(batch) >= FETCH_CHUNK:
                    client = client or Client(self.settings)
                    yield from self._rows(client, batch)
                    batch = []
            if batch:
                client = client or Client(self.settings)
                yield from self._rows(client, batch)
        finally:
            if client is not None:
                client.close()

    def _rows(self, client: Client, batch: list[str]) -> Iterator[tuple[Any, ...]]:
        for task_id, data in zip(batch, client.store.task_data_many(batch), strict=True):
            # the hash is the truth: a task that moved on since it was listed shows its new
            # status (and is left out if that status was not asked for); deleted ones vanish
            if state_of(data) in self.statuses:
                yield task_row(task_id, data)


def read_tasks(
    spark: SparkSession,
    url: str | Settings,
    queue: str,
    statuses: Iterable[str] | str | None = None,
    *,
    partition_size: int = 10_000,
    hash_tags: bool = False,
    cluster: bool | None = None,
    redis_kwargs: dict[str, Any] | None = None,
) -> DataFrame:
    """The tasks of ``queue`` (those in ``statuses``, all by default) as a DataFrame with
    TASK_SCHEMA: id, status, parameters, result, error, node, pid, attempts, and the created,
    updated, started and finished times (UTC timestamps; null where unknown).

    The driver lists the ids now; the task hashes are read by the executors, in partitions of
    ``partition_size`` ids, each time an action runs; ``cache()`` the DataFrame to keep one
    reading. A row's status is the hash's status when it was read, ``cancelled`` for a failed
    task that was cancelled (``statuses`` may name it: cancelled tasks are listed apart).

    Keys read: blueque_scheduled_tasks_, blueque_pending_tasks_, blueque_listeners_ and
    blueque_reserved_tasks_, blueque_started_tasks_, blueque_complete_tasks_,
    blueque_failed_tasks_ and blueque_cancelled_tasks_ of the queue (driver);
    blueque_task_[id] (executors).
    Raises ConfigurationError or RedisUnavailable on the driver; an executor that cannot reach
    Redis fails the Spark job with RedisUnavailable's message."""
    if partition_size < 1:
        raise ConfigurationError(f"partition_size must be at least 1, not {partition_size}")
    wanted = statuses_wanted(statuses)
    settings = settings_for(url, hash_tags_option(hash_tags, cluster), **(redis_kwargs or {}))
    client = Client(settings)
    try:
        client.get_queue(queue)  # checks the name
        ids = list_task_ids(client.store, queue, wanted)
    finally:
        client.close()
    partitions = max(1, math.ceil(len(ids) / partition_size))
    rows = spark.sparkContext.parallelize(ids, partitions).mapPartitions(
        TaskFetcher(settings, wanted)
    )
    # task_row builds every value with its schema type: skip the per-row verification
    return spark.createDataFrame(rows, TASK_SCHEMA, verifySchema=False)
