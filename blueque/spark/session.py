"""A local SparkSession that stays on loopback, for the example, the tests and the benchmark.

On a real cluster build the session the usual way (spark-submit, ``SparkSession.builder``);
nothing in ``blueque.spark`` needs this module.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping

from pyspark import SparkContext
from pyspark.sql import SparkSession

from blueque.private_redis import free_port


def local_session(
    cores: int = 2, app_name: str = "blueque", conf: Mapping[str, str] | None = None
) -> SparkSession:
    """A ``local[cores]`` session bound to 127.0.0.1 with pinned driver ports and no UI.

    Sets SPARK_LOCAL_IP and PYSPARK_PYTHON in this process's environment when they are unset,
    so the JVM binds to loopback and the Python workers run this interpreter."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.port": str(free_port()),
        "spark.blockManager.port": str(free_port()),
        "spark.sql.shuffle.partitions": str(2 * cores),
        "spark.default.parallelism": str(cores),
        **(conf or {}),
    }
    builder = SparkSession.builder.master(f"local[{cores}]").appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session: SparkSession = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def stop_session(session: SparkSession, timeout: float = 30.0) -> None:
    """Stop the session and then the JVM that PySpark launched for it (by its pid).

    ``SparkSession.stop()`` leaves the gateway JVM running until the Python process exits;
    tests and examples that start it should also stop it."""
    session.stop()
    gateway = SparkContext._gateway
    process: subprocess.Popen[bytes] | None = getattr(gateway, "proc", None)
    if gateway is not None:
        gateway.shutdown()
        SparkContext._gateway = None
        SparkContext._jvm = None
    if process is not None and process.stdin is not None:
        process.stdin.close()  # the JVM exits when its stdin closes
    if process is not None and process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
