"""Spark pipelines: fan a DataFrame out as Blueque tasks, follow them, read them back.

Install with ``pip install -e '.[spark]'`` in Blueque's checkout. blueque must be importable
on the executors too (installed on every node, or shipped with ``--py-files``): each partition
opens its own Redis connection, because a client made on the driver cannot be pickled: the
driver parses the URL once into a ``blueque.config.Settings`` (frozen, picklable) and the
executors build their clients from it. enqueue_dataframe and read_tasks also take a
Settings in place of the URL.

- ``enqueue_dataframe(df, url, queue, parameters=..., task_id=...)``: one task per row.
- ``wait_for_tasks(url, queue, task_ids=... | count=...)``: block with progress per state.
- ``read_tasks(spark, url, queue, statuses=...)``: the tasks as a typed DataFrame.
"""

from blueque.spark.enqueue import (
    EnqueueResult,
    InvalidDataFrame,
    PartitionReport,
    SparkEnqueueError,
    enqueue_dataframe,
)
from blueque.spark.progress import BatchProgress, WaitTimeout, wait_for_tasks
from blueque.spark.read import TASK_SCHEMA, read_tasks

__all__ = [
    "TASK_SCHEMA",
    "BatchProgress",
    "EnqueueResult",
    "InvalidDataFrame",
    "PartitionReport",
    "SparkEnqueueError",
    "WaitTimeout",
    "enqueue_dataframe",
    "read_tasks",
    "wait_for_tasks",
]
